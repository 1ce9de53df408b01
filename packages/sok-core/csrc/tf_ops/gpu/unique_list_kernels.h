// The GPU half of SokUniqueIndexList: the distinct keys of each of several key arrays (the dynamic
// tables of one lookup) in order of first occurrence, and each key's position among them, for all
// arrays at once in a fixed number of launches (the per-array sort of unique_kernels.h launches
// about eighteen kernels per array). The outputs equal SokUniqueIndex's of each array.
//
// Method: the arrays are one concatenation of `total` occurrences (occurrence g of array t at
// begin[t] + i). One kernel inserts every occurrence into an open-addressing hash table keyed by
// (array, key bits), linear probing, each slot holding some occurrence of its key and, by atomicMin,
// its first; an occurrence is first where the slot's first is itself; an inclusive scan of those
// flags over the concatenation numbers each array's distinct keys in order of first occurrence (less
// the count before the array). Keys are compared by their bits: int32 arrays (4 bytes) and int64 or
// uint64 ones (8 bytes) in one call, every value a key.
//
// Use: unique_list_workspace_bytes, then unique_list_index (counts on the device, so that the
// counts of several calls come to the host in one copy), then, with outputs sized by the counts,
// unique_list_finish with the same lists and workspace. Everything is ordered on `stream`.
#ifndef SOK_TF_OPS_GPU_UNIQUE_LIST_KERNELS_H_
#define SOK_TF_OPS_GPU_UNIQUE_LIST_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace sok_gpu {

// Arrays per call: the lists travel as kernel parameters (under CUDA's 4 KiB for both structs).
constexpr int kUniqueListArrays = 64;

// Occurrences per call: the hash table then has at most 2**31 slots (int32 slot numbers).
constexpr int64_t kUniqueListMaxTotal = int64_t{1} << 30;

struct KeyLists {
  int32_t num = 0;                                  // arrays, 1 .. kUniqueListArrays
  const void* keys[kUniqueListArrays] = {};         // device, key_bytes[t] each
  int8_t key_bytes[kUniqueListArrays] = {};         // 4 or 8
  int64_t begin[kUniqueListArrays + 1] = {};        // array t: occurrences begin[t] .. begin[t + 1] - 1
};

struct ListOutputs {
  void* distinct[kUniqueListArrays] = {};     // (counts[t],) device, the array's key width
  int32_t* positions[kUniqueListArrays] = {};  // (begin[t + 1] - begin[t],) device
};

// *bytes = the workspace of `total` occurrences; cudaErrorInvalidValue for total < 0 or above
// kUniqueListMaxTotal.
cudaError_t unique_list_workspace_bytes(int64_t total, size_t* bytes);

// Indexes every array's keys into the workspace: counts[t] (device) = array t's distinct keys.
cudaError_t unique_list_index(const KeyLists& lists, void* workspace, size_t workspace_bytes,
                              int32_t* counts,  // (lists.num,) device
                              cudaStream_t stream);

// After unique_list_index: each array's distinct keys and positions.
cudaError_t unique_list_finish(const KeyLists& lists, const ListOutputs& out, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

}  // namespace sok_gpu

#endif  // SOK_TF_OPS_GPU_UNIQUE_LIST_KERNELS_H_
