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
    "the C++ server's tables are read-only to a graph: only the server writes them (model files, online updates)";

class ServedRows final : public Storage {
 public:
  ServedRows(std::shared_ptr<Server> server, const ServedTable& table, const GraphRows& rows, int32_t key_type)
      : Storage(key_type, static_cast<int32_t>(table.dim)), server_(std::move(server)), table_(table), rows_(rows) {}

  int64_t size(const sok_exec_context&) override { return rows_.size(); }
  int64_t capacity() override { return rows_.capacity(); }

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
    // Arrays on the GPU (a graph whose lookups TensorFlow placed there): found there, in the call's
    // stream, where the rows are on that GPU with keys of the graph's type (uint64 ones are int64's
    // bits); else through host copies.
    const bool same_keys = key_type() == rows_.key_type() ||
                           (key_type() == SOK_KEY_UINT64 && rows_.key_type() == SOK_KEY_INT64);
    if (rows_.device() == ctx.device_id && same_keys && cols.begin == 0 && cols.end == rows_.dim()) {
      rows_.find_on_device(ctx, keys, n, values, default_row, found);
      return;
    }
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
  // The rows' find, with the caller's columns, default row and found: int64 and uint64 keys passed as
  // they are (the same 64 bits), int32 keys widened.
  void find_on_host(int64_t n, const void* keys, Columns cols, float* values, const float* default_row,
                    uint8_t* found) {
    std::unique_ptr<int64_t[]> widened;
    const auto* wide = static_cast<const int64_t*>(keys);
    if (key_type() == SOK_KEY_INT32) {
      widened.reset(new int64_t[static_cast<size_t>(n > 0 ? n : 1)]);
      for (int64_t i = 0; i < n; ++i) widened[i] = static_cast<int64_t>(load_key(keys, key_type(), i));
      wide = widened.get();
    }
    const int64_t dim = rows_.dim();
    if (cols.begin == 0 && cols.end == dim) {
      rows_.find(wide, n, values, default_row, found);
      return;
    }
    // some columns: whole rows, then the asked ones (a default row is the asked columns')
    const int32_t w = cols.width();
    std::vector<float> whole(static_cast<size_t>(n * dim));
    std::vector<uint8_t> hit(static_cast<size_t>(n));
    rows_.find(wide, n, whole.data(), nullptr, hit.data());
    for (int64_t i = 0; i < n; ++i) {
      float* out = values + i * w;
      if (hit[i] || default_row == nullptr) {
        std::copy(whole.begin() + i * dim + cols.begin, whole.begin() + i * dim + cols.end, out);
      } else {
        std::copy(default_row, default_row + w, out);
      }
      if (found != nullptr) found[i] = hit[i];
    }
  }

#ifdef SOK_WITH_CUDA
  static void check(cudaError_t status) {
    if (status != cudaSuccess) fail(SOK_ERROR_INTERNAL, std::string("CUDA: ") + cudaGetErrorString(status));
  }
#endif

  const std::shared_ptr<Server> server_;  // kept alive by its references, and with it table_ and rows_
  const ServedTable& table_;
  const GraphRows& rows_;
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
  const GraphRows& rows = server->graph_table(table, tier);
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
