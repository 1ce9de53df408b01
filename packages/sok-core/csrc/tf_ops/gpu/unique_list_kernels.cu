// SokUniqueIndexList on the GPU (unique_list_kernels.h says what and how).
//
// Arrays of the workspace, `total` occurrences, a hash table of C slots (a power of two, at least
// twice the occurrences):
//   holder (C,)   1 + some occurrence of the slot's key; 0: empty
//   first (C,)    the slot key's first occurrence (kUnset until one lands)
//   slot (total,) each occurrence's slot            flag (total,)  1 at a first occurrence
//   rank (total,) inclusive sum of flag over the concatenation
// plus CUB's scan scratch.
#include <cub/device/device_scan.cuh>

#include "common.cuh"
#include "unique_list_kernels.h"

namespace sok_gpu {
namespace {

using detail::blocks_for;
using detail::kThreads;
using detail::thread_index;
using detail::thread_stride;

constexpr int32_t kUnset = 0x7f7f7f7f;  // `first` before any occurrence lands: every byte 0x7f (one memset)
static_assert(kUniqueListMaxTotal <= kUnset, "an occurrence's index must stay below the unset mark");

struct Workspace {
  int32_t* holder;
  int32_t* first;
  int32_t* slot;
  int32_t* flag;
  int32_t* rank;
  void* cub;
  size_t cub_bytes;
  uint32_t mask;  // C - 1
  size_t total;
};

uint32_t slots_for(int64_t total) {
  uint64_t c = 64;
  while (c < 2 * static_cast<uint64_t>(total)) c <<= 1;
  return static_cast<uint32_t>(c);
}

cudaError_t carve(int64_t total, void* base, Workspace* ws) {
  if (total < 0 || total > kUniqueListMaxTotal) return cudaErrorInvalidValue;
  size_t scan_bytes = 0;
  const cudaError_t e = cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, static_cast<const int32_t*>(nullptr),
                                                      static_cast<int32_t*>(nullptr), static_cast<int>(total));
  if (e != cudaSuccess) return e;
  const uint32_t slots = slots_for(total);
  detail::Carver c(base);
  ws->holder = c.take<int32_t>(slots);
  ws->first = c.take<int32_t>(slots);
  ws->slot = c.take<int32_t>(total);
  ws->flag = c.take<int32_t>(total);
  ws->rank = c.take<int32_t>(total);
  ws->cub_bytes = std::max(scan_bytes, size_t{1});
  ws->cub = c.take_bytes(ws->cub_bytes);
  ws->mask = slots - 1;
  ws->total = c.total();
  return cudaSuccess;
}

cudaError_t placed(const KeyLists& lists, void* workspace, size_t workspace_bytes, Workspace* ws) {
  if (lists.num < 1 || lists.num > kUniqueListArrays || workspace == nullptr) return cudaErrorInvalidValue;
  const cudaError_t e = carve(lists.begin[lists.num], workspace, ws);
  if (e != cudaSuccess) return e;
  return ws->total <= workspace_bytes ? cudaSuccess : cudaErrorInvalidValue;
}

// The array of occurrence g: the last t with begin[t] <= g < begin[t + 1] (empty arrays skipped).
__device__ inline int array_of(const KeyLists& lists, int64_t g) {
  int lo = 0, hi = lists.num - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (lists.begin[mid] <= g) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

__device__ inline uint64_t key_bits(const KeyLists& lists, int t, int64_t g) {
  const int64_t i = g - lists.begin[t];
  if (lists.key_bytes[t] == 4) return static_cast<const uint32_t*>(lists.keys[t])[i];
  return static_cast<const uint64_t*>(lists.keys[t])[i];
}

// SplitMix64's finalizer of the key bits and the array.
__device__ inline uint32_t hash_of(uint64_t key, int t) {
  uint64_t z = key ^ (static_cast<uint64_t>(t + 1) * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

// Every occurrence finds (or claims) the slot of its (array, key) and lowers the slot's first.
__global__ void insert_kernel(KeyLists lists, int64_t total, uint32_t mask, int32_t* __restrict__ holder,
                              int32_t* __restrict__ first, int32_t* __restrict__ slot) {
  for (int64_t g = thread_index(); g < total; g += thread_stride()) {
    const int t = array_of(lists, g);
    const uint64_t key = key_bits(lists, t, g);
    uint32_t h = hash_of(key, t) & mask;
    for (;;) {
      const int32_t held = atomicCAS(&holder[h], 0, static_cast<int32_t>(g) + 1);
      if (held == 0) break;
      const int64_t other = held - 1;
      const int u = array_of(lists, other);
      if (u == t && key_bits(lists, u, other) == key) break;
      h = (h + 1) & mask;
    }
    atomicMin(&first[h], static_cast<int32_t>(g));
    slot[g] = static_cast<int32_t>(h);
  }
}

__global__ void flag_kernel(int64_t total, const int32_t* __restrict__ first, const int32_t* __restrict__ slot,
                            int32_t* __restrict__ flag) {
  for (int64_t g = thread_index(); g < total; g += thread_stride()) flag[g] = first[slot[g]] == g ? 1 : 0;
}

// The distinct keys before array t's: the inclusive rank of the occurrence before it.
__device__ inline int32_t before(const KeyLists& lists, const int32_t* rank, int t) {
  return lists.begin[t] > 0 ? rank[lists.begin[t] - 1] : 0;
}

__global__ void counts_kernel(KeyLists lists, const int32_t* __restrict__ rank, int32_t* __restrict__ counts) {
  const int t = static_cast<int>(thread_index());
  if (t >= lists.num) return;
  counts[t] = lists.begin[t + 1] > lists.begin[t] ? rank[lists.begin[t + 1] - 1] - before(lists, rank, t) : 0;
}

__global__ void finish_kernel(KeyLists lists, ListOutputs out, int64_t total, const int32_t* __restrict__ first,
                              const int32_t* __restrict__ slot, const int32_t* __restrict__ rank) {
  for (int64_t g = thread_index(); g < total; g += thread_stride()) {
    const int t = array_of(lists, g);
    const int32_t base = before(lists, rank, t);
    const int32_t f = first[slot[g]];
    out.positions[t][g - lists.begin[t]] = rank[f] - 1 - base;
    if (f != g) continue;
    const int32_t row = rank[g] - 1 - base;
    if (lists.key_bytes[t] == 4) {
      static_cast<uint32_t*>(out.distinct[t])[row] = static_cast<const uint32_t*>(lists.keys[t])[g - lists.begin[t]];
    } else {
      static_cast<uint64_t*>(out.distinct[t])[row] = static_cast<const uint64_t*>(lists.keys[t])[g - lists.begin[t]];
    }
  }
}

}  // namespace

cudaError_t unique_list_workspace_bytes(int64_t total, size_t* bytes) {
  if (bytes == nullptr) return cudaErrorInvalidValue;
  Workspace ws{};
  const cudaError_t e = carve(total, nullptr, &ws);
  *bytes = ws.total;
  return e;
}

cudaError_t unique_list_index(const KeyLists& lists, void* workspace, size_t workspace_bytes, int32_t* counts,
                              cudaStream_t stream) {
  if (counts == nullptr || lists.num < 1 || lists.num > kUniqueListArrays) return cudaErrorInvalidValue;
  const int64_t total = lists.begin[lists.num];
  if (total == 0) return cudaMemsetAsync(counts, 0, sizeof(int32_t) * lists.num, stream);
  Workspace ws{};
  cudaError_t e = placed(lists, workspace, workspace_bytes, &ws);
  if (e != cudaSuccess) return e;
  const size_t slots = static_cast<size_t>(ws.mask) + 1;
  if ((e = cudaMemsetAsync(ws.holder, 0, sizeof(int32_t) * slots, stream)) != cudaSuccess) return e;
  if ((e = cudaMemsetAsync(ws.first, 0x7f, sizeof(int32_t) * slots, stream)) != cudaSuccess) return e;
  const unsigned int blocks = blocks_for(total);
  insert_kernel<<<blocks, kThreads, 0, stream>>>(lists, total, ws.mask, ws.holder, ws.first, ws.slot);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  flag_kernel<<<blocks, kThreads, 0, stream>>>(total, ws.first, ws.slot, ws.flag);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  size_t bytes = ws.cub_bytes;
  e = cub::DeviceScan::InclusiveSum(ws.cub, bytes, ws.flag, ws.rank, static_cast<int>(total), stream);
  if (e != cudaSuccess) return e;
  counts_kernel<<<1, kUniqueListArrays, 0, stream>>>(lists, ws.rank, counts);
  return cudaGetLastError();
}

cudaError_t unique_list_finish(const KeyLists& lists, const ListOutputs& out, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  if (lists.num < 1 || lists.num > kUniqueListArrays) return cudaErrorInvalidValue;
  const int64_t total = lists.begin[lists.num];
  if (total == 0) return cudaSuccess;
  Workspace ws{};
  const cudaError_t e = placed(lists, workspace, workspace_bytes, &ws);
  if (e != cudaSuccess) return e;
  finish_kernel<<<blocks_for(total), kThreads, 0, stream>>>(lists, out, total, ws.first, ws.slot, ws.rank);
  return cudaGetLastError();
}

}  // namespace sok_gpu
