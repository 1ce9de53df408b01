// DEVICE_GPU kernel of SokSparseApplyAdagradTables (registered by static_apply_ops.cc, which says
// what it computes): two CUDA kernels per 32 tables on TensorFlow's compute stream
// (gpu/static_apply_kernels.h). With check_indices (indices that SOK's own gradient op did not
// make), one small copy to the host after a synchronisation checks every index before anything is
// written; without it the step never waits for the device (the learning rate is read on the device
// too) and rows of index -1 (SokPooledLookupGrad's padding) are skipped.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpu/static_apply_kernels.h"
#include "gpu_exec.h"
#include "static_apply.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok_tf {
namespace {

using ::tensorflow::DEVICE_GPU;
using static_apply::Table;

class SparseApplyAdagradTablesGpuOp : public OpKernel {
 public:
  explicit SparseApplyAdagradTablesGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("epsilon", &epsilon_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("check_indices", &check_indices_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("row_wise", &row_wise_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("names", &names_));
  }

  void Compute(OpKernelContext* ctx) override {
    static_apply::LockedVariables locks;
    std::vector<Table> tables;
    const Tensor* learning_rate = nullptr;
    OP_REQUIRES_OK(ctx, static_apply::gather(ctx, names_, row_wise_, &locks, &tables, &learning_rate));
    const float* lr = learning_rate->flat<float>().data();  // device memory
    DeviceGuard guard;
    const sok_exec_context exec = GpuExec::of(ctx);
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    const cudaStream_t stream = stream_of(exec);
    std::vector<sok_gpu::AdagradTable> device(tables.size());
    for (size_t t = 0; t < tables.size(); ++t) {
      device[t] = describe(tables[t]);
    }
    if (check_indices_) OP_REQUIRES_OK(ctx, check(ctx, tables, device, stream));
    const auto copy = [stream](const char* from, char* to, size_t bytes) {
      return SOK_CUDA(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream));
    };
    OP_REQUIRES_OK(ctx, static_apply::prepare_in_place_writes(ctx, tables, copy));
    for (size_t t = 0; t < tables.size(); ++t) {  // the buffers after any copy
      device[t].table = const_cast<char*>(tables[t].var->tensor()->tensor_data().data());
      device[t].row_type = tables[t].row_type;
      device[t].accumulator = tables[t].accumulator->tensor()->flat<float>().data();
    }
    const auto apply = row_wise_ ? sok_gpu::sparse_apply_row_wise_adagrad : sok_gpu::sparse_apply_adagrad;
    OP_REQUIRES_OK(ctx, SOK_CUDA(apply(device.data(), static_cast<int>(device.size()), lr, epsilon_, stream)));
  }

 private:
  static sok_gpu::AdagradTable describe(const Table& x) {
    sok_gpu::AdagradTable d{};
    d.indices = x.indices->flat<int64_t>().data();
    d.grads = x.grads->flat<float>().data();
    d.count = x.count;
    d.dim = x.dim;
    d.rows = x.rows;
    return d;
  }

  // Refuses the call when an index is outside its table (one synchronisation).
  Status check(OpKernelContext* ctx, const std::vector<Table>& tables, const std::vector<sok_gpu::AdagradTable>& d,
               cudaStream_t stream) const {
    const int n = static_cast<int>(d.size());
    Tensor scratch;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_INT64, TensorShape({2 * n}), &scratch));
    int64_t* first_bad = scratch.flat<int64_t>().data();
    TF_RETURN_IF_ERROR(
        SOK_CUDA(sok_gpu::check_adagrad_indices(d.data(), n, first_bad, first_bad + n, stream)));
    std::vector<int64_t> host(2 * n);
    TF_RETURN_IF_ERROR(
        SOK_CUDA(cudaMemcpyAsync(host.data(), first_bad, 2 * n * sizeof(int64_t), cudaMemcpyDeviceToHost, stream)));
    TF_RETURN_IF_ERROR(SOK_CUDA(cudaStreamSynchronize(stream)));
    for (int t = 0; t < n; ++t) {
      if (host[n + t] == 0) continue;
      int64_t value = 0;
      TF_RETURN_IF_ERROR(SOK_CUDA(cudaMemcpyAsync(&value, d[t].indices + host[t], sizeof(int64_t),
                                                  cudaMemcpyDeviceToHost, stream)));
      TF_RETURN_IF_ERROR(SOK_CUDA(cudaStreamSynchronize(stream)));
      return static_apply::bad_index(names_, tables[t], t, host[t], value, host[n + t]);
    }
    return Status();
  }

  float epsilon_ = 0.0f;
  bool check_indices_ = true;
  bool row_wise_ = false;
  std::vector<std::string> names_;
};

// One list drives the registrations and the kernel table below (read by the build test).
#define SOK_STATIC_APPLY_GPU_KERNELS(X) X(SokSparseApplyAdagradTables, SparseApplyAdagradTablesGpuOp)

#define SOK_REGISTER_STATIC_APPLY_GPU_KERNEL(op, kernel) \
  REGISTER_KERNEL_BUILDER(Name(#op).Device(DEVICE_GPU), kernel);
SOK_STATIC_APPLY_GPU_KERNELS(SOK_REGISTER_STATIC_APPLY_GPU_KERNEL)

}  // namespace
}  // namespace sok_tf

// The ops this file registers DEVICE_GPU kernels for (see storage_ops_gpu.cc's table).
#define SOK_STATIC_APPLY_GPU_KERNEL_NAME(op, kernel) #op ","
extern "C" __attribute__((visibility("default"))) const char sok_tf_ops_gpu_kernels_static_apply[] =
    "sok_tf_ops_gpu kernels: " SOK_STATIC_APPLY_GPU_KERNELS(SOK_STATIC_APPLY_GPU_KERNEL_NAME);
