// SokUniqueIndex and SokUniqueSum on the GPU (unique_kernels.h says what and how).
//
// Arrays of the workspace, n keys (sorted domain j: the order of the sorted keys; batch domain i:
// the order of the keys):
//   sorted_keys (n,)  the keys' bits, sorted (stable)        sorted_index (n,)  batch index of each
//   head (n,)         1 where a run of equal keys begins     segment (n,)       inclusive sum of head
//   first (n,)        1 at the first occurrence of a key     rank (n,)          inclusive sum of first
//   segment_row (n,)  row (order of first occurrence) of each run
//   segment_begin (n + 1,)  where each run begins in the sorted domain (the end of the last: n)
//   iota (n,)         0 .. n-1, the values of the sort         count (1,)         scratch
// plus CUB's scratch. Distinct key r is the r-th first occurrence in batch order; its run holds
// its occurrences in batch order (the sort is stable), which the sums walk.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "common.cuh"
#include "unique_kernels.h"

namespace sok_gpu {
namespace {

using detail::blocks_for;
using detail::kThreads;
using detail::thread_index;
using detail::thread_stride;

template <typename K>
struct Workspace {
  K* sorted_keys;
  int32_t* iota;
  int32_t* sorted_index;
  int32_t* head;
  int32_t* segment;
  int32_t* first;
  int32_t* rank;
  int32_t* segment_row;
  int32_t* segment_begin;
  void* cub;
  size_t cub_bytes;
  size_t total;
};

// The workspace's arrays at `base` (nullptr: only measure).
template <typename K>
cudaError_t carve(int32_t n, void* base, Workspace<K>* ws) {
  size_t sort_bytes = 0, scan_bytes = 0;
  cudaError_t e =
      cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const K*>(nullptr), static_cast<K*>(nullptr),
                                      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n);
  if (e != cudaSuccess) return e;
  e = cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, static_cast<const int32_t*>(nullptr),
                                    static_cast<int32_t*>(nullptr), n);
  if (e != cudaSuccess) return e;
  detail::Carver c(base);
  ws->sorted_keys = c.take<K>(n);
  ws->iota = c.take<int32_t>(n);
  ws->sorted_index = c.take<int32_t>(n);
  ws->head = c.take<int32_t>(n);
  ws->segment = c.take<int32_t>(n);
  ws->first = c.take<int32_t>(n);
  ws->rank = c.take<int32_t>(n);
  ws->segment_row = c.take<int32_t>(n);
  ws->segment_begin = c.take<int32_t>(static_cast<int64_t>(n) + 1);
  ws->cub_bytes = std::max(std::max(sort_bytes, scan_bytes), size_t{1});
  ws->cub = c.take_bytes(ws->cub_bytes);
  ws->total = c.total();
  return cudaSuccess;
}

template <typename K>
cudaError_t placed(int32_t n, void* workspace, size_t workspace_bytes, Workspace<K>* ws) {
  if (n < 0 || workspace == nullptr) return cudaErrorInvalidValue;
  const cudaError_t e = carve<K>(n, workspace, ws);
  if (e != cudaSuccess) return e;
  return ws->total <= workspace_bytes ? cudaSuccess : cudaErrorInvalidValue;
}

__global__ void iota_kernel(int32_t n, int32_t* __restrict__ out) {
  for (int64_t j = thread_index(); j < n; j += thread_stride()) out[j] = static_cast<int32_t>(j);
}

// head[j] = whether sorted key j begins a run of equal keys; first[batch index] = the same flag, so that
// first marks each key's first occurrence (a run's head has the smallest batch index: stable sort).
template <typename K>
__global__ void mark_kernel(int32_t n, const K* __restrict__ sorted_keys, const int32_t* __restrict__ sorted_index,
                            int32_t* __restrict__ head, int32_t* __restrict__ first) {
  for (int64_t j = thread_index(); j < n; j += thread_stride()) {
    const int32_t h = j == 0 || sorted_keys[j] != sorted_keys[j - 1] ? 1 : 0;
    head[j] = h;
    first[sorted_index[j]] = h;
  }
}

// For each run s (at its head j): its row r (the order of first occurrence), where it begins, and
// distinct[r] = its key; the last thread closes the last run.
template <typename K>
__global__ void runs_kernel(int32_t n, const K* __restrict__ sorted_keys, const int32_t* __restrict__ sorted_index,
                            const int32_t* __restrict__ head, const int32_t* __restrict__ segment,
                            const int32_t* __restrict__ rank, int32_t* __restrict__ segment_row,
                            int32_t* __restrict__ segment_begin, K* __restrict__ distinct) {
  for (int64_t j = thread_index(); j < n; j += thread_stride()) {
    const int32_t s = segment[j] - 1;
    if (head[j] != 0) {
      const int32_t r = rank[sorted_index[j]] - 1;
      segment_row[s] = r;
      segment_begin[s] = static_cast<int32_t>(j);
      distinct[r] = sorted_keys[j];
    }
    if (j == n - 1) segment_begin[s + 1] = n;
  }
}

__global__ void positions_kernel(int32_t n, const int32_t* __restrict__ sorted_index,
                                 const int32_t* __restrict__ segment, const int32_t* __restrict__ segment_row,
                                 int32_t* __restrict__ positions) {
  for (int64_t j = thread_index(); j < n; j += thread_stride()) {
    positions[sorted_index[j]] = segment_row[segment[j] - 1];
  }
}

// sums (u, w): row segment_row[s], column c = the values of run s's occurrences, in batch order.
__global__ void run_sums_kernel(int32_t u, int64_t w, const float* __restrict__ values,
                                const int32_t* __restrict__ sorted_index, const int32_t* __restrict__ segment_begin,
                                const int32_t* __restrict__ segment_row, float* __restrict__ sums) {
  const int64_t total = static_cast<int64_t>(u) * w;
  for (int64_t t = thread_index(); t < total; t += thread_stride()) {
    const int64_t s = t / w;
    const int64_t c = t - s * w;
    sums[static_cast<int64_t>(segment_row[s]) * w + c] =
        detail::sum_in_order(values, sorted_index, segment_begin[s], segment_begin[s + 1], w, c);
  }
}

// Sorts keys (n > 0) into the workspace and marks runs and first occurrences; the number of runs
// is then ws.segment[n - 1] (device).
template <typename K>
cudaError_t sort_runs(const K* keys, int32_t n, void* workspace, size_t workspace_bytes, Workspace<K>* ws,
                      cudaStream_t stream) {
  cudaError_t e = placed<K>(n, workspace, workspace_bytes, ws);
  if (e != cudaSuccess) return e;
  const unsigned int blocks = blocks_for(n);
  iota_kernel<<<blocks, kThreads, 0, stream>>>(n, ws->iota);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  size_t bytes = ws->cub_bytes;
  e = cub::DeviceRadixSort::SortPairs(ws->cub, bytes, keys, ws->sorted_keys, ws->iota, ws->sorted_index, n, 0,
                                      static_cast<int>(sizeof(K) * 8), stream);
  if (e != cudaSuccess) return e;
  mark_kernel<K><<<blocks, kThreads, 0, stream>>>(n, ws->sorted_keys, ws->sorted_index, ws->head, ws->first);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  bytes = ws->cub_bytes;
  if ((e = cub::DeviceScan::InclusiveSum(ws->cub, bytes, ws->head, ws->segment, n, stream)) != cudaSuccess) return e;
  bytes = ws->cub_bytes;
  return cub::DeviceScan::InclusiveSum(ws->cub, bytes, ws->first, ws->rank, n, stream);
}

template <typename K>
cudaError_t sort_keys(const K* keys, int32_t n, void* workspace, size_t workspace_bytes, int32_t* num_distinct,
                      cudaStream_t stream) {
  *num_distinct = 0;
  if (n == 0) return cudaSuccess;
  Workspace<K> ws{};
  cudaError_t e = sort_runs<K>(keys, n, workspace, workspace_bytes, &ws, stream);
  if (e != cudaSuccess) return e;
  // u = the number of runs (host memory: the copy completes before the synchronization returns).
  int32_t u = 0;
  e = cudaMemcpyAsync(&u, ws.segment + (n - 1), sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
  if (e != cudaSuccess) return e;
  if ((e = cudaStreamSynchronize(stream)) != cudaSuccess) return e;
  *num_distinct = u;
  return cudaSuccess;
}

template <typename K>
cudaError_t index_finish(int32_t n, void* workspace, size_t workspace_bytes, K* distinct, int32_t* positions,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Workspace<K> ws{};
  cudaError_t e = placed<K>(n, workspace, workspace_bytes, &ws);
  if (e != cudaSuccess) return e;
  const unsigned int blocks = blocks_for(n);
  runs_kernel<K><<<blocks, kThreads, 0, stream>>>(n, ws.sorted_keys, ws.sorted_index, ws.head, ws.segment, ws.rank,
                                                  ws.segment_row, ws.segment_begin, distinct);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  positions_kernel<<<blocks, kThreads, 0, stream>>>(n, ws.sorted_index, ws.segment, ws.segment_row, positions);
  return cudaGetLastError();
}

template <typename K>
cudaError_t sum_finish(int32_t n, int32_t u, void* workspace, size_t workspace_bytes, const float* values, int64_t w,
                       K* distinct, float* sums, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Workspace<K> ws{};
  cudaError_t e = placed<K>(n, workspace, workspace_bytes, &ws);
  if (e != cudaSuccess) return e;
  runs_kernel<K><<<blocks_for(n), kThreads, 0, stream>>>(n, ws.sorted_keys, ws.sorted_index, ws.head, ws.segment,
                                                         ws.rank, ws.segment_row, ws.segment_begin, distinct);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const int64_t total = static_cast<int64_t>(u) * w;
  if (total == 0) return cudaSuccess;
  run_sums_kernel<<<blocks_for(total), kThreads, 0, stream>>>(u, w, values, ws.sorted_index, ws.segment_begin,
                                                              ws.segment_row, sums);
  return cudaGetLastError();
}

}  // namespace

cudaError_t unique_workspace_bytes(int32_t n, int key_bytes, size_t* bytes) {
  if (n < 0 || bytes == nullptr) return cudaErrorInvalidValue;
  cudaError_t e = cudaErrorInvalidValue;
  if (key_bytes == 4) {
    Workspace<uint32_t> ws{};
    e = carve<uint32_t>(n, nullptr, &ws);
    *bytes = ws.total;
  } else if (key_bytes == 8) {
    Workspace<uint64_t> ws{};
    e = carve<uint64_t>(n, nullptr, &ws);
    *bytes = ws.total;
  }
  return e;
}

cudaError_t unique_sort(const void* keys, int key_bytes, int32_t n, void* workspace, size_t workspace_bytes,
                        int32_t* num_distinct, cudaStream_t stream) {
  if (num_distinct == nullptr || (n > 0 && keys == nullptr)) return cudaErrorInvalidValue;
  if (key_bytes == 4) {
    return sort_keys(static_cast<const uint32_t*>(keys), n, workspace, workspace_bytes, num_distinct, stream);
  }
  if (key_bytes == 8) {
    return sort_keys(static_cast<const uint64_t*>(keys), n, workspace, workspace_bytes, num_distinct, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t unique_index_finish(int key_bytes, int32_t n, void* workspace, size_t workspace_bytes, void* distinct,
                                int32_t* positions, cudaStream_t stream) {
  if (n > 0 && (distinct == nullptr || positions == nullptr)) return cudaErrorInvalidValue;
  if (key_bytes == 4) {
    return index_finish(n, workspace, workspace_bytes, static_cast<uint32_t*>(distinct), positions, stream);
  }
  if (key_bytes == 8) {
    return index_finish(n, workspace, workspace_bytes, static_cast<uint64_t*>(distinct), positions, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t unique_sum_finish(int key_bytes, int32_t n, int32_t num_distinct, void* workspace, size_t workspace_bytes,
                              const float* values, int64_t w, void* distinct, float* sums, cudaStream_t stream) {
  if (w < 0 || num_distinct < 0 || num_distinct > n ||
      (n > 0 && (distinct == nullptr || (w > 0 && (values == nullptr || sums == nullptr))))) {
    return cudaErrorInvalidValue;
  }
  if (key_bytes == 4) {
    return sum_finish(n, num_distinct, workspace, workspace_bytes, values, w, static_cast<uint32_t*>(distinct), sums,
                      stream);
  }
  if (key_bytes == 8) {
    return sum_finish(n, num_distinct, workspace, workspace_bytes, values, w, static_cast<uint64_t*>(distinct), sums,
                      stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace sok_gpu
