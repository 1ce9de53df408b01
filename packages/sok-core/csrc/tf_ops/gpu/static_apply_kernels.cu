// Kernels of static_apply_kernels.h. Each launch takes up to kApplyTables tables: blockIdx.y picks
// the table, the blocks along x stride over its count * dim gradient elements. Rounding as Keras'
// ops: each product, sum, square root and quotient rounded on its own (no fused multiply-add).
#include <climits>
#include <cstdint>
#include <vector>

#include "gpu/static_apply_kernels.h"

namespace sok_gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int64_t kMaxBlocks = 4096;  // per table and launch; the blocks stride over the rest

struct Batch {
  AdagradTable t[kApplyTables];
};

__global__ void accumulate_kernel(Batch batch) {
  const AdagradTable& x = batch.t[blockIdx.y];
  const int64_t total = x.count * x.dim;
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < total; e += int64_t{gridDim.x} * kThreads) {
    const int64_t i = e / x.dim;
    const int64_t row = x.indices[i];
    if (row < 0) break;  // padding: it ends the gradient, and this thread's elements only go up
    const float g = x.grads[e];
    atomicAdd(x.accumulator + row * x.dim + (e - i * x.dim), __fmul_rn(g, g));
  }
}

__global__ void update_kernel(Batch batch, const float* learning_rate, float epsilon) {
  const AdagradTable& x = batch.t[blockIdx.y];
  const int64_t total = x.count * x.dim;
  const float lr = *learning_rate;
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < total; e += int64_t{gridDim.x} * kThreads) {
    const int64_t i = e / x.dim;
    const int64_t row = x.indices[i];
    if (row < 0) break;  // padding: it ends the gradient
    const int64_t at = row * x.dim + (e - i * x.dim);
    const float denominator = __fsqrt_rn(__fadd_rn(x.accumulator[at], epsilon));
    atomicAdd(static_cast<float*>(x.table) + at, -__fdiv_rn(__fmul_rn(lr, x.grads[e]), denominator));
  }
}

// Columns per lane that row_wise_kernel holds in registers (a row of up to kWarp * kHeld columns
// takes one pass: DCNv2's 128).
constexpr int kHeld = 4;

// A warp per row: the mean of the row's squares (lane sums over columns lane, lane + kWarp, ...,
// then a butterfly over the warp: the same order every run), its accumulator, then the row (read
// widened to float32, stored rounded to the table's row type). The row's index, its gradient's and
// the table's first kWarp * kHeld columns and its accumulator are loaded together, so that a row
// waits on memory once, not once per dependent step (index, gradient, accumulator, table); columns
// past them are read as they are used.
template <RowType R>
__global__ void row_wise_kernel(Batch batch, const float* learning_rate, float epsilon) {
  const AdagradTable& x = batch.t[blockIdx.y];
  const float lr = *learning_rate;
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t{gridDim.x} * (kThreads / kWarp);
  for (int64_t i = blockIdx.x * int64_t{kThreads / kWarp} + threadIdx.x / kWarp; i < x.count; i += warps) {
    const int64_t row = x.indices[i];
    if (row < 0) break;  // padding: it ends the gradient (the warp's rows only go up)
    const float* g = x.grads + i * x.dim;
    const int64_t at = row * x.dim;  // the row's first element
    const float before = x.accumulator[row];
    float gh[kHeld];
    float wh[kHeld];
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t c = lane + int64_t{k} * kWarp;
      gh[k] = c < x.dim ? g[c] : 0.0f;
      wh[k] = c < x.dim ? load_row_element<R>(x.table, at + c) : 0.0f;
    }
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      if (lane + int64_t{k} * kWarp < x.dim) squares = __fadd_rn(squares, __fmul_rn(gh[k], gh[k]));
    }
    for (int64_t c = lane + int64_t{kHeld} * kWarp; c < x.dim; c += kWarp) {
      squares = __fadd_rn(squares, __fmul_rn(g[c], g[c]));
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      squares = __fadd_rn(squares, __shfl_xor_sync(0xffffffffu, squares, offset));
    }
    const float mean = x.dim > 0 ? __fdiv_rn(squares, static_cast<float>(x.dim)) : 0.0f;
    const float accumulated = __fadd_rn(before, mean);
    __syncwarp();
    if (lane == 0) x.accumulator[row] = accumulated;
    const float denominator = __fadd_rn(__fsqrt_rn(accumulated), epsilon);
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      const int64_t c = lane + int64_t{k} * kWarp;
      if (c < x.dim) {
        const float step = __fdiv_rn(__fmul_rn(lr, gh[k]), denominator);
        store_row_element<R>(x.table, at + c, __fsub_rn(wh[k], step));
      }
    }
    for (int64_t c = lane + int64_t{kHeld} * kWarp; c < x.dim; c += kWarp) {
      const float step = __fdiv_rn(__fmul_rn(lr, g[c]), denominator);
      store_row_element<R>(x.table, at + c, __fsub_rn(load_row_element<R>(x.table, at + c), step));
    }
  }
}

__global__ void check_kernel(Batch batch, int first, int64_t* first_bad, int64_t* bad_count) {
  const AdagradTable& x = batch.t[blockIdx.y];
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < x.count; i += int64_t{gridDim.x} * kThreads) {
    if (static_cast<uint64_t>(x.indices[i]) >= static_cast<uint64_t>(x.rows)) {
      atomicMin(reinterpret_cast<unsigned long long*>(first_bad + first + blockIdx.y),
                static_cast<unsigned long long>(i));
      atomicAdd(reinterpret_cast<unsigned long long*>(bad_count + first + blockIdx.y), 1ull);
    }
  }
}

__global__ void init_checks_kernel(int64_t* first_bad, int64_t* bad_count, int n) {
  const int t = blockIdx.x * kThreads + threadIdx.x;
  if (t < n) {
    first_bad[t] = INT64_MAX;
    bad_count[t] = 0;
  }
}

// Blocks along x for the largest of `per_table` over the batch's tables.
template <class Size>
unsigned blocks_for(const Batch& b, int count, Size per_table) {
  int64_t most = 0;
  for (int t = 0; t < count; ++t) {
    const int64_t n = per_table(b.t[t]);
    most = n > most ? n : most;
  }
  const int64_t blocks = (most + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Calls launch(batch, count, first) for each group of up to kApplyTables tables.
template <class Launch>
cudaError_t for_each_batch(const AdagradTable* tables, int num_tables, Launch launch) {
  for (int first = 0; first < num_tables; first += kApplyTables) {
    Batch b{};
    const int count = num_tables - first < kApplyTables ? num_tables - first : kApplyTables;
    for (int t = 0; t < count; ++t) b.t[t] = tables[first + t];
    const cudaError_t e = launch(b, count, first);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t sparse_apply_adagrad(const AdagradTable* tables, int num_tables, const float* lr, float epsilon,
                                 cudaStream_t stream) {
  const auto elements = [](const AdagradTable& x) { return x.count * x.dim; };
  cudaError_t e = for_each_batch(tables, num_tables, [&](const Batch& b, int count, int) {
    const unsigned blocks = blocks_for(b, count, elements);
    if (blocks == 0) return cudaSuccess;
    accumulate_kernel<<<dim3(blocks, static_cast<unsigned>(count)), kThreads, 0, stream>>>(b);
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  // Every accumulator is complete before any table row reads it: the second kernels follow the first.
  return for_each_batch(tables, num_tables, [&](const Batch& b, int count, int) {
    const unsigned blocks = blocks_for(b, count, elements);
    if (blocks == 0) return cudaSuccess;
    update_kernel<<<dim3(blocks, static_cast<unsigned>(count)), kThreads, 0, stream>>>(b, lr, epsilon);
    return cudaGetLastError();
  });
}

cudaError_t sparse_apply_row_wise_adagrad(const AdagradTable* tables, int num_tables, const float* lr, float epsilon,
                                          cudaStream_t stream) {
  // One kernel per row type (its loads and stores known at compile time), over that type's tables.
  for (const RowType type : {kRowFloat32, kRowFloat16, kRowBFloat16}) {
    std::vector<AdagradTable> of_type;
    for (int t = 0; t < num_tables; ++t) {
      if (tables[t].row_type == type) of_type.push_back(tables[t]);
    }
    const int count_of_type = static_cast<int>(of_type.size());
    const cudaError_t e = for_each_batch(of_type.data(), count_of_type, [&](const Batch& b, int count, int) {
      const unsigned blocks = blocks_for(b, count, [](const AdagradTable& x) { return x.count * kWarp; });
      if (blocks == 0) return cudaSuccess;
      const dim3 grid(blocks, static_cast<unsigned>(count));
      if (type == kRowFloat16) {
        row_wise_kernel<kRowFloat16><<<grid, kThreads, 0, stream>>>(b, lr, epsilon);
      } else if (type == kRowBFloat16) {
        row_wise_kernel<kRowBFloat16><<<grid, kThreads, 0, stream>>>(b, lr, epsilon);
      } else {
        row_wise_kernel<kRowFloat32><<<grid, kThreads, 0, stream>>>(b, lr, epsilon);
      }
      return cudaGetLastError();
    });
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t check_adagrad_indices(const AdagradTable* tables, int num_tables, int64_t* first_bad,
                                  int64_t* bad_count, cudaStream_t stream) {
  if (num_tables <= 0) return cudaSuccess;
  init_checks_kernel<<<(num_tables + kThreads - 1) / kThreads, kThreads, 0, stream>>>(first_bad, bad_count,
                                                                                       num_tables);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return for_each_batch(tables, num_tables, [&](const Batch& b, int count, int first) {
    const unsigned blocks = blocks_for(b, count, [](const AdagradTable& x) { return x.count; });
    if (blocks == 0) return cudaSuccess;
    check_kernel<<<dim3(blocks, static_cast<unsigned>(count)), kThreads, 0, stream>>>(b, first, first_bad,
                                                                                    bad_count);
    return cudaGetLastError();
  });
}

}  // namespace sok_gpu
