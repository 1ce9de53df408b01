// Device helpers of SOK's own CUDA kernels (gpu/*.cu): launch shapes, workspace carving, and the
// batch-order row sums that make GPU results equal the CPU kernels' bit for bit.
#ifndef SOK_TF_OPS_GPU_COMMON_CUH_
#define SOK_TF_OPS_GPU_COMMON_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace sok_gpu {
namespace detail {

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over `total` items (total > 0).
inline unsigned int blocks_for(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::min<int64_t>(blocks, int64_t{1} << 20));
}

__device__ inline int64_t thread_index() { return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t thread_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// Carves aligned arrays out of one workspace: first with base == nullptr to measure (total()), then
// with the workspace's address to place them, in the same order.
class Carver {
 public:
  explicit Carver(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* take(int64_t count) {
    const size_t at = offset_;
    offset_ += (static_cast<size_t>(count) * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    return base_ == nullptr ? nullptr : reinterpret_cast<T*>(base_ + at);
  }
  void* take_bytes(size_t bytes) { return take<char>(static_cast<int64_t>(bytes)); }
  size_t total() const { return offset_; }

 private:
  static constexpr size_t kAlign = 256;
  char* base_;
  size_t offset_ = 0;
};

// 0.0f plus values[occurrence[k] * w + c] for k in [begin, end), one after the other: the order and
// rounding of the CPU kernels' `sums = 0; sums[p] += row` (IEEE adds, never reassociated). The loads
// of a group go out together; the adds stay in order.
__device__ inline float sum_in_order(const float* __restrict__ values, const int32_t* __restrict__ occurrence,
                                     int32_t begin, int32_t end, int64_t w, int64_t c) {
  constexpr int kGroup = 8;
  float acc = 0.0f;
  int32_t k = begin;
  for (; k + kGroup <= end; k += kGroup) {
    float v[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) v[j] = values[static_cast<int64_t>(occurrence[k + j]) * w + c];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) acc = __fadd_rn(acc, v[j]);
  }
  for (; k < end; ++k) acc = __fadd_rn(acc, values[static_cast<int64_t>(occurrence[k]) * w + c]);
  return acc;
}

// A "hot" key (more than kHotOccurrences occurrences in a batch) is summed by a block of
// kHotThreads: kHotGroups warps, each a strided share of the occurrences, kHotColumns columns per
// block (a warp's lanes), then a fixed tree over the warps: deterministic, not the CPU's order.
constexpr int kHotColumns = 32;
constexpr int kHotGroups = 32;
constexpr int kHotThreads = kHotColumns * kHotGroups;  // 1024
constexpr int kHotUnroll = 8;                          // terms loaded before they are added

// Column lane's sum of term(i) for i in [begin, end), called by every thread of a kHotThreads
// block (active: whether its column exists), the same value back to all warps. The fixed order:
// warp g adds term(begin + g), term(begin + g + kHotGroups), ... to 0.0f one after another, then the
// warps' partial sums are added in a tree (partial[g] += partial[g + half], half = 16, 8, ..., 1).
template <class Term>
__device__ float hot_sum(int64_t begin, int64_t end, bool active, Term term) {
  __shared__ float partial[kHotGroups][kHotColumns];
  const int lane = threadIdx.x % kHotColumns;
  const int group = threadIdx.x / kHotColumns;
  float sum = 0.0f;
  if (active) {
    int64_t i = begin + group;
    for (; i + (kHotUnroll - 1) * kHotGroups < end; i += kHotUnroll * kHotGroups) {
      float x[kHotUnroll];
#pragma unroll
      for (int u = 0; u < kHotUnroll; ++u) x[u] = term(i + u * kHotGroups);
#pragma unroll
      for (int u = 0; u < kHotUnroll; ++u) sum = __fadd_rn(sum, x[u]);
    }
    for (; i < end; i += kHotGroups) sum = __fadd_rn(sum, term(i));
  }
  partial[group][lane] = sum;
  __syncthreads();
  for (int half = kHotGroups / 2; half > 0; half >>= 1) {
    if (group < half) partial[group][lane] = __fadd_rn(partial[group][lane], partial[group + half][lane]);
    __syncthreads();
  }
  const float out = partial[0][lane];
  __syncthreads();  // partial is the next call's
  return out;
}

}  // namespace detail
}  // namespace sok_gpu

#endif  // SOK_TF_OPS_GPU_COMMON_CUH_
