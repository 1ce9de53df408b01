// det_storage_api, DetStorage and DetTier (det_tier.hpp).
#include "det_tier.hpp"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include "sok/kit/loaded_library.hpp"

#ifdef SOK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sok {
namespace hps {
namespace {

// sok-backend-det's library and its entry point (sok_det_storage.h, which sok-hps does not include:
// det is reached at run time only).
constexpr char kDetLibrary[] = "libsok_det_storage.so";
constexpr char kDetEntry[] = "sok_det_storage_api";
using DetEntry = const sok_storage_api* (*)();

#ifdef SOK_WITH_CUDA
void check_cuda(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw std::runtime_error(what + ": CUDA: " + cudaGetErrorString(status));
}

// An array of `bytes` on the current GPU, freed in `stream` when it goes.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t bytes, cudaStream_t stream, const std::string& what) : stream_(stream) {
    check_cuda(cudaMallocAsync(&data_, std::max<size_t>(bytes, 1), stream), what);
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

void GraphRows::find_on_device(const sok_exec_context&, const int64_t*, int64_t, float*, const float*,
                               uint8_t*) const {
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

const sok_storage_api* det_storage_api() {
  static const sok_storage_api* const api = [] {
    auto entry = reinterpret_cast<DetEntry>(loaded_library_symbol(kDetLibrary, kDetEntry));
    const sok_storage_api* found = entry != nullptr ? entry() : nullptr;
    if (found == nullptr) {
      throw std::runtime_error(
          std::string("the C++ server keeps its tables' rows in sok-backend-det's storage, and this process has "
                      "not loaded its library ") +
          kDetLibrary +
          ": load it (TF_LoadLibrary) before libsok_hps_serving.so, as graph_calls.serving_libraries() lists them "
          "(python -c \"from hierarchical_parameter_server import graph_calls; "
          "print(*graph_calls.serving_libraries())\"); it is in the package directory of sok-backend-det");
    }
    if (found->api_version != SOK_STORAGE_API_VERSION || !sok_storage_api_has(found, find)) {
      throw std::runtime_error(std::string(kDetLibrary) + " has storage API version " +
                               std::to_string(found->api_version) + ", and libsok_hps_serving.so was built for " +
                               std::to_string(SOK_STORAGE_API_VERSION) +
                               ": install sok-backend-det and sok-hps of the same release");
    }
    return found;
  }();
  return api;
}

DetStorage::DetStorage(const std::string& what, int64_t dim, int64_t capacity, int32_t device)
    : api_(det_storage_api()), what_(what), dim_(dim), device_(device) {
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
  const std::string slots = std::to_string(std::max<int64_t>(capacity, 1));
  const char* names[] = {"init_capacity"};
  const char* values[] = {slots.c_str()};
  sok_storage_config config{};
  config.struct_size = sizeof(sok_storage_config);
  config.key_type = SOK_KEY_INT64;
  config.row_width = static_cast<int32_t>(dim);
  config.device_type = device_ >= 0 ? SOK_DEVICE_CUDA : SOK_DEVICE_CPU;
  config.device_id = std::max(device_, 0);
  config.num_options = 1;
  config.option_names = names;
  config.option_values = values;
  if (api_->create(&config, &storage_) != SOK_OK) {
    const std::string error = api_->last_error(nullptr);
#ifdef SOK_WITH_CUDA
    if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
    throw std::runtime_error("creating " + what_ + ": " + error);
  }
}

DetStorage::~DetStorage() {
  if (storage_ != nullptr) api_->destroy(storage_);
#ifdef SOK_WITH_CUDA
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

sok_exec_context DetStorage::context() const {
  if (device_ < 0) return kHostContext;
  return sok_exec_context{SOK_DEVICE_CUDA, device_, stream_};
}

void DetStorage::check(sok_status status, const char* call) const {
  if (status != SOK_OK) {
    throw std::runtime_error(std::string(call) + " on " + what_ + ": " + api_->last_error(storage_));
  }
}

void DetStorage::find(const int64_t* keys, int64_t n, float* rows, const float* default_row, uint8_t* found) const {
  const auto d = static_cast<int32_t>(dim_);
  if (device_ < 0) {
    check(api_->find(storage_, &kHostContext, n, keys, 0, d, rows, default_row, found), "find");
    return;
  }
#ifdef SOK_WITH_CUDA
  // through the GPU's memory, in the storage's stream
  const std::string what = "find on " + what_;
  const auto stream = static_cast<cudaStream_t>(stream_);
  const auto rows_bytes = static_cast<size_t>(n * dim_) * sizeof(float);
  check_cuda(cudaSetDevice(device_), what);
  DeviceBuffer k(static_cast<size_t>(n) * sizeof(int64_t), stream, what), r(rows_bytes, stream, what),
      def(dim_ * sizeof(float), stream, what), f(static_cast<size_t>(n), stream, what);
  check_cuda(cudaMemcpyAsync(k.as<int64_t>(), keys, n * sizeof(int64_t), cudaMemcpyHostToDevice, stream), what);
  if (default_row != nullptr) {
    check_cuda(cudaMemcpyAsync(def.as<float>(), default_row, dim_ * sizeof(float), cudaMemcpyHostToDevice, stream),
               what);
  }
  const sok_exec_context ctx = context();
  check(api_->find(storage_, &ctx, n, k.as<int64_t>(), 0, d, r.as<float>(),
                   default_row != nullptr ? def.as<float>() : nullptr, found != nullptr ? f.as<uint8_t>() : nullptr),
        "find");
  check_cuda(cudaMemcpyAsync(rows, r.as<float>(), rows_bytes, cudaMemcpyDeviceToHost, stream), what);
  if (found != nullptr) check_cuda(cudaMemcpyAsync(found, f.as<uint8_t>(), n, cudaMemcpyDeviceToHost, stream), what);
  check_cuda(cudaStreamSynchronize(stream), what);
#endif
}

void DetStorage::find_on_device(const sok_exec_context& ctx, const int64_t* keys, int64_t n, float* rows,
                                const float* default_row, uint8_t* found) const {
  check(api_->find(storage_, &ctx, n, keys, 0, static_cast<int32_t>(dim_), rows, default_row, found), "find");
}

void DetStorage::insert(const int64_t* keys, int64_t n, const float* rows) const {
  const auto d = static_cast<int32_t>(dim_);
  if (device_ < 0) {
    check(api_->insert_or_assign(storage_, &kHostContext, n, keys, 0, d, rows, nullptr, nullptr, 0), "insert");
    return;
  }
#ifdef SOK_WITH_CUDA
  const std::string what = "insert into " + what_;
  const auto stream = static_cast<cudaStream_t>(stream_);
  const auto rows_bytes = static_cast<size_t>(n * dim_) * sizeof(float);
  check_cuda(cudaSetDevice(device_), what);
  DeviceBuffer k(static_cast<size_t>(n) * sizeof(int64_t), stream, what), r(rows_bytes, stream, what);
  check_cuda(cudaMemcpyAsync(k.as<int64_t>(), keys, n * sizeof(int64_t), cudaMemcpyHostToDevice, stream), what);
  check_cuda(cudaMemcpyAsync(r.as<float>(), rows, rows_bytes, cudaMemcpyHostToDevice, stream), what);
  const sok_exec_context ctx = context();
  check(api_->insert_or_assign(storage_, &ctx, n, k.as<int64_t>(), 0, d, r.as<float>(), nullptr, nullptr, 0),
        "insert");
  check_cuda(cudaStreamSynchronize(stream), what);
#endif
}

int64_t DetStorage::size() const {
  int64_t out = 0;
  const sok_exec_context ctx = context();
  check(api_->size(storage_, &ctx, &out), "size");
#ifdef SOK_WITH_CUDA
  if (device_ >= 0) check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "size of " + what_);
#endif
  return out;
}

int64_t DetStorage::capacity() const {
  int64_t out = 0;
  check(api_->capacity(storage_, &out), "capacity");
  return out;
}

void DetTier::check_open() const {
  if (closed_) throw TierClosed("this " + name_ + " is closed and holds no rows; make a new HashMapTier");
}

void DetTier::check_table_dim(const std::string& tag, const DetStorage& table, int64_t dim, const char* what) const {
  if (table.dim() != dim) {
    throw std::invalid_argument(tag + ": the " + name_ + " holds rows of dim " + std::to_string(table.dim()) + ", " +
                                what + " dim " + std::to_string(dim));
  }
}

std::shared_ptr<const DetStorage> DetTier::table(const std::string& tag, int64_t dim, const char* what) {
  check_dim(tag, dim);
  std::lock_guard<std::mutex> lock(mu_);
  check_open();
  auto it = tables_.find(tag);
  if (it == tables_.end()) return nullptr;
  check_table_dim(tag, *it->second, dim, what);
  return it->second;
}

void DetTier::fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows, bool* found) {
  std::shared_ptr<const DetStorage> t = table(tag, dim, "asked for");
  if (t == nullptr) {
    std::fill(rows, rows + n * dim, 0.0f);
    std::fill(found, found + n, false);
    return;
  }
  static_assert(sizeof(bool) == sizeof(uint8_t), "found masks are one-byte bools");
  t->find(keys, n, rows, nullptr, reinterpret_cast<uint8_t*>(found));
}

void DetTier::insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows, int64_t dim) {
  storage(tag, dim, n)->insert(keys, n, rows);
}

std::shared_ptr<const DetStorage> DetTier::storage(const std::string& tag, int64_t dim, int64_t capacity) {
  if (std::shared_ptr<const DetStorage> t = table(tag, dim, "got rows of")) return t;
  auto made = std::make_shared<const DetStorage>("the " + name_ + " storage of " + tag, dim, capacity);
  std::lock_guard<std::mutex> lock(mu_);
  check_open();
  auto [it, inserted] = tables_.emplace(tag, made);  // another thread's, where it made one meanwhile
  if (!inserted) check_table_dim(tag, *it->second, dim, "got rows of");
  return it->second;
}

int64_t DetTier::size(const std::string& tag) {
  std::shared_ptr<const DetStorage> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open();
    auto it = tables_.find(tag);
    if (it == tables_.end()) return 0;
    t = it->second;
  }
  return t->size();
}

void DetTier::close() {
  std::map<std::string, std::shared_ptr<const DetStorage>> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  dropped.swap(tables_);
}

}  // namespace hps
}  // namespace sok
