// DEVICE_GPU kernels of SOK's storage ops (libsok_tf_ops_gpu.so): the same calls as the CPU
// kernels, with TF's device pointers and TF's CUDA stream in a sok_exec_context{SOK_DEVICE_CUDA}.
// The backend does the device work; this file is host code and needs no nvcc. The training ops
// (unique, distinct lookups, the fused optimizer step) are in training_ops_gpu.cc, the pooled
// lookups in pooled_lookup_ops_gpu.cc.
//
// The ops are registered by libsok_tf_ops.so (storage_ops.cc), which must be loaded first; this
// library only adds kernels. It is built when a CUDA toolkit is found and loaded only by a CUDA
// build of TensorFlow (sparse_operation_kit/tf_ops.py). Memory: the handle, the table reference,
// SokExport's threshold and the scalar outputs (SokSize's size, SokErase's count, SokTryLookup's
// status code and message) in host memory; keys, values and found in device memory.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gpu_exec.h"
#include "sok/kit/export.hpp"
#include "storage_ops.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok_tf {
namespace {

using ::tensorflow::DEVICE_GPU;

// values = rows of keys; missing keys are inserted with insert_and_evict, and the rows that made
// room come back as evicted_keys / evicted_values (embedding columns). As the CPU kernel, with the
// host half (initial rows of the missing keys) on the host: keys, found and values go to the host
// and back. Simple, not fast; eviction is the exception path of a lookup.
class LookupAndEvictGpuOp : public RowOp {
 public:
  using RowOp::RowOp;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, prepare(ctx, kKeys, &ref));
    const sok_exec_context exec = GpuExec::of(ctx);
    DeviceGuard guard;
    SOK_OK_OR_RETURN(ctx, guard.enter(exec.device_id));
    const cudaStream_t stream = stream_of(exec);
    const Tensor& keys = ctx->input(kKeys);  // (n,) device
    const int64_t n = keys.NumElements();
    const int32_t w = width();
    const int32_t row = ref->row_width;
    const size_t key_bytes = sok::key_size(ref->key_type);
    Tensor* values = nullptr;  // (n, w) device
    OP_REQUIRES_OK(ctx, allocate_rows(ctx, 0, keys, &values));
    Tensor found;  // (n,) device
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_UINT8, TensorShape({n}), &found));
    SOK_OK_OR_RETURN(ctx, status_of(ref, ref->api->find(ref->storage, &exec, n, keys.data(), col_begin_, col_end_,
                                                        values->flat<float>().data(), nullptr,
                                                        found.flat<uint8_t>().data()), "find"));
    std::vector<char> keys_h(n * key_bytes);
    std::vector<uint8_t> found_h(n);
    std::vector<float> values_h(n * w);
    if (n > 0) {
      SOK_OK_OR_RETURN(ctx, SOK_CUDA(cudaMemcpyAsync(keys_h.data(), keys.data(), keys_h.size(),
                                                     cudaMemcpyDeviceToHost, stream)));
      SOK_OK_OR_RETURN(ctx, SOK_CUDA(cudaMemcpyAsync(found_h.data(), found.data(), found_h.size(),
                                                     cudaMemcpyDeviceToHost, stream)));
      SOK_OK_OR_RETURN(ctx, SOK_CUDA(cudaMemcpyAsync(values_h.data(), values->data(),
                                                     sizeof(float) * values_h.size(), cudaMemcpyDeviceToHost, stream)));
      SOK_OK_OR_RETURN(ctx, SOK_CUDA(cudaStreamSynchronize(stream)));
    }
    // Missing keys: whole initial rows, inserted with eviction.
    std::vector<char> missing_keys_h;
    std::vector<float> rows_h;
    const int64_t m = init_missing_rows(ref, n, keys_h.data(), found_h.data(), col_begin_, w, values_h.data(),
                                        &missing_keys_h, &rows_h);
    Tensor evicted_keys, evicted_rows;  // (m,), (m, row) device
    int64_t evicted = 0;
    if (m > 0) {
      Tensor missing_keys, rows, evicted_scores;  // (m,), (m, row), (m,) device
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(keys.dtype(), TensorShape({m}), &missing_keys));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({m, row}), &rows));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(keys.dtype(), TensorShape({m}), &evicted_keys));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({m, row}), &evicted_rows));
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_UINT64, TensorShape({m}), &evicted_scores));
      SOK_OK_OR_RETURN(ctx, SOK_CUDA(cudaMemcpyAsync(missing_keys.data(), missing_keys_h.data(), missing_keys_h.size(),
                                                     cudaMemcpyHostToDevice, stream)));
      SOK_OK_OR_RETURN(ctx, SOK_CUDA(cudaMemcpyAsync(rows.data(), rows_h.data(), sizeof(float) * rows_h.size(),
                                                     cudaMemcpyHostToDevice, stream)));
      sok_status st = ref->api->insert_and_evict(
          ref->storage, &exec, m, missing_keys.data(), 0, row, rows.flat<float>().data(), nullptr, ref->inits,
          ref->num_inits, evicted_keys.data(), evicted_rows.flat<float>().data(),
          evicted_scores.flat<uint64_t>().data(), &evicted);
      SOK_OK_OR_RETURN(ctx, status_of(ref, st, "insert_and_evict"));
      // The missing keys' rows of values, filled on the host.
      SOK_OK_OR_RETURN(ctx, SOK_CUDA(cudaMemcpyAsync(values->data(), values_h.data(), sizeof(float) * values_h.size(),
                                                     cudaMemcpyHostToDevice, stream)));
    }
    Tensor *ek = nullptr, *ev = nullptr;  // (evicted,), (evicted, w) device
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({evicted}), &ek));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({evicted, w}), &ev));
    if (evicted > 0) {
      SOK_OK_OR_RETURN(ctx, SOK_CUDA(cudaMemcpyAsync(ek->data(), evicted_keys.data(), evicted * key_bytes,
                                                     cudaMemcpyDeviceToDevice, stream)));
      // Columns [col_begin, col_end) of the whole evicted rows.
      SOK_OK_OR_RETURN(ctx, SOK_CUDA(cudaMemcpy2DAsync(ev->data(), sizeof(float) * w,
                                                       evicted_rows.flat<float>().data() + col_begin_,
                                                       sizeof(float) * row, sizeof(float) * w, evicted,
                                                       cudaMemcpyDeviceToDevice, stream)));
    }
    // The host buffers must outlive the copies from them.
    if (m > 0) SOK_OK_OR_RETURN(ctx, SOK_CUDA(cudaStreamSynchronize(stream)));
  }
};

// keys, values, scores of every row (with filter: rows scored >= threshold). Chunks of slots are
// exported straight into device buffers sized for size() rows plus one chunk (grown if the table
// grew meanwhile); the outputs are their first `total` rows, without a copy.
class ExportGpuOp : public ExportOpBase {
 public:
  using ExportOpBase::ExportOpBase;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    uint64_t threshold = 0;
    int64_t capacity = 0;
    SOK_OK_OR_RETURN(ctx, begin(ctx, &ref, &threshold, &capacity));
    const sok_exec_context exec = GpuExec::of(ctx);
    DeviceGuard guard;
    SOK_OK_OR_RETURN(ctx, guard.enter(exec.device_id));
    int64_t size = 0;
    SOK_OK_OR_RETURN(ctx, status_of(ref, ref->api->size(ref->storage, &exec, &size), "size"));
    const int64_t key_bytes = ::tensorflow::DataTypeSize(key_dtype_);
    const int64_t chunk =
        std::min(std::max<int64_t>(capacity, 1), sok::export_chunk_slots(key_bytes + 4 * width() + 8));
    Buffers out;
    SOK_OK_OR_RETURN(ctx, reserve(ctx, stream_of(exec), size + chunk, 0, &out));
    int64_t total = 0;
    for (int64_t offset = 0; offset < capacity; offset += chunk) {
      const int64_t limit = std::min(chunk, capacity - offset);
      SOK_OK_OR_RETURN(ctx, reserve(ctx, stream_of(exec), total + limit, total, &out));
      int64_t count = 0;
      SOK_OK_OR_RETURN(ctx, export_chunk(ref, &exec, threshold, offset, limit,
                                         static_cast<char*>(out.keys.data()) + total * key_bytes,
                                         out.values.flat<float>().data() + total * width(),
                                         out.scores.flat<uint64_t>().data() + total, &count));
      total += count;
    }
    ctx->set_output(0, out.keys.Slice(0, total));
    ctx->set_output(1, out.values.Slice(0, total));
    ctx->set_output(2, out.scores.Slice(0, total));
  }

 private:
  struct Buffers {
    Tensor keys, values, scores;  // (rows,), (rows, w), (rows,) device
  };

  // Makes `out` hold at least `rows` rows, keeping its first `keep` (a stream-ordered copy).
  Status reserve(OpKernelContext* ctx, cudaStream_t stream, int64_t rows, int64_t keep, Buffers* out) const {
    const int64_t have = out->keys.dim_size(0);  // 0 for a default Tensor
    if (have >= rows) return Status();
    const int64_t grown = std::max(rows, 2 * have);
    Buffers next;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(key_dtype_, TensorShape({grown}), &next.keys));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({grown, width()}), &next.values));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_UINT64, TensorShape({grown}), &next.scores));
    if (keep > 0) {
      const int64_t kb = ::tensorflow::DataTypeSize(key_dtype_);
      TF_RETURN_IF_ERROR(SOK_CUDA(
          cudaMemcpyAsync(next.keys.data(), out->keys.data(), keep * kb, cudaMemcpyDeviceToDevice, stream)));
      TF_RETURN_IF_ERROR(SOK_CUDA(cudaMemcpyAsync(next.values.data(), out->values.data(),
                                                  sizeof(float) * keep * width(), cudaMemcpyDeviceToDevice, stream)));
      TF_RETURN_IF_ERROR(SOK_CUDA(cudaMemcpyAsync(next.scores.data(), out->scores.data(), sizeof(uint64_t) * keep,
                                                  cudaMemcpyDeviceToDevice, stream)));
    }
    *out = std::move(next);
    return Status();
  }
};

// One list drives the registrations and the kernel table below (read by the build test).
// X(op, host-memory arguments, kernel)
#define SOK_GPU_KERNELS(X)                                                                               \
  X(SokLookup, .HostMemory("handle").HostMemory("table"), LookupOp<GpuExec>)                            \
  X(SokFindOrInsert, .HostMemory("handle").HostMemory("table"), LookupOp<GpuExec>)                      \
  X(SokTryLookup,                                                                                       \
    .HostMemory("handle").HostMemory("table").HostMemory("status_code").HostMemory("status_message"),     \
    LookupOp<GpuExec, true>)                                                                             \
  X(SokLookupAndEvict, .HostMemory("handle").HostMemory("table"), LookupAndEvictGpuOp)                  \
  X(SokFind, .HostMemory("handle").HostMemory("table"), FindOp<GpuExec>)                                \
  X(SokFindOrDefault, .HostMemory("handle").HostMemory("table"), FindOp<GpuExec, true>)                 \
  X(SokInsertOrAssign, .HostMemory("handle").HostMemory("table"), WriteOp<GpuExec, false>)              \
  X(SokAccumOrAssign, .HostMemory("handle").HostMemory("table"), WriteOp<GpuExec, true>)                \
  X(SokErase, .HostMemory("handle").HostMemory("table").HostMemory("count"), EraseOp<GpuExec>)          \
  X(SokSize, .HostMemory("handle").HostMemory("table").HostMemory("size"), SizeOp<GpuExec>)             \
  X(SokTableAddress, .HostMemory("table"), TableAddressOp)                                              \
  X(SokExport, .HostMemory("handle").HostMemory("table").HostMemory("threshold"), ExportGpuOp)

#define SOK_REGISTER_GPU_KERNEL(op, host_memory, ...) \
  REGISTER_KERNEL_BUILDER(Name(#op).Device(DEVICE_GPU) host_memory, __VA_ARGS__);
SOK_GPU_KERNELS(SOK_REGISTER_GPU_KERNEL)

}  // namespace
}  // namespace sok_tf

// The ops this library registers DEVICE_GPU kernels for, comma-separated after the prefix (a
// string in the file, so a test can read it without loading the library).
#define SOK_GPU_KERNEL_NAME(op, host_memory, ...) #op ","
extern "C" __attribute__((visibility("default"))) const char sok_tf_ops_gpu_kernels[] =
    "sok_tf_ops_gpu kernels: " SOK_GPU_KERNELS(SOK_GPU_KERNEL_NAME);
