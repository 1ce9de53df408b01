// The C++ server's tables as read-only SOK storages (served_storage.hpp).
#include "served_storage.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "sok/kit/abi_adapter.hpp"
#include "sok/kit/keys.hpp"

#ifdef SOK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sok {
namespace hps {
namespace {

constexpr char kReadOnly[] =
    "the C++ server's tables are read-only: their rows are the model files' (serve a new model to change them)";

class ServedRows final : public Storage {
 public:
  ServedRows(std::shared_ptr<Server> server, const ServedTable& table, const DetStorage& rows, int32_t key_type)
      : Storage(key_type, static_cast<int32_t>(table.dim)), server_(std::move(server)), table_(table), rows_(rows) {}

  int64_t size(const sok_exec_context&) override {
    int64_t out = 0;
    check(det_storage_api()->size(rows_.handle(), &kHostContext, &out));
    return out;
  }
  int64_t capacity() override {
    int64_t out = 0;
    check(det_storage_api()->capacity(rows_.handle(), &out));
    return out;
  }

#ifdef SOK_WITH_CUDA
  bool supports_device(int32_t device_type) const override {
    return device_type == SOK_DEVICE_CPU || device_type == SOK_DEVICE_CUDA;
  }
#endif

  void find(const sok_exec_context& ctx, int64_t n, const void* keys, Columns cols, float* values,
            const float* default_row, uint8_t* found) override {
    if (ctx.device_type == SOK_DEVICE_CPU) {
      find_on_host(n, keys, cols, values, default_row, found);
      return;
    }
#ifdef SOK_WITH_CUDA
    // Arrays on the GPU (a graph whose lookups TensorFlow placed there): through host copies, in the
    // call's stream; the rows live in host memory.
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    const int32_t w = cols.width();
    std::vector<char> host_keys(static_cast<size_t>(n) * key_size(key_type()));
    std::vector<float> host_default(default_row != nullptr ? w : 0);
    std::vector<float> host_values(static_cast<size_t>(n * w));
    std::vector<uint8_t> host_found(found != nullptr ? n : 0);
    check(cudaSetDevice(ctx.device_id));
    check(cudaMemcpyAsync(host_keys.data(), keys, host_keys.size(), cudaMemcpyDeviceToHost, stream));
    if (default_row != nullptr) {
      check(cudaMemcpyAsync(host_default.data(), default_row, w * sizeof(float), cudaMemcpyDeviceToHost, stream));
    }
    check(cudaStreamSynchronize(stream));
    find_on_host(n, host_keys.data(), cols, host_values.data(), default_row != nullptr ? host_default.data() : nullptr,
                 found != nullptr ? host_found.data() : nullptr);
    check(cudaMemcpyAsync(values, host_values.data(), host_values.size() * sizeof(float), cudaMemcpyHostToDevice,
                          stream));
    if (found != nullptr) check(cudaMemcpyAsync(found, host_found.data(), n, cudaMemcpyHostToDevice, stream));
    check(cudaStreamSynchronize(stream));  // the host buffers go at return
#endif
  }

  void find_or_insert(const sok_exec_context&, int64_t, const void*, Columns, float*, uint8_t*, const uint64_t*,
                      const sok_initializer*, int32_t) override {
    fail(SOK_ERROR_UNSUPPORTED, kReadOnly);
  }
  void insert_or_assign(const sok_exec_context&, int64_t, const void*, Columns, const float*, const uint64_t*,
                        const sok_initializer*, int32_t) override {
    fail(SOK_ERROR_UNSUPPORTED, kReadOnly);
  }
  void accum_or_assign(const sok_exec_context&, int64_t, const void*, Columns, const float*, const uint64_t*,
                       const sok_initializer*, int32_t) override {
    fail(SOK_ERROR_UNSUPPORTED, kReadOnly);
  }
  int64_t erase(const sok_exec_context&, int64_t, const void*) override { fail(SOK_ERROR_UNSUPPORTED, kReadOnly); }
  int64_t export_batch(const sok_exec_context&, int64_t, int64_t, Columns, const uint64_t*, void*, float*,
                       uint64_t*) override {
    fail(SOK_ERROR_UNSUPPORTED, "the C++ server's tables are not exported: read the model files");
  }
  int64_t insert_and_evict(const sok_exec_context&, int64_t, const void*, Columns, const float*, const uint64_t*,
                           const sok_initializer*, int32_t, void*, float*, uint64_t*) override {
    fail(SOK_ERROR_UNSUPPORTED, kReadOnly);
  }
  void import_batch(const sok_exec_context&, int64_t, const void*, Columns, const float*, const uint64_t*,
                    const sok_initializer*, int32_t) override {
    fail(SOK_ERROR_UNSUPPORTED, kReadOnly);
  }
  void clear(const sok_exec_context&) override { fail(SOK_ERROR_UNSUPPORTED, kReadOnly); }
  std::string describe() override { return "HPS C++ server table " + table_.tag + " of " + server_->path(); }

 private:
  // det's find on the table's storage, with the caller's columns, default row and found: int64 and
  // uint64 keys passed as they are (the same 64 bits), int32 keys widened.
  void find_on_host(int64_t n, const void* keys, Columns cols, float* values, const float* default_row,
                    uint8_t* found) {
    std::unique_ptr<int64_t[]> widened;
    const void* wide = keys;
    if (key_type() == SOK_KEY_INT32) {
      widened.reset(new int64_t[static_cast<size_t>(n > 0 ? n : 1)]);
      for (int64_t i = 0; i < n; ++i) widened[i] = static_cast<int64_t>(load_key(keys, key_type(), i));
      wide = widened.get();
    }
    check(det_storage_api()->find(rows_.handle(), &kHostContext, n, wide, cols.begin, cols.end, values, default_row,
                                  found));
  }

  // Throws det's message of a failed call on the table's storage.
  void check(sok_status status) const {
    if (status != SOK_OK) fail(status, det_storage_api()->last_error(rows_.handle()));
  }

#ifdef SOK_WITH_CUDA
  static void check(cudaError_t status) {
    if (status != cudaSuccess) fail(SOK_ERROR_INTERNAL, std::string("CUDA: ") + cudaGetErrorString(status));
  }
#endif

  const std::shared_ptr<Server> server_;  // kept alive by its references, and with it table_ and rows_
  const ServedTable& table_;
  const DetStorage& rows_;
};

Storage* refuse_create(const sok_storage_config&, Options&) {
  invalid("the C++ server's tables are made by the server (served_table_ref), not through create");
}

}  // namespace

const sok_table_ref* served_table_ref(const std::shared_ptr<Server>& server, const ServedTable& table,
                                      const std::string& tier, int32_t key_type) {
  static std::mutex mu;
  static auto* refs = new std::map<std::tuple<const Server*, const ServedTable*, std::string, int32_t>, sok_table_ref*>;
  static const sok_storage_api* api = make_storage_api<&refuse_create>("hps_cpp_server");
  const DetStorage& rows = server->graph_table(table, tier);
  std::lock_guard<std::mutex> lock(mu);
  auto& ref = (*refs)[{server.get(), &table, tier, key_type}];
  if (ref == nullptr) {
    ref = new sok_table_ref{};
    ref->magic = SOK_TABLE_REF_MAGIC;
    ref->api = api;
    ref->storage = detail::to_handle(new ServedRows(server, table, rows, key_type));
    ref->key_type = key_type;
    ref->row_width = static_cast<int32_t>(table.dim);
    ref->inits = nullptr;
    ref->num_inits = 0;
  }
  return ref;
}

}  // namespace hps
}  // namespace sok
