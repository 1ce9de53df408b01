// The embedding cache of a table with a database behind it that may hold more rows than the cache
// (gpucacheper below 1.0 with embedding_cache_type dynamic: what the Python server keeps in an HKV
// table, cache.py): at most `capacity` rows, the least recently read or written evicted first.
// One partition of the C++ HashMapTier (evict_oldest), so it needs no GPU and no HKV; the capacity
// is cache.py's capacity_of (gpucacheper x the table's rows, rounded up to a power of two, at
// least 128 rows).
//
// Example:
//   EvictingCache cache("hps_et.m.t", 16, capacity_of(30000, 0.2));   // 8192 rows
//   cache.insert(keys, n, rows);
//   cache.find(keys, n, out, nullptr, found);
#ifndef SOK_HPS_SERVING_EVICTING_CACHE_HPP_
#define SOK_HPS_SERVING_EVICTING_CACHE_HPP_

#include <cstdint>
#include <memory>
#include <string>

#include "det_tier.hpp"
#include "hash_map_tier.hpp"

namespace sok {
namespace hps {

// cache.py's capacity_of: ceil(fraction x rows) rounded up to a power of two, at least 128.
int64_t capacity_of(int64_t rows, double fraction);

class EvictingCache final : public GraphRows {
 public:
  EvictingCache(std::string tag, int64_t dim, int64_t capacity);

  int64_t dim() const override { return dim_; }
  void find(const int64_t* keys, int64_t n, float* rows, const float* default_row, uint8_t* found) const override;
  int64_t size() const override;
  int64_t capacity() const override { return capacity_; }

  // Inserts or overwrites rows [n, dim] of keys [n], evicting down to the capacity.
  void insert(const int64_t* keys, int64_t n, const float* rows);
  // Overwrites the rows of the keys the cache holds (an online update); returns how many.
  int64_t update_present(const int64_t* keys, int64_t n, const float* rows);

 private:
  const std::string tag_;
  const int64_t dim_;
  const int64_t capacity_;
  mutable HashMapTier rows_;  // a find counts as a use
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_EVICTING_CACHE_HPP_
