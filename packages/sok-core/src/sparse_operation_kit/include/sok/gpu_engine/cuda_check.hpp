// One way to check a CUDA call: its text, file and line in the message. SOK_CHECK_CUDA reports
// through sok::fail (the GPU engine: the storage ABI's error codes, SOK_ERROR_OUT_OF_MEMORY for a
// failed allocation); csrc/tf_ops/gpu_exec.h's SOK_CUDA turns the same text into a TensorFlow
// Status for the op kernels. Header-only, no TensorFlow.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "sok/kit/error.hpp"

namespace sok {
namespace gpu {

// "file:line: call failed: cudaErrorName (its description)".
inline std::string cuda_error_text(cudaError_t err, const char* call, const char* file, int line) {
  return std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " + cudaGetErrorName(err) + " (" +
         cudaGetErrorString(err) + ")";
}

// Nothing for cudaSuccess; else clears a sticky launch error and fails with the call's text.
inline void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  const std::string message = cuda_error_text(err, call, file, line);
  if (err == cudaErrorMemoryAllocation) sok::fail(SOK_ERROR_OUT_OF_MEMORY, message);
  sok::fail(SOK_ERROR_INTERNAL, message);
}

}  // namespace gpu
}  // namespace sok

// A CUDA call (or a launcher returning cudaError_t) checked: sok::fail with its text, file and line.
#define SOK_CHECK_CUDA(call) ::sok::gpu::check_cuda((call), #call, __FILE__, __LINE__)
