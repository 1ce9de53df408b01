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
// found and loaded only by a CUDA build of TensorFlow; storage_ops.h holds what both share. The
// training ops that are not a storage's own calls (SokUniqueIndex and the like, SokSparseApply) are
// in training_ops.cc.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "sok/kit/export.hpp"
#include "sok/kit/rows.hpp"
#include "cpu_ops.h"
#include "storage_ops.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace sok_tf {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpInputList;
using ::tensorflow::OpOutputList;
using ::tensorflow::shape_inference::InferenceContext;


// The execution context of the CPU kernels: host pointers, no stream.
struct CpuExec {
  static sok_exec_context of(OpKernelContext*) { return kCpu; }
  static Status zero(OpKernelContext*, void* data, size_t bytes) {
    std::memset(data, 0, bytes);
    return Status();
  }
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
      sok::copy_row(ev_out + j * w, evicted_rows.data() + j * row + col_begin_, w);
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
    const int64_t kChunk = sok::export_chunk_slots(key_bytes + 4 * width() + 8);
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

// SokLookupDistinct (CPU): the rows of keys for backends whose find_or_insert leaves the same rows
// and scores whether a key repeats in a batch or not. Each distinct key (from SokUniqueIndex of the
// flattened keys, in order of first occurrence, so new keys get the same rows) is looked up once
// and its row copied to every occurrence: a power-law batch has several times fewer distinct keys
// than keys. The keys input gives the output's shape and the gradient's indices; sok's optimizer
// reuses the distinct keys and positions for its update.
class LookupDistinctOp : public RowOp {
 public:
  using RowOp::RowOp;

  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, prepare(ctx, kKeys, &ref));
    const Tensor& keys = ctx->input(kKeys);
    const Tensor& distinct = ctx->input(kKeys + 1);
    const Tensor& positions = ctx->input(kKeys + 2);
    const int64_t n = keys.NumElements();
    const int64_t u = distinct.NumElements();
    OP_REQUIRES_OK(ctx, check_distinct_lookup_inputs(ctx));
    OP_REQUIRES_OK(ctx, check_positions(positions, u));
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, allocate_rows(ctx, 0, keys, &values));
    const int64_t w = width();
    Tensor rows_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT, TensorShape({u, w}), &rows_t));
    const float* rows = rows_t.flat<float>().data();
    SOK_OK_OR_RETURN(ctx, status_of(ref,
                                    ref->api->find_or_insert(ref->storage, &kCpu, u, distinct.data(), col_begin_,
                                                             col_end_, rows_t.flat<float>().data(), nullptr, nullptr,
                                                             ref->inits, ref->num_inits),
                                    "lookup (find_or_insert)"));
    const int32_t* position = positions.flat<int32_t>().data();
    float* out = values->flat<float>().data();
    in_parallel(ctx, n, 2 * w, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sok::copy_row(out + i * w, rows + static_cast<int64_t>(position[i]) * w, w);
    });
  }
};


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

// The output, attributes and shape of the ops that return rows [col_begin, col_end) of their keys.
#define SOK_ROWS_OF_KEYS                                                   \
  .Output("values: float")                                                 \
  .Attr(SOK_KEY_TYPES)                                                     \
  .Attr("col_begin: int")                                                  \
  .Attr("col_end: int")                                                    \
  .SetIsStateful()                                                         \
  .SetShapeFn([](InferenceContext* c) { return RowsShape(c, kKeys); })

REGISTER_OP("SokLookup")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("keys: Tkeys")
    SOK_ROWS_OF_KEYS
    .Doc("Rows [col_begin, col_end) of keys, inserting missing keys with the initializers.");

REGISTER_OP("SokLookupDistinct")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("keys: Tkeys")
    .Input("distinct_keys: Tkeys")
    .Input("positions: int32")
    SOK_ROWS_OF_KEYS
    .Doc("SokLookup for backends whose find_or_insert does not depend on repeats: each of distinct_keys "
         "(SokUniqueIndex of the flattened keys) is looked up once and copied to its positions.");

REGISTER_OP("SokTryLookup")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("keys: Tkeys")
    .Output("values: float")
    .Output("status_code: int32")
    .Output("status_message: string")
    .Attr(SOK_KEY_TYPES)
    .Attr("col_begin: int")
    .Attr("col_end: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RowsShape(c, kKeys));
      c->set_output(1, c->Scalar());
      c->set_output(2, c->Scalar());
      return Status();
    })
    .Doc("SokLookup that does not fail when the table does: status_code is the TensorFlow error code (0: ok) and "
         "status_message its message; values are zeros after a failure. For the multi-rank lookup_sparse, where "
         "every rank must join the exchange before any raises.");

REGISTER_OP("SokFindOrInsert")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("keys: Tkeys")
    SOK_ROWS_OF_KEYS
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

REGISTER_OP("SokFindOrDefault")
    .Input("handle: resource")
    .Input("table: int64")
    .Input("keys: Tkeys")
    .Input("default_row: float")
    .Output("values: float")
    .Output("found: bool")
    .Attr(SOK_KEY_TYPES)
    .Attr("col_begin: int")
    .Attr("col_end: int")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RowsShape(c, kKeys));
      ::tensorflow::shape_inference::ShapeHandle row;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(kKeys + 1), 1, &row));
      c->set_output(1, c->input(kKeys));
      return Status();
    })
    .Doc("Rows of keys, default_row (one row of the column range) where a key is missing; never inserts.");

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

REGISTER_OP("SokTableAddress")
    .Output("table: int64")
    .Attr("address: int")
    .SetIsStateful()  // not folded into a Const, which would live on the CPU
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape)
    .Doc("The table input of the storage ops, made on their device: a host scalar holding `address`.");

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
REGISTER_KERNEL_BUILDER(Name("SokLookupDistinct").Device(DEVICE_CPU), LookupDistinctOp);
REGISTER_KERNEL_BUILDER(Name("SokFindOrInsert").Device(DEVICE_CPU), LookupOp<CpuExec>);
REGISTER_KERNEL_BUILDER(Name("SokTryLookup").Device(DEVICE_CPU), LookupOp<CpuExec, true>);
REGISTER_KERNEL_BUILDER(Name("SokLookupAndEvict").Device(DEVICE_CPU), LookupAndEvictOp);
REGISTER_KERNEL_BUILDER(Name("SokFind").Device(DEVICE_CPU), FindOp<CpuExec>);
REGISTER_KERNEL_BUILDER(Name("SokFindOrDefault").Device(DEVICE_CPU), (FindOp<CpuExec, true>));
REGISTER_KERNEL_BUILDER(Name("SokInsertOrAssign").Device(DEVICE_CPU), WriteOp<CpuExec, false>);
REGISTER_KERNEL_BUILDER(Name("SokAccumOrAssign").Device(DEVICE_CPU), WriteOp<CpuExec, true>);
REGISTER_KERNEL_BUILDER(Name("SokErase").Device(DEVICE_CPU), EraseOp<CpuExec>);
REGISTER_KERNEL_BUILDER(Name("SokSize").Device(DEVICE_CPU), SizeOp<CpuExec>);
REGISTER_KERNEL_BUILDER(Name("SokTableAddress").Device(DEVICE_CPU), TableAddressOp);
REGISTER_KERNEL_BUILDER(Name("SokExport").Device(DEVICE_CPU), ExportOp);

}  // namespace sok_tf
