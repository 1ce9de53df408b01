// sok-backend-det's CPU storage as the C++ server holds rows in it: det's function table, reached at
// run time through libsok_det_storage.so (det_storage_api), a storage of one table's rows
// (DetStorage), and DetTier, the volatile hash map that never evicts (hash_map / parallel_hash_map
// without overflow_margin) as a Tier of one det storage per table, what the Python HashMapTier keeps
// such rows in too (tiers/hash_map.py), so that a lookup graph's SokFind reads them (storage()).
//
// Example:
//   DetTier tier("hash_map");
//   tier.insert("hps_et.m.t", keys, n, rows, 16);
//   tier.fetch("hps_et.m.t", keys, n, 16, out, found);
#ifndef SOK_HPS_SERVING_DET_TIER_HPP_
#define SOK_HPS_SERVING_DET_TIER_HPP_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "sok/storage_api.h"
#include "tier.hpp"

namespace sok {
namespace hps {

// sok-backend-det's function table, from libsok_det_storage.so (sok_det_storage_api), which the
// process must have loaded (TF_LoadLibrary, dlopen) before; found by dlopen RTLD_NOLOAD, so sok-hps
// needs no det at build time. Throws std::runtime_error, naming the library to load, where it is not
// loaded or is of another storage API version.
const sok_storage_api* det_storage_api();

// The host execution context of every det call here (det's CPU storage).
inline constexpr sok_exec_context kHostContext{SOK_DEVICE_CPU, 0, nullptr};

// Rows a lookup graph's SokFind reads (served_storage.hpp): a det storage, or the evicting cache
// (evicting_cache.hpp). Keys int64.
class GraphRows {
 public:
  virtual ~GraphRows() = default;
  virtual int64_t dim() const = 0;
  // rows [n, dim] of keys [n], arrays in host memory: the stored row, or default_row (zeros where
  // null); found [n] may be null.
  virtual void find(const int64_t* keys, int64_t n, float* rows, const float* default_row, uint8_t* found) const = 0;
  virtual int64_t size() const = 0;
  virtual int64_t capacity() const = 0;
  // The GPU the rows are in (they are found there, in a caller's stream: find_on_device), or -1:
  // host memory.
  virtual int32_t device() const { return -1; }
  // find with every array on device() and ctx (a CUDA context of device()) the caller's stream. Only
  // where device() >= 0.
  virtual void find_on_device(const sok_exec_context& ctx, const int64_t* keys, int64_t n, float* rows,
                              const float* default_row, uint8_t* found) const;
};

// The GPU the C++ server's caches of every row live on, as the Python server's (cache.py's
// cache_device: the first GPU, else the CPU): 0 where this library was built with CUDA and the
// process sees a GPU, else -1.
int32_t cache_device();

// One det storage (int64 keys, dim float columns), in host memory or on a GPU, destroyed with this
// object. Its host-array calls (find, insert) copy through the GPU's memory where it is on one.
class DetStorage final : public GraphRows {
 public:
  // Slots for `capacity` rows at once (no rehash while as many load), on GPU `device` (-1: host
  // memory). Throws std::runtime_error.
  DetStorage(const std::string& what, int64_t dim, int64_t capacity, int32_t device = -1);
  ~DetStorage() override;
  DetStorage(const DetStorage&) = delete;
  DetStorage& operator=(const DetStorage&) = delete;

  int64_t dim() const override { return dim_; }
  void find(const int64_t* keys, int64_t n, float* rows, const float* default_row, uint8_t* found) const override;
  void insert(const int64_t* keys, int64_t n, const float* rows) const;  // the last of a repeated key wins
  int64_t size() const override;
  int64_t capacity() const override;
  int32_t device() const override { return device_; }
  void find_on_device(const sok_exec_context& ctx, const int64_t* keys, int64_t n, float* rows,
                      const float* default_row, uint8_t* found) const override;

 private:
  void check(sok_status status, const char* call) const;
  sok_exec_context context() const;  // of the storage's own calls: the host, or its GPU and stream

  const sok_storage_api* const api_;
  const std::string what_;  // for messages: "the det storage of <tag>"
  const int64_t dim_;
  const int32_t device_;
  void* stream_ = nullptr;  // a cudaStream_t of device_'s, for the host-array calls
  sok_storage* storage_ = nullptr;
};

// The volatile hash map that never evicts: one DetStorage per table tag, made at its first insert
// (or storage()). Thread-safe; close() drops the tables, calls in flight finish on the rows they
// started with.
class DetTier final : public Tier {
 public:
  explicit DetTier(std::string name) : name_(std::move(name)) {}

  const std::string& name() const override { return name_; }
  void fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows, bool* found) override;
  void insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows, int64_t dim) override;
  int64_t size(const std::string& tag) override;
  void close() override;

  // The storage of tag's rows, made empty (with slots for capacity rows) where the tier has none:
  // what a lookup graph's SokFind reads (tiers/hash_map.py's graph_table). Throws
  // std::invalid_argument (the tier holds tag with another dim), TierClosed.
  std::shared_ptr<const DetStorage> storage(const std::string& tag, int64_t dim, int64_t capacity = 1);

 private:
  // tag's table, nullptr where the tier has none; throws TierClosed, and std::invalid_argument when its
  // dim is not dim (`what`: "asked for" or "got rows of").
  std::shared_ptr<const DetStorage> table(const std::string& tag, int64_t dim, const char* what);
  void check_open() const;  // TierClosed after close(); under mu_
  // std::invalid_argument unless `table` (tag's) holds rows of dim (`what`: as table()'s).
  void check_table_dim(const std::string& tag, const DetStorage& table, int64_t dim, const char* what) const;

  const std::string name_;
  std::mutex mu_;
  bool closed_ = false;
  std::map<std::string, std::shared_ptr<const DetStorage>> tables_;
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_DET_TIER_HPP_
