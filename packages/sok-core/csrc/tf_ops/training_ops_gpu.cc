// DEVICE_GPU kernels of the training path's own ops (libsok_tf_ops_gpu.so): SokUniqueIndex,
// SokUniqueIndexList, SokUniqueSum, SokLookupDistinct and SokSparseApply, so that a DynamicVariable
// whose table lives on a GPU trains without copying keys or rows to the host. Their results equal
// the CPU kernels' (training_ops.cc; storage_ops.cc for SokLookupDistinct) bit for bit, but for
// SokSparseApply's keys with more than 32 gradient rows (T, kHotOccurrences of
// gpu/sparse_apply_kernels.cu): those are summed in a fixed parallel order, the same bits run after
// run and the CPU's within float rounding. Only scalars come to the host (the number of distinct
// keys, to size outputs, and the first bad position, to refuse bad input before the table changes).
//
// Host code, compiled by g++ with TensorFlow's flags: the device work is in gpu/unique_kernels.cu
// and gpu/sparse_apply_kernels.cu (nvcc, no TensorFlow headers) behind plain launchers, and the
// table work in the backend, through the storage ABI with TF's stream (gpu_exec.h). Scratch memory
// comes from ctx->allocate_temp: TF's GPU allocator hands it out in the order of the op's stream,
// on which every launch here is made. Memory: the handle, the table reference and lr in host
// memory; keys, positions, values and gradients in device memory.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpu/sparse_apply_kernels.h"
#include "gpu/unique_kernels.h"
#include "gpu/unique_list_kernels.h"
#include "gpu_exec.h"
#include "sparse_rules.h"
#include "storage_ops.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok_tf {
namespace {

using ::tensorflow::DEVICE_GPU;

// A device workspace of `bytes` bytes (at least one, so that its address is never null).
Status allocate_workspace(OpKernelContext* ctx, size_t bytes, Tensor* out) {
  return ctx->allocate_temp(::tensorflow::DT_INT8, TensorShape({static_cast<int64_t>(bytes > 0 ? bytes : 1)}), out);
}

// As check_positions in cpu_ops.h, on the device: positions (n,) are rows of u distinct keys.
Status check_positions_on_device(OpKernelContext* ctx, cudaStream_t stream, const Tensor& positions, int64_t u) {
  const int64_t n = positions.NumElements();
  if (n == 0) return Status();
  Tensor flag;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT32, TensorShape({1}), &flag));
  int64_t i = -1;
  int32_t value = 0;
  TF_RETURN_IF_ERROR(SOK_CUDA(sok_gpu::find_bad_position(positions.flat<int32_t>().data(), static_cast<int32_t>(n), u,
                                                         flag.flat<int32_t>().data(), &i, &value, stream)));
  if (i < 0) return Status();
  return errors::InvalidArgument("positions[", i, "] = ", value, " is not a row of the ", u,
                                 " distinct keys; valid: 0 .. ", u - 1, " (from SokUniqueIndex)");
}

// The distinct keys of keys (n,) on the device: the workspace, sorted, and u. The caller finishes
// with unique_index_finish or unique_sum_finish on the same workspace.
struct Distinct {
  Tensor workspace;
  size_t bytes = 0;
  int key_bytes = 0;
  int32_t n = 0;
  int32_t u = 0;

  Status sort(OpKernelContext* ctx, cudaStream_t stream, const Tensor& keys) {
    n = static_cast<int32_t>(keys.NumElements());
    key_bytes = ::tensorflow::DataTypeSize(keys.dtype());
    if (n == 0) return Status();
    TF_RETURN_IF_ERROR(SOK_CUDA(sok_gpu::unique_workspace_bytes(n, key_bytes, &bytes)));
    TF_RETURN_IF_ERROR(allocate_workspace(ctx, bytes, &workspace));
    return SOK_CUDA(sok_gpu::unique_sort(keys.data(), key_bytes, n, workspace.data(), bytes, &u, stream));
  }
};

// SokUniqueIndex: distinct_keys (u,) in order of first occurrence and positions (n,), as the CPU
// kernel (a stable sort instead of a hash index; the same outputs).
class UniqueIndexGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);  // (n,) device, any shape
    const int64_t n = keys.NumElements();
    OP_REQUIRES_OK(ctx, check_key_count(n));
    const sok_exec_context exec = GpuExec::of(ctx);
    DeviceGuard guard;
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    const cudaStream_t stream = stream_of(exec);
    Distinct distinct;
    OP_REQUIRES_OK(ctx, distinct.sort(ctx, stream, keys));
    Tensor *distinct_t = nullptr, *positions_t = nullptr;  // (u,), (n,) device
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({distinct.u}), &distinct_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &positions_t));
    if (n == 0) return;
    OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::unique_index_finish(distinct.key_bytes, distinct.n, distinct.workspace.data(),
                                                              distinct.bytes, distinct_t->data(),
                                                              positions_t->flat<int32_t>().data(), stream)));
  }
};

// SokUniqueIndexList: SokUniqueIndex of each key tensor in a fixed number of launches per group of
// up to kUniqueListArrays tensors (gpu/unique_list_kernels.h), with one synchronization for all of
// them: every group is indexed and counted on the device, the counts come to the host in one copy,
// then the outputs are sized and every group finished.
class UniqueIndexListGpuOp : public OpKernel {
 public:
  explicit UniqueIndexListGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, check_unique_index_list(ctx));
  }

  void Compute(OpKernelContext* ctx) override {
    ::tensorflow::OpInputList keys;
    OP_REQUIRES_OK(ctx, ctx->input_list("keys", &keys));
    const int num = keys.size();
    OP_REQUIRES_OK(ctx, check_key_counts(keys));
    const sok_exec_context exec = GpuExec::of(ctx);
    DeviceGuard guard;
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    const cudaStream_t stream = stream_of(exec);
    std::vector<Group> groups;
    OP_REQUIRES_OK(ctx, grouped(keys, &groups));
    Tensor counts;  // (num,) int32 device, in table order: the groups are consecutive runs of tables
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT32, TensorShape({num}), &counts));
    std::vector<Tensor> workspaces(groups.size());
    std::vector<size_t> bytes(groups.size(), 0);
    for (size_t k = 0; k < groups.size(); ++k) {
      const sok_gpu::KeyLists& lists = groups[k].lists;
      OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::unique_list_workspace_bytes(lists.begin[lists.num], &bytes[k])));
      OP_REQUIRES_OK(ctx, allocate_workspace(ctx, bytes[k], &workspaces[k]));
      OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::unique_list_index(lists, workspaces[k].data(), bytes[k],
                                                              counts.flat<int32_t>().data() + groups[k].first,
                                                              stream)));
    }
    std::vector<int32_t> u(num, 0);
    OP_REQUIRES_OK(ctx, SOK_CUDA(cudaMemcpyAsync(u.data(), counts.flat<int32_t>().data(), sizeof(int32_t) * num,
                                                 cudaMemcpyDeviceToHost, stream)));
    OP_REQUIRES_OK(ctx, SOK_CUDA(cudaStreamSynchronize(stream)));
    ::tensorflow::OpOutputList distinct_out, positions_out;
    OP_REQUIRES_OK(ctx, ctx->output_list("distinct_keys", &distinct_out));
    OP_REQUIRES_OK(ctx, ctx->output_list("positions", &positions_out));
    for (size_t k = 0; k < groups.size(); ++k) {
      const sok_gpu::KeyLists& lists = groups[k].lists;
      sok_gpu::ListOutputs out;
      for (int j = 0; j < lists.num; ++j) {
        const int t = groups[k].first + j;
        Tensor *distinct = nullptr, *positions = nullptr;  // (u,), (n,) device
        OP_REQUIRES_OK(ctx, distinct_out.allocate(t, TensorShape({u[t]}), &distinct));
        OP_REQUIRES_OK(ctx, positions_out.allocate(t, TensorShape({keys[t].NumElements()}), &positions));
        out.distinct[j] = distinct->data();
        out.positions[j] = positions->flat<int32_t>().data();
      }
      OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::unique_list_finish(lists, out, workspaces[k].data(), bytes[k], stream)));
    }
  }

 private:
  struct Group {
    int first = 0;  // its first table
    sok_gpu::KeyLists lists;
  };

  // Consecutive runs of tables, each at most kUniqueListArrays tables and kUniqueListMaxTotal keys.
  static Status grouped(const ::tensorflow::OpInputList& keys, std::vector<Group>* groups) {
    for (int t = 0; t < keys.size(); ++t) {
      const int64_t n = keys[t].NumElements();
      if (n > sok_gpu::kUniqueListMaxTotal) {
        return errors::InvalidArgument("SokUniqueIndexList: keys[", t, "] has ", n, " keys; the GPU kernel takes ",
                                       "at most ", sok_gpu::kUniqueListMaxTotal, " per table and call; split the ",
                                       "batch");
      }
      if (groups->empty() || groups->back().lists.num == sok_gpu::kUniqueListArrays ||
          groups->back().lists.begin[groups->back().lists.num] + n > sok_gpu::kUniqueListMaxTotal) {
        groups->emplace_back();
        groups->back().first = t;
      }
      sok_gpu::KeyLists& lists = groups->back().lists;
      lists.keys[lists.num] = keys[t].data();
      lists.key_bytes[lists.num] = static_cast<int8_t>(::tensorflow::DataTypeSize(keys[t].dtype()));
      lists.begin[lists.num + 1] = lists.begin[lists.num] + n;
      ++lists.num;
    }
    return Status();
  }
};

// SokUniqueSum: unique_keys (u,) in order of first occurrence and sums (u, w), each the value rows
// of its key added in batch order to 0.0f, as the CPU kernel.
class UniqueSumGpuOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);    // (n,) device, any shape
    const Tensor& values = ctx->input(1);  // (n, w) device
    const int64_t n = keys.NumElements();
    OP_REQUIRES(ctx, values.dims() == 2 && values.dim_size(0) == n,
                errors::InvalidArgument("values must have shape [", n, ", width] (one row per key), got ",
                                        values.shape().DebugString()));
    OP_REQUIRES_OK(ctx, check_key_count(n));
    const int64_t w = values.dim_size(1);
    const sok_exec_context exec = GpuExec::of(ctx);
    DeviceGuard guard;
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    const cudaStream_t stream = stream_of(exec);
    Distinct distinct;
    OP_REQUIRES_OK(ctx, distinct.sort(ctx, stream, keys));
    Tensor *unique_t = nullptr, *sums_t = nullptr;  // (u,), (u, w) device
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({distinct.u}), &unique_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({distinct.u, w}), &sums_t));
    if (n == 0) return;
    OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::unique_sum_finish(
                            distinct.key_bytes, distinct.n, distinct.u, distinct.workspace.data(), distinct.bytes,
                            values.flat<float>().data(), w, unique_t->data(), sums_t->flat<float>().data(), stream)));
  }
};

// SokLookupDistinct (GPU): find_or_insert of the distinct keys (u,) into a temporary (u, w), then
// each key's row copied to its place in values (keys.shape + [w]). As the CPU kernel.
class LookupDistinctGpuOp : public RowOp {
 public:
  using RowOp::RowOp;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, prepare(ctx, kKeys, &ref));
    const Tensor& keys = ctx->input(kKeys);           // any shape, n elements, device
    const Tensor& distinct = ctx->input(kKeys + 1);   // (u,) device
    const Tensor& positions = ctx->input(kKeys + 2);  // (n,) int32 device
    const int64_t n = keys.NumElements();
    const int64_t u = distinct.NumElements();
    OP_REQUIRES_OK(ctx, check_distinct_lookup_inputs(ctx));
    OP_REQUIRES_OK(ctx, check_key_count(n));
    const sok_exec_context exec = GpuExec::of(ctx);
    DeviceGuard guard;
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    const cudaStream_t stream = stream_of(exec);
    OP_REQUIRES_OK(ctx, check_positions_on_device(ctx, stream, positions, u));
    Tensor* values = nullptr;  // keys.shape + [w] device
    OP_REQUIRES_OK(ctx, allocate_rows(ctx, 0, keys, &values));
    const int64_t w = width();
    Tensor rows;  // (u, w) device
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({u, w}), &rows));
    SOK_OK_OR_RETURN(ctx, status_of(ref,
                                    ref->api->find_or_insert(ref->storage, &exec, u, distinct.data(), col_begin_,
                                                             col_end_, rows.flat<float>().data(), nullptr, nullptr,
                                                             ref->inits, ref->num_inits),
                                    "lookup (find_or_insert)"));
    OP_REQUIRES_OK(ctx,
                   SOK_CUDA(sok_gpu::gather_rows(rows.flat<float>().data(), positions.flat<int32_t>().data(),
                                                 static_cast<int32_t>(n), w, values->flat<float>().data(), stream)));
  }
};

// The rule attribute of SokSparseApply with its hyper-parameters, checked as RowRule::parse does
// (sparse_rules.h: SparseRuleKind numbers the rules in its order).
Status parse_rule(const std::string& name, const std::vector<float>& hyper, sok_gpu::SparseRule* out,
                  SparseRuleSpec* spec) {
  static_assert(sok_gpu::kRuleSgd == 0 && sok_gpu::kRuleMomentum == 1 && sok_gpu::kRuleAdagrad == 2 &&
                    sok_gpu::kRuleRowWiseAdagrad == 3,
                "SparseRuleKind follows SOK_SPARSE_RULES");
  TF_RETURN_IF_ERROR(find_sparse_rule(name, hyper.size(), spec));
  *out = sok_gpu::SparseRule{static_cast<sok_gpu::SparseRuleKind>(spec->kind), {0.0f, 0.0f}};
  for (size_t k = 0; k < hyper.size(); ++k) out->hyper[k] = hyper[k];
  return Status();
}

// The optimizer step of SokSparseApply as the visitor of find_or_insert_rows: enqueued on the
// table's call stream (TensorFlow's, the op's context) on the rows the table lends.
struct LentApply {
  const int32_t* positions;
  const float* grads;
  int32_t n, u, d, row_width;
  sok_gpu::SparseRule rule;
  float lr;
  void* workspace;
  size_t workspace_bytes;
  cudaError_t error;

  static int32_t visit(void* user_data, int64_t rows_n, float* const* rows, const sok_exec_context* ctx) {
    auto* a = static_cast<LentApply*>(user_data);
    a->error = rows_n != a->u ? cudaErrorInvalidValue
                              : sok_gpu::sparse_apply_lent_rows(a->positions, a->grads, a->n, a->u, a->d, a->row_width,
                                                                a->rule, a->lr, rows, a->workspace, a->workspace_bytes,
                                                                static_cast<cudaStream_t>(ctx->stream));
    return a->error == cudaSuccess ? 0 : 1;
  }
};

// SokSparseApply (GPU): the whole rows [embedding | state] of the distinct keys (u,) are found or
// inserted (a key evicted since its lookup comes back with initial values, as the CPU kernel's copy
// path) and updated on the device (per key: its gradient rows (n, d) summed in batch order, then
// the rule): in the table itself where it lends its rows (find_or_insert_rows), else on a copy
// (find_or_insert) written back with insert_or_assign. As the CPU kernel.
class SparseApplyGpuOp : public OpKernel {
 public:
  explicit SparseApplyGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string name;
    std::vector<float> hyper;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("rule", &name));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hyper", &hyper));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("positions_checked", &positions_checked_));
    OP_REQUIRES_OK(ctx, parse_rule(name, hyper, &rule_, &spec_));
  }

  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, table_from(ctx, kTable, &ref));
    const Tensor& distinct = ctx->input(kKeys);       // (u,) device
    const Tensor& positions = ctx->input(kKeys + 1);  // (n,) int32 device
    const Tensor& grads = ctx->input(kKeys + 2);      // (n, d) device
    const Tensor& lr = ctx->input(kKeys + 3);         // scalar, host
    const int64_t n = positions.NumElements();
    OP_REQUIRES(ctx, grads.dims() == 2 && grads.dim_size(0) == n,
                errors::InvalidArgument("values must have shape [", n, ", width] (one row per key), got ",
                                        grads.shape().DebugString()));
    OP_REQUIRES_OK(ctx, check_key_count(n));
    OP_REQUIRES(ctx, key_type_of(distinct.dtype()) == ref->key_type,
                errors::InvalidArgument("keys have dtype ", ::tensorflow::DataTypeString(distinct.dtype()),
                                        " but the table's key type is ", sok::key_type_name(ref->key_type)));
    OP_REQUIRES(ctx, ::tensorflow::TensorShapeUtils::IsScalar(lr.shape()),
                errors::InvalidArgument("lr must be a scalar, got shape ", lr.shape().DebugString()));
    const int64_t u = distinct.NumElements();
    const int64_t d = grads.dim_size(1);
    const int32_t row = ref->row_width;
    OP_REQUIRES(ctx, spec_.row_width(d) == row,
                errors::InvalidArgument("gradient rows of ", d, " floats need table rows of ", spec_.row_width(d),
                                        " floats for this rule, the table's are ", row));
    OP_REQUIRES(ctx, u < kMaxKeys,
                errors::InvalidArgument("at most 2**31 - 1 distinct keys per call, got ", u, "; split the batch"));
    const sok_exec_context exec = GpuExec::of(ctx);
    DeviceGuard guard;
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    const cudaStream_t stream = stream_of(exec);
    if (!positions_checked_) OP_REQUIRES_OK(ctx, check_positions_on_device(ctx, stream, positions, u));
    if (u == 0) return;  // no rows (and, the positions being valid, no gradients)
    size_t bytes = 0;
    OP_REQUIRES_OK(
        ctx, SOK_CUDA(sok_gpu::sparse_apply_workspace_bytes(static_cast<int32_t>(n), static_cast<int32_t>(u), &bytes)));
    Tensor workspace;
    OP_REQUIRES_OK(ctx, allocate_workspace(ctx, bytes, &workspace));
    // In place where the table lends its rows: one pass over the table instead of three.
    if (sok_storage_api_has(ref->api, find_or_insert_rows)) {
      LentApply apply{positions.flat<int32_t>().data(), grads.flat<float>().data(), static_cast<int32_t>(n),
                      static_cast<int32_t>(u), static_cast<int32_t>(d), row, rule_, lr.scalar<float>()(),
                      workspace.data(), bytes, cudaSuccess};
      const sok_status lent = ref->api->find_or_insert_rows(ref->storage, &exec, u, distinct.data(), nullptr, nullptr,
                                                            ref->inits, ref->num_inits, &LentApply::visit, &apply);
      OP_REQUIRES_OK(ctx, cuda_status(apply.error, "sok_gpu::sparse_apply_lent_rows", __FILE__, __LINE__));
      if (lent != SOK_ERROR_UNSUPPORTED) {  // declined: the copies below
        SOK_OK_OR_RETURN(ctx, status_of(ref, lent, "find_or_insert_rows"));
        return;
      }
    }
    Tensor rows_t;  // (u, row) device
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({u, row}), &rows_t));
    float* rows = rows_t.flat<float>().data();
    SOK_OK_OR_RETURN(ctx, status_of(ref,
                                    ref->api->find_or_insert(ref->storage, &exec, u, distinct.data(), 0, row, rows,
                                                             nullptr, nullptr, ref->inits, ref->num_inits),
                                    "find_or_insert"));
    OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::sparse_apply_rows(
                            positions.flat<int32_t>().data(), grads.flat<float>().data(), static_cast<int32_t>(n),
                            static_cast<int32_t>(u), static_cast<int32_t>(d), row, rule_, lr.scalar<float>()(), rows,
                            workspace.data(), bytes, stream)));
    // The keys are distinct (the op's contract: sok_unique_index's output), which spares a table
    // that takes hints the deduplication of the keys present.
    const sok_status written =
        sok_storage_api_has(ref->api, insert_or_assign_hinted)
            ? ref->api->insert_or_assign_hinted(ref->storage, &exec, u, distinct.data(), 0, row, rows, nullptr,
                                                ref->inits, ref->num_inits, SOK_HINT_UNIQUE_KEYS)
            : ref->api->insert_or_assign(ref->storage, &exec, u, distinct.data(), 0, row, rows, nullptr, ref->inits,
                                         ref->num_inits);
    SOK_OK_OR_RETURN(ctx, status_of(ref, written, "insert_or_assign"));
  }

 private:
  sok_gpu::SparseRule rule_{};
  SparseRuleSpec spec_{};
  bool positions_checked_ = false;
};

// Registrations: SokUniqueIndex and SokUniqueSum per key type (as the CPU kernels), the table ops
// for every key type with the handle, the table reference and lr in host memory.
#define SOK_PER_KEY_TYPE(op, host_memory, kernel)                                                             \
  REGISTER_KERNEL_BUILDER(Name(#op).Device(DEVICE_GPU).TypeConstraint<int64_t>("Tkeys") host_memory, kernel); \
  REGISTER_KERNEL_BUILDER(Name(#op).Device(DEVICE_GPU).TypeConstraint<int32_t>("Tkeys") host_memory, kernel); \
  REGISTER_KERNEL_BUILDER(Name(#op).Device(DEVICE_GPU).TypeConstraint<uint64_t>("Tkeys") host_memory, kernel);
#define SOK_ANY_KEY_TYPE(op, host_memory, kernel) \
  REGISTER_KERNEL_BUILDER(Name(#op).Device(DEVICE_GPU) host_memory, kernel);

// One list drives the registrations and the kernel table below (read by the build test).
// X(op, how it is registered, host-memory arguments, kernel)
#define SOK_TRAINING_GPU_KERNELS(X)                                                                      \
  X(SokUniqueIndex, SOK_PER_KEY_TYPE, , UniqueIndexGpuOp)                                                \
  X(SokUniqueSum, SOK_PER_KEY_TYPE, , UniqueSumGpuOp)                                                    \
  X(SokUniqueIndexList, SOK_ANY_KEY_TYPE, , UniqueIndexListGpuOp)                                        \
  X(SokLookupDistinct, SOK_ANY_KEY_TYPE, .HostMemory("handle").HostMemory("table"), LookupDistinctGpuOp) \
  X(SokSparseApply, SOK_ANY_KEY_TYPE, .HostMemory("handle").HostMemory("table").HostMemory("lr"), SparseApplyGpuOp)

#define SOK_REGISTER_TRAINING_GPU_KERNEL(op, how, host_memory, kernel) how(op, host_memory, kernel)
SOK_TRAINING_GPU_KERNELS(SOK_REGISTER_TRAINING_GPU_KERNEL)

}  // namespace
}  // namespace sok_tf

// The ops this file registers DEVICE_GPU kernels for, comma-separated after the prefix (a string
// in the library, so a test can read it without loading the library).
#define SOK_TRAINING_GPU_KERNEL_NAME(op, how, host_memory, kernel) #op ","
extern "C" __attribute__((visibility("default"))) const char sok_tf_ops_gpu_kernels_training[] =
    "sok_tf_ops_gpu kernels: " SOK_TRAINING_GPU_KERNELS(SOK_TRAINING_GPU_KERNEL_NAME);

// The native rules of this library's SokSparseApply kernel (sparse_rules.h), under a name of the
// exported kernel tables (gpu_exports.map).
extern "C" __attribute__((visibility("default"))) const char sok_tf_ops_gpu_kernels_sparse_rules[] =
    SOK_SPARSE_RULES_TEXT;
