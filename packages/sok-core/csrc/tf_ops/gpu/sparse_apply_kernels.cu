// SokLookupDistinct's and SokSparseApply's device work (sparse_apply_kernels.h says what).
//
// The step builds, per distinct key, the list of its gradient rows in batch order (a CSR): a stable
// radix sort of (position, batch index) pairs, and for row r the range [begin[r], begin[r + 1]) of
// the sorted pairs with position r (a binary search per row). One kernel then sums and applies the
// rule, a thread per (row, column). Every float operation is an explicit IEEE round-to-nearest
// intrinsic, so nvcc never contracts a multiply and an add into an FMA: the results are those of
// RowRule::apply on the CPU, operation for operation.
//
// Except for hot rows, with more than kHotOccurrences gradient rows: a serial sum of them would be
// a chain as long as their count. Those rows are listed on the device (hot_rows_kernel) and
// apply_hot_kernel gives each a block per 32-column tile whose 32 warps each sum every 32nd gradient
// row in order, then add their partial sums in a fixed tree (hot_sum) and apply the rule. No float
// atomics: the order depends only on the row's count, so the bits are the same run after run; they
// equal the CPU's within float rounding (the CPU adds in batch order), and to the bit for the others.
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "sparse_apply_kernels.h"

namespace sok_gpu {
namespace {

using detail::blocks_for;
using detail::hot_sum;
using detail::kHotColumns;
using detail::kHotThreads;
using detail::kThreads;
using detail::thread_index;
using detail::thread_stride;

// T: a row with at most this many gradient rows has them summed serially in batch order, the CPU's
// bits; one with more is "hot" and summed in a fixed parallel order (hot_sum).
constexpr int32_t kHotOccurrences = 32;
constexpr int32_t kHotBlocks = 1024;                   // the most hot blocks per column tile

// *flag = max over bad i of (n - i): the smallest bad index, and 0 when there is none.
__global__ void bad_position_kernel(const int32_t* __restrict__ positions, int32_t n, int64_t u,
                                    int32_t* __restrict__ flag) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const int32_t p = positions[i];
    if (p < 0 || p >= u) atomicMax(flag, static_cast<int32_t>(n - i));
  }
}

__global__ void gather_kernel(const float* __restrict__ rows, const int32_t* __restrict__ positions, int32_t n,
                              int64_t w, float* __restrict__ out) {
  const int64_t total = static_cast<int64_t>(n) * w;
  for (int64_t t = thread_index(); t < total; t += thread_stride()) {
    const int64_t i = t / w;
    const int64_t c = t - i * w;
    out[t] = rows[static_cast<int64_t>(positions[i]) * w + c];
  }
}

__global__ void iota_kernel(int32_t n, int32_t* __restrict__ out) {
  for (int64_t j = thread_index(); j < n; j += thread_stride()) out[j] = static_cast<int32_t>(j);
}

// begin[r] = the first j with sorted[j] >= r, for r in [0, u]: begin[u] = n.
__global__ void row_begin_kernel(const uint32_t* __restrict__ sorted, int32_t n, int32_t u,
                                 int32_t* __restrict__ begin) {
  for (int64_t r = thread_index(); r <= u; r += thread_stride()) {
    int32_t lo = 0, hi = n;
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo) / 2;
      if (sorted[mid] < static_cast<uint32_t>(r)) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    begin[r] = lo;
  }
}

// The rule on column c of one row (d embedding columns, then the state's): g the summed gradient
// (RowRule::apply).
template <int32_t kKind>
__device__ inline void apply_rule(float* __restrict__ row, int64_t d, int64_t c, float g, float lr, float h0,
                                  float h1) {
  float& w = row[c];
  if (kKind == kRuleSgd) {  // w - g * lr
    w = __fsub_rn(w, __fmul_rn(g, lr));
  } else if (kKind == kRuleMomentum) {  // m = m * momentum - g * lr; w + (m * momentum - g * lr if nesterov else m)
    float& s = row[d + c];
    const float m = __fsub_rn(__fmul_rn(s, h0), __fmul_rn(g, lr));
    s = m;
    w = h1 != 0.0f ? __fadd_rn(w, __fsub_rn(__fmul_rn(m, h0), __fmul_rn(g, lr))) : __fadd_rn(w, m);
  } else {  // acc + g**2; w - lr * g / (sqrt(acc) + eps if after sqrt else sqrt(acc + eps))
    float& s = row[d + c];
    const float acc = __fadd_rn(s, __fmul_rn(g, g));
    s = acc;
    const float denominator = h1 != 0.0f ? __fadd_rn(__fsqrt_rn(acc), h0) : __fsqrt_rn(__fadd_rn(acc, h0));
    w = __fsub_rn(w, __fdiv_rn(__fmul_rn(lr, g), denominator));
  }
}

// hot[0, *count) = the rows with more than kHotOccurrences gradient rows, in any order.
__global__ void hot_rows_kernel(const int32_t* __restrict__ begin, int32_t u, int32_t* __restrict__ hot,
                                int32_t* __restrict__ count) {
  for (int64_t r = thread_index(); r < u; r += thread_stride()) {
    if (begin[r + 1] - begin[r] > kHotOccurrences) hot[atomicAdd(count, 1)] = static_cast<int32_t>(r);
  }
}

// Where row r of the u rows lies: rows (u, W) one after another, or (with `lent`) the address of
// each (the table's own rows, find_or_insert_rows; null for a row the table refused, left alone).
struct Rows {
  float* base;
  float* const* lent;
  int32_t width;
  __device__ float* operator()(int64_t r) const { return lent != nullptr ? lent[r] : base + r * width; }
};

// Row r, column c (not hot rows: apply_hot_kernel's): g = the gradient rows of r in batch order,
// then the rule on the row.
template <int32_t kKind>
__global__ void apply_kernel(int32_t u, int32_t d, const float* __restrict__ grads,
                             const int32_t* __restrict__ occurrence, const int32_t* __restrict__ begin, float lr,
                             float h0, float h1, Rows rows) {
  const int64_t total = static_cast<int64_t>(u) * d;
  for (int64_t t = thread_index(); t < total; t += thread_stride()) {
    const int64_t r = t / d;
    const int64_t c = t - r * d;
    if (begin[r + 1] - begin[r] > kHotOccurrences) continue;
    float* row = rows(r);
    if (row == nullptr) continue;
    const float g = detail::sum_in_order(grads, occurrence, begin[r], begin[r + 1], d, c);
    apply_rule<kKind>(row, d, c, g, lr, h0, h1);
  }
}

// Row-wise Adagrad, a warp per row (hot rows too: the row's mean couples its columns, so they are
// summed serially in batch order like the others): each lane sums its columns' gradients
// (sum_in_order), adds their squares in order, the 32 partial sums meet in a fixed tree on lane 0,
// which gives every lane the new accumulator; then each lane steps its columns. The same bits run
// after run; equal to RowRule::apply on the CPU within float rounding (it adds the squares in
// column order).
__global__ void apply_row_wise_kernel(int32_t u, int32_t d, const float* __restrict__ grads,
                                      const int32_t* __restrict__ occurrence, const int32_t* __restrict__ begin,
                                      float lr, float eps, Rows rows) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t r = thread_index() / 32; r < u; r += warps) {
    float* row = rows(r);
    if (row == nullptr) continue;  // the same for the whole warp
    float squares = 0.0f;
    for (int64_t c = lane; c < d; c += 32) {
      const float g = detail::sum_in_order(grads, occurrence, begin[r], begin[r + 1], d, c);
      squares = __fadd_rn(squares, __fmul_rn(g, g));
    }
    for (int offset = 16; offset > 0; offset /= 2) squares = __fadd_rn(squares, __shfl_down_sync(kAll, squares, offset));
    float acc = 0.0f;
    if (lane == 0) acc = __fadd_rn(row[d], __fdiv_rn(squares, static_cast<float>(d)));
    acc = __shfl_sync(kAll, acc, 0);
    const float denominator = __fadd_rn(__fsqrt_rn(acc), eps);
    for (int64_t c = lane; c < d; c += 32) {
      const float g = detail::sum_in_order(grads, occurrence, begin[r], begin[r + 1], d, c);
      row[c] = __fsub_rn(row[c], __fdiv_rn(__fmul_rn(lr, g), denominator));
    }
    if (lane == 0) row[d] = acc;
  }
}

// The hot rows hot[0, *count), column tile blockIdx.y: g summed by hot_sum, then the rule. Blocks
// stride over the list (its length is only known on the device).
template <int32_t kKind>
__global__ void __launch_bounds__(kHotThreads)
    apply_hot_kernel(int32_t d, const float* __restrict__ grads, const int32_t* __restrict__ occurrence,
                     const int32_t* __restrict__ begin, const int32_t* __restrict__ hot,
                     const int32_t* __restrict__ count, float lr, float h0, float h1, Rows rows) {
  const int32_t hot_rows = *count;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kHotColumns + threadIdx.x % kHotColumns;
  for (int32_t h = blockIdx.x; h < hot_rows; h += gridDim.x) {
    const int64_t r = hot[h];
    const float g = hot_sum(begin[r], begin[r + 1], c < d,
                            [=](int64_t k) { return grads[static_cast<int64_t>(occurrence[k]) * d + c]; });
    float* row = rows(r);
    if (threadIdx.x < kHotColumns && c < d && row != nullptr) apply_rule<kKind>(row, d, c, g, lr, h0, h1);
  }
}

// The most rows that can be hot: each has more than kHotOccurrences of the n gradient rows.
int32_t max_hot_rows(int32_t n, int32_t u) { return std::min(u, n / (kHotOccurrences + 1)); }

struct Workspace {
  int32_t* iota;
  uint32_t* sorted_positions;
  int32_t* occurrence;
  int32_t* begin;
  int32_t* hot_count;  // (1,)
  int32_t* hot;        // (max_hot_rows,)
  void* cub;
  size_t cub_bytes;
  size_t total;
};

// The bits that hold 0 .. u - 1 (at least one).
int position_bits(int32_t u) {
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < u) ++bits;
  return bits;
}

cudaError_t carve(int32_t n, int32_t u, void* base, Workspace* ws) {
  size_t sort_bytes = 0;
  const cudaError_t e = cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, position_bits(u));
  if (e != cudaSuccess) return e;
  detail::Carver c(base);
  ws->iota = c.take<int32_t>(n);
  ws->sorted_positions = c.take<uint32_t>(n);
  ws->occurrence = c.take<int32_t>(n);
  ws->begin = c.take<int32_t>(static_cast<int64_t>(u) + 1);
  ws->hot_count = c.take<int32_t>(1);
  ws->hot = c.take<int32_t>(max_hot_rows(n, u));
  ws->cub_bytes = std::max(sort_bytes, size_t{1});
  ws->cub = c.take_bytes(ws->cub_bytes);
  ws->total = c.total();
  return cudaSuccess;
}

}  // namespace

cudaError_t find_bad_position(const int32_t* positions, int32_t n, int64_t u, int32_t* flag, int64_t* bad_index,
                              int32_t* bad_value, cudaStream_t stream) {
  if (bad_index == nullptr || bad_value == nullptr || n < 0) return cudaErrorInvalidValue;
  *bad_index = -1;
  *bad_value = 0;
  if (n == 0) return cudaSuccess;
  if (positions == nullptr || flag == nullptr) return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int32_t), stream);
  if (e != cudaSuccess) return e;
  bad_position_kernel<<<blocks_for(n), kThreads, 0, stream>>>(positions, n, u, flag);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  int32_t found = 0;
  if ((e = cudaMemcpyAsync(&found, flag, sizeof(int32_t), cudaMemcpyDeviceToHost, stream)) != cudaSuccess) return e;
  if ((e = cudaStreamSynchronize(stream)) != cudaSuccess) return e;
  if (found == 0) return cudaSuccess;
  const int32_t i = n - found;
  int32_t value = 0;
  e = cudaMemcpyAsync(&value, positions + i, sizeof(int32_t), cudaMemcpyDeviceToHost, stream);
  if (e != cudaSuccess) return e;
  if ((e = cudaStreamSynchronize(stream)) != cudaSuccess) return e;
  *bad_index = i;
  *bad_value = value;
  return cudaSuccess;
}

cudaError_t gather_rows(const float* rows, const int32_t* positions, int32_t n, int64_t w, float* out,
                        cudaStream_t stream) {
  if (n < 0 || w < 0) return cudaErrorInvalidValue;
  const int64_t total = static_cast<int64_t>(n) * w;
  if (total == 0) return cudaSuccess;
  if (rows == nullptr || positions == nullptr || out == nullptr) return cudaErrorInvalidValue;
  gather_kernel<<<blocks_for(total), kThreads, 0, stream>>>(rows, positions, n, w, out);
  return cudaGetLastError();
}

cudaError_t sparse_apply_workspace_bytes(int32_t n, int32_t u, size_t* bytes) {
  if (n < 0 || u < 0 || bytes == nullptr) return cudaErrorInvalidValue;
  Workspace ws{};
  const cudaError_t e = carve(n, u, nullptr, &ws);
  *bytes = ws.total;
  return e;
}

namespace {

cudaError_t apply_rows(const int32_t* positions, const float* grads, int32_t n, int32_t u, int32_t d,
                       int32_t row_width, SparseRule rule, float lr, Rows rows, void* workspace,
                       size_t workspace_bytes, cudaStream_t stream) {
  // The row width of each rule (sparse_rules.h): sgd none, momentum and adagrad a block, rowwise one float.
  const int64_t state = rule.kind == kRuleSgd ? 0 : rule.kind == kRuleRowWiseAdagrad ? 1 : d;
  if (n < 0 || u < 0 || d < 0 || rule.kind < kRuleSgd || rule.kind > kRuleRowWiseAdagrad ||
      static_cast<int64_t>(d) + state != row_width) {
    return cudaErrorInvalidValue;
  }
  const int64_t total = static_cast<int64_t>(u) * d;
  if (total == 0) return cudaSuccess;
  if ((rows.base == nullptr && rows.lent == nullptr) || workspace == nullptr ||
      (n > 0 && (positions == nullptr || grads == nullptr))) {
    return cudaErrorInvalidValue;
  }
  Workspace ws{};
  cudaError_t e = carve(n, u, workspace, &ws);
  if (e != cudaSuccess) return e;
  if (ws.total > workspace_bytes) return cudaErrorInvalidValue;
  if (n > 0) {
    iota_kernel<<<blocks_for(n), kThreads, 0, stream>>>(n, ws.iota);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    // Valid positions are in [0, u): as unsigned, their low position_bits(u) bits order them.
    size_t bytes = ws.cub_bytes;
    e = cub::DeviceRadixSort::SortPairs(ws.cub, bytes, reinterpret_cast<const uint32_t*>(positions),
                                        ws.sorted_positions, ws.iota, ws.occurrence, n, 0, position_bits(u), stream);
    if (e != cudaSuccess) return e;
  }
  row_begin_kernel<<<blocks_for(static_cast<int64_t>(u) + 1), kThreads, 0, stream>>>(ws.sorted_positions, n, u,
                                                                                     ws.begin);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const unsigned int blocks = blocks_for(total);
  const float h0 = rule.hyper[0], h1 = rule.hyper[1];
  if (rule.kind == kRuleRowWiseAdagrad) {  // every row, hot ones included, in one kernel
    apply_row_wise_kernel<<<blocks_for(static_cast<int64_t>(u) * 32), kThreads, 0, stream>>>(
        u, d, grads, ws.occurrence, ws.begin, lr, h0, rows);
    return cudaGetLastError();
  }
  switch (rule.kind) {
    case kRuleSgd:
      apply_kernel<kRuleSgd>
          <<<blocks, kThreads, 0, stream>>>(u, d, grads, ws.occurrence, ws.begin, lr, h0, h1, rows);
      break;
    case kRuleMomentum:
      apply_kernel<kRuleMomentum>
          <<<blocks, kThreads, 0, stream>>>(u, d, grads, ws.occurrence, ws.begin, lr, h0, h1, rows);
      break;
    default:
      apply_kernel<kRuleAdagrad>
          <<<blocks, kThreads, 0, stream>>>(u, d, grads, ws.occurrence, ws.begin, lr, h0, h1, rows);
      break;
  }
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  // Hot rows (none unless n > kHotOccurrences): listed, then summed and updated by apply_hot_kernel;
  // apply_kernel left them alone, so the two kernels touch disjoint rows.
  const int32_t max_hot = max_hot_rows(n, u);
  const int64_t tiles = (static_cast<int64_t>(d) + kHotColumns - 1) / kHotColumns;
  if (max_hot == 0) return cudaSuccess;
  if (tiles > 65535) return cudaErrorInvalidConfiguration;
  if ((e = cudaMemsetAsync(ws.hot_count, 0, sizeof(int32_t), stream)) != cudaSuccess) return e;
  hot_rows_kernel<<<blocks_for(u), kThreads, 0, stream>>>(ws.begin, u, ws.hot, ws.hot_count);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(std::min(max_hot, kHotBlocks)), static_cast<unsigned>(tiles));
  switch (rule.kind) {
    case kRuleSgd:
      apply_hot_kernel<kRuleSgd><<<grid, kHotThreads, 0, stream>>>(d, grads, ws.occurrence, ws.begin, ws.hot,
                                                                   ws.hot_count, lr, h0, h1, rows);
      break;
    case kRuleMomentum:
      apply_hot_kernel<kRuleMomentum><<<grid, kHotThreads, 0, stream>>>(
          d, grads, ws.occurrence, ws.begin, ws.hot, ws.hot_count, lr, h0, h1, rows);
      break;
    default:
      apply_hot_kernel<kRuleAdagrad><<<grid, kHotThreads, 0, stream>>>(
          d, grads, ws.occurrence, ws.begin, ws.hot, ws.hot_count, lr, h0, h1, rows);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t sparse_apply_rows(const int32_t* positions, const float* grads, int32_t n, int32_t u, int32_t d,
                              int32_t row_width, SparseRule rule, float lr, float* rows, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  if (rows == nullptr && static_cast<int64_t>(u) * d > 0) return cudaErrorInvalidValue;
  return apply_rows(positions, grads, n, u, d, row_width, rule, lr, Rows{rows, nullptr, row_width}, workspace,
                    workspace_bytes, stream);
}

cudaError_t sparse_apply_lent_rows(const int32_t* positions, const float* grads, int32_t n, int32_t u, int32_t d,
                                   int32_t row_width, SparseRule rule, float lr, float* const* rows, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream) {
  if (rows == nullptr && static_cast<int64_t>(u) * d > 0) return cudaErrorInvalidValue;
  return apply_rows(positions, grads, n, u, d, row_width, rule, lr, Rows{nullptr, rows, row_width}, workspace,
                    workspace_bytes, stream);
}

}  // namespace sok_gpu
