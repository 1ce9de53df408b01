// CUDA kernels of SokPooledLookup and SokPooledLookupGrad: see pooled_lookup_kernels.h.
//
// Every kernel covers all tables of a call in one launch: the host gives each table a range of
// blocks (first_block, in its descriptor) and a block finds its table by binary search. A sample
// (forward) or a distinct id (gradient) gets `lanes` threads (a power of two up to a block, from its
// table's dim), each summing the columns lane, lane + lanes, ... alone, in the CPU kernel's order.
// The loops load kUnroll ids' rows before they add them, so the adds stay in order while the loads
// overlap; the forward loads 4 columns at once (float4) where it can, and each of its blocks reads
// its table's descriptor once, into shared memory (block_table).
//
// The gradient of a hot id (more than kHotOccurrences occurrences) is not summed by one thread per
// column, a serial chain as long as its occurrences: accumulate_kernel lists it, and
// accumulate_hot_kernel gives it a block per 32-column tile whose 32 warps each sum every 32nd
// occurrence in order, then add their partial sums in a fixed tree (hot_sum). No float atomics: the
// order depends only on the occurrence count, so the bits are the same run after run; they equal
// the CPU's within float rounding (the CPU adds in id order), and to the bit for the other ids.
#include "pooled_lookup_kernels.h"

#include <algorithm>
#include <climits>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <vector>

#include "common.cuh"

namespace sok_gpu {
namespace {

using detail::hot_sum;
using detail::kHotColumns;
using detail::kHotThreads;

constexpr int kThreads = 256;
constexpr int kUnroll = 8;
// local_row of an id that another shard holds (Table::local of pooled_lookup_ops.cc).
constexpr int64_t kNotHeld = INT64_MIN;
constexpr size_t kAlign = 256;
// T: a distinct id with at most this many occurrences has its gradient summed serially in the CPU's
// order (bit-exact); one with more is "hot" and summed in a fixed parallel order (hot_sum).
constexpr int64_t kHotOccurrences = 32;
constexpr int64_t kHotBlocks = 1024;                     // the most hot blocks per column tile
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
  int32_t lanes;                // threads per sample or distinct id
  int32_t pool_lanes;           // the forward's threads per sample (lanes, or dim / 4 with pool_vec 4)
  int32_t pool_vec;             // the forward's columns per load: 4 (float4) or 1
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

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The tables' descriptors, without their blocks: ids and divisors laid out table after table.
std::vector<TableDev> describe(const PooledTable* tables, int num_tables, int64_t batch) {
  std::vector<TableDev> out(num_tables);
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
    d.lanes = 1;
    while (d.lanes < d.t.dim && d.lanes < kThreads) d.lanes <<= 1;
    // The forward loads 4 columns at once where rows and outputs are float4-aligned and unweighted.
    const bool vec = d.t.dim % 4 == 0 && d.t.weights == nullptr && reinterpret_cast<uintptr_t>(d.t.params) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(d.t.out) % 16 == 0;
    d.pool_vec = vec ? 4 : 1;
    d.pool_lanes = 1;
    while (d.pool_lanes < d.t.dim / d.pool_vec && d.pool_lanes < kThreads) d.pool_lanes <<= 1;
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

__device__ float4 add4(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

// Column k of the sum of the held rows of [begin, end) (num of them) in sum_rows' order: the first
// `head` one after another, then each further 8 summed apart and added.
__device__ float sum_rows(const TableDev& d, int64_t begin, int64_t end, int64_t head, int64_t k) {
  const PooledTable& t = d.t;
  float out = 0.0f;
  float group = 0.0f;
  int64_t count = 0;
  for (int64_t j0 = begin; j0 < end; j0 += kUnroll) {
    float x[kUnroll];
    bool held[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      held[u] = false;
      x[u] = 0.0f;
      if (j0 + u < end) {
        const int64_t row = local_row(d, id_at(t, j0 + u));
        held[u] = valid_row(row, t.rows);
        if (held[u]) x[u] = t.params[row * t.dim + k];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!held[u]) continue;
      if (count < head) {
        out = __fadd_rn(out, x[u]);
      } else {
        const int64_t m = (count - head) & 7;
        group = m == 0 ? x[u] : __fadd_rn(group, x[u]);
        if (m == 7) out = __fadd_rn(out, group);
      }
      ++count;
    }
  }
  return out;
}

// Columns k .. k + 3 of sum_rows at once (float4 loads; each column added in sum_rows' order).
__device__ float4 sum_rows4(const TableDev& d, int64_t begin, int64_t end, int64_t head, int64_t k) {
  const PooledTable& t = d.t;
  float4 out = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 group = out;
  int64_t count = 0;
  for (int64_t j0 = begin; j0 < end; j0 += kUnroll) {
    float4 x[kUnroll];
    bool held[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      held[u] = false;
      x[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (j0 + u < end) {
        const int64_t row = local_row(d, id_at(t, j0 + u));
        held[u] = valid_row(row, t.rows);
        if (held[u]) x[u] = *reinterpret_cast<const float4*>(t.params + row * t.dim + k);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!held[u]) continue;
      if (count < head) {
        out = add4(out, x[u]);
      } else {
        const int64_t m = (count - head) & 7;
        group = m == 0 ? x[u] : add4(group, x[u]);
        if (m == 7) out = add4(out, group);
      }
      ++count;
    }
  }
  return out;
}

// Column k of the sum of row * w of the held ids of [begin, end), one after another.
__device__ float sum_weighted_rows(const TableDev& d, int64_t begin, int64_t end, int64_t k) {
  const PooledTable& t = d.t;
  float out = 0.0f;
  for (int64_t j0 = begin; j0 < end; j0 += kUnroll) {
    float x[kUnroll];
    float w[kUnroll];
    bool held[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      held[u] = false;
      x[u] = 0.0f;
      w[u] = 0.0f;
      if (j0 + u < end) {
        const int64_t row = local_row(d, id_at(t, j0 + u));
        held[u] = valid_row(row, t.rows);
        if (held[u]) {
          x[u] = t.params[row * t.dim + k];
          w[u] = t.weights[j0 + u];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (held[u]) out = __fadd_rn(out, __fmul_rn(x[u], w[u]));
    }
  }
  return out;
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

// out (batch, dim) of each table: one sample per `pool_lanes` threads, each `pool_vec` columns at a
// time.
__global__ void pool_kernel(const TableDev* tables, int num_tables, int64_t batch) {
  const TableDev& d = block_table(tables, num_tables, kPool);
  const PooledTable& t = d.t;
  const int lanes = d.pool_lanes;
  const int lane = threadIdx.x & (lanes - 1);
  const int64_t s =
      (static_cast<int64_t>(blockIdx.x) - d.first_block[kPool]) * (kThreads / lanes) + threadIdx.x / lanes;
  if (s >= batch) return;
  int64_t begin = 0;
  int64_t end = 0;
  sample_range(t, s, &begin, &end);
  const float div = divisor(t, begin, end);
  float* out = t.out + s * t.dim;
  int64_t head = 0;
  if (t.weights == nullptr) {
    int64_t num = 0;
    for (int64_t j = begin; j < end; ++j) num += valid_row(local_row(d, id_at(t, j)), t.rows) ? 1 : 0;
    const int64_t rest = num & 7;
    head = num == 1 ? 1 : (rest == 0 ? (num < 8 ? num : 8) : (rest == 1 ? 9 : rest));
  }
  const auto combine = [&](float sum) {
    return t.combiner == kPooledSum ? sum : (div != 0.0f ? __fdiv_rn(sum, div) : 0.0f);
  };
  if (d.pool_vec == 4) {
    for (int64_t k = 4 * lane; k < t.dim; k += 4 * lanes) {
      const float4 sum = sum_rows4(d, begin, end, head, k);
      *reinterpret_cast<float4*>(out + k) = make_float4(combine(sum.x), combine(sum.y), combine(sum.z), combine(sum.w));
    }
    return;
  }
  for (int64_t k = lane; k < t.dim; k += lanes) {
    out[k] = combine(t.weights == nullptr ? sum_rows(d, begin, end, head, k) : sum_weighted_rows(d, begin, end, k));
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

// Where pooled_grad_distinct left the distinct ids.
struct Distinct {
  const uint64_t* keys;         // (ids,) sorted
  const uint32_t* positions;    // (ids,) in the order of keys
  const uint32_t* samples;      // (ids,) by position
  const uint32_t* head_sorted;  // (distinct,) in first-occurrence order
  const float* div;             // divisors
  const int64_t* bases;         // (tables,) count_kernel's
  const PooledCheck* checks;    // (tables,) pooled_grad_distinct's
  uint64_t row_mask;
  int64_t num;
  uint32_t* hot;                // (distinct of all tables,) the hot ids (bases[t] + index), any order
  uint32_t* hot_count;          // how many of them
};

// Whether the checks of a table found its row_splits and ids valid.
__device__ bool checks_passed(const PooledCheck& c, const PooledTable& t) {
  return c.first_split == 0 && c.last_split == t.nnz && c.first_decrease == kPooledNone && c.bad_ids == 0;
}

// The term of occurrence i (a sorted index) in column k of the gradient of table d.
__device__ float grad_term(const TableDev& d, const Distinct& in, int64_t i, int64_t k) {
  const PooledTable& t = d.t;
  const uint32_t p = in.positions[i];
  const int64_t s = in.samples[p];
  float x = t.grads[s * t.dim + k];
  if (t.combiner != kPooledSum) {
    const float div = in.div[d.div_base + s];
    if (div == 0.0f) return 0.0f;  // a sample whose divisor is 0 gives zeros: no gradient
    x = __fdiv_rn(x, div);
  }
  if (t.weights != nullptr) x = __fmul_rn(x, t.weights[p - d.id_base]);
  return x;
}

// Distinct id `index` of table d (`rank` among all tables'): its id and its gradient row, or, for a
// hot id, its place in the hot list (accumulate_hot_kernel sums it).
__device__ void accumulate_one(const TableDev& d, const Distinct& in, int64_t rank, int64_t index, int lane) {
  const PooledTable& t = d.t;
  const int lanes = d.lanes;
  const int64_t head = in.head_sorted[rank];
  const uint64_t key = in.keys[head];
  if (lane == 0) t.out_ids[index] = static_cast<int64_t>(key & in.row_mask);
  if (head + kHotOccurrences < in.num && in.keys[head + kHotOccurrences] == key) {
    // More than kHotOccurrences occurrences (the keys are sorted): accumulate_hot_kernel's.
    if (lane == 0) in.hot[atomicAdd(in.hot_count, 1u)] = static_cast<uint32_t>(rank);
    return;
  }
  for (int64_t k = lane; k < t.dim; k += lanes) {
    float sum = 0.0f;
    bool more = true;
    for (int64_t i0 = head; more; i0 += kUnroll) {
      float g[kUnroll];
      bool add[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + u;
        const bool same = i < in.num && in.keys[i] == key;
        add[u] = false;
        g[u] = 0.0f;
        if (same) {
          const uint32_t p = in.positions[i];
          const int64_t s = in.samples[p];
          float x = t.grads[s * t.dim + k];
          bool use = true;
          if (t.combiner != kPooledSum) {
            const float div = in.div[d.div_base + s];
            use = div != 0.0f;  // a sample whose divisor is 0 gives zeros: no gradient
            x = __fdiv_rn(x, div);
          }
          if (t.weights != nullptr) x = __fmul_rn(x, t.weights[p - d.id_base]);
          add[u] = use;
          g[u] = x;
        }
        if (u == kUnroll - 1) more = same;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (add[u]) sum = __fadd_rn(sum, g[u]);
      }
    }
    t.out[index * t.dim + k] = sum;
  }
}

// The distinct ids of table ti that get rows: none when its checks failed, at most its bound.
__device__ int64_t rows_of(const TableDev& d, int ti, const Distinct& in) {
  const PooledCheck& check = in.checks[ti];
  if (!checks_passed(check, d.t)) return 0;
  return static_cast<int64_t>(check.distinct) < d.bound ? static_cast<int64_t>(check.distinct) : d.bound;
}

// out (rows_of, dim) and out_ids (rows_of,) of each table: one distinct id per `lanes` threads,
// the table's blocks striding over its ids.
__global__ void accumulate_kernel(const TableDev* tables, int num_tables, Distinct in) {
  const int ti = table_of(tables, num_tables, kAccumulate);
  const TableDev d = tables[ti];
  const int lanes = d.lanes;
  const int lane = threadIdx.x & (lanes - 1);
  const int64_t distinct = rows_of(d, ti, in);
  const int64_t stride = d.blocks[kAccumulate] * (kThreads / lanes);
  for (int64_t index = (static_cast<int64_t>(blockIdx.x) - d.first_block[kAccumulate]) * (kThreads / lanes) +
                       threadIdx.x / lanes;
       index < distinct; index += stride) {
    accumulate_one(d, in, in.bases[ti] + index, index, lane);
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

// out (distinct, dim) of the hot ids that accumulate_kernel listed: a block per (hot id, column tile
// blockIdx.y), blocks striding over the list (its length is only known on the device).
__global__ void __launch_bounds__(kHotThreads)
    accumulate_hot_kernel(const TableDev* tables, int num_tables, Distinct in) {
  const uint32_t count = *in.hot_count;
  const int64_t k = static_cast<int64_t>(blockIdx.y) * kHotColumns + threadIdx.x % kHotColumns;
  for (uint32_t h = blockIdx.x; h < count; h += gridDim.x) {
    const int64_t g = in.hot[h];
    // Its table: the last with bases <= g (an empty table before it shares its base).
    int lo = 0;
    int hi = num_tables - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (in.bases[mid] <= g) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const TableDev d = tables[lo];
    if (static_cast<int64_t>(blockIdx.y) * kHotColumns >= d.t.dim) continue;  // the whole block
    const int64_t head = in.head_sorted[g];
    const uint64_t key = in.keys[head];
    // end = the first sorted index past the id's run: gallop from head + kHotOccurrences (in it),
    // then bisect (last, bound).
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
    const float sum = hot_sum(head, bound, k < d.t.dim, [&](int64_t i) { return grad_term(d, in, i, k); });
    if (threadIdx.x < kHotColumns && k < d.t.dim) d.t.out[(g - in.bases[lo]) * d.t.dim + k] = sum;
  }
}

// ---- the gradient's workspace --------------------------------------------------------------------

// Byte offsets of the gradient's buffers in its workspace, and the sizes they follow from.
struct GradLayout {
  int64_t num_ids = 0;  // all tables' ids
  int64_t num_div = 0;  // divisors: batch per "mean" / "sqrtn" table
  int row_bits = 0;     // bits of a row in a sort key (the table index above them)
  int key_bits = 1;
  size_t tables = 0, keys_in = 0, keys_out = 0, positions_in = 0, positions_out = 0, samples = 0, first = 0,
         order = 0, div = 0, bases = 0, hot_count = 0, temp = 0;
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
    if (tables[t].combiner != kPooledSum) l.num_div += batch;
  }
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
  l.order = take(n * sizeof(uint32_t));  // then the hot ids
  l.div = take(static_cast<size_t>(l.num_div) * sizeof(float));
  l.bases = take(static_cast<size_t>(num_tables) * sizeof(int64_t));
  if (l.num_ids > 0) {
    const int num = static_cast<int>(l.num_ids);
    size_t sort_bytes = 0;
    size_t scan_bytes = 0;
    SOK_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const uint64_t*>(nullptr),
                                                    static_cast<uint64_t*>(nullptr),
                                                    static_cast<const uint32_t*>(nullptr),
                                                    static_cast<uint32_t*>(nullptr), num, 0, l.key_bits));
    SOK_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const uint32_t*>(nullptr),
                                                  static_cast<uint32_t*>(nullptr), num));
    l.temp_bytes = std::max(sort_bytes, scan_bytes);
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

cudaError_t pooled_forward(const PooledTable* tables, int num_tables, int64_t batch, void* workspace,
                           PooledCheck* checks, cudaStream_t stream) {
  if (num_tables <= 0) return cudaSuccess;
  std::vector<TableDev> d = describe(tables, num_tables, batch);
  const int64_t validate = plan(&d, kValidate, [batch](const TableDev& x) { return validate_blocks(x, batch); });
  const int64_t pool = plan(&d, kPool, [batch](const TableDev& x) {
    return x.t.dim > 0 ? ceil_div(batch, kThreads / x.pool_lanes) : int64_t{0};
  });
  auto* dev = static_cast<TableDev*>(workspace);
  SOK_CUDA_RETURN(upload(d, dev, stream));
  SOK_CUDA_RETURN(launch(init_checks_kernel, ceil_div(num_tables, kThreads), stream, checks, num_tables));
  SOK_CUDA_RETURN(launch(validate_kernel, validate, stream, static_cast<const TableDev*>(dev), num_tables, batch,
                         checks, KeysOut{nullptr, nullptr, nullptr, 0, 0}));
  return launch(pool_kernel, pool, stream, static_cast<const TableDev*>(dev), num_tables, batch);
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
    return std::min(ceil_div(x.bound, kThreads / x.lanes), kSweepBlocks);
  });
  const int64_t pad_blocks = plan(&d, kPad, [padded](const TableDev& x) {
    return padded ? std::min(ceil_div(x.bound, kThreads), kSweepBlocks) : int64_t{0};
  });
  int64_t max_dim = 0;
  for (const TableDev& x : d) max_dim = std::max(max_dim, x.bound > 0 ? x.t.dim : int64_t{0});
  auto* dev = at<TableDev>(workspace, l.tables);
  SOK_CUDA_RETURN(upload(d, dev, stream));
  auto* hot_count = at<uint32_t>(workspace, l.hot_count);
  const Distinct in{at<uint64_t>(workspace, l.keys_out),
                    at<uint32_t>(workspace, l.positions_out),
                    at<uint32_t>(workspace, l.samples),
                    at<uint32_t>(workspace, l.keys_in),
                    at<float>(workspace, l.div),
                    at<int64_t>(workspace, l.bases),
                    checks,
                    l.row_mask(),
                    l.num_ids,
                    at<uint32_t>(workspace, l.order),  // dead after pooled_grad_distinct
                    hot_count};
  SOK_CUDA_RETURN(cudaMemsetAsync(hot_count, 0, sizeof(uint32_t), stream));
  SOK_CUDA_RETURN(launch(accumulate_kernel, blocks, stream, static_cast<const TableDev*>(dev), num_tables, in));
  SOK_CUDA_RETURN(launch(pad_kernel, pad_blocks, stream, static_cast<const TableDev*>(dev), num_tables, in));
  // At most num_ids / (kHotOccurrences + 1) hot ids; blocks past the device's count exit at once.
  const int64_t hot_blocks = std::min(l.num_ids / (kHotOccurrences + 1), kHotBlocks);
  const int64_t tiles = ceil_div(max_dim, kHotColumns);
  if (hot_blocks == 0 || tiles == 0) return cudaSuccess;
  if (tiles > 65535) return cudaErrorInvalidConfiguration;
  accumulate_hot_kernel<<<dim3(static_cast<unsigned>(hot_blocks), static_cast<unsigned>(tiles)), kHotThreads, 0,
                          stream>>>(static_cast<const TableDev*>(dev), num_tables, in);
  return cudaGetLastError();
}

}  // namespace sok_gpu
