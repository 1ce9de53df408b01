// The embedding cache of a table with a database behind it that may hold more rows than the cache
// (gpucacheper below 1.0 with embedding_cache_type dynamic): an hkv storage (sok-backend-hkv's
// libsok_hkv_storage.so through the storage C ABI) of at most `capacity` rows that evicts the
// least recently written, on the GPU where the process sees one and in host memory otherwise: the
// table the Python server's cache is (cache.py), with its options (storage_options.hpp).
//
// Example:
//   EvictingCache cache("hps_et.m.t", 16, capacity_of(30000, 0.2), SOK_KEY_INT64);   // 8192 rows
//   cache.insert(keys, n, rows);
//   cache.find(keys, n, out, nullptr, found);
#ifndef SOK_HPS_SERVING_EVICTING_CACHE_HPP_
#define SOK_HPS_SERVING_EVICTING_CACHE_HPP_

#include <cstdint>
#include <mutex>
#include <string>

#include "row_storage.hpp"

namespace sok {
namespace hps {

class EvictingCache final : public GraphRows {
 public:
  // keys of key_type (SOK_KEY_INT64, or SOK_KEY_INT32 where supportlonglong is false), on
  // cache_device(). Throws std::runtime_error (hkv's library not loaded; hkv's message).
  EvictingCache(const std::string& tag, int64_t dim, int64_t capacity, int32_t key_type);

  int64_t dim() const override { return rows_.dim(); }
  void find(const int64_t* keys, int64_t n, float* rows, const float* default_row, uint8_t* found) const override {
    rows_.find(keys, n, rows, default_row, found);
  }
  int64_t size() const override { return rows_.size(); }
  int64_t capacity() const override { return capacity_; }
  int32_t device() const override { return rows_.device(); }
  int32_t key_type() const override { return rows_.key_type(); }
  void find_on_device(const sok_exec_context& ctx, const void* keys, int64_t n, float* rows,
                      const float* default_row, uint8_t* found) const override {
    rows_.find_on_device(ctx, keys, n, rows, default_row, found);
  }

  // Inserts or overwrites rows [n, dim] of keys [n]; hkv evicts to stay within the capacity.
  void insert(const int64_t* keys, int64_t n, const float* rows);
  // Overwrites the rows of the keys the cache holds (an online update); returns how many.
  int64_t update_present(const int64_t* keys, int64_t n, const float* rows);

 private:
  const int64_t capacity_;
  RowStorage rows_;
  // update_present's find and write as one step against the fills' inserts (hkv locks each call).
  std::mutex writes_;
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_EVICTING_CACHE_HPP_
