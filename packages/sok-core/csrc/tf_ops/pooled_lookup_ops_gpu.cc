// DEVICE_GPU kernels of SokPooledLookup and SokPooledLookupGrad: the CPU kernels' results to the bit
// (pooled_lookup_ops.cc defines the semantics), from SOK's CUDA kernels (gpu/pooled_lookup_kernels.h)
// on TensorFlow's compute stream. Every input and output is in device memory. One exception: the
// gradient rows of ids with more than 1024 occurrences (kHotSegment of the .cu) are summed in
// segments: deterministic (the same bits run after run), the CPU's within float rounding; every
// other id's row is bit-equal.
//
// The ops are registered by libsok_tf_ops.so, loaded first; this file only adds kernels. Each op
// reads one small array back to the host, after one cudaStreamSynchronize: the checks of each
// table's row_splits and ids and, for the gradient, its count of distinct ids (the size of its
// outputs); the forward with its "checked" attr (the caller checked) reads nothing. An offending id
// is copied only on the error path. The gradient with `padded` reads nothing back: its outputs have
// a row per id, the distinct ids' rows first, then index -1 with rows left unwritten (all of them
// for a table whose checks failed: the forward op of the same ids raised). The errors are the CPU
// kernels', with the same texts and in the same order: the shape checks of a table run on the host,
// its row_splits values on the device, and a host error after tables whose row_splits are not yet
// checked waits for their check first.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gpu/pooled_lookup_kernels.h"
#include "gpu_exec.h"
#include "pooled_lookup_ops.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace sok_tf {
namespace {

using ::sok_gpu::PooledCheck;
using ::sok_gpu::PooledTable;
using ::tensorflow::DEVICE_GPU;
using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// Device memory of `bytes` bytes (at least one, so that data() is never null).
Status allocate_bytes(OpKernelContext* ctx, size_t bytes, Tensor* out) {
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT8,
                                        TensorShape({static_cast<int64_t>(bytes > 0 ? bytes : 1)}), out));
  return Status();
}

static_assert(static_cast<int32_t>(kCombineSum) == sok_gpu::kPooledSum &&
                  static_cast<int32_t>(kCombineMean) == sok_gpu::kPooledMean &&
                  static_cast<int32_t>(kCombineSqrtn) == sok_gpu::kPooledSqrtn,
              "the combiner codes of pooled_lookup_ops.h and gpu/pooled_lookup_kernels.h differ");

// The tables of an op, from the checks of gather_tables (pooled_lookup_ops.cc) that need no device
// data. `error` is the first of them that failed and `before` the number of tables whose row_splits
// values gather_tables checks before it: their errors come first.
struct Gathered {
  std::vector<PooledTable> tables;
  int64_t batch = 0;
  Status error;
  int before = 0;
};

// Sets g->error (before: the tables whose row_splits come first) unless an earlier error is set.
void defer(Gathered* g, int before, Status error) {
  if (!g->error.ok()) return;
  g->error = std::move(error);
  g->before = before;
}

// Fills g from the inputs ids, row_splits and weights (params and grads stay unset); a returned error
// precedes every device check (the list lengths).
Status gather(OpKernelContext* ctx, const PooledAttrs& attrs, const std::vector<int64_t>& rows,
              const std::vector<int64_t>& dims, Gathered* g) {
  OpInputList ids, splits, weights;
  TF_RETURN_IF_ERROR(ctx->input_list("ids", &ids));
  TF_RETURN_IF_ERROR(ctx->input_list("row_splits", &splits));
  TF_RETURN_IF_ERROR(ctx->input_list("weights", &weights));
  const int n = static_cast<int>(attrs.combiners.size());
  if (ids.size() != n || splits.size() != n || (weights.size() != 0 && weights.size() != n)) {
    return pooled_errors::list_lengths(n, ids.size(), splits.size(), weights.size());
  }
  g->batch = splits[0].NumElements() - 1;
  if (g->batch < 0) {
    // The CPU kernel would read row_splits[0][0] of an empty tensor.
    defer(g, 0, errors::InvalidArgument("row_splits[0] must have shape [batch + 1] with batch >= 0, got ",
                                        splits[0].shape()));
  }
  for (int t = 0; t < n && g->error.ok(); ++t) {
    PooledTable table{};
    table.rows = rows[t];
    table.dim = dims[t];
    table.combiner = attrs.combiners[t];
    table.stride = attrs.strides[t];
    table.offset = attrs.offsets[t];
    if (ids[t].dims() != 1) {
      defer(g, t, pooled_errors::ids_rank(t, ids[t].shape()));
      break;
    }
    table.nnz = ids[t].NumElements();
    table.ids = ids[t].data();
    table.ids_int64 = ids[t].dtype() == ::tensorflow::DT_INT64 ? 1 : 0;
    const Tensor& s = splits[t];
    if (s.dims() != 1 || s.NumElements() != g->batch + 1) {
      defer(g, t, pooled_errors::splits_shape(t, g->batch, s.shape()));
      break;
    }
    table.splits = s.flat<int64_t>().data();
    if (weights.size() != 0) {
      if (weights[t].NumElements() != table.nnz) {
        g->tables.push_back(table);  // its row_splits values come first
        defer(g, t + 1, pooled_errors::weights_count(t, weights[t].NumElements(), table.nnz));
        break;
      }
      table.weights = weights[t].flat<float>().data();
    }
    g->tables.push_back(table);
  }
  return Status();
}

// Copies the first `count` checks to the host (waits for the stream).
Status read_checks(cudaStream_t stream, const Tensor& device, size_t count, std::vector<PooledCheck>* host) {
  host->resize(count);
  if (count == 0) return Status();
  TF_RETURN_IF_ERROR(SOK_CUDA(
      cudaMemcpyAsync(host->data(), device.data(), count * sizeof(PooledCheck), cudaMemcpyDeviceToHost, stream)));
  return SOK_CUDA(cudaStreamSynchronize(stream));
}

// The error of the first table whose row_splits the device found wrong (gather_tables' texts).
Status splits_error(const std::vector<PooledTable>& tables, const std::vector<PooledCheck>& checks) {
  for (size_t t = 0; t < checks.size(); ++t) {
    const PooledCheck& c = checks[t];
    if (c.first_split != 0 || c.last_split != tables[t].nnz) {
      return pooled_errors::splits_range(t, tables[t].nnz, c.first_split, c.last_split);
    }
    if (c.first_decrease != sok_gpu::kPooledNone) {
      return pooled_errors::splits_decrease(t, static_cast<int64_t>(c.first_decrease));
    }
  }
  return Status();
}

// g.error, or the row_splits error of one of the g.before tables that gather_tables checks first.
Status deferred_error(OpKernelContext* ctx, cudaStream_t stream, const Gathered& g) {
  const int count = g.before;
  if (count > 0) {
    Tensor workspace, checks;
    TF_RETURN_IF_ERROR(allocate_bytes(ctx, sok_gpu::pooled_forward_workspace_bytes(count), &workspace));
    TF_RETURN_IF_ERROR(allocate_bytes(ctx, count * sizeof(PooledCheck), &checks));
    TF_RETURN_IF_ERROR(SOK_CUDA(sok_gpu::pooled_validate(g.tables.data(), count, g.batch, workspace.data(),
                                                         static_cast<PooledCheck*>(checks.data()), stream)));
    std::vector<PooledCheck> host;
    TF_RETURN_IF_ERROR(read_checks(stream, checks, count, &host));
    TF_RETURN_IF_ERROR(splits_error(g.tables, host));
  }
  return g.error;
}

// Id j of a table, copied from the device (error path only).
Status id_at(const PooledTable& t, uint64_t j, cudaStream_t stream, int64_t* id) {
  int32_t id32 = 0;
  const size_t size = t.ids_int64 ? sizeof(int64_t) : sizeof(int32_t);
  void* to = t.ids_int64 ? static_cast<void*>(id) : static_cast<void*>(&id32);
  const char* from = static_cast<const char*>(t.ids) + j * size;
  TF_RETURN_IF_ERROR(SOK_CUDA(cudaMemcpyAsync(to, from, size, cudaMemcpyDeviceToHost, stream)));
  TF_RETURN_IF_ERROR(SOK_CUDA(cudaStreamSynchronize(stream)));
  if (!t.ids_int64) *id = id32;
  return Status();
}

class PooledLookupGpuOp : public PooledLookupKernel {
 public:
  using PooledLookupKernel::PooledLookupKernel;

  void Compute(OpKernelContext* ctx) override {
    std::vector<int64_t> rows, dims;
    OP_REQUIRES_OK(ctx, params_shapes(ctx, attrs_.combiners.size(), &rows, &dims));
    OpInputList params;
    OP_REQUIRES_OK(ctx, ctx->input_list("params", &params));
    Gathered g;
    OP_REQUIRES_OK(ctx, gather(ctx, attrs_, rows, dims, &g));
    DeviceGuard guard;
    const sok_exec_context exec = GpuExec::of(ctx);
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    const cudaStream_t stream = stream_of(exec);
    OP_REQUIRES_OK(ctx, deferred_error(ctx, stream, g));
    const int n = static_cast<int>(g.tables.size());
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("embeddings", &outputs));
    for (int t = 0; t < n; ++t) {
      Tensor* tensor = nullptr;
      OP_REQUIRES_OK(ctx, outputs.allocate(t, TensorShape({g.batch, dims[t]}), &tensor));
      g.tables[t].params = params[t].tensor_data().data();
      g.tables[t].row_type = row_type_;
      g.tables[t].out = tensor->flat<float>().data();
    }
    Tensor workspace, checks;
    OP_REQUIRES_OK(ctx, allocate_bytes(ctx, sok_gpu::pooled_forward_workspace_bytes(n), &workspace));
    OP_REQUIRES_OK(ctx, allocate_bytes(ctx, n * sizeof(PooledCheck), &checks));
    auto* device_checks = static_cast<PooledCheck*>(checks.data());
    if (checked_) {  // nothing to read back: the caller checked (the "checked" attr)
      OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::pooled_forward(g.tables.data(), n, g.batch, workspace.data(),
                                                           device_checks, stream)));
      return;
    }
    // The checks are read back before the pooling is launched, not after it: the host then waits for
    // the checks alone and goes on while the GPU pools, instead of waiting for the pooling too and
    // leaving the GPU idle while it launches the ops that follow.
    OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::pooled_validate(g.tables.data(), n, g.batch, workspace.data(),
                                                          device_checks, stream)));
    std::vector<PooledCheck> host;
    OP_REQUIRES_OK(ctx, read_checks(stream, checks, n, &host));
    OP_REQUIRES_OK(ctx, splits_error(g.tables, host));
    for (int t = 0; t < n; ++t) {
      if (host[t].bad_ids > 0) {
        int64_t example = 0;
        OP_REQUIRES_OK(ctx, id_at(g.tables[t], host[t].first_bad, stream, &example));
        OP_REQUIRES_OK(ctx, pooled_errors::out_of_range(positions_[t], g.tables[t].rows, g.tables[t].stride, names_[t],
                                                        static_cast<int64_t>(host[t].bad_ids), example));
      }
    }
    OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::pooled_pool(g.tables.data(), n, g.batch, workspace.data(), stream)));
  }
};

class PooledLookupGradGpuOp : public PooledLookupGradKernel {
 public:
  using PooledLookupGradKernel::PooledLookupGradKernel;

  void Compute(OpKernelContext* ctx) override {
    std::vector<int64_t> dims;
    OP_REQUIRES_OK(ctx, grads_dims(ctx, &dims));
    OpInputList grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    std::vector<int64_t> rows_of;
    OP_REQUIRES_OK(ctx, resolve_table_rows(ctx, table_rows_, &rows_of));
    Gathered g;
    OP_REQUIRES_OK(ctx, gather(ctx, attrs_, rows_of, dims, &g));
    const int n = static_cast<int>(attrs_.combiners.size());
    for (int t = 0; t < n && g.error.ok(); ++t) {
      if (grads[t].dim_size(0) != g.batch) defer(&g, n, pooled_errors::grads_rows(t, grads[t].dim_size(0), g.batch));
      g.tables[t].grads = grads[t].flat<float>().data();
    }
    if (g.error.ok()) {
      if (const char* why = sok_gpu::pooled_grad_unsupported(g.tables.data(), n, g.batch)) {
        int64_t ids = 0;
        for (const PooledTable& t : g.tables) ids += t.nnz;
        defer(&g, n, errors::InvalidArgument("SokPooledLookupGrad's GPU kernel cannot take ", why, " (", n,
                                             " tables, ", ids, " ids, a batch of ", g.batch,
                                             "); split the call into smaller ones"));
      }
    }
    DeviceGuard guard;
    const sok_exec_context exec = GpuExec::of(ctx);
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    const cudaStream_t stream = stream_of(exec);
    OP_REQUIRES_OK(ctx, deferred_error(ctx, stream, g));
    size_t bytes = 0;
    OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::pooled_grad_workspace_bytes(g.tables.data(), n, g.batch, &bytes)));
    Tensor workspace, checks;
    OP_REQUIRES_OK(ctx, allocate_bytes(ctx, bytes, &workspace));
    OP_REQUIRES_OK(ctx, allocate_bytes(ctx, n * sizeof(PooledCheck), &checks));
    auto* device_checks = static_cast<PooledCheck*>(checks.data());
    OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::pooled_grad_distinct(g.tables.data(), n, g.batch, workspace.data(), bytes,
                                                               device_checks, stream)));
    std::vector<uint64_t> bound(n, 0);
    if (padded_) {
      for (int t = 0; t < n; ++t) bound[t] = static_cast<uint64_t>(g.tables[t].nnz);
    } else {
      std::vector<PooledCheck> host;
      OP_REQUIRES_OK(ctx, read_checks(stream, checks, n, &host));
      OP_REQUIRES_OK(ctx, splits_error(g.tables, host));
      for (int t = 0; t < n; ++t) {
        OP_REQUIRES(ctx, host[t].bad_ids == 0, pooled_errors::shard_rows(t, rows_of[t]));
        bound[t] = host[t].distinct;
      }
    }
    OpOutputList rows, indices;
    OP_REQUIRES_OK(ctx, ctx->output_list("rows", &rows));
    OP_REQUIRES_OK(ctx, ctx->output_list("indices", &indices));
    for (int t = 0; t < n; ++t) {
      const int64_t u = static_cast<int64_t>(bound[t]);
      Tensor* tensor = nullptr;
      OP_REQUIRES_OK(ctx, rows.allocate(t, TensorShape({u, dims[t]}), &tensor));
      g.tables[t].out = tensor->flat<float>().data();
      OP_REQUIRES_OK(ctx, indices.allocate(t, TensorShape({u}), &tensor));
      g.tables[t].out_ids = tensor->flat<int64_t>().data();
    }
    OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::pooled_grad_accumulate(g.tables.data(), bound.data(), padded_,
                                                                 device_checks, n, g.batch, workspace.data(), bytes,
                                                                 stream)));
  }
};

// One list drives the registrations and the kernel table below (read by the build test).
#define SOK_POOLED_GPU_KERNELS(X)              \
  X(SokPooledLookup, PooledLookupGpuOp)        \
  X(SokPooledLookupGrad, PooledLookupGradGpuOp)

#define SOK_REGISTER_POOLED_GPU_KERNEL(op, kernel) \
  REGISTER_KERNEL_BUILDER(Name(#op).Device(DEVICE_GPU), kernel);
SOK_POOLED_GPU_KERNELS(SOK_REGISTER_POOLED_GPU_KERNEL)

}  // namespace
}  // namespace sok_tf

// The ops this file registers DEVICE_GPU kernels for (see storage_ops_gpu.cc's table).
#define SOK_POOLED_GPU_KERNEL_NAME(op, kernel) #op ","
extern "C" __attribute__((visibility("default"))) const char sok_tf_ops_gpu_kernels_pooled[] =
    "sok_tf_ops_gpu kernels: " SOK_POOLED_GPU_KERNELS(SOK_POOLED_GPU_KERNEL_NAME);
