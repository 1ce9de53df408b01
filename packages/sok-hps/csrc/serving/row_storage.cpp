// The storages' function tables, cache_device and RowStorage (row_storage.hpp).
#include "row_storage.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "sok/kit/keys.hpp"
#include "sok/kit/loaded_library.hpp"

#ifdef SOK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sok {
namespace hps {
namespace {

using StorageEntry = const sok_storage_api* (*)();

// The function table of the backend whose library (its sok_<backend>_storage.h, which sok-hps does
// not include: the backends are reached at run time only) the process loaded; `package` names the
// distribution to reinstall where it is of another API version.
const sok_storage_api* loaded_storage_api(const char* library, const char* entry_name, const char* package,
                                          const char* role) {
  auto entry = reinterpret_cast<StorageEntry>(loaded_library_symbol(library, entry_name));
  const sok_storage_api* found = entry != nullptr ? entry() : nullptr;
  if (found == nullptr) {
    throw std::runtime_error(
        std::string("the C++ server keeps ") + role + " in " + package + "'s storage, and this process has not " +
        "loaded its library " + library +
        ": load it (TF_LoadLibrary) before libsok_hps_serving.so, as graph_calls.serving_libraries() lists them "
        "(python -c \"from hierarchical_parameter_server import graph_calls; "
        "print(*graph_calls.serving_libraries())\"); it is in the package directory of " +
        package);
  }
  if (found->api_version != SOK_STORAGE_API_VERSION || !sok_storage_api_has(found, find)) {
    throw std::runtime_error(std::string(library) + " has storage API version " + std::to_string(found->api_version) +
                             ", and libsok_hps_serving.so was built for " + std::to_string(SOK_STORAGE_API_VERSION) +
                             ": install " + package + " and sok-hps of the same release");
  }
  return found;
}

#ifdef SOK_WITH_CUDA
void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw std::runtime_error(what + ": CUDA: " + cudaGetErrorString(status));
}

// An array of `bytes` on the current GPU, freed in `stream` when it goes; `from` (host memory), where
// given, is copied in, in `stream`.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, cudaStream_t stream, const std::string& what, const void* from = nullptr)
      : stream_(stream) {
    check_cuda(cudaMallocAsync(&data_, std::max<size_t>(bytes, 1), stream), what);
    if (from == nullptr) return;
    const cudaError_t copied = cudaMemcpyAsync(data_, from, bytes, cudaMemcpyHostToDevice, stream);
    if (copied != cudaSuccess) {
      cudaFreeAsync(data_, stream);  // no destructor runs for a constructor that throws
      check_cuda(copied, what);
    }
  }
  ~DeviceBuffer() { cudaFreeAsync(data_, stream_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};
#endif

}  // namespace

const sok_storage_api* det_storage_api() {
  static const sok_storage_api* const api = loaded_storage_api(
      "libsok_det_storage.so", "sok_det_storage_api", "sok-backend-det", "its tables' rows");
  return api;
}

const sok_storage_api* hkv_storage_api() {
  static const sok_storage_api* const api = loaded_storage_api(
      "libsok_hkv_storage.so", "sok_hkv_storage_api", "sok-backend-hkv", "its evicting caches' rows");
  return api;
}

void GraphRows::find_on_device(const sok_exec_context&, const void*, int64_t, float*, const float*, uint8_t*) const {
  throw std::logic_error("find_on_device of rows in host memory");
}

int32_t cache_device() {
#ifdef SOK_WITH_CUDA
  static const int32_t device = [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? 0 : -1;
  }();
  return device;
#else
  return -1;
#endif
}

RowStorage::RowStorage(const sok_storage_api* api, std::string what, int64_t dim, int32_t key_type, int32_t device,
                       const StorageOptions& options)
    : api_(api), what_(std::move(what)), dim_(dim), key_type_(key_type), device_(device) {
  if (key_type_ != SOK_KEY_INT64 && key_type_ != SOK_KEY_INT32) {
    throw std::invalid_argument("creating " + what_ + ": key type " + std::to_string(key_type_) +
                                "; valid: SOK_KEY_INT64, SOK_KEY_INT32");
  }
#ifdef SOK_WITH_CUDA
  if (device_ >= 0) {
    check_cuda(cudaSetDevice(device_), "creating " + what_);
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating " + what_);
    stream_ = stream;
  }
#else
  if (device_ >= 0) throw std::runtime_error("creating " + what_ + ": this build of sok-hps has no CUDA");
#endif
  std::vector<const char*> names, values;
  for (const auto& [name, value] : options) {
    names.push_back(name.c_str());
    values.push_back(value.c_str());
  }
  sok_storage_config config{};
  config.struct_size = sizeof(sok_storage_config);
  config.key_type = key_type_;
  config.row_width = static_cast<int32_t>(dim);
  config.device_type = device_ >= 0 ? SOK_DEVICE_CUDA : SOK_DEVICE_CPU;
  config.device_id = std::max(device_, 0);
  config.num_options = static_cast<int32_t>(options.size());
  config.option_names = names.data();
  config.option_values = values.data();
  if (api_->create(&config, &storage_) != SOK_OK) {
    const std::string error = api_->last_error(nullptr);
#ifdef SOK_WITH_CUDA
    if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
    throw std::runtime_error("creating " + what_ + ": " + error);
  }
}

RowStorage::~RowStorage() {
  if (storage_ != nullptr) api_->destroy(storage_);
#ifdef SOK_WITH_CUDA
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

sok_exec_context RowStorage::context() const {
  if (device_ < 0) return kHostContext;
  return sok_exec_context{SOK_DEVICE_CUDA, device_, stream_};
}

void RowStorage::check(sok_status status, const char* call) const {
  if (status != SOK_OK) {
    throw std::runtime_error(std::string(call) + " on " + what_ + ": " + api_->last_error(storage_));
  }
}

const void* RowStorage::stored_keys(const int64_t* keys, int64_t n, std::vector<int32_t>* narrowed) const {
  if (key_type_ == SOK_KEY_INT64) return keys;
  narrowed->assign(keys, keys + n);  // in int32's range: the server checked the model files and updates
  return narrowed->data();
}

void RowStorage::find(const int64_t* keys, int64_t n, float* rows, const float* default_row, uint8_t* found) const {
  const auto d = static_cast<int32_t>(dim_);
  std::vector<int32_t> narrowed;
  const void* k = stored_keys(keys, n, &narrowed);
  if (device_ < 0) {
    check(api_->find(storage_, &kHostContext, n, k, 0, d, rows, default_row, found), "find");
    return;
  }
#ifdef SOK_WITH_CUDA
  // through the GPU's memory, in the storage's stream
  const std::string what = "find on " + what_;
  const auto stream = static_cast<cudaStream_t>(stream_);
  const auto rows_bytes = static_cast<size_t>(n * dim_) * sizeof(float);
  check_cuda(cudaSetDevice(device_), what);
  DeviceBuffer dk(n * key_size(key_type_), stream, what, k), r(rows_bytes, stream, what),
      def(dim_ * sizeof(float), stream, what, default_row), f(static_cast<size_t>(n), stream, what);
  const sok_exec_context ctx = context();
  check(api_->find(storage_, &ctx, n, dk.as<void>(), 0, d, r.as<float>(),
                   default_row != nullptr ? def.as<float>() : nullptr, found != nullptr ? f.as<uint8_t>() : nullptr),
        "find");
  check_cuda(cudaMemcpyAsync(rows, r.as<float>(), rows_bytes, cudaMemcpyDeviceToHost, stream), what);
  if (found != nullptr) check_cuda(cudaMemcpyAsync(found, f.as<uint8_t>(), n, cudaMemcpyDeviceToHost, stream), what);
  check_cuda(cudaStreamSynchronize(stream), what);
#endif
}

void RowStorage::find_on_device(const sok_exec_context& ctx, const void* keys, int64_t n, float* rows,
                                const float* default_row, uint8_t* found) const {
  check(api_->find(storage_, &ctx, n, keys, 0, static_cast<int32_t>(dim_), rows, default_row, found), "find");
}

void RowStorage::insert(const int64_t* keys, int64_t n, const float* rows) const {
  const auto d = static_cast<int32_t>(dim_);
  std::vector<int32_t> narrowed;
  const void* k = stored_keys(keys, n, &narrowed);
  if (device_ < 0) {
    check(api_->insert_or_assign(storage_, &kHostContext, n, k, 0, d, rows, nullptr, nullptr, 0), "insert");
    return;
  }
#ifdef SOK_WITH_CUDA
  const std::string what = "insert into " + what_;
  const auto stream = static_cast<cudaStream_t>(stream_);
  check_cuda(cudaSetDevice(device_), what);
  DeviceBuffer dk(n * key_size(key_type_), stream, what, k),
      r(static_cast<size_t>(n * dim_) * sizeof(float), stream, what, rows);
  const sok_exec_context ctx = context();
  check(api_->insert_or_assign(storage_, &ctx, n, dk.as<void>(), 0, d, r.as<float>(), nullptr, nullptr, 0), "insert");
  check_cuda(cudaStreamSynchronize(stream), what);
#endif
}

int64_t RowStorage::size() const {
  int64_t out = 0;
  const sok_exec_context ctx = context();
  check(api_->size(storage_, &ctx, &out), "size");
#ifdef SOK_WITH_CUDA
  if (device_ >= 0) check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "size of " + what_);
#endif
  return out;
}

int64_t RowStorage::capacity() const {
  int64_t out = 0;
  check(api_->capacity(storage_, &out), "capacity");
  return out;
}

}  // namespace hps
}  // namespace sok
