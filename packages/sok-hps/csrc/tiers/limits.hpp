// The bounds of a volatile DB's settings that the ps_config reader (csrc/serving/ps_config.hpp)
// checks and the tiers obey: config.py's constants of the same names.
#ifndef SOK_HPS_TIERS_LIMITS_HPP_
#define SOK_HPS_TIERS_LIMITS_HPP_
#include <cstdint>
#include <limits>

namespace sok {
namespace hps {

// overflow_margin of a tier that never evicts, its default (config.py's NO_OVERFLOW_LIMIT; the
// original's SIZE_MAX).
inline constexpr uint64_t kNoOverflowLimit = std::numeric_limits<uint64_t>::max();
// The most partitions per table (config.py's MAX_PARTITIONS): Redis cluster's 16384 hash slots (a
// partition is one Redis hash).
inline constexpr int64_t kMaxPartitions = 16384;

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_TIERS_LIMITS_HPP_
