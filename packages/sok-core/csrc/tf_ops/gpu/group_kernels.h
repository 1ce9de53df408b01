// The GPU half of SokGroupByKey: a stable order that groups n small keys (each in [0, num_groups))
// and the count of each group, equal to the CPU kernel (group_ops.cc).
//
// Plain C++ launchers over raw device pointers, compiled by nvcc without TensorFlow's headers. The
// caller passes a device workspace of group_workspace_bytes(n, num_groups) bytes; everything is
// ordered on `stream` and nothing waits for the device. A key outside [0, num_groups) is not
// checked on the device (the op's callers make the keys): it sorts after every group and is in no
// count.
//
// Method: a stable radix sort of (key, index) pairs over only the bits that num_groups needs, then
// each group's count from the sorted keys (one binary search per group boundary).
#ifndef SOK_TF_OPS_GPU_GROUP_KERNELS_H_
#define SOK_TF_OPS_GPU_GROUP_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace sok_gpu {

// *bytes = the workspace for n keys in num_groups groups; cudaErrorInvalidValue for n < 0,
// n > INT32_MAX or num_groups < 1.
cudaError_t group_workspace_bytes(int64_t n, int32_t num_groups, size_t* bytes);

// order (n,) = indices of keys, grouped by key in ascending order and, within a group, ascending;
// counts (num_groups,) = the number of keys equal to each group.
cudaError_t group_by_key(const int64_t* keys,  // (n,) device
                         int64_t n, int32_t num_groups,
                         int64_t* order,   // (n,) device
                         int64_t* counts,  // (num_groups,) device
                         void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace sok_gpu

#endif  // SOK_TF_OPS_GPU_GROUP_KERNELS_H_
