// EvictingCache (evicting_cache.hpp).
#include "evicting_cache.hpp"

#include <algorithm>
#include <memory>
#include <vector>

namespace sok {
namespace hps {

EvictingCache::EvictingCache(const std::string& tag, int64_t dim, int64_t capacity, int32_t key_type)
    : capacity_(capacity),
      rows_(hkv_storage_api(), "the cache of " + tag, dim, key_type, cache_device(), hkv_cache_options(capacity)) {}

void EvictingCache::insert(const int64_t* keys, int64_t n, const float* rows) {
  std::lock_guard<std::mutex> lock(writes_);
  rows_.insert(keys, n, rows);
}

int64_t EvictingCache::update_present(const int64_t* keys, int64_t n, const float* rows) {
  const int64_t dim = rows_.dim();
  std::lock_guard<std::mutex> lock(writes_);
  std::vector<float> held(static_cast<size_t>(n * dim));
  std::unique_ptr<uint8_t[]> hit(new uint8_t[static_cast<size_t>(std::max<int64_t>(n, 1))]);
  rows_.find(keys, n, held.data(), nullptr, hit.get());
  std::vector<int64_t> present;
  std::vector<float> values;
  for (int64_t i = 0; i < n; ++i) {
    if (!hit[i]) continue;
    present.push_back(keys[i]);
    values.insert(values.end(), rows + i * dim, rows + (i + 1) * dim);
  }
  if (!present.empty()) rows_.insert(present.data(), static_cast<int64_t>(present.size()), values.data());
  return static_cast<int64_t>(present.size());
}

}  // namespace hps
}  // namespace sok
