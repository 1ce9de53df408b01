// CUDA kernels of SokPooledLookup and SokPooledLookupGrad: see pooled_lookup_kernels.h.
//
// Every kernel covers all tables of a call in one launch: the host gives each table a range of
// blocks (first_block, in its descriptor) and a block finds its table by binary search. A run of
// samples (forward: pool_run of them, about kRunIds ids) gets `pool_lanes` threads of one warp (a
// power of two, from its table's dim): they load its ids, rows of the shard and weights a lane each,
// then pass them round (shuffles) while each sums its columns alone, in the CPU kernel's order. The
// loops load kUnroll rows before they add them, so the adds stay in order while the loads overlap
// (across the samples of a run too); both directions load 4 columns at once (float4) where they can,
// and each forward block reads its table's descriptor once, into shared memory (block_table).
//
// The gradient of an id with at most kHotOccurrences occurrences is summed in a span: `grad_lanes`
// threads of one warp take as many sorted keys and stream the occurrences of the ids whose runs
// start there, as a forward run streams its ids: they load the occurrences' samples, divisors and
// weights a lane each, then pass them round (shuffles) while each adds its columns in the CPU's
// order. A hot id (more occurrences) is not summed there (one warp would hold the step for them):
// accumulate_kernel lists it, and hot_segments_kernel gives each kHotSegment of its occurrences a
// warp that sums them in order as above; an id of several segments gets their sums added in segment
// order (hot_finish_kernel). No float atomics: the order depends only on the occurrence count, so
// the bits are the same run after run; they equal the CPU's within float rounding for an id of
// several segments (the CPU adds in id order), and to the bit for the other ids.
#include "pooled_lookup_kernels.h"

#include <algorithm>
#include <climits>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <vector>

#include "pooled_order.h"
#include "common.cuh"

namespace sok_gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;
// The ids a forward run of short samples aims at (pool_run: their samples, from the mean per sample).
constexpr int64_t kRunIds = 32;
// local_row of an id that another shard holds (Table::local of pooled_lookup_ops.cc).
constexpr int64_t kNotHeld = INT64_MIN;
constexpr size_t kAlign = 256;
// A distinct id with at most this many occurrences has its gradient summed in the pass over the
// distinct ids; one with more is "hot" and summed by the hot kernels, in segments.
constexpr int64_t kHotOccurrences = 32;
constexpr int64_t kHotBlocks = 4096;  // the most blocks of the hot kernels
// The occurrences of a hot id that one warp sums in order: an id with more gets a warp per segment
// (their sums added in segment order), so that the hottest id of a batch does not hold the step to
// one warp's serial chain.
constexpr int64_t kHotSegment = 1024;
// Blocks per SM asked of the compiler (__launch_bounds__) by the kernels that gather rows: their
// loads wait on memory, so more warps in flight beat more registers per thread. The forward and the
// hot segments: 3 (80 registers, a few spilled); the spans of the gradient: 2 (3 spilled more than it
// gained). benchmarks/LOG.md has the measurements.
constexpr int kGatherBlocksPerSm = 3;
constexpr int kSpanBlocksPerSm = 2;
// The most blocks per table of the gradient's accumulation and padding: their threads stride over
// the rest (the padded gradient plans for a row per id; most of them are padding).
constexpr int64_t kSweepBlocks = 2048;

// The kernels that split their blocks by table.
enum Kind { kValidate, kPool, kDivisor, kAccumulate, kPad, kKinds };

// A table as the kernels see it: the op's table and its place in the launches.
struct TableDev {
  PooledTable t;
  int64_t first_block[kKinds];  // each kind's first block of this table
  int64_t id_base;              // the position of ids[0] among all tables' ids (gradient)
  int64_t div_base;             // its samples' divisors in the gradient's divisor array
  int64_t bound;                // pooled_grad_accumulate: its output rows (the distinct ids, or more)
  int64_t blocks[kKinds];       // each kind's blocks of this table (where its threads stride)
  int32_t shift;                // log2(stride) when stride is a power of two, else -1
  int32_t pool_lanes;           // the forward's threads per sample (dim / pool_vec up to a warp)
  int32_t pool_vec;             // the forward's columns per load: 8 (half-width rows, 16 bytes), 4 or 1
  int32_t pool_run;             // the forward's samples per pool_lanes threads (up to pool_lanes)
  int32_t grad_lanes;           // the gradient's threads per distinct id (dim / grad_vec up to a warp)
  int32_t grad_vec;             // the gradient's columns per load: 4 (float4) or 1
};

#define SOK_CUDA_RETURN(expr)              \
  do {                                     \
    const cudaError_t sok_error_ = (expr); \
    if (sok_error_ != cudaSuccess) {       \
      return sok_error_;                   \
    }                                      \
  } while (0)

int bit_width(uint64_t x) {
  int bits = 0;
  for (; x != 0; x >>= 1) ++bits;
  return bits;
}

__host__ __device__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Whether the forward of a call loads 8 columns at once (16 bytes) from every table: half-width
// rows whose dims are multiples of 8, rows and outputs 16-byte aligned. That halves the load
// instructions of 4 columns a load (the forward is bound by their count, not by the rows' bytes);
// the forward's kernel then has that one path (pool_kernel<R, true>: no registers for the others).
bool wide_call(const PooledTable* tables, int num_tables) {
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  for (int t = 0; t < num_tables; ++t) {
    const PooledTable& x = tables[t];
    if (x.row_type == kRowFloat32 || x.dim % 8 != 0 || !aligned16(x.params) || !aligned16(x.out)) return false;
  }
  return num_tables > 0;
}

// Whether every table's shard has rows below 2^31 (their row numbers travel as 32-bit values).
bool rows_fit_int32(const PooledTable* tables, int num_tables) {
  for (int t = 0; t < num_tables; ++t) {
    if (tables[t].rows > INT32_MAX) return false;
  }
  return true;
}

// The tables' descriptors, without their blocks: ids and divisors laid out table after table.
std::vector<TableDev> describe(const PooledTable* tables, int num_tables, int64_t batch) {
  std::vector<TableDev> out(num_tables);
  const bool wide = wide_call(tables, num_tables);
  int64_t id_base = 0;
  int64_t div_base = 0;
  for (int t = 0; t < num_tables; ++t) {
    TableDev& d = out[t];
    d = TableDev{};
    d.t = tables[t];
    d.id_base = id_base;
    id_base += d.t.nnz;
    d.div_base = d.t.combiner == kPooledSum ? -1 : div_base;
    if (d.t.combiner != kPooledSum) div_base += batch;
    d.shift = -1;
    for (int b = 1; b < 63; ++b) {
      if (d.t.stride == int64_t{1} << b) d.shift = b;
    }
    // 4 columns at once where rows and outputs are float4-aligned.
    const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool out4 = d.t.dim % 4 == 0 && aligned16(d.t.out);
    const auto aligned_row4 = [&d](const void* p) {  // 4 elements of the rows at once
      return reinterpret_cast<uintptr_t>(p) % (4 * row_type_bytes(d.t.row_type)) == 0;
    };
    d.pool_vec = out4 && aligned_row4(d.t.params) ? 4 : 1;
    if (wide) d.pool_vec = 8;
    d.pool_lanes = 1;
    while (d.pool_lanes < d.t.dim / d.pool_vec && d.pool_lanes < 32) d.pool_lanes <<= 1;
    const int64_t per_sample = batch > 0 ? std::max<int64_t>(ceil_div(d.t.nnz, batch), 1) : 1;
    d.pool_run = static_cast<int32_t>(std::min<int64_t>(std::max<int64_t>(kRunIds / per_sample, 1), d.pool_lanes));
    d.grad_vec = out4 && aligned16(d.t.grads) ? 4 : 1;
    d.grad_lanes = 1;
    while (d.grad_lanes < d.t.dim / d.grad_vec && d.grad_lanes < 32) d.grad_lanes <<= 1;
  }
  return out;
}

// Sets first_block[kind] from blocks(table) and returns the blocks of all tables.
template <class Blocks>
int64_t plan(std::vector<TableDev>* tables, Kind kind, Blocks blocks) {
  int64_t total = 0;
  for (TableDev& d : *tables) {
    d.first_block[kind] = total;
    d.blocks[kind] = blocks(d);
    total += d.blocks[kind];
  }
  return total;
}

int64_t validate_blocks(const TableDev& d, int64_t batch) { return ceil_div(batch + 1 + d.t.nnz, kThreads); }

// Launches kernel on blocks blocks (none when 0).
template <class Kernel, class... Args>
cudaError_t launch(Kernel kernel, int64_t blocks, cudaStream_t stream, Args... args) {
  if (blocks <= 0) return cudaSuccess;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}

// Copies the descriptors to the device (a pageable copy: the host vector may go once it returns).
cudaError_t upload(const std::vector<TableDev>& tables, void* device, cudaStream_t stream) {
  if (tables.empty()) return cudaSuccess;
  return cudaMemcpyAsync(device, tables.data(), tables.size() * sizeof(TableDev), cudaMemcpyHostToDevice, stream);
}

// ---- device helpers ----------------------------------------------------------------------------

// The table of this block for kernels of kind `kind`.
__device__ int table_of(const TableDev* tables, int num_tables, Kind kind) {
  const int64_t block = blockIdx.x;
  int lo = 0;
  int hi = num_tables - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tables[mid].first_block[kind] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The block's table, read once into shared memory: every thread of the block calls it first (a
// barrier), so that no thread reads the descriptor from global memory itself. (The forward's
// pool_kernel; the gradient's kernels keep their own copies, measured no faster this way.)
__device__ const TableDev& block_table(const TableDev* tables, int num_tables, Kind kind) {
  __shared__ TableDev shared;
  if (threadIdx.x == 0) shared = tables[table_of(tables, num_tables, kind)];
  __syncthreads();
  return shared;
}

__device__ int64_t id_at(const PooledTable& t, int64_t j) {
  return t.ids_int64 ? static_cast<const int64_t*>(t.ids)[j] : static_cast<const int32_t*>(t.ids)[j];
}

// The row of id i in the shard (negative or >= rows for an invalid id), kNotHeld when another
// shard holds it: Table::local of pooled_lookup_ops.cc, case by case.
__device__ int64_t local_row(const TableDev& d, int64_t i) {
  const int64_t stride = d.t.stride;
  if (stride == 1) return d.t.offset == 0 ? (i < -1 ? int64_t{-1} : i) : kNotHeld;
  if (d.shift >= 0) return (i & (stride - 1)) == d.t.offset ? (i >> d.shift) : kNotHeld;
  return i % stride == d.t.offset ? i / stride : kNotHeld;
}

__device__ bool valid_row(int64_t row, int64_t rows) {
  return static_cast<uint64_t>(row) < static_cast<uint64_t>(rows);
}

// Sample s's ids [begin, end), clamped to [0, nnz) so that bad row_splits read nothing outside.
__device__ void sample_range(const PooledTable& t, int64_t s, int64_t* begin, int64_t* end) {
  int64_t b = t.splits[s];
  int64_t e = t.splits[s + 1];
  b = b < 0 ? 0 : (b > t.nnz ? t.nnz : b);
  e = e < b ? b : (e > t.nnz ? t.nnz : e);
  *begin = b;
  *end = e;
}

// The divisor of sample [begin, end): divisor() of pooled_lookup_ops.cc.
__device__ float divisor(const PooledTable& t, int64_t begin, int64_t end) {
  if (t.combiner == kPooledSum) return 1.0f;
  float total = 0.0f;
  if (t.weights == nullptr) {
    total = __ll2float_rn(end - begin);
  } else {
    for (int64_t j = begin; j < end; ++j) {
      const float w = t.weights[j];
      total = __fadd_rn(total, t.combiner == kPooledMean ? w : __fmul_rn(w, w));
    }
  }
  return t.combiner == kPooledSqrtn ? __fsqrt_rn(total) : total;
}

// Columns k .. k + V - 1 of row `row` of the (rows, dim) matrix `rows` (V = 4: one float4 load).
template <int V>
__device__ void load_columns(const float* rows, int64_t row, int64_t dim, int64_t k, float* x) {
  if constexpr (V == 4) {
    const float4 q = *reinterpret_cast<const float4*>(rows + row * dim + k);
    x[0] = q.x;
    x[1] = q.y;
    x[2] = q.z;
    x[3] = q.w;
  } else {
    x[0] = rows[row * dim + k];
  }
}

// Columns k .. k + V - 1 of row `row` of the (rows, dim) matrix `rows` of type R, as float32.
template <int V, RowType R>
__device__ void load_row_columns(const void* rows, int64_t row, int64_t dim, int64_t k, float* x) {
  if constexpr (V == 8) {
    load_row_elements8<R>(rows, row * dim + k, x);
  } else if constexpr (V == 4) {
    load_row_elements4<R>(rows, row * dim + k, x);
  } else {
    x[0] = load_row_element<R>(rows, row * dim + k);
  }
}

// Columns k .. k + V - 1 of row `row` of the (rows, dim) matrix `rows` = x (load_columns' store).
template <int V>
__device__ void store_columns(float* rows, int64_t row, int64_t dim, int64_t k, const float* x) {
  if constexpr (V == 8) {
    *reinterpret_cast<float4*>(rows + row * dim + k) = make_float4(x[0], x[1], x[2], x[3]);
    *reinterpret_cast<float4*>(rows + row * dim + k + 4) = make_float4(x[4], x[5], x[6], x[7]);
  } else if constexpr (V == 4) {
    *reinterpret_cast<float4*>(rows + row * dim + k) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
    rows[row * dim + k] = x[0];
  }
}

// The lanes of this thread's sample (or distinct id) within its warp, `lanes` of them.
__device__ unsigned group_mask(int lanes) {
  return lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << (static_cast<int>(threadIdx.x & 31) & ~(lanes - 1));
}

// The held ids of [begin, end), counted by the `lanes` threads of `mask`, `lanes` at a time.
__device__ int64_t held_ids(const TableDev& d, int64_t begin, int64_t end, int lane, int lanes, unsigned mask) {
  int64_t num = 0;
  for (int64_t chunk = begin; chunk < end; chunk += lanes) {
    const int64_t j = chunk + lane;
    num += __popc(__ballot_sync(mask, j < end && valid_row(local_row(d, id_at(d.t, j)), d.t.rows)));
  }
  return num;
}

// Columns [k, k + V) of the pooled rows of the `run` samples from s0 (a run: `lanes` <= 32 threads
// of `mask`, run <= lanes). The run's ids are one stream: the lanes load `lanes` ids (row and weight)
// at a time, a lane each, and pass them round by shuffles, kUnroll rows loaded before they are added,
// so that the loads of a run of short samples overlap as those of one long sample do; each thread
// adds its columns in the CPU's order per sample (unweighted: pooled_order.h; weighted: row * w one
// after another), and writes a sample's row when the stream passes its end. Lane i holds the end of
// sample s0 + i, clamped to [begin, nnz] and made non-decreasing (a max scan), so that row_splits the
// checks refuse read nothing outside the ids. A table whose shard holds every valid id (stride 1,
// offset 0) counts a sample's ids from its row_splits; others count its held ids first (held_ids).
// (Ids the checks refuse leave such rows wrong, and the op raises.) R: the rows' type; kRows32:
// every table's rows fit an int32 (rows_fit_int32).
template <int V, RowType R, bool kRows32>
__device__ void pool_run(const TableDev& d, int64_t s0, int run, int64_t k, int lane, int lanes, unsigned mask) {
  const PooledTable& t = d.t;
  const bool column = k < t.dim;
  const bool weighted = t.weights != nullptr;
  const bool whole = t.stride == 1 && t.offset == 0;
  // Rows in flight per lane: 8 of 4 columns, 4 of 8 (the same registers).
  constexpr int kRunUnroll = V == 8 ? kUnroll / 2 : kUnroll;
  const auto clamp = [&t](int64_t x, int64_t lo) { return x < lo ? lo : (x > t.nnz ? t.nnz : x); };
  const int64_t first = clamp(t.splits[s0], 0);
  int64_t ends = lane < run ? t.splits[s0 + lane + 1] : INT64_MIN;
  for (int offset = 1; offset < lanes; offset <<= 1) {
    const int64_t before = __shfl_up_sync(mask, ends, offset, lanes);
    if (lane >= offset && before > ends) ends = before;
  }
  ends = clamp(ends, first);
  const int64_t last = __shfl_sync(mask, ends, run - 1, lanes);

  int cur = 0;  // the sample being summed, from s0
  int64_t begin = first;
  int64_t end = __shfl_sync(mask, ends, 0, lanes);
  int64_t head = 0;
  int64_t count = 0;
  float div = 1.0f;
  float out[V];
  float group[V];
  const auto start = [&]() {
    count = 0;
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = group[v] = 0.0f;
    if (!weighted) head = sok_pooled::order_head(whole ? end - begin : held_ids(d, begin, end, lane, lanes, mask));
    div = divisor(t, begin, end);
  };
  const auto finish = [&]() {
    if (!column) return;
    float r[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
      r[v] = t.combiner == kPooledSum ? out[v] : (div != 0.0f ? __fdiv_rn(out[v], div) : 0.0f);
    }
    store_columns<V>(t.out, s0 + cur, t.dim, k, r);
  };
  start();
  for (int64_t chunk = first; chunk < last; chunk += lanes) {
    const int64_t j = chunk + lane;
    int64_t row = 0;
    int held = 0;
    float w = 0.0f;
    if (j < last) {
      row = local_row(d, id_at(t, j));
      held = valid_row(row, t.rows);
      if (weighted && held) w = t.weights[j];
    }
    // Rows below 2^31 travel as one 32-bit value, -1 for an id not held: two shuffles per id with
    // its weight (else four: the row's two halves, whether held, the weight).
    const int32_t slot = held ? static_cast<int32_t>(row) : -1;
    const int64_t n = last - chunk < lanes ? last - chunk : lanes;
    for (int64_t u0 = 0; u0 < n; u0 += kRunUnroll) {
      float x[kRunUnroll][V];
      float wu[kRunUnroll];
      bool use[kRunUnroll];
#pragma unroll
      for (int u = 0; u < kRunUnroll; ++u) {
        const int src = u0 + u < n ? static_cast<int>(u0 + u) : 0;  // every lane takes part in each shuffle
        int64_t r;
        if constexpr (kRows32) {
          const int32_t s = __shfl_sync(mask, slot, src, lanes);
          r = s;
          use[u] = s >= 0 && u0 + u < n;
        } else {
          r = __shfl_sync(mask, row, src, lanes);
          use[u] = __shfl_sync(mask, held, src, lanes) != 0 && u0 + u < n;
        }
        wu[u] = __shfl_sync(mask, w, src, lanes);
#pragma unroll
        for (int v = 0; v < V; ++v) x[u][v] = 0.0f;
        if (use[u] && column) load_row_columns<V, R>(t.params, r, t.dim, k, x[u]);
      }
#pragma unroll
      for (int u = 0; u < kRunUnroll; ++u) {
        if (u0 + u >= n) break;
        // The samples that end before this id (empty ones too) are done.
        while (chunk + u0 + u >= end) {
          finish();
          ++cur;
          begin = end;
          end = __shfl_sync(mask, ends, cur, lanes);
          start();
        }
        if (!use[u]) continue;
        if (weighted) {
#pragma unroll
          for (int v = 0; v < V; ++v) out[v] = __fadd_rn(out[v], __fmul_rn(x[u][v], wu[u]));
        } else if (count < head) {
#pragma unroll
          for (int v = 0; v < V; ++v) out[v] = __fadd_rn(out[v], x[u][v]);
        } else {
          const int64_t m = (count - head) & 7;
#pragma unroll
          for (int v = 0; v < V; ++v) group[v] = m == 0 ? x[u][v] : __fadd_rn(group[v], x[u][v]);
          if (m == 7) {
#pragma unroll
            for (int v = 0; v < V; ++v) out[v] = __fadd_rn(out[v], group[v]);
          }
        }
        ++count;
      }
    }
  }
  // The last sample with ids, and the empty ones after it.
  for (;;) {
    finish();
    if (++cur >= run) break;
    begin = end;
    end = __shfl_sync(mask, ends, cur, lanes);
    start();
  }
}

// ---- kernels -----------------------------------------------------------------------------------

__global__ void init_checks_kernel(PooledCheck* checks, int num_tables) {
  const int t = blockIdx.x * kThreads + threadIdx.x;
  if (t >= num_tables) return;
  checks[t] = PooledCheck{0, 0, kPooledNone, 0, kPooledNone, 0};
}

// Where the gradient's sort keys go (keys == nullptr: the forward, none).
struct KeysOut {
  uint64_t* keys;        // (ids,): table << row_bits | row, row_mask for an id the shard does not hold
  uint32_t* positions;   // (ids,): the position among all tables' ids
  uint32_t* samples;     // (ids,): the sample of each id
  int row_bits;
  uint64_t row_mask;
};

// Items [0, batch] check row_splits entry b, items batch + 1 + j check id j (and write its key).
__global__ void validate_kernel(const TableDev* tables, int num_tables, int64_t batch, PooledCheck* checks,
                                KeysOut out) {
  const int t = table_of(tables, num_tables, kValidate);
  const TableDev d = tables[t];
  const int64_t item = (static_cast<int64_t>(blockIdx.x) - d.first_block[kValidate]) * kThreads + threadIdx.x;
  const int64_t* splits = d.t.splits;
  if (item <= batch) {
    if (splits == nullptr) return;
    if (item == 0) checks[t].first_split = splits[0];
    if (item == batch) checks[t].last_split = splits[batch];
    if (item < batch && splits[item + 1] < splits[item]) {
      atomicMin(reinterpret_cast<unsigned long long*>(&checks[t].first_decrease),
                static_cast<unsigned long long>(item));
    }
    return;
  }
  const int64_t j = item - batch - 1;
  if (j >= d.t.nnz) return;
  const int64_t row = local_row(d, id_at(d.t, j));
  const bool valid = valid_row(row, d.t.rows);
  if (!valid && row != kNotHeld) {
    atomicAdd(reinterpret_cast<unsigned long long*>(&checks[t].bad_ids), 1ull);
    atomicMin(reinterpret_cast<unsigned long long*>(&checks[t].first_bad), static_cast<unsigned long long>(j));
  }
  if (out.keys == nullptr) return;
  const int64_t p = d.id_base + j;
  out.keys[p] = (static_cast<uint64_t>(t) << out.row_bits) | (valid ? static_cast<uint64_t>(row) : out.row_mask);
  out.positions[p] = static_cast<uint32_t>(p);
  // The sample of id j: the last s < batch with splits[s] <= j (valid row_splits; else any s).
  int64_t lo = 0;
  int64_t hi = batch - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (splits[mid] <= j) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  out.samples[p] = static_cast<uint32_t>(lo < 0 ? 0 : lo);
}

// out (batch, dim) of each table: a run of `pool_run` samples per `pool_lanes` threads of a warp,
// each `pool_vec` columns at a time; the tables' rows of type R (one type per call); kWide: every
// table's pool_vec is 8 (wide_call); kRows32: every table's rows fit an int32 (rows_fit_int32).
template <RowType R, bool kWide, bool kRows32>
__global__ void __launch_bounds__(kThreads, kGatherBlocksPerSm)
    pool_kernel(const TableDev* tables, int num_tables, int64_t batch) {
  const TableDev& d = block_table(tables, num_tables, kPool);
  const int lanes = d.pool_lanes;
  const int lane = threadIdx.x & (lanes - 1);
  const unsigned mask = group_mask(lanes);
  const int64_t s0 =
      ((static_cast<int64_t>(blockIdx.x) - d.first_block[kPool]) * (kThreads / lanes) + threadIdx.x / lanes) *
      d.pool_run;
  if (s0 >= batch) return;
  const int run = static_cast<int>(batch - s0 < d.pool_run ? batch - s0 : d.pool_run);
  const int vec = d.pool_vec;
  for (int64_t k0 = 0; k0 < d.t.dim; k0 += int64_t{vec} * lanes) {
    const int64_t k = k0 + int64_t{vec} * lane;
    if constexpr (kWide) {
      pool_run<8, R, kRows32>(d, s0, run, k, lane, lanes, mask);
    } else if (vec == 4) {
      pool_run<4, R, kRows32>(d, s0, run, k, lane, lanes, mask);
    } else {
      pool_run<1, R, kRows32>(d, s0, run, k, lane, lanes, mask);
    }
  }
}

// div[div_base + s] = the divisor of sample s of each "mean" / "sqrtn" table.
__global__ void divisor_kernel(const TableDev* tables, int num_tables, int64_t batch, float* div) {
  const TableDev d = tables[table_of(tables, num_tables, kDivisor)];
  const int64_t s = (static_cast<int64_t>(blockIdx.x) - d.first_block[kDivisor]) * kThreads + threadIdx.x;
  if (s >= batch) return;
  int64_t begin = 0;
  int64_t end = 0;
  sample_range(d.t, s, &begin, &end);
  div[d.div_base + s] = divisor(d.t, begin, end);
}

// Marks the first occurrence of each held key (sorted: the head of its run, whose position is the
// smallest, the sort being stable) at its position, with the head's index in the sorted keys.
__global__ void firsts_kernel(const uint64_t* keys, const uint32_t* positions, int64_t num, uint64_t row_mask,
                              uint32_t* first, uint32_t* head_of_first) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= num) return;
  const uint64_t key = keys[i];
  if ((key & row_mask) == row_mask || (i > 0 && keys[i - 1] == key)) return;
  const uint32_t p = positions[i];
  first[p] = 1;
  head_of_first[p] = static_cast<uint32_t>(i);
}

// checks[t].distinct = the first occurrences among table t's positions; bases[t] = those of the
// tables before it (the index of its first distinct id among all tables', non-decreasing in t).
__global__ void count_kernel(const TableDev* tables, int num_tables, const uint32_t* first, const uint32_t* order,
                             int64_t num, PooledCheck* checks, int64_t* bases) {
  const int t = blockIdx.x * kThreads + threadIdx.x;
  if (t >= num_tables) return;
  const int64_t base = tables[t].id_base;
  bases[t] = base < num ? order[base] : (num > 0 ? static_cast<int64_t>(order[num - 1]) + first[num - 1] : 0);
  if (tables[t].t.nnz == 0) return;
  const int64_t last = base + tables[t].t.nnz - 1;
  checks[t].distinct = static_cast<uint64_t>(order[last]) + first[last] - order[base];
}

// head_sorted[r] = the sorted index of the head of the distinct id of rank r (first-occurrence order).
__global__ void heads_kernel(int64_t num, const uint32_t* first, const uint32_t* order, const uint32_t* head_of_first,
                             uint32_t* head_sorted) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (p >= num || first[p] == 0) return;
  head_sorted[order[p]] = head_of_first[p];
}

// Where pooled_grad_distinct left the distinct ids, and the hot ids' buffers.
struct Distinct {
  const uint64_t* keys;         // (ids,) sorted
  const uint32_t* positions;    // (ids,) in the order of keys
  const uint32_t* samples;      // (ids,) by position
  const uint32_t* head_sorted;  // (distinct,) in first-occurrence order
  const float* div;             // divisors
  const uint32_t* order;        // (ids,) by position: the rank of the distinct id whose head is there
  const int64_t* bases;         // (tables,) count_kernel's
  const PooledCheck* checks;    // (tables,) pooled_grad_distinct's
  uint64_t row_mask;
  int64_t num;
  uint32_t* hot;                // (max_hot,) the hot ids (their ranks), any order
  uint32_t* hot_count;          // how many of them
  int64_t max_hot;              // the most hot ids there can be: num / (kHotOccurrences + 1)
  uint32_t* hot_end;            // (max_hot,) the end of each hot id's run of sorted keys
  uint64_t* hot_counts;         // (max_hot + 1,) segments - 1 << 32 | partial rows (segments when > 1)
  uint64_t* hot_plan;           // (max_hot + 1,) their exclusive sums: first extra segment, first partial row
  float* partials;              // (partial rows, partial_stride) the sums of the segments of hot ids
  int64_t partial_stride;       // the widest table's dim
};

// Whether the checks of a table found its row_splits and ids valid.
__device__ bool checks_passed(const PooledCheck& c, const PooledTable& t) {
  return c.first_split == 0 && c.last_split == t.nnz && c.first_decrease == kPooledNone && c.bad_ids == 0;
}

// Columns [k, k + V) of row `out` (the gradient row of a distinct id, or a segment's sum): the
// sorted indices head, head + 1, ... before `limit` while the key is `key`, (grad / divisor) * w of
// each added in order from 0 (the CPU's order). The `lanes` threads of `mask` (one id's) load the
// occurrences' samples, divisors and weights a lane each, lanes at a time, and pass them round by
// shuffles.
template <int V>
__device__ void accumulate_columns(const TableDev& d, const Distinct& in, int64_t head, uint64_t key, int64_t limit,
                                   float* out, int64_t k, int lane, int lanes, unsigned mask) {
  const PooledTable& t = d.t;
  const bool column = k < t.dim;
  float sum[V];
#pragma unroll
  for (int v = 0; v < V; ++v) sum[v] = 0.0f;
  for (int64_t chunk = head;; chunk += lanes) {
    const int64_t i = chunk + lane;
    const bool same = i < limit && in.keys[i] == key;
    int64_t sample = 0;
    float div = 1.0f;
    float w = 1.0f;
    int use = 0;
    if (same) {
      const uint32_t p = in.positions[i];
      sample = in.samples[p];
      use = 1;
      if (t.combiner != kPooledSum) {
        div = in.div[d.div_base + sample];
        use = div != 0.0f;  // a sample whose divisor is 0 gives zeros: no gradient
      }
      if (t.weights != nullptr) w = t.weights[p - d.id_base];
    }
    // The run is a prefix of the chunk (the keys are sorted).
    const int n = __popc(__ballot_sync(mask, same));
    for (int u0 = 0; u0 < n; u0 += kUnroll) {
      float x[kUnroll][V];
      float scale_div[kUnroll];
      float scale_w[kUnroll];
      bool add[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int src = u0 + u < n ? u0 + u : 0;  // every lane of the id takes part in each shuffle
        const int64_t s = __shfl_sync(mask, sample, src, lanes);
        scale_div[u] = __shfl_sync(mask, div, src, lanes);
        scale_w[u] = __shfl_sync(mask, w, src, lanes);
        add[u] = __shfl_sync(mask, use, src, lanes) != 0 && u0 + u < n;
#pragma unroll
        for (int v = 0; v < V; ++v) x[u][v] = 0.0f;
        if (add[u] && column) load_columns<V>(t.grads, s, t.dim, k, x[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (!add[u]) continue;
#pragma unroll
        for (int v = 0; v < V; ++v) {
          float g = x[u][v];
          if (t.combiner != kPooledSum) g = __fdiv_rn(g, scale_div[u]);
          if (t.weights != nullptr) g = __fmul_rn(g, scale_w[u]);
          sum[v] = __fadd_rn(sum[v], g);
        }
      }
    }
    if (n < lanes) break;
  }
  if (column) store_columns<V>(out, 0, t.dim, k, sum);
}

// Row `out` of the distinct id whose run of sorted keys starts at head, over [head, limit): every
// column, `lanes` threads of `mask` (an id's), `vec` columns per load.
__device__ void accumulate_row(const TableDev& d, const Distinct& in, int64_t head, int64_t limit, float* out,
                               int vec, int lane, int lanes, unsigned mask) {
  const uint64_t key = in.keys[head];
  for (int64_t k0 = 0; k0 < d.t.dim; k0 += int64_t{vec} * lanes) {
    const int64_t k = k0 + int64_t{vec} * lane;
    if (vec == 4) {
      accumulate_columns<4>(d, in, head, key, limit, out, k, lane, lanes, mask);
    } else {
      accumulate_columns<1>(d, in, head, key, limit, out, k, lane, lanes, mask);
    }
  }
}

// The distinct ids of table ti that get rows: none when its checks failed, at most its bound.
__device__ int64_t rows_of(const TableDev& d, int ti, const Distinct& in) {
  const PooledCheck& check = in.checks[ti];
  if (!checks_passed(check, d.t)) return 0;
  return static_cast<int64_t>(check.distinct) < d.bound ? static_cast<int64_t>(check.distinct) : d.bound;
}

// What accumulate_span passes round about an occurrence (bits of one int).
enum Occurrence { kUse = 1, kHead = 2, kHeld = 4, kHot = 8 };

// Columns [k, k + V) of the gradient rows of the distinct ids of table d whose runs of sorted keys
// start in [h0, h1) (a span: `lanes` threads of `mask`), `rows` of them at most, the first at
// `base` among all tables' (their index is order[position] - base); with `list`, each one's id
// into out_ids and each hot one (more than kHotOccurrences occurrences) into the hot list. The
// span's occurrences are one stream, as a forward run's ids (pool_run): the lanes load `lanes`
// occurrences (key, sample, divisor, weight) at a time, a lane each, pass them round by shuffles,
// and load kUnroll gradient rows before they add them, (grad / divisor) * w in order from 0 per id
// (the CPU's order), writing an id's row where its run ends. A cold run that starts in the span
// ends within kHotOccurrences of h1; the stream stops at a hot id's head (its run reaches past h1),
// at the first run that starts at h1 or later, and at the table's keys of ids the shard does not
// hold (row_mask: sorted last).
template <int V>
__device__ void accumulate_span(const TableDev& d, const Distinct& in, int64_t h0, int64_t h1, int64_t end,
                                int64_t rows, int64_t base, bool list, int64_t k, int lane, int lanes,
                                unsigned mask) {
  const PooledTable& t = d.t;
  const bool column = k < t.dim;
  const auto held_key = [&in](uint64_t key) { return (key & in.row_mask) != in.row_mask; };
  {  // the stream starts at the span's first head
    const int64_t h = h0 + lane;
    bool head = false;
    if (h < h1) {
      const uint64_t key = in.keys[h];
      head = held_key(key) && (h == 0 || in.keys[h - 1] != key);
    }
    const unsigned heads = (__ballot_sync(mask, head) & mask) >> (static_cast<int>(threadIdx.x & 31) & ~(lanes - 1));
    if (heads == 0) return;
    h0 += __ffs(heads) - 1;
  }
  float sum[V] = {};
  int64_t index = -1;  // the open run's row, -1: none open
  const auto flush = [&]() {
    if (index < 0 || index >= rows || !column) return;
    store_columns<V>(t.out, index, t.dim, k, sum);
  };
  for (int64_t chunk = h0;; chunk += lanes) {
    const int64_t j = chunk + lane;
    uint32_t sample = 0;
    float div = 1.0f;
    float w = 1.0f;
    int flags = 0;
    int32_t at = -1;  // pooled_grad_unsupported: fewer than 2^31 ids
    if (j < end) {
      const uint64_t key = in.keys[j];
      if (held_key(key)) {
        flags = kHeld | kUse;
        const uint32_t p = in.positions[j];
        sample = in.samples[p];
        if (t.combiner != kPooledSum) {
          div = in.div[d.div_base + sample];
          if (div == 0.0f) flags &= ~kUse;  // a sample whose divisor is 0 gives zeros: no gradient
        }
        if (t.weights != nullptr) w = t.weights[p - d.id_base];
        if (j == 0 || in.keys[j - 1] != key) {
          flags |= kHead;
          at = static_cast<int32_t>(in.order[p] - base);
          const bool hot = j + kHotOccurrences < end && in.keys[j + kHotOccurrences] == key;
          if (hot) flags |= kHot;
          if (list && j < h1 && at < rows) {
            t.out_ids[at] = static_cast<int64_t>(key & in.row_mask);
            // The hot kernels sum it.
            if (hot) in.hot[atomicAdd(in.hot_count, 1u)] = static_cast<uint32_t>(base + at);
          }
        }
      }
    }
    const int64_t n = end - chunk < lanes ? end - chunk : lanes;
    bool stop = false;
    for (int64_t u0 = 0; u0 < n; u0 += kUnroll) {
      float x[kUnroll][V];
      float scale_div[kUnroll];
      float scale_w[kUnroll];
      int occurrence[kUnroll];
      int32_t row_at[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int src = u0 + u < n ? static_cast<int>(u0 + u) : 0;  // every lane of the span takes part
        const uint32_t s = __shfl_sync(mask, sample, src, lanes);
        scale_div[u] = __shfl_sync(mask, div, src, lanes);
        scale_w[u] = __shfl_sync(mask, w, src, lanes);
        const int f = __shfl_sync(mask, flags, src, lanes);
        occurrence[u] = u0 + u < n ? f : 0;
        row_at[u] = __shfl_sync(mask, at, src, lanes);
#pragma unroll
        for (int v = 0; v < V; ++v) x[u][v] = 0.0f;
        if ((occurrence[u] & kUse) != 0 && column) load_columns<V>(t.grads, s, t.dim, k, x[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (u0 + u >= n) break;
        const int f = occurrence[u];
        if ((f & (kHead | kHeld)) != kHeld) {  // a head, or an id the shard does not hold: the run ends
          flush();
          index = -1;
          if ((f & kHeld) == 0 || chunk + u0 + u >= h1 || (f & kHot) != 0) {
            stop = true;
            break;
          }
          index = row_at[u];
#pragma unroll
          for (int v = 0; v < V; ++v) sum[v] = 0.0f;
        }
        if ((f & kUse) == 0) continue;
#pragma unroll
        for (int v = 0; v < V; ++v) {
          float g = x[u][v];
          if (t.combiner != kPooledSum) g = __fdiv_rn(g, scale_div[u]);
          if (t.weights != nullptr) g = __fmul_rn(g, scale_w[u]);
          sum[v] = __fadd_rn(sum[v], g);
        }
      }
      if (stop) break;
    }
    if (stop || n < lanes) break;  // n < lanes: the table's last occurrences
  }
  flush();
}

// out (rows_of, dim) and out_ids (rows_of,) of each table: `grad_lanes` threads of a warp per span of
// as many sorted keys (accumulate_span), the table's blocks striding over its keys.
__global__ void __launch_bounds__(kThreads, kSpanBlocksPerSm)
    accumulate_kernel(const TableDev* tables, int num_tables, Distinct in) {
  const int ti = table_of(tables, num_tables, kAccumulate);
  const TableDev d = tables[ti];
  const int lanes = d.grad_lanes;
  const int lane = threadIdx.x & (lanes - 1);
  const unsigned mask = group_mask(lanes);
  const int64_t rows = rows_of(d, ti, in);
  if (rows == 0) return;
  const int64_t base = in.bases[ti];
  const int64_t end = d.id_base + d.t.nnz;  // the table's keys are [id_base, end) of the sorted keys
  const int64_t stride = d.blocks[kAccumulate] * kThreads;
  for (int64_t h0 = d.id_base + ((static_cast<int64_t>(blockIdx.x) - d.first_block[kAccumulate]) * kThreads +
                                 (threadIdx.x & ~(lanes - 1)));
       h0 < end; h0 += stride) {
    const int64_t h1 = h0 + lanes < end ? h0 + lanes : end;
    for (int64_t k0 = 0; k0 < d.t.dim; k0 += int64_t{d.grad_vec} * lanes) {
      const int64_t k = k0 + int64_t{d.grad_vec} * lane;
      if (d.grad_vec == 4) {
        accumulate_span<4>(d, in, h0, h1, end, rows, base, k0 == 0, k, lane, lanes, mask);
      } else {
        accumulate_span<1>(d, in, h0, h1, end, rows, base, k0 == 0, k, lane, lanes, mask);
      }
    }
  }
}

// out_ids[rows_of .. bound) = -1 of each table (a padded gradient).
__global__ void pad_kernel(const TableDev* tables, int num_tables, Distinct in) {
  const int ti = table_of(tables, num_tables, kPad);
  const TableDev d = tables[ti];
  const int64_t stride = d.blocks[kPad] * kThreads;
  for (int64_t i = rows_of(d, ti, in) + (static_cast<int64_t>(blockIdx.x) - d.first_block[kPad]) * kThreads +
                   threadIdx.x;
       i < d.bound; i += stride) {
    d.t.out_ids[i] = -1;
  }
}

// The table of distinct id g (a rank among all tables'): the last with bases <= g (an empty table
// before it shares its base).
__device__ int table_of_rank(const int64_t* bases, int num_tables, int64_t g) {
  int lo = 0;
  int hi = num_tables - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (bases[mid] <= g) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The first sorted index past the run of the key at head, a run longer than kHotOccurrences: gallop
// from head + kHotOccurrences (in it), then bisect (last, bound).
__device__ int64_t run_end(const Distinct& in, int64_t head) {
  const uint64_t key = in.keys[head];
  int64_t last = head + kHotOccurrences;
  int64_t step = 1;
  while (last + step < in.num && in.keys[last + step] == key) {
    last += step;
    step <<= 1;
  }
  int64_t bound = last + step < in.num ? last + step : in.num;  // not in the run
  while (bound - last > 1) {
    const int64_t mid = last + (bound - last) / 2;
    if (in.keys[mid] == key) {
      last = mid;
    } else {
      bound = mid;
    }
  }
  return bound;
}

// hot_end and hot_counts of every hot id that accumulate_kernel listed; 0 for the entries past them
// (up to max_hot + 1, so that the scan's last entry holds the totals).
__global__ void hot_plan_kernel(Distinct in) {
  const int64_t h = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (h > in.max_hot) return;
  uint64_t counts = 0;
  if (h < *in.hot_count) {
    const int64_t head = in.head_sorted[in.hot[h]];
    const int64_t end = run_end(in, head);
    in.hot_end[h] = static_cast<uint32_t>(end);
    const uint64_t segments = static_cast<uint64_t>(ceil_div(end - head, kHotSegment));
    counts = (segments - 1) << 32 | (segments > 1 ? segments : 0);
  }
  in.hot_counts[h] = counts;
}

// The segments of the hot ids, `lanes` threads of a warp per segment (a power of two: the widest
// table's columns / 4, up to 32, so that narrow tables do not leave most lanes idle), groups
// striding over them (their number is only known on the device): first each listed id's first
// segment, then the further segments of the ids of several (hot_plan: the scanned hot_counts). An
// id of one segment gets its row, one of several its segments' sums in partials (partial_stride: a
// multiple of 4, for float4 stores).
__global__ void __launch_bounds__(kThreads, kGatherBlocksPerSm)
    hot_segments_kernel(const TableDev* tables, int num_tables, Distinct in, int lanes) {
  const int64_t count = *in.hot_count;
  const int64_t items = count + static_cast<int64_t>(in.hot_plan[in.max_hot] >> 32);
  const int groups = kThreads / lanes;
  const int lane = threadIdx.x & (lanes - 1);
  const unsigned mask = group_mask(lanes);
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * groups + threadIdx.x / lanes; item < items;
       item += static_cast<int64_t>(gridDim.x) * groups) {
    int64_t lo = item;  // the hot id of a first segment
    int64_t segment = 0;
    if (item >= count) {
      // A further segment: the last id whose first further segment is <= extra (that id has some).
      const int64_t extra = item - count;
      lo = 0;
      int64_t hi = count - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) >> 1;
        if (static_cast<int64_t>(in.hot_plan[mid] >> 32) <= extra) {
          lo = mid;
        } else {
          hi = mid - 1;
        }
      }
      segment = 1 + extra - static_cast<int64_t>(in.hot_plan[lo] >> 32);
    }
    const int64_t g = in.hot[lo];
    const int ti = table_of_rank(in.bases, num_tables, g);
    const TableDev d = tables[ti];
    const int64_t head = in.head_sorted[g];
    const int64_t end = in.hot_end[lo];
    const int64_t begin = head + segment * kHotSegment;
    const int64_t stop = begin + kHotSegment < end ? begin + kHotSegment : end;
    const int64_t partial = static_cast<int64_t>(in.hot_plan[lo] & 0xffffffffu) + segment;
    float* out = begin == head && stop == end ? d.t.out + (g - in.bases[ti]) * d.t.dim
                                              : in.partials + partial * in.partial_stride;
    accumulate_row(d, in, begin, stop, out, d.grad_vec, lane, lanes, mask);
  }
}

// The row of each hot id of several segments: their sums added in segment order, from 0.
__global__ void hot_finish_kernel(const TableDev* tables, int num_tables, Distinct in) {
  const uint32_t count = *in.hot_count;
  for (int64_t h = blockIdx.x; h < count; h += gridDim.x) {
    const int64_t first = static_cast<int64_t>(in.hot_plan[h] & 0xffffffffu);
    const int64_t parts = static_cast<int64_t>(in.hot_plan[h + 1] & 0xffffffffu) - first;
    if (parts == 0) continue;  // one segment: hot_segments_kernel wrote its row
    const int64_t g = in.hot[h];
    const int ti = table_of_rank(in.bases, num_tables, g);
    const PooledTable& t = tables[ti].t;
    for (int64_t k = threadIdx.x; k < t.dim; k += blockDim.x) {
      float sum = 0.0f;
      for (int64_t j = 0; j < parts; ++j) sum = __fadd_rn(sum, in.partials[(first + j) * in.partial_stride + k]);
      t.out[(g - in.bases[ti]) * t.dim + k] = sum;
    }
  }
}

// ---- the gradient's workspace --------------------------------------------------------------------

// Byte offsets of the gradient's buffers in its workspace, and the sizes they follow from.
struct GradLayout {
  int64_t num_ids = 0;  // all tables' ids
  int64_t num_div = 0;  // divisors: batch per "mean" / "sqrtn" table
  int row_bits = 0;     // bits of a row in a sort key (the table index above them)
  int key_bits = 1;
  int64_t max_hot = 0;         // hot ids: at most num_ids / (kHotOccurrences + 1)
  int64_t partial_rows = 0;    // segments of hot ids of several: fewer than 2 num_ids / kHotSegment
  int64_t partial_stride = 0;  // the widest table's dim, rounded up to a multiple of 4
  size_t tables = 0, keys_in = 0, keys_out = 0, positions_in = 0, positions_out = 0, samples = 0, first = 0,
         order = 0, div = 0, bases = 0, hot = 0, hot_count = 0, hot_end = 0, hot_counts = 0, hot_plan = 0, partials = 0,
         temp = 0;
  size_t temp_bytes = 0;
  size_t total = 0;
  uint64_t row_mask() const { return row_bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << row_bits) - 1; }
};

cudaError_t grad_layout(const PooledTable* tables, int num_tables, int64_t batch, GradLayout* layout) {
  GradLayout& l = *layout;
  l = GradLayout{};
  int64_t max_rows = 0;
  for (int t = 0; t < num_tables; ++t) {
    l.num_ids += tables[t].nnz;
    max_rows = std::max(max_rows, tables[t].rows);
    l.partial_stride = std::max(l.partial_stride, tables[t].dim);
    if (tables[t].combiner != kPooledSum) l.num_div += batch;
  }
  l.max_hot = l.num_ids / (kHotOccurrences + 1);
  // An id of s > 1 segments has more than (s - 1) kHotSegment occurrences, so s < 2 occurrences / kHotSegment.
  l.partial_rows = 2 * l.num_ids / kHotSegment + 1;
  l.partial_stride = ceil_div(l.partial_stride, 4) * 4;
  // row_mask (all ones) is above every row of every table: the key of an id the shard does not hold.
  l.row_bits = bit_width(static_cast<uint64_t>(max_rows));
  l.key_bits = std::max(1, l.row_bits + bit_width(static_cast<uint64_t>(num_tables - 1)));
  const size_t n = static_cast<size_t>(l.num_ids);
  size_t offset = 0;
  auto take = [&offset](size_t bytes) {
    const size_t at = offset;
    offset += aligned(bytes);
    return at;
  };
  l.tables = take(num_tables * sizeof(TableDev));
  l.keys_in = take(n * sizeof(uint64_t));  // then head_sorted
  l.keys_out = take(n * sizeof(uint64_t));
  l.positions_in = take(n * sizeof(uint32_t));  // then head_of_first
  l.positions_out = take(n * sizeof(uint32_t));
  l.samples = take(n * sizeof(uint32_t));
  l.first = take(n * sizeof(uint32_t));
  l.order = take(n * sizeof(uint32_t));
  l.div = take(static_cast<size_t>(l.num_div) * sizeof(float));
  l.bases = take(static_cast<size_t>(num_tables) * sizeof(int64_t));
  l.hot = take(static_cast<size_t>(l.max_hot) * sizeof(uint32_t));
  l.hot_end = take(static_cast<size_t>(l.max_hot) * sizeof(uint32_t));
  l.hot_counts = take(static_cast<size_t>(l.max_hot + 1) * sizeof(uint64_t));
  l.hot_plan = take(static_cast<size_t>(l.max_hot + 1) * sizeof(uint64_t));
  l.partials = take(static_cast<size_t>(l.partial_rows * l.partial_stride) * sizeof(float));
  if (l.num_ids > 0) {
    const int num = static_cast<int>(l.num_ids);
    size_t sort_bytes = 0;
    size_t scan_bytes = 0;
    SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const uint64_t*>(nullptr),
                                                    static_cast<uint64_t*>(nullptr),
                                                    static_cast<const uint32_t*>(nullptr),
                                                    static_cast<uint32_t*>(nullptr), num, 0, l.key_bits));
    size_t plan_bytes = 0;
    SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const uint32_t*>(nullptr),
                                                  static_cast<uint32_t*>(nullptr), num));
    SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, plan_bytes, static_cast<const uint64_t*>(nullptr),
                                                  static_cast<uint64_t*>(nullptr), static_cast<int>(l.max_hot + 1)));
    l.temp_bytes = std::max({sort_bytes, scan_bytes, plan_bytes});
  }
  l.hot_count = take(sizeof(uint32_t));
  l.temp = take(l.temp_bytes);
  l.total = offset;
  return cudaSuccess;
}

template <class T>
T* at(void* workspace, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(workspace) + offset);
}

// forward(pool_kernel<R, ...>) with the kernel's flags (wide: float32 rows have no wide kernel).
template <RowType R, class Forward>
cudaError_t pool_forward_of(bool wide, bool rows32, Forward forward) {
  if constexpr (R != kRowFloat32) {
    if (wide) return rows32 ? forward(pool_kernel<R, true, true>) : forward(pool_kernel<R, true, false>);
  }
  return rows32 ? forward(pool_kernel<R, false, true>) : forward(pool_kernel<R, false, false>);
}

// pool_kernel of the call's row type and flags over `blocks` blocks (descriptors already at dev).
cudaError_t launch_pool(const PooledTable* tables, int num_tables, int64_t batch, int64_t blocks, const TableDev* dev,
                        cudaStream_t stream) {
  const bool wide = wide_call(tables, num_tables);
  const bool rows32 = rows_fit_int32(tables, num_tables);
  const auto forward = [&](auto kernel) { return launch(kernel, blocks, stream, dev, num_tables, batch); };
  switch (tables[0].row_type) {  // the same for every table of the call
    case kRowFloat16:
      return pool_forward_of<kRowFloat16>(wide, rows32, forward);
    case kRowBFloat16:
      return pool_forward_of<kRowBFloat16>(wide, rows32, forward);
    default:
      return pool_forward_of<kRowFloat32>(wide, rows32, forward);
  }
}

}  // namespace

size_t pooled_forward_workspace_bytes(int num_tables) {
  return aligned(static_cast<size_t>(std::max(num_tables, 0)) * sizeof(TableDev));
}

cudaError_t pooled_validate(const PooledTable* tables, int num_tables, int64_t batch, void* workspace,
                            PooledCheck* checks, cudaStream_t stream) {
  if (num_tables <= 0) return cudaSuccess;
  std::vector<TableDev> d = describe(tables, num_tables, batch);
  const int64_t blocks = plan(&d, kValidate, [batch](const TableDev& x) { return validate_blocks(x, batch); });
  auto* dev = static_cast<TableDev*>(workspace);
  SOK_CUDA_RETURN(upload(d, dev, stream));
  SOK_CUDA_RETURN(launch(init_checks_kernel, ceil_div(num_tables, kThreads), stream, checks, num_tables));
  return launch(validate_kernel, blocks, stream, static_cast<const TableDev*>(dev), num_tables, batch, checks,
                KeysOut{nullptr, nullptr, nullptr, 0, 0});
}

cudaError_t pooled_pool(const PooledTable* tables, int num_tables, int64_t batch, void* workspace,
                        cudaStream_t stream) {
  if (num_tables <= 0) return cudaSuccess;
  std::vector<TableDev> d = describe(tables, num_tables, batch);
  const int64_t pool = plan(&d, kPool, [batch](const TableDev& x) {
    return x.t.dim > 0 ? ceil_div(ceil_div(batch, x.pool_run), kThreads / x.pool_lanes) : int64_t{0};
  });
  auto* dev = static_cast<TableDev*>(workspace);
  SOK_CUDA_RETURN(upload(d, dev, stream));
  return launch_pool(tables, num_tables, batch, pool, dev, stream);
}

cudaError_t pooled_forward(const PooledTable* tables, int num_tables, int64_t batch, void* workspace,
                           PooledCheck* checks, cudaStream_t stream) {
  if (num_tables <= 0) return cudaSuccess;
  std::vector<TableDev> d = describe(tables, num_tables, batch);
  const int64_t validate = plan(&d, kValidate, [batch](const TableDev& x) { return validate_blocks(x, batch); });
  const int64_t pool = plan(&d, kPool, [batch](const TableDev& x) {
    return x.t.dim > 0 ? ceil_div(ceil_div(batch, x.pool_run), kThreads / x.pool_lanes) : int64_t{0};
  });
  auto* dev = static_cast<TableDev*>(workspace);
  SOK_CUDA_RETURN(upload(d, dev, stream));
  SOK_CUDA_RETURN(launch(init_checks_kernel, ceil_div(num_tables, kThreads), stream, checks, num_tables));
  SOK_CUDA_RETURN(launch(validate_kernel, validate, stream, static_cast<const TableDev*>(dev), num_tables, batch,
                         checks, KeysOut{nullptr, nullptr, nullptr, 0, 0}));
  return launch_pool(tables, num_tables, batch, pool, dev, stream);
}

const char* pooled_grad_unsupported(const PooledTable* tables, int num_tables, int64_t batch) {
  int64_t num_ids = 0;
  int64_t max_rows = 0;
  for (int t = 0; t < num_tables; ++t) {
    num_ids += tables[t].nnz;
    max_rows = std::max(max_rows, tables[t].rows);
  }
  if (num_ids > INT_MAX) return "more than 2^31 - 1 ids in all tables of one call";
  if (batch > INT_MAX) return "a batch of more than 2^31 - 1 samples";
  if (bit_width(static_cast<uint64_t>(max_rows)) + bit_width(static_cast<uint64_t>(std::max(num_tables, 1) - 1)) > 64) {
    return "more table rows and tables than a 64-bit sort key holds (bits of the most rows + bits of the table count "
           "> 64)";
  }
  return nullptr;
}

cudaError_t pooled_grad_workspace_bytes(const PooledTable* tables, int num_tables, int64_t batch, size_t* bytes) {
  if (pooled_grad_unsupported(tables, num_tables, batch) != nullptr) return cudaErrorInvalidValue;
  GradLayout layout;
  SOK_CUDA_RETURN(grad_layout(tables, num_tables, batch, &layout));
  *bytes = layout.total;
  return cudaSuccess;
}

cudaError_t pooled_grad_distinct(const PooledTable* tables, int num_tables, int64_t batch, void* workspace,
                                 size_t workspace_bytes, PooledCheck* checks, cudaStream_t stream) {
  if (num_tables <= 0) return cudaSuccess;
  if (pooled_grad_unsupported(tables, num_tables, batch) != nullptr) return cudaErrorInvalidValue;
  GradLayout l;
  SOK_CUDA_RETURN(grad_layout(tables, num_tables, batch, &l));
  if (workspace_bytes < l.total) return cudaErrorInvalidValue;
  std::vector<TableDev> d = describe(tables, num_tables, batch);
  const int64_t validate = plan(&d, kValidate, [batch](const TableDev& x) { return validate_blocks(x, batch); });
  const int64_t divisors = plan(&d, kDivisor, [batch](const TableDev& x) {
    return x.t.combiner != kPooledSum ? ceil_div(batch, kThreads) : int64_t{0};
  });
  auto* dev = at<TableDev>(workspace, l.tables);
  auto* keys_in = at<uint64_t>(workspace, l.keys_in);
  auto* keys_out = at<uint64_t>(workspace, l.keys_out);
  auto* positions_in = at<uint32_t>(workspace, l.positions_in);
  auto* positions_out = at<uint32_t>(workspace, l.positions_out);
  auto* samples = at<uint32_t>(workspace, l.samples);
  auto* first = at<uint32_t>(workspace, l.first);
  auto* order = at<uint32_t>(workspace, l.order);
  // Dead after the sort: their room takes the heads.
  auto* head_of_first = positions_in;
  auto* head_sorted = reinterpret_cast<uint32_t*>(keys_in);
  SOK_CUDA_RETURN(upload(d, dev, stream));
  SOK_CUDA_RETURN(launch(init_checks_kernel, ceil_div(num_tables, kThreads), stream, checks, num_tables));
  SOK_CUDA_RETURN(launch(validate_kernel, validate, stream, static_cast<const TableDev*>(dev), num_tables, batch,
                         checks, KeysOut{keys_in, positions_in, samples, l.row_bits, l.row_mask()}));
  SOK_CUDA_RETURN(launch(divisor_kernel, divisors, stream, static_cast<const TableDev*>(dev), num_tables, batch,
                         at<float>(workspace, l.div)));
  if (l.num_ids == 0) return cudaSuccess;
  const int num = static_cast<int>(l.num_ids);
  const int64_t blocks = ceil_div(l.num_ids, kThreads);
  size_t temp_bytes = l.temp_bytes;
  SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(at<void>(workspace, l.temp), temp_bytes,
                                                  static_cast<const uint64_t*>(keys_in), keys_out,
                                                  static_cast<const uint32_t*>(positions_in), positions_out, num, 0,
                                                  l.key_bits, stream));
  SOK_CUDA_RETURN(cudaMemsetAsync(first, 0, static_cast<size_t>(num) * sizeof(uint32_t), stream));
  SOK_CUDA_RETURN(launch(firsts_kernel, blocks, stream, static_cast<const uint64_t*>(keys_out),
                         static_cast<const uint32_t*>(positions_out), l.num_ids, l.row_mask(), first, head_of_first));
  temp_bytes = l.temp_bytes;
  SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(at<void>(workspace, l.temp), temp_bytes,
                                                static_cast<const uint32_t*>(first), order, num, stream));
  SOK_CUDA_RETURN(launch(count_kernel, ceil_div(num_tables, kThreads), stream, static_cast<const TableDev*>(dev),
                         num_tables, static_cast<const uint32_t*>(first), static_cast<const uint32_t*>(order),
                         l.num_ids, checks, at<int64_t>(workspace, l.bases)));
  return launch(heads_kernel, blocks, stream, l.num_ids, static_cast<const uint32_t*>(first),
                static_cast<const uint32_t*>(order), static_cast<const uint32_t*>(head_of_first), head_sorted);
}

cudaError_t pooled_grad_accumulate(const PooledTable* tables, const uint64_t* bound, bool padded,
                                   const PooledCheck* checks, int num_tables, int64_t batch, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream) {
  if (num_tables <= 0) return cudaSuccess;
  if (pooled_grad_unsupported(tables, num_tables, batch) != nullptr) return cudaErrorInvalidValue;
  GradLayout l;
  SOK_CUDA_RETURN(grad_layout(tables, num_tables, batch, &l));
  if (workspace_bytes < l.total) return cudaErrorInvalidValue;
  std::vector<TableDev> d = describe(tables, num_tables, batch);
  for (int t = 0; t < num_tables; ++t) d[t].bound = static_cast<int64_t>(bound[t]);
  const int64_t blocks = plan(&d, kAccumulate, [](const TableDev& x) {
    return x.bound > 0 ? std::min(ceil_div(x.t.nnz, kThreads), kSweepBlocks) : int64_t{0};
  });
  const int64_t pad_blocks = plan(&d, kPad, [padded](const TableDev& x) {
    return padded ? std::min(ceil_div(x.bound, kThreads), kSweepBlocks) : int64_t{0};
  });
  auto* dev = at<TableDev>(workspace, l.tables);
  SOK_CUDA_RETURN(upload(d, dev, stream));
  auto* hot_count = at<uint32_t>(workspace, l.hot_count);
  const Distinct in{at<uint64_t>(workspace, l.keys_out),
                    at<uint32_t>(workspace, l.positions_out),
                    at<uint32_t>(workspace, l.samples),
                    at<uint32_t>(workspace, l.keys_in),
                    at<float>(workspace, l.div),
                    at<uint32_t>(workspace, l.order),
                    at<int64_t>(workspace, l.bases),
                    checks,
                    l.row_mask(),
                    l.num_ids,
                    at<uint32_t>(workspace, l.hot),
                    hot_count,
                    l.max_hot,
                    at<uint32_t>(workspace, l.hot_end),
                    at<uint64_t>(workspace, l.hot_counts),
                    at<uint64_t>(workspace, l.hot_plan),
                    at<float>(workspace, l.partials),
                    l.partial_stride};
  SOK_CUDA_RETURN(cudaMemsetAsync(hot_count, 0, sizeof(uint32_t), stream));
  SOK_CUDA_RETURN(launch(accumulate_kernel, blocks, stream, static_cast<const TableDev*>(dev), num_tables, in));
  SOK_CUDA_RETURN(launch(pad_kernel, pad_blocks, stream, static_cast<const TableDev*>(dev), num_tables, in));
  // The hot ids (their count is only on the device: blocks past it exit at once): each one's
  // segments, their first segment and partial row (a scan), the segments, the ids of several.
  if (l.max_hot == 0) return cudaSuccess;
  SOK_CUDA_RETURN(launch(hot_plan_kernel, ceil_div(l.max_hot + 1, kThreads), stream, in));
  size_t temp_bytes = l.temp_bytes;
  SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(at<void>(workspace, l.temp), temp_bytes,
                                                static_cast<const uint64_t*>(in.hot_counts), in.hot_plan,
                                                static_cast<int>(l.max_hot + 1), stream));
  // At most max_hot ids of one segment, and fewer than partial_rows segments of the others.
  int64_t max_dim = 0;
  for (const TableDev& x : d) max_dim = std::max(max_dim, x.bound > 0 ? x.t.dim : int64_t{0});
  int lanes = 1;
  while (lanes < max_dim / 4 && lanes < 32) lanes <<= 1;
  const int64_t hot_blocks = std::min(ceil_div(l.max_hot + l.partial_rows, kThreads / lanes), kHotBlocks);
  SOK_CUDA_RETURN(
      launch(hot_segments_kernel, hot_blocks, stream, static_cast<const TableDev*>(dev), num_tables, in, lanes));
  return launch(hot_finish_kernel, std::min(l.max_hot, kHotBlocks), stream, static_cast<const TableDev*>(dev),
                num_tables, in);
}

}  // namespace sok_gpu
