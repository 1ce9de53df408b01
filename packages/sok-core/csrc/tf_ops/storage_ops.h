// What the CPU kernels (storage_ops.cc, libsok_tf_ops.so) and the GPU kernels (storage_ops_gpu.cc,
// libsok_tf_ops_gpu.so) of SOK's TensorFlow ops share: reading the table reference, turning ABI
// status codes into TF errors, and the kernels that differ between devices only in the execution
// context they pass to the ABI.
//
// Everything here is inline or a template: the two libraries are loaded separately and neither
// links the other.
#ifndef SOK_TF_OPS_STORAGE_OPS_H_
#define SOK_TF_OPS_STORAGE_OPS_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "sok/kit/initializers.hpp"
#include "sok/kit/keys.hpp"
#include "sok/table_ref.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok_tf {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

// Inputs of every table op: 0 the variable's resource handle, 1 the table reference, 2 the keys.
constexpr int kTable = 1;
constexpr int kKeys = 2;

inline int32_t key_type_of(::tensorflow::DataType dt) {
  switch (dt) {
    case ::tensorflow::DT_INT64: return SOK_KEY_INT64;
    case ::tensorflow::DT_UINT64: return SOK_KEY_UINT64;
    case ::tensorflow::DT_INT32: return SOK_KEY_INT32;
    default: return -1;
  }
}

// The table reference behind input `input` (an int64 scalar address in host memory), checked.
inline Status table_from(OpKernelContext* ctx, int input, sok_table_ref** out) {
  const Tensor& t = ctx->input(input);
  if (!::tensorflow::TensorShapeUtils::IsScalar(t.shape())) {
    return errors::InvalidArgument("the table reference must be an int64 scalar, got shape ",
                                   t.shape().DebugString());
  }
  auto* ref = reinterpret_cast<sok_table_ref*>(static_cast<intptr_t>(t.scalar<int64_t>()()));
  if (!sok_table_ref_is_live(ref) || ref->api == nullptr || ref->storage == nullptr) {
    return errors::FailedPrecondition(
        "the table reference does not point at a live SOK storage (was its variable deleted?)");
  }
  *out = ref;
  return Status();
}

// Keys of one call are indexed with int32 positions: fewer than 2**31 of them.
constexpr int64_t kMaxKeys = int64_t{1} << 31;

inline Status check_key_count(int64_t n) {
  if (n < kMaxKeys) return Status();
  return errors::InvalidArgument("at most 2**31 - 1 keys per call, got ", n, "; split the batch");
}

// SokUniqueIndexList's key tensors: fewer than 2**31 keys each.
inline Status check_key_counts(const ::tensorflow::OpInputList& keys) {
  for (int t = 0; t < keys.size(); ++t) {
    if (keys[t].NumElements() >= kMaxKeys) {
      return errors::InvalidArgument("keys[", t, "] has ", keys[t].NumElements(),
                                     " keys; at most 2**31 - 1 per table and call: split the batch");
    }
  }
  return Status();
}

// SokUniqueIndexList's attrs agree: one key type per table.
inline Status check_unique_index_list(OpKernelConstruction* ctx) {
  int num_tables = 0;
  std::vector<::tensorflow::DataType> types;
  TF_RETURN_IF_ERROR(ctx->GetAttr("num_tables", &num_tables));
  TF_RETURN_IF_ERROR(ctx->GetAttr("Tkeys", &types));
  if (static_cast<int>(types.size()) != num_tables) {
    return errors::InvalidArgument("SokUniqueIndexList: num_tables = ", num_tables, " but ", types.size(),
                                   " key tensors; valid: one key tensor per table");
  }
  return Status();
}

inline Status status_of(const sok_table_ref* ref, sok_status st, const char* op) {
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

#define SOK_OK_OR_RETURN(ctx, expr) \
  do {                              \
    Status _s = (expr);             \
    if (!_s.ok()) {                 \
      (ctx)->SetStatus(_s);         \
      return;                       \
    }                               \
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
  // Output `index` of shape keys.shape + [width()]: one row of the column range per key. On the CPU
  // the rows are GPU-compatible (pinned) host memory where TensorFlow has a GPU, so a GPU op that
  // reads them (a CPU table feeding a GPU model) copies them by DMA, not through a staging buffer.
  Status allocate_rows(OpKernelContext* ctx, int index, const Tensor& keys, Tensor** out) const {
    TensorShape shape = keys.shape();
    shape.AddDim(width());
    ::tensorflow::AllocatorAttributes attr;
    attr.set_gpu_compatible(ctx->device()->attributes().device_type() == ::tensorflow::DEVICE_CPU);
    return ctx->allocate_output(index, shape, out, attr);
  }

  int32_t col_begin_ = 0;
  int32_t col_end_ = 0;
};

// SokLookupDistinct's inputs kKeys (any shape, n elements), kKeys + 1 (distinct keys, u) and kKeys + 2
// (positions, n), checked alike on every device (the position values: by each kernel).
inline Status check_distinct_lookup_inputs(OpKernelContext* ctx) {
  const Tensor& keys = ctx->input(kKeys);
  const Tensor& distinct = ctx->input(kKeys + 1);
  const Tensor& positions = ctx->input(kKeys + 2);
  if (distinct.dtype() != keys.dtype() || distinct.dims() != 1) {
    return errors::InvalidArgument("distinct_keys must be a vector of the keys' dtype, got ",
                                   ::tensorflow::DataTypeString(distinct.dtype()), " of shape ",
                                   distinct.shape().DebugString());
  }
  if (positions.dims() != 1 || positions.NumElements() != keys.NumElements()) {
    return errors::InvalidArgument("positions must have shape [", keys.NumElements(), "] (one per key), got ",
                                   positions.shape().DebugString());
  }
  return Status();
}

// SokExport's attributes and its per-chunk call, the same on every device.
class ExportOpBase : public RowOp {
 public:
  explicit ExportOpBase(OpKernelConstruction* ctx) : RowOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("filter", &filter_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Tkeys", &key_dtype_));
  }

 protected:
  // The reference, the score threshold (input 2, a host scalar) and the number of slots to scan.
  Status begin(OpKernelContext* ctx, sok_table_ref** ref, uint64_t* threshold, int64_t* capacity) const {
    TF_RETURN_IF_ERROR(table_from(ctx, kTable, ref));
    if (key_type_of(key_dtype_) != (*ref)->key_type) {
      return errors::InvalidArgument("Tkeys is ", ::tensorflow::DataTypeString(key_dtype_),
                                     " but the table's key type is ", sok::key_type_name((*ref)->key_type));
    }
    *threshold = ctx->input(kTable + 1).scalar<uint64_t>()();
    return status_of(*ref, (*ref)->api->capacity((*ref)->storage, capacity), "capacity");
  }
  // The live rows of slots [offset, offset + limit) (with filter: those scored >= threshold) into
  // keys (limit,), values (limit, width()), scores (limit,); *count = rows written (host).
  Status export_chunk(const sok_table_ref* ref, const sok_exec_context* exec, uint64_t threshold, int64_t offset,
                      int64_t limit, void* keys, float* values, uint64_t* scores, int64_t* count) const {
    sok_status st = filter_ ? ref->api->export_if(ref->storage, exec, threshold, offset, limit, col_begin_, col_end_,
                                                  keys, values, scores, count)
                            : ref->api->export_batch(ref->storage, exec, offset, limit, col_begin_, col_end_, keys,
                                                     values, scores, count);
    return status_of(ref, st, filter_ ? "export_if" : "export_batch");
  }

  bool filter_ = false;
  ::tensorflow::DataType key_dtype_ = ::tensorflow::DT_INVALID;
};

// The host half of lookup-and-evict, the same on every device: for the keys (n,) that found (n,)
// marks missing, their keys go to missing_keys (m,), their initial whole rows (from the reference's
// initializers) to rows (m, row_width), and the columns [col_begin, col_begin + w) of each initial
// row to values (n, w) at the key's position. All arrays in host memory. Returns m.
inline int64_t init_missing_rows(const sok_table_ref* ref, int64_t n, const void* keys, const uint8_t* found,
                                 int32_t col_begin, int32_t w, float* values, std::vector<char>* missing_keys,
                                 std::vector<float>* rows) {
  const size_t key_bytes = sok::key_size(ref->key_type);
  const int32_t row = ref->row_width;
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) m += found[i] ? 0 : 1;
  missing_keys->resize(m * key_bytes);
  rows->resize(m * row);
  int64_t j = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (found[i]) continue;
    std::memcpy(missing_keys->data() + j * key_bytes, static_cast<const char*>(keys) + i * key_bytes, key_bytes);
    float* r = rows->data() + j * row;
    sok::init_row(r, row, sok::load_key(keys, ref->key_type, i), ref->inits, ref->num_inits);
    std::memcpy(values + i * w, r + col_begin, sizeof(float) * w);
    ++j;
  }
  return m;
}

// The kernels below are the same on every device: `Exec::of(ctx)` gives the sok_exec_context
// (CPU: host pointers, no stream; CUDA: TF's device and stream), and the backend does the work.
// Keys, values and found live where Exec says; the table reference and scalar outputs on the host.

// values = rows of keys, inserting missing keys.
//
// kReport (SokTryLookup): the op never fails for what the table says; it returns the status
// instead, as outputs 1 (int32 scalar: the TensorFlow error code, 0 when the lookup worked) and 2
// (string scalar: the message), both in host memory, with values all zeros after a failure. The
// multi-rank lookup_sparse uses it so that a rank whose lookup fails still joins the exchange and
// every rank can raise together. `Exec::zero(ctx, data, bytes)` clears memory where values live.
template <class Exec, bool kReport = false>
class LookupOp : public RowOp {
 public:
  using RowOp::RowOp;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& keys = ctx->input(kKeys);
    Tensor* values = nullptr;
    OP_REQUIRES_OK(ctx, allocate_rows(ctx, 0, keys, &values));
    Status status = lookup(ctx, keys, values);
    if (!kReport) {
      SOK_OK_OR_RETURN(ctx, status);
      return;
    }
    if (!status.ok() && values->NumElements() > 0) {
      SOK_OK_OR_RETURN(ctx, Exec::zero(ctx, values->data(), sizeof(float) * values->NumElements()));
    }
    Tensor *code = nullptr, *message = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &code));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({}), &message));
    code->scalar<int32_t>()() = static_cast<int32_t>(status.code());
    message->scalar<::tensorflow::tstring>()() = std::string(status.message());
  }

 private:
  Status lookup(OpKernelContext* ctx, const Tensor& keys, Tensor* values) {
    sok_table_ref* ref = nullptr;
    TF_RETURN_IF_ERROR(prepare(ctx, kKeys, &ref));
    const sok_exec_context exec = Exec::of(ctx);
    sok_status st = ref->api->find_or_insert(ref->storage, &exec, keys.NumElements(), keys.data(), col_begin_,
                                             col_end_, values->flat<float>().data(), nullptr, nullptr, ref->inits,
                                             ref->num_inits);
    return status_of(ref, st, "lookup (find_or_insert)");
  }
};

// values, found = rows of keys; never inserts. A missing key's row is zeros, or with kDefault the
// input default_row (one row of the column range, on the op's device).
template <class Exec, bool kDefault = false>
class FindOp : public RowOp {
 public:
  using RowOp::RowOp;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, prepare(ctx, kKeys, &ref));
    const Tensor& keys = ctx->input(kKeys);
    const float* default_row = nullptr;
    if (kDefault) {
      const Tensor& row = ctx->input(kKeys + 1);
      OP_REQUIRES(ctx, row.dims() == 1 && row.NumElements() == width(),
                  errors::InvalidArgument("default_row must be one row of ", width(), " floats (the column range), got shape ",
                                          row.shape().DebugString()));
      default_row = row.flat<float>().data();
    }
    Tensor* values = nullptr;
    Tensor* found = nullptr;
    OP_REQUIRES_OK(ctx, allocate_rows(ctx, 0, keys, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &found));
    const sok_exec_context exec = Exec::of(ctx);
    sok_status st = ref->api->find(ref->storage, &exec, keys.NumElements(), keys.data(), col_begin_, col_end_,
                                   values->flat<float>().data(), default_row,
                                   reinterpret_cast<uint8_t*>(found->flat<bool>().data()));
    SOK_OK_OR_RETURN(ctx, status_of(ref, st, "find"));
  }
};

// Writes values to the rows of keys: insert_or_assign or accum_or_assign.
template <class Exec, bool kAccumulate>
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
    const sok_exec_context exec = Exec::of(ctx);
    auto fn = kAccumulate ? ref->api->accum_or_assign : ref->api->insert_or_assign;
    sok_status st = fn(ref->storage, &exec, n, keys.data(), col_begin_, col_end_, values.flat<float>().data(),
                       nullptr, ref->inits, ref->num_inits);
    SOK_OK_OR_RETURN(ctx, status_of(ref, st, kAccumulate ? "accum_or_assign" : "insert_or_assign"));
  }
};

// count (host scalar) = how many of keys were present; they are removed.
template <class Exec>
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
    const sok_exec_context exec = Exec::of(ctx);
    int64_t erased = 0;
    sok_status st = ref->api->erase(ref->storage, &exec, keys.NumElements(), keys.data(), &erased);
    SOK_OK_OR_RETURN(ctx, status_of(ref, st, "erase"));
    count->scalar<int64_t>()() = erased;
  }
};

// size (host scalar) = the number of rows.
template <class Exec>
class SizeOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    sok_table_ref* ref = nullptr;
    SOK_OK_OR_RETURN(ctx, table_from(ctx, kTable, &ref));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    const sok_exec_context exec = Exec::of(ctx);
    int64_t size = 0;
    SOK_OK_OR_RETURN(ctx, status_of(ref, ref->api->size(ref->storage, &exec, &size), "size"));
    out->scalar<int64_t>()() = size;
  }
};

// table (host scalar) = the attr `address`: the table input of the storage ops made on their own
// device (host memory), so that a graph of ops on a GPU takes no tensor from the CPU.
class TableAddressOp : public OpKernel {
 public:
  explicit TableAddressOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("address", &address_));
  }
  void Compute(OpKernelContext* ctx) override {
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = address_;
  }

 private:
  int64_t address_ = 0;
};

}  // namespace sok_tf

#endif  // SOK_TF_OPS_STORAGE_OPS_H_
