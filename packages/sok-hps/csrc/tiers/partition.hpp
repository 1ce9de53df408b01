// The partition of a key: the original HPS's rrxmrrxmsx_0 mix, modulo the partition count; the
// same function as hierarchical_parameter_server.tiers.partition.partition_of, so the hash map,
// Redis and the update files place a key alike whichever language wrote it. And the keys of a call
// grouped by partition (group_by_partition), as every partitioned tier works on them.
#ifndef SOK_HPS_TIERS_PARTITION_HPP_
#define SOK_HPS_TIERS_PARTITION_HPP_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

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

// The positions of a call's keys grouped by partition: order[begin, end) of each group are the
// positions (ascending) of the keys of partition `partition`; groups by ascending partition.
struct Groups {
  struct Group {
    int64_t partition, begin, end;
  };
  std::vector<int64_t> order;
  std::vector<Group> groups;
};

// Work in the number of keys, not of partitions: a counting sort where there are no more partitions
// than keys, else a sort of the positions by partition.
inline Groups group_by_partition(const int64_t* keys, int64_t n, int64_t num_partitions) {
  Groups out;
  out.order.resize(n);
  std::vector<int64_t> parts(n);
  for (int64_t i = 0; i < n; ++i) parts[i] = static_cast<int64_t>(partition_of(keys[i], num_partitions));
  if (num_partitions <= n) {
    std::vector<int64_t> start(num_partitions + 1, 0);
    for (int64_t i = 0; i < n; ++i) ++start[parts[i] + 1];
    for (int64_t p = 0; p < num_partitions; ++p) {
      if (start[p + 1] > 0) out.groups.push_back({p, start[p], start[p] + start[p + 1]});
      start[p + 1] += start[p];
    }
    for (int64_t i = 0; i < n; ++i) out.order[start[parts[i]]++] = i;
  } else {
    std::iota(out.order.begin(), out.order.end(), int64_t{0});
    std::stable_sort(out.order.begin(), out.order.end(), [&](int64_t a, int64_t b) { return parts[a] < parts[b]; });
    for (int64_t i = 0; i < n; ++i) {
      if (i == 0 || parts[out.order[i]] != parts[out.order[i - 1]]) out.groups.push_back({parts[out.order[i]], i, i});
      out.groups.back().end = i + 1;
    }
  }
  return out;
}

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_TIERS_PARTITION_HPP_
