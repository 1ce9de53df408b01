// DEVICE_GPU kernel of SokGroupByKey (registered by group_ops.cc, which says what it computes): a
// radix sort on TensorFlow's compute stream (gpu/group_kernels.h); it never waits for the device.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu/group_kernels.h"
#include "gpu_exec.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok_tf {
namespace {

using ::tensorflow::DEVICE_GPU;

class GroupByKeyGpuOp : public OpKernel {
 public:
  explicit GroupByKeyGpuOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t groups = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_groups", &groups));
    OP_REQUIRES(ctx, groups <= INT32_MAX,
                errors::InvalidArgument("SokGroupByKey: num_groups = ", groups, " is above ", INT32_MAX));
    num_groups_ = static_cast<int32_t>(groups);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(0);
    OP_REQUIRES(ctx, keys.dims() == 1,
                errors::InvalidArgument("SokGroupByKey: keys has shape ", keys.shape().DebugString(),
                                        "; it takes a vector"));
    const int64_t n = keys.NumElements();
    OP_REQUIRES(ctx, n <= INT32_MAX,
                errors::InvalidArgument("SokGroupByKey: ", n, " keys; the GPU kernel takes at most ", INT32_MAX));
    Tensor* order = nullptr;
    Tensor* counts = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n}), &order));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({num_groups_}), &counts));
    size_t bytes = 0;
    OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::group_workspace_bytes(n, num_groups_, &bytes)));
    Tensor workspace;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT8, TensorShape({static_cast<int64_t>(bytes)}),
                                           &workspace));
    const sok_exec_context exec = GpuExec::of(ctx);
    DeviceGuard guard;
    OP_REQUIRES_OK(ctx, guard.enter(exec.device_id));
    OP_REQUIRES_OK(ctx, SOK_CUDA(sok_gpu::group_by_key(keys.flat<int64_t>().data(), n, num_groups_,
                                                       order->flat<int64_t>().data(), counts->flat<int64_t>().data(),
                                                       workspace.flat<int8_t>().data(), bytes, stream_of(exec))));
  }

 private:
  int32_t num_groups_ = 1;
};

// One list drives the registration and the kernel table below.
#define SOK_GROUP_GPU_KERNELS(X) X(SokGroupByKey, GroupByKeyGpuOp)
#define SOK_REGISTER_GROUP_GPU_KERNEL(op, kernel) \
  REGISTER_KERNEL_BUILDER(Name(#op).Device(DEVICE_GPU), kernel);
SOK_GROUP_GPU_KERNELS(SOK_REGISTER_GROUP_GPU_KERNEL)

}  // namespace
}  // namespace sok_tf

// The ops this file registers DEVICE_GPU kernels for, comma-separated after the prefix.
#define SOK_GROUP_GPU_KERNEL_NAME(op, kernel) #op ","
extern "C" __attribute__((visibility("default"))) const char sok_tf_ops_gpu_kernels_group[] =
    "sok_tf_ops_gpu kernels: " SOK_GROUP_GPU_KERNELS(SOK_GROUP_GPU_KERNEL_NAME);
