// TensorFlow ops over a storage's C ABI: the training path of sok.DynamicVariable.
//
// Each op takes the variable's resource handle (input 0) and the address of its sok_table_ref
// (input 1, an int64 scalar) and calls the backend through its function table; sok-core never links a
// backend. The handle is never read: it is there so that tf.function's automatic control dependencies
// order every op on one table in program order (a lookup is never moved past an update of its rows)
// and so that gradients reach the variable. CPU kernels; the CUDA build adds DEVICE_GPU
// registrations that pass TF's stream in the execution context.
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "sok/backend.hpp"
#include "sok/table_ref.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace sok_tf {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;
namespace errors = ::tensorflow::errors;

constexpr sok_exec_context kCpu{SOK_DEVICE_CPU, 0, nullptr};
// Inputs of every table op: 0 the variable's resource handle, 1 the table reference, 2 the keys.
constexpr int kTable = 1;
constexpr int kKeys = 2;

int32_t key_type_of(::tensorflow::DataType dt) {
  switch (dt) {
    case ::tensorflow::DT_INT64: return SOK_KEY_INT64;
    case ::tensorflow::DT_UINT64: return SOK_KEY_UINT64;
    case ::tensorflow::DT_INT32: return SOK_KEY_INT32;
    default: return -1;
  }
}

// The table reference behind input `input` (an int64 scalar address), checked.
Status table_from(OpKernelContext* ctx, int input, sok_table_ref** out) {
  const Tensor& t = ctx->input(input);
  if (!::tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return errors::InvalidArgument("the table reference must be an int64 scalar, got shape ",
                                   t.shape().DebugString());
  }
  auto* ref = reinterpret_cast<sok_table_ref*>(static_cast<intptr_t>(t.scalar<int64_t>()()));
  if (ref == nullptr || ref->magic != SOK_TABLE_REF_MAGIC || ref->api == nullptr || ref->storage == nullptr) {
    return errors::FailedPrecondition(
        "the table reference does not point at a live SOK storage (was its variable deleted?)");
  }
  *out = ref;
  return Status();
}

Status status_of(const sok_table_ref* ref, sok_status st, const char* op) {
  if (st == SOK_OK) return Status();
  std::string message = std::string(op) + " failed in backend '" + ref->api->backend_name +
                        "': " + ref->api->last_error(ref->storage);
  switch (st) {
    case SOK_ERROR_INVALID_ARGUMENT: return errors::InvalidArgument(message);
    case SOK_ERROR_OUT_OF_MEMORY: return errors::ResourceExhausted(message);
    case SOK_ERROR_UNSUPPORTED: return errors::Unimplemented(message);
    case SOK_ERROR_CAPACITY: return errors::ResourceExhausted(message);
    default: return errors::Internal(message);
  }
}

#define SOK_OK_OR_RETURN(ctx, expr)      \
  do {                                   \
    Status _s = (expr);                  \
    if (!_s.ok()) {                      \
      (ctx)->SetStatus(_s);              \
      return;                            \
    }                                    \
  } while (0)

// Ops that read or write a column range [col_begin, col_end) of rows (new rows are filled by the
// reference's initializers).
class RowOp : public OpKernel {
 public:
  explicit RowOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("col_begin", &col_begin_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("col_end", &col_end_));
    OP_REQUIRES(ctx, col_begin_ >= 0 && col_end_ > col_begin_,
                errors::InvalidArgument("bad column range [", col_begin_, ", ", col_end_, ")"));
  }

 protected:
  // The reference, checked against the keys' dtype (input keys_input).
  Status prepare(OpKernelContext* ctx, int keys_input, sok_table_ref** ref) {
    TF_RETURN_IF_ERROR(table_from(ctx, keys_input - 1, ref));
    const int32_t kt = key_type_of(ctx->input(keys_input).dtype());
    if (kt != (*ref)->key_type) {
      return errors::InvalidArgument("keys have dtype ", ::tensorflow::DataTypeString(ctx->input(keys_input).dtype()),
                                     " but the table's key type is ", sok::key_type_name((*ref)->key_type));
    }
    if (col_end_ > (*ref)->row_width) {
      return errors::InvalidArgument("column range [", col_begin_, ", ", col_end_, ") exceeds the row width ",
                                     (*ref)->row_width);
    }
    return Status();
  }
  int32_t width() const { return col_end_ - col_begin_; }
  // Output `index` of shape keys.shape + [width()]: one row of the column range per key.
  Status allocate_rows(OpKernelContext* ctx, int index, const Tensor& keys, Tensor** out) const {
    TensorShape shape = keys.shape();
    shape.AddDim(width());
    return ctx->allocate_output(index, shape, out);
  }

  int32_t col_begin_ = 0;
  int32_t col_end_ = 0;
};

// values = rows of keys, inserting missing keys.
class LookupOp : public RowOp {
 public:
  using RowOp::RowOp;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, prepare(ctx, kKeys, &ref));
    const Tensor& keys = ctx->input(kKeys);
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, allocate_rows(ctx, 0, keys, &values));
    const int64_t n = keys.NumElements();
    sok_status st = ref->api->find_or_insert(ref->storage, &kCpu, n, keys.data(), col_begin_, col_end_,
                                             values->flat<float>().data(), nullptr, nullptr, ref->inits, ref->num_inits);
    SOK_OK_OR_RETURN(ctx, status_of(ref, st, "lookup (find_or_insert)"));
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
    const size_t key_bytes = ref->key_type == SOK_KEY_INT32 ? 4 : 8;
    std::vector<char> missing_keys;
    std::vector<float> rows;
    int64_t m = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (found[i]) continue;
      missing_keys.resize((m + 1) * key_bytes);
      std::memcpy(missing_keys.data() + m * key_bytes, static_cast<const char*>(keys.data()) + i * key_bytes, key_bytes);
      rows.resize((m + 1) * row);
      sok::init_row(rows.data() + m * row, row, sok::load_key(keys.data(), ref->key_type, i), ref->inits, ref->num_inits);
      std::memcpy(out + i * w, rows.data() + m * row + col_begin_, sizeof(float) * w);
      ++m;
    }
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

// values, found = rows of keys (default zeros); never inserts.
class FindOp : public RowOp {
 public:
  using RowOp::RowOp;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, prepare(ctx, kKeys, &ref));
    const Tensor& keys = ctx->input(kKeys);
    Tensor* values = nullptr;
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, allocate_rows(ctx, 0, keys, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &found));
    sok_status st = ref->api->find(ref->storage, &kCpu, keys.NumElements(), keys.data(), col_begin_, col_end_,
                                   values->flat<float>().data(), nullptr,
                                   reinterpret_cast<uint8_t*>(found->flat<bool>().data()));
    SOK_OK_OR_RETURN(ctx, status_of(ref, st, "find"));
  }
};

// Writes values to the rows of keys: insert_or_assign or accum_or_assign.
template <bool kAccumulate>
class WriteOp : public RowOp {
 public:
  using RowOp::RowOp;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, prepare(ctx, kKeys, &ref));
    const Tensor& keys = ctx->input(kKeys);
    const Tensor& values = ctx->input(kKeys + 1);
    const int64_t n = keys.NumElements();
    OP_REQUIRES(ctx, values.NumElements() == n * width(),
                errors::InvalidArgument("values must hold ", n, " rows of ", width(), " floats, got shape ",
                                        values.shape().DebugString()));
    auto fn = kAccumulate ? ref->api->accum_or_assign : ref->api->insert_or_assign;
    sok_status st = fn(ref->storage, &kCpu, n, keys.data(), col_begin_, col_end_, values.flat<float>().data(),
                       nullptr, ref->inits, ref->num_inits);
    SOK_OK_OR_RETURN(ctx, status_of(ref, st, kAccumulate ? "accum_or_assign" : "insert_or_assign"));
  }
};

class EraseOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, table_from(ctx, kTable, &ref));
    const Tensor& keys = ctx->input(kKeys);
    OP_REQUIRES(ctx, key_type_of(keys.dtype()) == ref->key_type,
                errors::InvalidArgument("keys dtype does not match the table's key type"));
    Tensor* count = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &count));
    int64_t erased = 0;
    sok_status st = ref->api->erase(ref->storage, &kCpu, keys.NumElements(), keys.data(), &erased);
    SOK_OK_OR_RETURN(ctx, status_of(ref, st, "erase"));
    count->scalar<int64_t>()() = erased;
  }
};

class SizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, table_from(ctx, kTable, &ref));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    int64_t size = 0;
    SOK_OK_OR_RETURN(ctx, status_of(ref, ref->api->size(ref->storage, &kCpu, &size), "size"));
    out->scalar<int64_t>()() = size;
  }
};

// keys, values, scores of every row (with filter: rows scored >= threshold).
class ExportOp : public RowOp {
 public:
  explicit ExportOp(OpKernelConstruction* ctx) : RowOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("filter", &filter_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tkeys", &key_dtype_));
  }
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, table_from(ctx, kTable, &ref));
    OP_REQUIRES(ctx, key_type_of(key_dtype_) == ref->key_type,
                errors::InvalidArgument("Tkeys does not match the table's key type"));
    const uint64_t threshold = ctx->input(kTable + 1).scalar<uint64_t>()();
    int64_t capacity = 0;
    SOK_OK_OR_RETURN(ctx, status_of(ref, ref->api->capacity(ref->storage, &capacity), "capacity"));
    const int64_t key_bytes = ref->key_type == SOK_KEY_INT32 ? 4 : 8;
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
      sok_status st = filter_ ? ref->api->export_if(ref->storage, &kCpu, threshold, offset, limit, col_begin_, col_end_,
                                                    keys.data() + total * key_bytes, values.data() + total * width(),
                                                    scores.data() + total, &count)
                              : ref->api->export_batch(ref->storage, &kCpu, offset, limit, col_begin_, col_end_,
                                                       keys.data() + total * key_bytes, values.data() + total * width(),
                                                       scores.data() + total, &count);
      SOK_OK_OR_RETURN(ctx, status_of(ref, st, "export"));
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

 private:
  bool filter_ = false;
  ::tensorflow::DataType key_dtype_;
};

// unique_keys, sums = the distinct keys (in order of first occurrence) and the sum of the rows of
// values per distinct key: tf.unique + unsorted_segment_sum in one pass over a hash index.
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
    const int64_t w = values_t.dim_size(1);
    const K* keys = keys_t.flat<K>().data();
    const float* values = values_t.flat<float>().data();
    int64_t slots = 16;
    while (slots < 2 * n) slots <<= 1;
    std::vector<int64_t> index(slots, -1);  // slot -> position among the distinct keys
    std::vector<int64_t> position(n);        // key i -> position of its distinct key
    std::vector<K> distinct;
    distinct.reserve(n);
    for (int64_t i = 0; i < n; ++i) {
      const K key = keys[i];
      uint64_t s = sok::hash_key(static_cast<uint64_t>(key)) & (slots - 1);
      while (index[s] >= 0 && distinct[index[s]] != key) s = (s + 1) & (slots - 1);
      if (index[s] < 0) {
        index[s] = static_cast<int64_t>(distinct.size());
        distinct.push_back(key);
      }
      position[i] = index[s];
    }
    const int64_t u = static_cast<int64_t>(distinct.size());
    Tensor *unique_t = nullptr, *sums_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u}), &unique_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({u, w}), &sums_t));
    std::copy(distinct.begin(), distinct.end(), unique_t->flat<K>().data());
    float* sums = sums_t->flat<float>().data();
    std::fill(sums, sums + u * w, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      float* dst = sums + position[i] * w;
      const float* src = values + i * w;
      for (int64_t c = 0; c < w; ++c) dst[c] += src[c];
    }
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

REGISTER_KERNEL_BUILDER(Name("SokLookup").Device(DEVICE_CPU), LookupOp);
REGISTER_KERNEL_BUILDER(Name("SokFindOrInsert").Device(DEVICE_CPU), LookupOp);
REGISTER_KERNEL_BUILDER(Name("SokLookupAndEvict").Device(DEVICE_CPU), LookupAndEvictOp);
REGISTER_KERNEL_BUILDER(Name("SokFind").Device(DEVICE_CPU), FindOp);
REGISTER_KERNEL_BUILDER(Name("SokInsertOrAssign").Device(DEVICE_CPU), WriteOp<false>);
REGISTER_KERNEL_BUILDER(Name("SokAccumOrAssign").Device(DEVICE_CPU), WriteOp<true>);
REGISTER_KERNEL_BUILDER(Name("SokErase").Device(DEVICE_CPU), EraseOp);
REGISTER_KERNEL_BUILDER(Name("SokSize").Device(DEVICE_CPU), SizeOp);
REGISTER_KERNEL_BUILDER(Name("SokUniqueSum").Device(DEVICE_CPU).TypeConstraint<int64_t>("Tkeys"), UniqueSumOp<int64_t>);
REGISTER_KERNEL_BUILDER(Name("SokUniqueSum").Device(DEVICE_CPU).TypeConstraint<int32_t>("Tkeys"), UniqueSumOp<int32_t>);
REGISTER_KERNEL_BUILDER(Name("SokUniqueSum").Device(DEVICE_CPU).TypeConstraint<uint64_t>("Tkeys"), UniqueSumOp<uint64_t>);
REGISTER_KERNEL_BUILDER(Name("SokExport").Device(DEVICE_CPU), ExportOp);

}  // namespace sok_tf
