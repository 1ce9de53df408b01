// TensorFlow ops over a storage's C ABI: the training path of sok.DynamicVariable.
//
// Each op takes the variable's resource handle (input 0) and the address of its sok_table_ref
// (input 1, an int64 scalar) and calls the backend through its function table; sok-core never links a
// backend. The handle is never read: it is there so that tf.function's automatic control dependencies
// order every op on one table in program order (a lookup is never moved past an update of its rows)
// and so that gradients reach the variable.
//
// This file holds the op registrations and the CPU kernels (libsok_tf_ops.so). The GPU kernels are
// in storage_ops_gpu.cc, a separate library (libsok_tf_ops_gpu.so) built when a CUDA toolkit is
// found and loaded only by a CUDA build of TensorFlow; storage_ops.h holds what both share.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "sok/prefetch.hpp"
#include "storage_ops.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_tf {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::shape_inference::InferenceContext;

constexpr sok_exec_context kCpu{SOK_DEVICE_CPU, 0, nullptr};

// The execution context of the CPU kernels: host pointers, no stream.
struct CpuExec {
  static sok_exec_context of(OpKernelContext*) { return kCpu; }
};

// values = rows of keys; missing keys are inserted with insert_and_evict, and the rows that made room
// come back as evicted_keys / evicted_values (embedding columns).
class LookupAndEvictOp : public RowOp {
 public:
  using RowOp::RowOp;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, prepare(ctx, kKeys, &ref));
    const Tensor& keys = ctx->input(kKeys);
    const int64_t n = keys.NumElements();
    const int32_t w = width();
    const int32_t row = ref->row_width;
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, allocate_rows(ctx, 0, keys, &values));
    float* out = values->flat<float>().data();
    std::vector<uint8_t> found(n);
    SOK_OK_OR_RETURN(ctx, status_of(ref, ref->api->find(ref->storage, &kCpu, n, keys.data(), col_begin_, col_end_,
                                                        out, nullptr, found.data()), "find"));
    // Missing keys: whole initial rows, inserted with eviction.
    const size_t key_bytes = sok::key_size(ref->key_type);
    std::vector<char> missing_keys;
    std::vector<float> rows;
    const int64_t m = init_missing_rows(ref, n, keys.data(), found.data(), col_begin_, w, out, &missing_keys, &rows);
    std::vector<char> evicted_keys(std::max<int64_t>(m, 1) * key_bytes);
    std::vector<float> evicted_rows(std::max<int64_t>(m, 1) * row);
    std::vector<uint64_t> evicted_scores(std::max<int64_t>(m, 1));
    int64_t evicted = 0;
    if (m > 0) {
      sok_status st = ref->api->insert_and_evict(ref->storage, &kCpu, m, missing_keys.data(), 0, row, rows.data(),
                                                 nullptr, ref->inits, ref->num_inits, evicted_keys.data(),
                                                 evicted_rows.data(), evicted_scores.data(), &evicted);
      SOK_OK_OR_RETURN(ctx, status_of(ref, st, "insert_and_evict"));
    }
    Tensor *ek = nullptr, *ev = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({evicted}), &ek));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({evicted, w}), &ev));
    std::memcpy(ek->data(), evicted_keys.data(), evicted * key_bytes);
    float* ev_out = ev->flat<float>().data();
    for (int64_t j = 0; j < evicted; ++j) {
      std::memcpy(ev_out + j * w, evicted_rows.data() + j * row + col_begin_, sizeof(float) * w);
    }
  }
};

// keys, values, scores of every row (with filter: rows scored >= threshold).
class ExportOp : public ExportOpBase {
 public:
  using ExportOpBase::ExportOpBase;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    uint64_t threshold = 0;
    int64_t capacity = 0;
    SOK_OK_OR_RETURN(ctx, begin(ctx, &ref, &threshold, &capacity));
    const int64_t key_bytes = static_cast<int64_t>(sok::key_size(ref->key_type));
    // Export in chunks of slots into growing buffers, then copy into outputs of the exact size.
    constexpr int64_t kChunk = 1 << 16;
    std::vector<char> keys;
    std::vector<float> values;
    std::vector<uint64_t> scores;
    int64_t total = 0;
    for (int64_t offset = 0; offset < capacity; offset += kChunk) {
      const int64_t limit = std::min(kChunk, capacity - offset);
      keys.resize((total + limit) * key_bytes);
      values.resize((total + limit) * width());
      scores.resize(total + limit);
      int64_t count = 0;
      SOK_OK_OR_RETURN(ctx, export_chunk(ref, &kCpu, threshold, offset, limit, keys.data() + total * key_bytes,
                                         values.data() + total * width(), scores.data() + total, &count));
      total += count;
    }
    Tensor *k = nullptr, *v = nullptr, *s = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &k));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({total, width()}), &v));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({total}), &s));
    std::memcpy(k->data(), keys.data(), total * key_bytes);
    std::memcpy(v->flat<float>().data(), values.data(), sizeof(float) * total * width());
    std::memcpy(s->flat<uint64_t>().data(), scores.data(), sizeof(uint64_t) * total);
  }
};

// unique_keys, sums = the distinct keys (in order of first occurrence) and the sum of the rows of
// values per distinct key: tf.unique + unsorted_segment_sum in one pass over a hash index.
// CPU only (it calls no storage): under a CUDA TensorFlow the placer runs it on the CPU.
template <typename K>
class UniqueSumOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys_t = ctx->input(0);
    const Tensor& values_t = ctx->input(1);
    const int64_t n = keys_t.NumElements();
    OP_REQUIRES(ctx, values_t.dims() == 2 && values_t.dim_size(0) == n,
                errors::InvalidArgument("values must have shape [", n, ", width], got ", values_t.shape().DebugString()));
    OP_REQUIRES(ctx, n < (int64_t{1} << 31),
                errors::InvalidArgument("at most 2**31 - 1 keys per call, got ", n, "; split the batch"));
    const int64_t w = values_t.dim_size(1);
    const K* keys = keys_t.flat<K>().data();
    const float* values = values_t.flat<float>().data();
    // Open addressing over (key, position) entries, the home slot of a key further on
    // prefetched: the index is larger than the caches for big batches, so each probe would
    // otherwise wait for memory.
    struct Entry {
      K key;
      int32_t position;  // -1: empty
    };
    int64_t slots = 16;
    while (slots < 2 * n) slots <<= 1;
    const uint64_t mask = static_cast<uint64_t>(slots - 1);
    std::vector<Entry> index(slots, Entry{K{}, -1});
    std::vector<int32_t> position(n);  // key i -> position of its distinct key
    std::vector<K> distinct;
    distinct.reserve(n);
    auto home = [&](int64_t i) { return sok::hash_key(static_cast<uint64_t>(keys[i])) & mask; };
    for (int64_t i = 0; i < n; ++i) {
      if (i + sok::kPrefetchDistance < n) sok::prefetch(&index[home(i + sok::kPrefetchDistance)]);
      const K key = keys[i];
      uint64_t s = home(i);
      while (index[s].position >= 0 && index[s].key != key) s = (s + 1) & mask;
      if (index[s].position < 0) {
        index[s] = Entry{key, static_cast<int32_t>(distinct.size())};
        distinct.push_back(key);
      }
      position[i] = index[s].position;
    }
    const int64_t u = static_cast<int64_t>(distinct.size());
    Tensor *unique_t = nullptr, *sums_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &unique_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({u, w}), &sums_t));
    std::copy(distinct.begin(), distinct.end(), unique_t->flat<K>().data());
    float* __restrict__ sums = sums_t->flat<float>().data();
    std::fill(sums, sums + u * w, 0.0f);
    for (int64_t i = 0; i < n; ++i) add_row(sums + static_cast<int64_t>(position[i]) * w, values + i * w, w);
  }

 private:
  // dst += src over w floats (the pointers never overlap: an output row and an input row).
  static void add_row(float* __restrict__ dst, const float* __restrict__ src, int64_t w) {
    for (int64_t c = 0; c < w; ++c) dst[c] += src[c];
  }
};

#define SOK_KEY_TYPES "Tkeys: {int32, int64, uint64}"

// Output 0 has the shape of the keys (input keys_input) plus one axis of col_end - col_begin.
Status RowsShape(InferenceContext* c, int keys_input) {
  int64_t b, e;
  TF_RETURN_IF_ERROR(c->GetAttr("col_begin", &b));
  TF_RETURN_IF_ERROR(c->GetAttr("col_end", &e));
  ::tensorflow::shape_inference::ShapeHandle out;
  TF_RETURN_IF_ERROR(c->Concatenate(c->input(keys_input), c->Vector(e - b), &out));
  c->set_output(0, out);
  return Status();
}

REGISTER_OP("SokUniqueSum")
    .Input("keys: Tkeys")
    .Input("values: float")
    .Output("unique_keys: Tkeys")
    .Output("sums: float")
    .Attr(SOK_KEY_TYPES)
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, c->Dim(c->input(1), 1)));
      return Status();
    })
    .Doc("Distinct keys in order of first occurrence and the per-key sums of the value rows.");

REGISTER_OP("SokLookup")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("keys: Tkeys")
    .Output("values: float")
    .Attr(SOK_KEY_TYPES)
    .Attr("col_begin: int")
    .Attr("col_end: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return RowsShape(c, kKeys); })
    .Doc("Rows [col_begin, col_end) of keys, inserting missing keys with the initializers.");

REGISTER_OP("SokFindOrInsert")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("keys: Tkeys")
    .Output("values: float")
    .Attr(SOK_KEY_TYPES)
    .Attr("col_begin: int")
    .Attr("col_end: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return RowsShape(c, kKeys); })
    .Doc("Rows [col_begin, col_end) of keys, inserting missing keys (no gradient).");

REGISTER_OP("SokLookupAndEvict")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("keys: Tkeys")
    .Output("values: float")
    .Output("evicted_keys: Tkeys")
    .Output("evicted_values: float")
    .Attr(SOK_KEY_TYPES)
    .Attr("col_begin: int")
    .Attr("col_end: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RowsShape(c, kKeys));
      int64_t b, e;
      TF_RETURN_IF_ERROR(c->GetAttr("col_begin", &b));
      TF_RETURN_IF_ERROR(c->GetAttr("col_end", &e));
      c->set_output(1, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(2, c->Matrix(InferenceContext::kUnknownDim, e - b));
      return Status();
    })
    .Doc("Rows of keys; missing keys are inserted with eviction and the evicted rows returned.");

REGISTER_OP("SokFind")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("keys: Tkeys")
    .Output("values: float")
    .Output("found: bool")
    .Attr(SOK_KEY_TYPES)
    .Attr("col_begin: int")
    .Attr("col_end: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RowsShape(c, kKeys));
      c->set_output(1, c->input(kKeys));
      return Status();
    });

#define SOK_WRITE_OP(name)                  \
  REGISTER_OP(name)                         \
      .Input("handle: resource")            \
      .Input("table: int64")                \
      .Input("keys: Tkeys")                 \
      .Input("values: float")               \
      .Attr(SOK_KEY_TYPES)                  \
      .Attr("col_begin: int")               \
      .Attr("col_end: int")                 \
      .SetIsStateful()                      \
      .SetShapeFn(::tensorflow::shape_inference::NoOutputs)

SOK_WRITE_OP("SokInsertOrAssign");
SOK_WRITE_OP("SokAccumOrAssign");

REGISTER_OP("SokErase")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("keys: Tkeys")
    .Output("count: int64")
    .Attr(SOK_KEY_TYPES)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("SokSize")
    .Input("handle: resource")
    .Input("table: int64")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("SokExport")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("threshold: uint64")
    .Output("keys: Tkeys")
    .Output("values: float")
    .Output("scores: uint64")
    .Attr(SOK_KEY_TYPES)
    .Attr("col_begin: int")
    .Attr("col_end: int")
    .Attr("filter: bool = false")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t b, e;
      TF_RETURN_IF_ERROR(c->GetAttr("col_begin", &b));
      TF_RETURN_IF_ERROR(c->GetAttr("col_end", &e));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, e - b));
      c->set_output(2, c->Vector(InferenceContext::kUnknownDim));
      return Status();
    });

REGISTER_KERNEL_BUILDER(Name("SokLookup").Device(DEVICE_CPU), LookupOp<CpuExec>);
REGISTER_KERNEL_BUILDER(Name("SokFindOrInsert").Device(DEVICE_CPU), LookupOp<CpuExec>);
REGISTER_KERNEL_BUILDER(Name("SokLookupAndEvict").Device(DEVICE_CPU), LookupAndEvictOp);
REGISTER_KERNEL_BUILDER(Name("SokFind").Device(DEVICE_CPU), FindOp<CpuExec>);
REGISTER_KERNEL_BUILDER(Name("SokInsertOrAssign").Device(DEVICE_CPU), WriteOp<CpuExec, false>);
REGISTER_KERNEL_BUILDER(Name("SokAccumOrAssign").Device(DEVICE_CPU), WriteOp<CpuExec, true>);
REGISTER_KERNEL_BUILDER(Name("SokErase").Device(DEVICE_CPU), EraseOp<CpuExec>);
REGISTER_KERNEL_BUILDER(Name("SokSize").Device(DEVICE_CPU), SizeOp<CpuExec>);
REGISTER_KERNEL_BUILDER(Name("SokUniqueSum").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tkeys"), UniqueSumOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name("SokUniqueSum").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tkeys"), UniqueSumOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("SokUniqueSum").Device(DEVICE_CPU).TypeConstraint<uint64_t>("Tkeys"), UniqueSumOp<uint64_t>);
REGISTER_KERNEL_BUILDER(Name("SokExport").Device(DEVICE_CPU), ExportOp);

}  // namespace sok_tf
