// EvictingCache (evicting_cache.hpp).
#include "evicting_cache.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace sok {
namespace hps {
namespace {

constexpr int64_t kMinCapacity = 128;  // one HKV bucket, cache.py's least capacity

HashMapOptions cache_options(int64_t capacity) {
  HashMapOptions o;
  o.num_partitions = 1;
  o.parallel = false;
  o.overflow_margin = static_cast<uint64_t>(capacity);
  o.overflow_policy = OverflowPolicy::kEvictOldest;
  o.overflow_resolution_target = 1.0;  // evict the overflow only
  return o;
}

}  // namespace

int64_t capacity_of(int64_t rows, double fraction) {
  const auto wanted = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(fraction * static_cast<double>(rows))));
  int64_t capacity = kMinCapacity;
  while (capacity < wanted) {
    if (capacity > (INT64_MAX >> 1)) throw std::invalid_argument("a cache of " + std::to_string(wanted) + " rows");
    capacity <<= 1;
  }
  return capacity;
}

EvictingCache::EvictingCache(std::string tag, int64_t dim, int64_t capacity)
    : tag_(std::move(tag)), dim_(dim), capacity_(capacity), rows_(cache_options(capacity)) {}

void EvictingCache::find(const int64_t* keys, int64_t n, float* rows, const float* default_row, uint8_t* found) const {
  std::unique_ptr<bool[]> hit(new bool[static_cast<size_t>(std::max<int64_t>(n, 1))]);
  rows_.fetch(tag_, keys, n, dim_, rows, hit.get());
  for (int64_t i = 0; i < n; ++i) {
    if (!hit[i] && default_row != nullptr) std::copy(default_row, default_row + dim_, rows + i * dim_);
    if (found != nullptr) found[i] = hit[i];
  }
}

int64_t EvictingCache::size() const { return rows_.size(tag_); }

void EvictingCache::insert(const int64_t* keys, int64_t n, const float* rows) {
  rows_.insert(tag_, keys, n, rows, dim_);
}

int64_t EvictingCache::update_present(const int64_t* keys, int64_t n, const float* rows) {
  std::vector<float> held(static_cast<size_t>(n * dim_));
  std::unique_ptr<bool[]> hit(new bool[static_cast<size_t>(std::max<int64_t>(n, 1))]);
  rows_.fetch(tag_, keys, n, dim_, held.data(), hit.get());
  std::vector<int64_t> present;
  std::vector<float> values;
  for (int64_t i = 0; i < n; ++i) {
    if (!hit[i]) continue;
    present.push_back(keys[i]);
    values.insert(values.end(), rows + i * dim_, rows + (i + 1) * dim_);
  }
  if (!present.empty()) rows_.insert(tag_, present.data(), static_cast<int64_t>(present.size()), values.data(), dim_);
  return static_cast<int64_t>(present.size());
}

}  // namespace hps
}  // namespace sok
