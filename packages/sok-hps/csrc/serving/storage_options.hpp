// The creation options of the C++ server's storages (row_storage.hpp), and the capacity of an
// evicting cache: what cache.py gives the Python server's, held to it by test_serving_without_python
// through _serving.capacity_of and _serving.hkv_cache_options.
//
// Example:
//   capacity_of(30000, 0.2);          // 8192
//   hkv_cache_options(8192);          // init_capacity 8192, max_capacity 8192, evict_strategy lru
#ifndef SOK_HPS_SERVING_STORAGE_OPTIONS_HPP_
#define SOK_HPS_SERVING_STORAGE_OPTIONS_HPP_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sok {
namespace hps {

// A storage's creation options, as (name, value) text pairs (sok_storage_config's).
using StorageOptions = std::vector<std::pair<std::string, std::string>>;

inline constexpr int64_t kMinCacheCapacity = 128;  // one HKV bucket, cache.py's least capacity
// sok_backend_hkv.plugin.DEFAULT_INIT_CAPACITY: the most init_capacity cache.py gives an hkv cache.
inline constexpr int64_t kHkvDefaultInitCapacity = 8192;

// A det storage's: slots for `capacity` rows at once (no rehash while as many load).
inline StorageOptions det_options(int64_t capacity) {
  return {{"init_capacity", std::to_string(std::max<int64_t>(capacity, 1))}};
}

// cache.py's capacity_of: ceil(fraction x rows) rounded up to a power of two, at least 128.
// Throws std::invalid_argument where that passes int64.
inline int64_t capacity_of(int64_t rows, double fraction) {
  const auto wanted = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(fraction * static_cast<double>(rows))));
  int64_t capacity = kMinCacheCapacity;
  while (capacity < wanted) {
    if (capacity > (INT64_MAX >> 1)) throw std::invalid_argument("a cache of " + std::to_string(wanted) + " rows");
    capacity <<= 1;
  }
  return capacity;
}

// cache.py's hkv options of an evicting cache of `capacity` rows (a power of two).
inline StorageOptions hkv_cache_options(int64_t capacity) {
  return {{"init_capacity", std::to_string(std::min(capacity, kHkvDefaultInitCapacity))},
          {"max_capacity", std::to_string(capacity)},
          {"evict_strategy", "lru"}};
}

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_STORAGE_OPTIONS_HPP_
