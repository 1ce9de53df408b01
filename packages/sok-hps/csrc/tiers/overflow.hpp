// What the evicting tiers (HashMapTier, RedisClusterTier) share about overflow: the check of
// overflow_resolution_target and the rows an overflowing partition keeps, as the Python tiers
// compute them; and Python's repr of a float, for the messages of settings.
#ifndef SOK_HPS_TIERS_OVERFLOW_HPP_
#define SOK_HPS_TIERS_OVERFLOW_HPP_

#include <charconv>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "limits.hpp"

namespace sok {
namespace hps {

// x as Python's repr writes a float (shortest round trip, "0.0" rather than "0").
inline std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[32];
  const auto end = std::to_chars(buffer, buffer + sizeof(buffer), x).ptr;
  std::string out(buffer, end);
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

// std::invalid_argument unless 0 < target <= 1.
inline void check_overflow_resolution_target(double target) {
  if (!(0.0 < target && target <= 1.0)) {
    throw std::invalid_argument("overflow_resolution_target must be in (0, 1], got " + py_float_repr(target));
  }
}

// The rows an overflowing partition keeps: round(margin * target), half to even as Python's round;
// kNoOverflowLimit for a tier that never evicts.
inline uint64_t keep_rows_of(uint64_t margin, double target) {
  if (margin == kNoOverflowLimit) return kNoOverflowLimit;
  const double keep = std::nearbyint(static_cast<double>(margin) * target);
  return keep <= 0 ? 0 : static_cast<uint64_t>(keep);
}

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_TIERS_OVERFLOW_HPP_
