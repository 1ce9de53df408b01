// SokGroupByKey on the GPU (group_kernels.h says what and how).
//
// Arrays of the workspace: narrow (n,) the keys as uint32, a key outside [0, num_groups) as
// num_groups; sorted (n,) the same, sorted; iota (n,) 0 .. n-1 as int64, the sort's values; plus
// CUB's scratch. The sort's values land in `order` directly.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "common.cuh"
#include "group_kernels.h"

namespace sok_gpu {
namespace {

using detail::blocks_for;
using detail::kThreads;
using detail::thread_index;
using detail::thread_stride;

struct Workspace {
  uint32_t* narrow;
  uint32_t* sorted;
  int64_t* iota;
  void* cub;
  size_t cub_bytes;
  size_t total;
};

// Bits that hold every value of [0, num_groups] (num_groups: the keys outside the groups).
int bits_for(int32_t num_groups) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) <= static_cast<uint64_t>(num_groups)) ++bits;
  return bits;
}

cudaError_t carve(int64_t n, int32_t num_groups, void* base, Workspace* ws) {
  if (n < 0 || n > INT32_MAX || num_groups < 1) return cudaErrorInvalidValue;
  size_t sort_bytes = 0;
  const cudaError_t e = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int64_t*>(nullptr), static_cast<int64_t*>(nullptr), static_cast<int>(n), 0,
      bits_for(num_groups));
  if (e != cudaSuccess) return e;
  detail::Carver c(base);
  ws->narrow = c.take<uint32_t>(n);
  ws->sorted = c.take<uint32_t>(n);
  ws->iota = c.take<int64_t>(n);
  ws->cub_bytes = std::max(sort_bytes, size_t{1});
  ws->cub = c.take_bytes(ws->cub_bytes);
  ws->total = c.total();
  return cudaSuccess;
}

__global__ void narrow_kernel(const int64_t* __restrict__ keys, int64_t n, int32_t num_groups,
                              uint32_t* __restrict__ narrow, int64_t* __restrict__ iota) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const int64_t k = keys[i];
    narrow[i] = k >= 0 && k < num_groups ? static_cast<uint32_t>(k) : static_cast<uint32_t>(num_groups);
    iota[i] = i;
  }
}

// counts[g] = (first position of a key > g) - (first position of a key >= g) in the sorted keys.
__global__ void count_kernel(const uint32_t* __restrict__ sorted, int64_t n, int32_t num_groups,
                             int64_t* __restrict__ counts) {
  for (int64_t g = thread_index(); g < num_groups; g += thread_stride()) {
    const auto first_at_least = [&](uint32_t value) {
      int64_t lo = 0, hi = n;
      while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] < value) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      return lo;
    };
    counts[g] = first_at_least(static_cast<uint32_t>(g) + 1) - first_at_least(static_cast<uint32_t>(g));
  }
}

}  // namespace

cudaError_t group_workspace_bytes(int64_t n, int32_t num_groups, size_t* bytes) {
  Workspace ws{};
  const cudaError_t e = carve(n, num_groups, nullptr, &ws);
  if (e == cudaSuccess) *bytes = ws.total;
  return e;
}

cudaError_t group_by_key(const int64_t* keys, int64_t n, int32_t num_groups, int64_t* order, int64_t* counts,
                         void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Workspace ws{};
  cudaError_t e = carve(n, num_groups, workspace, &ws);
  if (e != cudaSuccess) return e;
  if (workspace == nullptr || ws.total > workspace_bytes) return cudaErrorInvalidValue;
  if (n > 0) {
    narrow_kernel<<<blocks_for(n), kThreads, 0, stream>>>(keys, n, num_groups, ws.narrow, ws.iota);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    e = cub::DeviceRadixSort::SortPairs(ws.cub, ws.cub_bytes, ws.narrow, ws.sorted, ws.iota, order,
                                        static_cast<int>(n), 0, bits_for(num_groups), stream);
    if (e != cudaSuccess) return e;
  }
  count_kernel<<<blocks_for(num_groups), kThreads, 0, stream>>>(ws.sorted, n, num_groups, counts);
  return cudaGetLastError();
}

}  // namespace sok_gpu
