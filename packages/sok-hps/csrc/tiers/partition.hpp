// The partition of a key: the original HPS's rrxmrrxmsx_0 mix, modulo the partition count; the
// same function as hierarchical_parameter_server.tiers.partition.partition_of, so the hash map,
// Redis and the update files place a key alike whichever language wrote it.
#ifndef SOK_HPS_TIERS_PARTITION_HPP_
#define SOK_HPS_TIERS_PARTITION_HPP_

#include <cstdint>

namespace sok {
namespace hps {

inline uint64_t rotr64(uint64_t x, int r) { return (x >> r) | (x << (64 - r)); }

// rrxmrrxmsx_0 of key (an int64 key is taken as the uint64 of the same bits).
inline uint64_t rrxmrrxmsx_0(uint64_t x) {
  x ^= rotr64(x, 25) ^ rotr64(x, 50);
  x *= 0xA24BAED4963EE407ull;
  x ^= rotr64(x, 24) ^ rotr64(x, 49);
  x *= 0x9FB21C651E98DF25ull;
  return x ^ (x >> 28);
}

// The partition of key, < num_partitions (>= 1).
inline uint64_t partition_of(int64_t key, uint64_t num_partitions) {
  return rrxmrrxmsx_0(static_cast<uint64_t>(key)) % num_partitions;
}

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_TIERS_PARTITION_HPP_
