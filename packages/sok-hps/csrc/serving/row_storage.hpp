// Where the C++ server keeps rows: SOK storages reached through the storage C ABI at run time (det's
// libsok_det_storage.so for the tables that never evict, hkv's libsok_hkv_storage.so for the
// evicting caches: the backends the Python server's caches and hash map use), one table's rows per
// RowStorage, in host memory or on a GPU; and GraphRows, the rows a lookup graph's SokFind reads.
//
// Example:
//   RowStorage rows(det_storage_api(), "the cache of hps_et.m.t", 16, SOK_KEY_INT64, cache_device(),
//                   det_options(30000));
//   rows.insert(keys, n, values);
//   rows.find(keys, n, out, nullptr, found);
#ifndef SOK_HPS_SERVING_ROW_STORAGE_HPP_
#define SOK_HPS_SERVING_ROW_STORAGE_HPP_

#include <cstdint>
#include <string>

#include "sok/storage_api.h"
#include "storage_options.hpp"

namespace sok {
namespace hps {

// sok-backend-det's and sok-backend-hkv's function tables, from the libraries the process must have
// loaded before (TF_LoadLibrary, dlopen: graph_calls.serving_libraries() lists them), found by
// dlopen RTLD_NOLOAD, so sok-hps needs neither at build time. Throw std::runtime_error, naming the
// library to load, where it is not loaded or is of another storage API version.
const sok_storage_api* det_storage_api();
const sok_storage_api* hkv_storage_api();

// The host execution context of every host-memory storage call here.
inline constexpr sok_exec_context kHostContext{SOK_DEVICE_CPU, 0, nullptr};

// The GPU the C++ server's caches live on, as the Python server's (cache.py's cache_device: the
// first GPU, else the CPU): 0 where this library was built with CUDA and the process sees a GPU,
// else -1.
int32_t cache_device();

// Rows a lookup graph's SokFind reads (served_storage.hpp). Host-side keys are int64 whatever the
// storage's key type (int32 keys are narrowed: the server checked their range).
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
  // The key type find_on_device takes (SOK_KEY_INT64 or SOK_KEY_INT32).
  virtual int32_t key_type() const { return SOK_KEY_INT64; }
  // find with every array on device() (keys of key_type()) and ctx (a CUDA context of device()) the
  // caller's stream. Only where device() >= 0.
  virtual void find_on_device(const sok_exec_context& ctx, const void* keys, int64_t n, float* rows,
                              const float* default_row, uint8_t* found) const;
};

// One storage of `api` (key_type keys, dim float columns), in host memory or on GPU `device`,
// destroyed with this object. Its host-array calls (find, insert) copy through the GPU's memory
// where it is on one, in a stream of its own.
class RowStorage final : public GraphRows {
 public:
  // what: for messages ("the cache of <tag>"). Throws std::runtime_error (the backend's message).
  RowStorage(const sok_storage_api* api, std::string what, int64_t dim, int32_t key_type, int32_t device,
             const StorageOptions& options);
  ~RowStorage() override;
  RowStorage(const RowStorage&) = delete;
  RowStorage& operator=(const RowStorage&) = delete;

  int64_t dim() const override { return dim_; }
  void find(const int64_t* keys, int64_t n, float* rows, const float* default_row, uint8_t* found) const override;
  // Inserts or overwrites; the last of a repeated key wins. A storage of bounded capacity (hkv)
  // evicts rows to make room, as its policy says.
  void insert(const int64_t* keys, int64_t n, const float* rows) const;
  int64_t size() const override;
  int64_t capacity() const override;
  int32_t device() const override { return device_; }
  int32_t key_type() const override { return key_type_; }
  void find_on_device(const sok_exec_context& ctx, const void* keys, int64_t n, float* rows,
                      const float* default_row, uint8_t* found) const override;

 private:
  void check(sok_status status, const char* call) const;
  sok_exec_context context() const;  // of the storage's own calls: the host, or its GPU and stream
  // keys as the storage takes them: the int64 array itself, or narrowed into `narrowed`.
  const void* stored_keys(const int64_t* keys, int64_t n, std::vector<int32_t>* narrowed) const;

  const sok_storage_api* const api_;
  const std::string what_;
  const int64_t dim_;
  const int32_t key_type_;
  const int32_t device_;
  void* stream_ = nullptr;  // a cudaStream_t of device_'s, for the host-array calls
  sok_storage* storage_ = nullptr;
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_ROW_STORAGE_HPP_
