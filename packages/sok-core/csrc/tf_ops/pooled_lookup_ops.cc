// Pooled lookups of static tables: every table of a sok.lookup_sparse call in one op instead of ~10
// TensorFlow ops per table. At world size 1 it pools the local batch with the full tables; with
// several ranks it pools the global batch into partial sums of the rows this rank holds
// (lookup/local_lookup.py).
//
// SokPooledLookup: embeddings_t[s] = combine(sum_j w_j * params_t[ids_t[j]]) for j in
//   row_splits_t[s] .. row_splits_t[s + 1] (w_j = 1 when unweighted), summed in id order; "mean"
//   and "sqrtn" then divide by sum(w) or sqrt(sum(w^2)) (the id count when unweighted), and a sample
//   whose divisor is 0 gives zeros, as tf.math.divide_no_nan in tf.nn.embedding_lookup_sparse (a
//   negative sum of weights divides).
//   Sharded tables (attrs strides, offsets): table t holds id i at row i / strides[t] when
//   i mod strides[t] == offsets[t] (offset -1: no id, a localized table of another rank); the sums
//   take the ids it holds only, the divisors every id of the sample.
// SokPooledLookupGrad: the gradient with respect to each table, as the rows of its distinct ids in
//   first-occurrence order (the order of tf.unique) and those ids (rows of the shard): the
//   tf.IndexedSlices that TensorFlow's unique + gather + segment-sum lookup yields.
//
// Both split their work over TensorFlow's intra-op threads: the forward in blocks of samples of
// similar cost, the gradient by table. Ids outside [0, rows) fail with InvalidArgument naming the
// sp_ids position, the table and the valid range.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "pooled_lookup_ops.h"
#include "pooled_order.h"
#include "sok/kit/prefetch.hpp"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/platform/threadpool.h"

namespace sok_tf {
namespace {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;
namespace errors = ::tensorflow::errors;

// About this many float operations per parallel task of the forward.
constexpr int64_t kTaskCost = 1 << 17;
// Rows are prefetched this many ids before they are summed (forward) or added to (gradient), when
// the rows of the table (forward) or of its gradient are more than kCachedBytes.
constexpr int64_t kAhead = 16;
constexpr int64_t kCachedBytes = 1 << 20;
// Table::local of an id that another shard holds.
constexpr int64_t kNotHeld = std::numeric_limits<int64_t>::min();

enum class Combiner : int32_t { kSum = kCombineSum, kMean = kCombineMean, kSqrtn = kCombineSqrtn };

// One table of the call: borrowed pointers into the op's inputs.
struct Table {
  const void* params;  // (rows, dim) of the op's row type (its T attribute)
  int64_t rows;
  int64_t dim;
  const int32_t* ids32;  // (nnz,), one of ids32 / ids64
  const int64_t* ids64;
  int64_t nnz;
  const int64_t* splits;  // (batch + 1,)
  const float* weights;   // (nnz,) or nullptr
  Combiner combiner;
  int64_t stride;  // the shard holds id i at row i / stride when i mod stride == offset
  int64_t offset;  // -1: it holds no id
  int shift;       // log2(stride) when stride is a power of two, else -1

  int64_t id(int64_t j) const { return ids64 != nullptr ? ids64[j] : ids32[j]; }
  // The row of id j in this shard (negative or >= rows for an invalid id), kNotHeld when another
  // shard holds it; a shift and masks, no division and no branch, for power-of-two strides.
  int64_t local(int64_t j) const {
    const int64_t i = id(j);
    if (stride == 1) return offset == 0 ? std::max<int64_t>(i, -1) : kNotHeld;
    if (shift >= 0) {
      const int64_t held = -static_cast<int64_t>((i & (stride - 1)) == offset);  // all ones or 0
      return ((i >> shift) & held) | (kNotHeld & ~held);
    }
    return i % stride == offset ? i / stride : kNotHeld;
  }
  // Whether a row from local() is in [0, rows).
  bool valid(int64_t row) const { return static_cast<uint64_t>(row) < static_cast<uint64_t>(rows); }
  // The params as rows of Row (the op's row type's C++ type).
  template <class Row>
  const Row* rows_of() const {
    return static_cast<const Row*>(params);
  }
};

// The tables of the inputs ids, row_splits and weights (both ops), with their row counts and widths;
// params stays unset (the gradient op has none).
Status gather_tables(OpKernelContext* ctx, const PooledAttrs& attrs, const std::vector<int64_t>& rows,
                     const std::vector<int64_t>& dims, std::vector<Table>* tables, int64_t* batch) {
  OpInputList ids, splits, weights;
  TF_RETURN_IF_ERROR(ctx->input_list("ids", &ids));
  TF_RETURN_IF_ERROR(ctx->input_list("row_splits", &splits));
  TF_RETURN_IF_ERROR(ctx->input_list("weights", &weights));
  const int n = static_cast<int>(attrs.combiners.size());
  if (ids.size() != n || splits.size() != n || (weights.size() != 0 && weights.size() != n)) {
    return pooled_errors::list_lengths(n, ids.size(), splits.size(), weights.size());
  }
  *batch = splits[0].NumElements() - 1;
  for (int t = 0; t < n; ++t) {
    Table table{};
    table.rows = rows[t];
    table.dim = dims[t];
    if (ids[t].dims() != 1) return pooled_errors::ids_rank(t, ids[t].shape());
    table.nnz = ids[t].NumElements();
    if (ids[t].dtype() == ::tensorflow::DT_INT64) {
      table.ids64 = ids[t].flat<int64_t>().data();
    } else {
      table.ids32 = ids[t].flat<int32_t>().data();
    }
    const Tensor& s = splits[t];
    if (s.dims() != 1 || s.NumElements() != *batch + 1) {
      return pooled_errors::splits_shape(t, *batch, s.shape());
    }
    table.splits = s.flat<int64_t>().data();
    if (table.splits[0] != 0 || table.splits[*batch] != table.nnz) {
      return pooled_errors::splits_range(t, table.nnz, table.splits[0], table.splits[*batch]);
    }
    for (int64_t b = 0; b < *batch; ++b) {
      if (table.splits[b + 1] < table.splits[b]) return pooled_errors::splits_decrease(t, b);
    }
    if (weights.size() != 0) {
      if (weights[t].NumElements() != table.nnz) {
        return pooled_errors::weights_count(t, weights[t].NumElements(), table.nnz);
      }
      table.weights = weights[t].flat<float>().data();
    }
    table.combiner = static_cast<Combiner>(attrs.combiners[t]);
    table.stride = attrs.strides[t];
    table.offset = attrs.offsets[t];
    table.shift = -1;
    for (int b = 1; b < 63; ++b) {
      if (table.stride == int64_t{1} << b) table.shift = b;
    }
    tables->push_back(table);
  }
  return Status();
}

// The divisor of sample [begin, end): 1 for "sum"; 0 means the sample gives zeros (it may be
// negative for "mean" with weights: then it divides, as in tf.nn.embedding_lookup_sparse).
float divisor(const Table& t, int64_t begin, int64_t end) {
  if (t.combiner == Combiner::kSum) return 1.0f;
  float total = 0.0f;
  if (t.weights == nullptr) {
    total = static_cast<float>(end - begin);
  } else {
    for (int64_t j = begin; j < end; ++j) total += t.combiner == Combiner::kMean ? t.weights[j] : t.weights[j] * t.weights[j];
  }
  return t.combiner == Combiner::kSqrtn ? std::sqrt(total) : total;
}

// out (dim) = the sum of the num rows (dim each, widened to float) in tf.sparse.segment_sum's order
// (pooled_order.h), so the sums are the same to the bit.
template <class Row>
void sum_rows(const Row* const* rows, int64_t num, int64_t dim, float* __restrict__ out) {
  const int64_t head = sok_pooled::order_head(num);
  std::fill(out, out + dim, 0.0f);
  const auto f = [](Row x) { return static_cast<float>(x); };
  for (int64_t j = 0; j < head; ++j) {
    const Row* __restrict__ row = rows[j];
    for (int64_t k = 0; k < dim; ++k) out[k] += f(row[k]);
  }
  for (int64_t j = head; j < num; j += 8) {
    const Row* const* r = rows + j;
    for (int64_t k = 0; k < dim; ++k) {
      out[k] += f(r[0][k]) + f(r[1][k]) + f(r[2][k]) + f(r[3][k]) + f(r[4][k]) + f(r[5][k]) + f(r[6][k]) + f(r[7][k]);
    }
  }
}

// out (dim) = the sum of weights[j] * rows[j] of the num rows (dim each), one after another
// (unsorted_segment_sum's order).
template <class Row>
void sum_weighted_rows(const Row* const* rows, const float* weights, int64_t num, int64_t dim,
                       float* __restrict__ out) {
  std::fill(out, out + dim, 0.0f);
  for (int64_t j = 0; j < num; ++j) {
    const Row* __restrict__ row = rows[j];
    const float w = weights[j];
    for (int64_t k = 0; k < dim; ++k) out[k] += static_cast<float>(row[k]) * w;
  }
}

// The rows (and weights, when the table has them) of the held ids of a sample. Whether a shard
// holds an id is random (half of them at two ranks), so collect() does not branch on it.
template <class Row>
struct SampleRows {
  std::vector<const Row*> rows;
  std::vector<float> weights;
  int64_t count = 0;

  // Collects sample [begin, end); false when a held id is outside [0, rows).
  bool collect(const Table& t, int64_t begin, int64_t end) {
    const size_t num = static_cast<size_t>(end - begin);
    if (rows.size() < num) {
      rows.resize(num);
      weights.resize(num);
    }
    count = 0;
    bool ok = true;
    for (int64_t j = begin; j < end; ++j) {
      const int64_t row = t.local(j);
      const int64_t valid = t.valid(row);
      ok &= static_cast<bool>(valid) | (row == kNotHeld);
      rows[count] = t.rows_of<Row>() + (row & -valid) * t.dim;
      if (t.weights != nullptr) weights[count] = t.weights[j];
      count += valid;
    }
    return ok;
  }
};

// out (dim) = the combined held rows of sample [begin, end) (found: scratch space); false (out
// untouched) when a held id is outside [0, rows).
template <class Row>
bool pool_sample(const Table& t, int64_t begin, int64_t end, SampleRows<Row>* found, float* __restrict__ out) {
  const int64_t dim = t.dim;
  if (!found->collect(t, begin, end)) return false;
  const int64_t num = found->count;
  if (t.weights == nullptr) {
    sum_rows(found->rows.data(), num, dim, out);
  } else {
    sum_weighted_rows(found->rows.data(), found->weights.data(), num, dim, out);
  }
  if (t.combiner != Combiner::kSum) {
    const float d = divisor(t, begin, end);
    if (d != 0.0f) {
      for (int64_t k = 0; k < dim; ++k) out[k] /= d;
    } else {
      std::fill(out, out + dim, 0.0f);
    }
  }
  return true;
}

// Pools samples [begin, end) of a table into out (its (batch, dim) output), prefetching the rows of
// the ids kAhead ids further on; false when an id is outside [0, rows).
template <class Row>
bool pool_block(const Table& t, int64_t begin, int64_t end, float* out) {
  const int64_t last = t.splits[end];
  const size_t row_bytes = static_cast<size_t>(t.dim) * sizeof(Row);
  int64_t ahead = t.rows * static_cast<int64_t>(row_bytes) > kCachedBytes ? t.splits[begin] : last;
  bool ok = true;
  SampleRows<Row> found;
  for (int64_t s = begin; s < end; ++s) {
    for (const int64_t stop = std::min(last, t.splits[s + 1] + kAhead); ahead < stop; ++ahead) {
      const int64_t row = t.local(ahead);
      sok::prefetch_range(t.rows_of<Row>() + (row & -static_cast<int64_t>(t.valid(row))) * t.dim,
                          row_bytes);  // see SampleRows
    }
    ok &= pool_sample(t, t.splits[s], t.splits[s + 1], &found, out + s * t.dim);
  }
  return ok;
}

// A block of samples of one table: the forward's unit of parallel work.
struct Block {
  int table;
  int64_t begin;
  int64_t end;
};

// Blocks of about kTaskCost float operations each, over every table.
std::vector<Block> blocks_of(const std::vector<Table>& tables, int64_t batch) {
  std::vector<Block> blocks;
  for (int t = 0; t < static_cast<int>(tables.size()); ++t) {
    const Table& table = tables[t];
    int64_t begin = 0;
    while (begin < batch) {
      int64_t end = begin;
      int64_t cost = 0;
      while (end < batch && cost < kTaskCost) {
        cost += (table.splits[end + 1] - table.splits[end] + 1) * table.dim;
        ++end;
      }
      blocks.push_back({t, begin, end});
      begin = end;
    }
  }
  return blocks;
}

// Runs fn(i) for i in [0, n) on TensorFlow's intra-op threads (the calling one included).
template <class Fn>
void for_each_parallel(OpKernelContext* ctx, int64_t n, int64_t cost_per_unit, Fn&& fn) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  pool->ParallelFor(n, cost_per_unit, [&fn](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fn(i);
  });
}

// The error for table t's ids outside [0, rows) (of its shard, when it is sharded).
Status out_of_range(const Table& t, int64_t position, const std::string& name) {
  int64_t count = 0;
  int64_t example = 0;
  for (int64_t j = 0; j < t.nnz; ++j) {
    const int64_t row = t.local(j);
    if (row != kNotHeld && !t.valid(row) && count++ == 0) example = t.id(j);
  }
  return pooled_errors::out_of_range(position, t.rows, t.stride, name, count, example);
}

class PooledLookupOp : public PooledLookupKernel {
 public:
  using PooledLookupKernel::PooledLookupKernel;

  void Compute(OpKernelContext* ctx) override {
    std::vector<int64_t> rows, dims;
    OP_REQUIRES_OK(ctx, params_shapes(ctx, attrs_.combiners.size(), &rows, &dims));
    OpInputList params;
    OP_REQUIRES_OK(ctx, ctx->input_list("params", &params));
    std::vector<Table> tables;
    int64_t batch = 0;
    OP_REQUIRES_OK(ctx, gather_tables(ctx, attrs_, rows, dims, &tables, &batch));
    for (int t = 0; t < params.size(); ++t) tables[t].params = params[t].tensor_data().data();
    OpOutputList outputs;
    OP_REQUIRES_OK(ctx, ctx->output_list("embeddings", &outputs));
    std::vector<float*> out(tables.size());
    for (size_t t = 0; t < tables.size(); ++t) {
      Tensor* tensor = nullptr;
      OP_REQUIRES_OK(ctx, outputs.allocate(t, TensorShape({batch, dims[t]}), &tensor));
      out[t] = tensor->flat<float>().data();
    }
    const std::vector<Block> blocks = blocks_of(tables, batch);
    std::vector<std::atomic<bool>> bad(tables.size());
    with_row_type(row_type_, [&](auto row) {  // every table of the call has the op's row type
      for_each_parallel(ctx, static_cast<int64_t>(blocks.size()), kTaskCost, [&](int64_t i) {
        const Block& b = blocks[i];
        if (!pool_block<decltype(row)>(tables[b.table], b.begin, b.end, out[b.table])) {
          bad[b.table].store(true, std::memory_order_relaxed);
        }
      });
    });
    for (size_t t = 0; t < tables.size(); ++t) {
      OP_REQUIRES(ctx, !bad[t].load(), out_of_range(tables[t], positions_[t], names_[t]));
    }
  }
};

// The distinct held rows of a table in first-occurrence order and each id's index among them.
struct Distinct {
  std::vector<int64_t> ids;       // rows of the shard
  std::vector<int64_t> held;      // the indices j of the ids the shard holds, in order
  std::vector<int32_t> position;  // (held,): each held id's index among ids
};

// The held ids of a table: d->held and their rows (without branching on whether the shard holds
// an id: see SampleRows); false when a held id is outside [0, rows).
bool find_held(const Table& t, Distinct* d, std::vector<int64_t>* rows) {
  d->held.resize(t.nnz);
  rows->resize(t.nnz);
  int64_t count = 0;
  bool ok = true;
  for (int64_t j = 0; j < t.nnz; ++j) {
    const int64_t row = t.local(j);
    const int64_t valid = t.valid(row);
    ok &= static_cast<bool>(valid) | (row == kNotHeld);
    d->held[count] = j;
    (*rows)[count] = row;
    count += valid;
  }
  d->held.resize(count);
  rows->resize(count);
  return ok;
}

// Distinct rows through a dense slot array (small tables) or an open-addressing hash (large ones);
// false (and nothing found) when a held id is outside [0, rows).
bool find_distinct(const Table& t, Distinct* d) {
  std::vector<int64_t> local;
  if (!find_held(t, d, &local)) return false;
  const int64_t num = static_cast<int64_t>(local.size());
  d->position.resize(num);
  if (t.rows <= 4 * num + 1024) {
    std::vector<int32_t> slot(t.rows, -1);
    for (int64_t c = 0; c < num; ++c) {
      const int64_t id = local[c];
      int32_t& p = slot[id];
      if (p < 0) {
        p = static_cast<int32_t>(d->ids.size());
        d->ids.push_back(id);
      }
      d->position[c] = p;
    }
    return true;
  }
  uint64_t capacity = 16;
  while (capacity < 2 * static_cast<uint64_t>(num)) capacity <<= 1;
  const uint64_t mask = capacity - 1;
  std::vector<int64_t> keys(capacity, -1);
  std::vector<int32_t> values(capacity);
  for (int64_t c = 0; c < num; ++c) {
    const int64_t id = local[c];
    uint64_t h = (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> 20;
    while (true) {
      h &= mask;
      if (keys[h] == id) break;
      if (keys[h] < 0) {
        keys[h] = id;
        values[h] = static_cast<int32_t>(d->ids.size());
        d->ids.push_back(id);
        break;
      }
      ++h;
    }
    d->position[c] = values[h];
  }
  return true;
}

// rows (distinct, dim) = sum over the ids of each distinct id of its sample's gradient, scaled as
// the forward scaled the row: (grad / divisor) * weight.
void accumulate(const Table& t, int64_t batch, const float* __restrict__ grad, const Distinct& d,
                float* __restrict__ rows) {
  const int64_t dim = t.dim;
  std::fill(rows, rows + static_cast<int64_t>(d.ids.size()) * dim, 0.0f);
  std::vector<float> scaled(dim);
  const int64_t num = static_cast<int64_t>(d.held.size());
  const int64_t prefetch_end =
      static_cast<int64_t>(d.ids.size()) * dim * static_cast<int64_t>(sizeof(float)) > kCachedBytes ? num : 0;
  int64_t c = 0;  // the first held id of sample s
  for (int64_t s = 0; s < batch; ++s) {
    const int64_t begin = t.splits[s], end = t.splits[s + 1];
    int64_t stop = c;
    while (stop < num && d.held[stop] < end) ++stop;
    const float* g = grad + s * dim;
    if (stop > c && t.combiner != Combiner::kSum) {
      const float div = divisor(t, begin, end);
      if (div == 0.0f) {
        c = stop;
        continue;
      }
      for (int64_t k = 0; k < dim; ++k) scaled[k] = g[k] / div;
      g = scaled.data();
    }
    for (; c < stop; ++c) {
      if (c + kAhead < prefetch_end) {
        sok::prefetch_write_range(rows + static_cast<int64_t>(d.position[c + kAhead]) * dim, dim * sizeof(float));
      }
      const int64_t j = d.held[c];
      float* __restrict__ row = rows + static_cast<int64_t>(d.position[c]) * dim;
      if (t.weights == nullptr) {
        for (int64_t k = 0; k < dim; ++k) row[k] += g[k];
      } else {
        const float w = t.weights[j];
        for (int64_t k = 0; k < dim; ++k) row[k] += g[k] * w;
      }
    }
  }
}

class PooledLookupGradOp : public PooledLookupGradKernel {
 public:
  using PooledLookupGradKernel::PooledLookupGradKernel;

  void Compute(OpKernelContext* ctx) override {
    std::vector<int64_t> dims;
    OP_REQUIRES_OK(ctx, grads_dims(ctx, &dims));
    OpInputList grads;
    OP_REQUIRES_OK(ctx, ctx->input_list("grads", &grads));
    std::vector<int64_t> rows_of;
    OP_REQUIRES_OK(ctx, resolve_table_rows(ctx, table_rows_, &rows_of));
    std::vector<Table> tables;
    int64_t batch = 0;
    OP_REQUIRES_OK(ctx, gather_tables(ctx, attrs_, rows_of, dims, &tables, &batch));
    const int64_t n = static_cast<int64_t>(tables.size());
    for (int64_t t = 0; t < n; ++t) {
      OP_REQUIRES(ctx, grads[t].dim_size(0) == batch, pooled_errors::grads_rows(t, grads[t].dim_size(0), batch));
    }
    std::vector<Distinct> distinct(n);
    std::vector<std::atomic<bool>> bad(n);
    for_each_parallel(ctx, n, kTaskCost * 8, [&](int64_t t) { bad[t] = !find_distinct(tables[t], &distinct[t]); });
    for (int64_t t = 0; t < n; ++t) {
      OP_REQUIRES(ctx, !bad[t].load(), pooled_errors::shard_rows(t, rows_of[t]));
    }
    OpOutputList rows, indices;
    OP_REQUIRES_OK(ctx, ctx->output_list("rows", &rows));
    OP_REQUIRES_OK(ctx, ctx->output_list("indices", &indices));
    std::vector<float*> out(n);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t u = static_cast<int64_t>(distinct[t].ids.size());
      // padded: a row per id, the padding index -1 with a row of zeros (the GPU kernel leaves
      // those rows unwritten; here they cost a fill and make the output deterministic).
      const int64_t size = padded_ ? tables[t].nnz : u;
      Tensor* tensor = nullptr;
      OP_REQUIRES_OK(ctx, rows.allocate(t, TensorShape({size, dims[t]}), &tensor));
      out[t] = tensor->flat<float>().data();
      std::fill(out[t] + u * dims[t], out[t] + size * dims[t], 0.0f);
      OP_REQUIRES_OK(ctx, indices.allocate(t, TensorShape({size}), &tensor));
      int64_t* ids = tensor->flat<int64_t>().data();
      std::copy(distinct[t].ids.begin(), distinct[t].ids.end(), ids);
      std::fill(ids + u, ids + size, int64_t{-1});
    }
    for_each_parallel(ctx, n, kTaskCost * 8, [&](int64_t t) {
      accumulate(tables[t], batch, grads[t].flat<float>().data(), distinct[t], out[t]);
    });
  }
};

// Output i has shape [batch, dim of params i]; batch is row_splits[0]'s length - 1.
Status pooled_lookup_shape(InferenceContext* c) {
  int n = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
  ::tensorflow::shape_inference::DimensionHandle batch = c->UnknownDim();
  ShapeHandle splits;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2 * n), 1, &splits));
  TF_RETURN_IF_ERROR(c->Subtract(c->Dim(splits, 0), 1, &batch));
  for (int t = 0; t < n; ++t) {
    ShapeHandle param;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(t), 2, &param));
    c->set_output(t, c->Matrix(batch, c->Dim(param, 1)));
  }
  return Status();
}

// rows[i] is [unknown, dim of grads i], indices[i] is [unknown].
Status pooled_lookup_grad_shape(InferenceContext* c) {
  int n = 0;
  TF_RETURN_IF_ERROR(c->GetAttr("num_tables", &n));
  for (int t = 0; t < n; ++t) {
    ShapeHandle grad;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(t), 2, &grad));
    c->set_output(t, c->Matrix(c->UnknownDim(), c->Dim(grad, 1)));
    c->set_output(n + t, c->Vector(c->UnknownDim()));
  }
  return Status();
}

}  // namespace

REGISTER_OP("SokPooledLookup")
    .Input("params: num_tables * T")
    .Input("ids: Tids")
    .Input("row_splits: num_tables * int64")
    .Input("weights: num_weights * float")
    .Output("embeddings: num_tables * float")
    .Attr("num_tables: int >= 1")
    // The rows' dtype (all tables of one call): read widened to float32, summed in float32.
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .Attr("num_weights: int >= 0")
    .Attr("Tids: list({int32, int64})")
    .Attr("combiners: list(string)")
    .Attr("names: list(string)")
    .Attr("positions: list(int)")
    .Attr("strides: list(int) = []")
    .Attr("offsets: list(int) = []")
    // Per table (or empty: none), whether its ids number its params, the rows of a lookup's distinct
    // keys, in order of first occurrence (SokUniqueIndexList): read by the gradient function only.
    .Attr("numbered: list(bool) = []")
    // Whether the caller has checked the ids and row splits (sok.lookup_sparse at several ranks: the
    // call's agreement counted ids outside each table before the exchange, and the row splits of the
    // ids it delivers are made, not given): the GPU kernel then reads nothing back, so it does not
    // wait for the GPU, and pools the valid ids only. The CPU kernel checks anyway (it waits on
    // nothing).
    .Attr("checked: bool = false")
    .SetShapeFn(pooled_lookup_shape)
    .Doc("Pooled lookups of several static tables (see pooled_lookup_ops.cc).");

REGISTER_OP("SokPooledLookupGrad")
    .Input("grads: num_tables * float")
    .Input("ids: Tids")
    .Input("row_splits: num_tables * int64")
    .Input("weights: num_weights * float")
    .Output("rows: num_tables * float")
    .Output("indices: num_tables * int64")
    .Attr("num_tables: int >= 1")
    .Attr("num_weights: int >= 0")
    .Attr("Tids: list({int32, int64})")
    .Attr("combiners: list(string)")
    .Attr("table_rows: list(int)")  // -1: ids that number a lookup's distinct keys (fewer than the ids)
    .Attr("strides: list(int) = []")
    .Attr("offsets: list(int) = []")
    // A row per id instead of per distinct id: the distinct ids' rows first, then index -1 (rows
    // unspecified; zeros on the CPU), which SokSparseApplyAdagradTables with check_indices=false
    // skips: the GPU kernel then reads no count back to the host.
    .Attr("padded: bool = false")
    .SetShapeFn(pooled_lookup_grad_shape)
    .Doc("The gradient of SokPooledLookup with respect to its params, per table as (rows, distinct ids).");

REGISTER_KERNEL_BUILDER(Name("SokPooledLookup").Device(DEVICE_CPU), PooledLookupOp);
REGISTER_KERNEL_BUILDER(Name("SokPooledLookupGrad").Device(DEVICE_CPU), PooledLookupGradOp);

}  // namespace sok_tf
