// The GPU half of SokUniqueIndex and SokUniqueSum: the distinct keys of a batch in order of first
// occurrence, with each key's position among them or the per-key sums of value rows, equal bit for
// bit to the CPU kernels (training_ops.cc).
//
// Plain C++ launchers over raw device pointers, compiled by nvcc without TensorFlow's headers. The
// caller passes a device workspace of unique_workspace_bytes(n, key_bytes) and calls unique_sort,
// which returns the number of distinct keys u on the host (so that outputs can be sized), then
// unique_index_finish or unique_sum_finish with the same workspace, n and key_bytes. Everything is
// ordered on `stream`; the workspace must stay allocated until the work of both calls is done
// (stream order suffices). Keys are compared by their bits, so one launcher serves int32 (4 bytes),
// int64 and uint64 (8 bytes): every value, -1, 0, 2**63 - 1 and 2**64 - 1 included, is a key.
// n == 0 launches nothing (unique_sort gives u = 0).
//
// Method: a stable radix sort of (key bits, index) pairs groups each key's occurrences in batch
// order; segment heads are first occurrences, and a scan of the first-occurrence flags in batch
// order numbers the distinct keys by first occurrence.
#ifndef SOK_TF_OPS_GPU_UNIQUE_KERNELS_H_
#define SOK_TF_OPS_GPU_UNIQUE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace sok_gpu {

// *bytes = the workspace that n keys of key_bytes (4 or 8) bytes need; cudaErrorInvalidValue for
// another key size or n < 0.
cudaError_t unique_workspace_bytes(int32_t n, int key_bytes, size_t* bytes);

// Sorts keys (n,) into the workspace and counts the distinct ones: *num_distinct (host) = u.
// Synchronizes `stream` once, to read u.
cudaError_t unique_sort(const void* keys,  // (n,) device, key_bytes each
                        int key_bytes, int32_t n, void* workspace, size_t workspace_bytes, int32_t* num_distinct,
                        cudaStream_t stream);

// After unique_sort: distinct (u,) = the distinct keys in order of first
// occurrence, positions (n,) = for each key, the row of its distinct key (SokUniqueIndex).
cudaError_t unique_index_finish(int key_bytes, int32_t n, void* workspace, size_t workspace_bytes,
                                void* distinct,      // (u,) device
                                int32_t* positions,  // (n,) device
                                cudaStream_t stream);

// After unique_sort: distinct (u,) as unique_index_finish, sums (u, w) = per distinct key, 0.0f
// plus its rows of values (n, w) one after the other in batch order (SokUniqueSum). num_distinct
// is unique_sort's u.
cudaError_t unique_sum_finish(int key_bytes, int32_t n, int32_t num_distinct, void* workspace, size_t workspace_bytes,
                              const float* values,  // (n, w) device
                              int64_t w,
                              void* distinct,  // (u,) device
                              float* sums,     // (u, w) device
                              cudaStream_t stream);

}  // namespace sok_gpu

#endif  // SOK_TF_OPS_GPU_UNIQUE_KERNELS_H_
