// What the DEVICE_GPU kernels of libsok_tf_ops_gpu.so (every *_gpu.cc) share: the sok_exec_context
// of a GPU op (TF's CUDA device and compute stream), CUDA errors as TF statuses, and a guard that
// makes the op's device current for our own CUDA calls.
//
// Host code, compiled by g++ with TensorFlow's flags (GOOGLE_CUDA, EIGEN_USE_GPU). Everything is
// inline: the library exports only its kernel tables.
#ifndef SOK_TF_OPS_GPU_EXEC_H_
#define SOK_TF_OPS_GPU_EXEC_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "sok/gpu_engine/cuda_check.hpp"
#include "sok/gpu_engine/device_guard.hpp"
#include "sok/storage_api.h"
#include "storage_ops.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "unsupported/Eigen/CXX11/Tensor"

namespace sok_tf {

inline Status cuda_status(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return Status();
  return errors::Internal(::sok::gpu::cuda_error_text(e, call, file, line));
}
// A CUDA call (or a launcher returning cudaError_t) as a Status naming the call, file and line
// (the text of the GPU engine's SOK_CHECK_CUDA, sok/gpu_engine/cuda_check.hpp).
#define SOK_CUDA(call) ::sok_tf::cuda_status((call), #call, __FILE__, __LINE__)

// Makes exec's device current for this thread (our own CUDA calls) until it goes out of scope;
// sok::gpu::DeviceGuard (sok/gpu_engine/device_guard.hpp) says when it switches and restores.
class DeviceGuard {
 public:
  Status enter(int device_id) { return SOK_CUDA(guard_.enter(device_id)); }

 private:
  sok::gpu::DeviceGuard guard_;
};

inline cudaStream_t stream_of(const sok_exec_context& exec) { return static_cast<cudaStream_t>(exec.stream); }

// The execution context of the GPU kernels: the CUDA device of this TF device and its compute
// stream, on which TF orders the op's inputs, outputs and temporaries.
struct GpuExec {
  static sok_exec_context of(OpKernelContext* ctx) {
    const auto* info = ctx->device()->tensorflow_accelerator_device_info();
    const int device_id = info != nullptr && info->gpu_id >= 0 ? info->gpu_id : 0;
    return sok_exec_context{SOK_DEVICE_CUDA, device_id,
                            static_cast<void*>(ctx->eigen_device<Eigen::GpuDevice>().stream())};
  }
  // Zeros bytes of device memory at data (ordered on the op's stream).
  static Status zero(OpKernelContext* ctx, void* data, size_t bytes) {
    const sok_exec_context exec = of(ctx);
    DeviceGuard guard;
    TF_RETURN_IF_ERROR(guard.enter(exec.device_id));
    return SOK_CUDA(cudaMemsetAsync(data, 0, bytes, stream_of(exec)));
  }
};

}  // namespace sok_tf

#endif  // SOK_TF_OPS_GPU_EXEC_H_
