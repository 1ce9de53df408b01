// A scope guard that makes a CUDA device current for the calling thread, shared by the GPU storage
// (sok/gpu_engine/bucket_table.cuh, built into the det and hkv backends) and the GPU kernels of
// sok-core's TensorFlow ops (csrc/tf_ops/gpu_exec.h).
//
// Several processes share a host, one per GPU, each seeing every GPU (no CUDA_VISIBLE_DEVICES).
// A thread that has no current CUDA context (cudaGetDevice then reports 0) must not be switched
// "back" to device 0 on leaving: since CUDA 12, cudaSetDevice initialises the device's primary
// context, which would put a context of this process on another process's GPU. So the guard asks
// the driver (cuCtxGetCurrent) whether the thread has a current context, switches only when that
// context is not on the wanted device, and restores only a context the thread had. A thread that
// had none keeps the wanted device's primary context current afterwards.
//
// Host code for g++ and nvcc alike. The driver functions are looked up through the CUDA runtime
// (cudaGetDriverEntryPointByVersion, or cudaGetDriverEntryPoint before CUDA 12.5), so nothing
// links libcuda.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

namespace sok {
namespace gpu {

// The driver's cuCtxGetCurrent and cuCtxSetCurrent, looked up once (per library that includes this).
struct DriverContextApi {
  PFN_cuCtxGetCurrent_v4000 get_current = nullptr;
  PFN_cuCtxSetCurrent_v4000 set_current = nullptr;
  cudaError_t error = cudaSuccess;  // why the look-up failed (then both are null)

  static const DriverContextApi& get() {
    static const DriverContextApi api = load();
    return api;
  }

 private:
  // The driver's entry point of `symbol` in its CUDA 4.0 ABI (the PFN_*_v4000 types).
  static cudaError_t lookup(const char* symbol, void** fn) {
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, fn, 4000, cudaEnableDefault, &found);
#else
    const cudaError_t e = cudaGetDriverEntryPoint(symbol, fn, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess) return e;
    return found == cudaDriverEntryPointSuccess && *fn != nullptr ? cudaSuccess : cudaErrorSymbolNotFound;
  }

  static DriverContextApi load() {
    DriverContextApi api;
    void* get = nullptr;
    void* set = nullptr;
    api.error = lookup("cuCtxGetCurrent", &get);
    if (api.error == cudaSuccess) api.error = lookup("cuCtxSetCurrent", &set);
    if (api.error == cudaSuccess) {
      api.get_current = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(get);
      api.set_current = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(set);
    }
    return api;
  }
};

// Makes a device current for this thread until the guard goes out of scope:
//
//   DeviceGuard guard;
//   check(guard.enter(device));  // then CUDA runtime calls of this thread run on `device`
//
// enter() switches only when the thread's current context is not on `device`; the destructor
// restores the thread's previous context, and only when it had one and enter() switched.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  // cudaSuccess, or the error of the failing look-up or call (cudaErrorSymbolNotFound: the driver
  // lacks cuCtxGetCurrent/cuCtxSetCurrent; cudaErrorCudartUnloading: the driver is unloading;
  // cudaErrorInitializationError: cuCtxGetCurrent failed otherwise). Call it at most once per guard.
  cudaError_t enter(int device) {
    const DriverContextApi& api = DriverContextApi::get();
    if (api.error != cudaSuccess) return api.error;
    CUcontext current = nullptr;
    const CUresult r = api.get_current(&current);
    if (r == CUDA_ERROR_DEINITIALIZED) return cudaErrorCudartUnloading;
    // Not initialised yet: no context is current; cudaSetDevice below initialises the driver.
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_INITIALIZED) return cudaErrorInitializationError;
    if (current != nullptr) {
      int now = -1;
      const cudaError_t e = cudaGetDevice(&now);  // the device of the current context
      if (e != cudaSuccess) return e;
      if (now == device) return cudaSuccess;
    }
    const cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return e;
    previous_ = current;
    return cudaSuccess;
  }

  ~DeviceGuard() {
    if (previous_ != nullptr) DriverContextApi::get().set_current(previous_);
  }

 private:
  CUcontext previous_ = nullptr;  // the context to restore; null: leave the thread as it is
};

}  // namespace gpu
}  // namespace sok
