// What the CPU kernels (pooled_lookup_ops.cc, libsok_tf_ops.so) and the GPU kernels
// (pooled_lookup_ops_gpu.cc, libsok_tf_ops_gpu.so) of SokPooledLookup and SokPooledLookupGrad share:
// the attributes and their checks, the shape checks that need no data, and the text of every error
// both devices raise (the GPU kernels raise the CPU kernels' errors, word for word, in the same
// order). Inline only: the two libraries are loaded separately and neither links the other.
#ifndef SOK_TF_OPS_POOLED_LOOKUP_OPS_H_
#define SOK_TF_OPS_POOLED_LOOKUP_OPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "row_dtypes.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace sok_tf {

// The combiners as both devices' kernels number them (sok_gpu::PooledCombiner has the same values:
// pooled_lookup_ops_gpu.cc checks it).
enum PooledCombinerCode : int32_t { kCombineSum = 0, kCombineMean = 1, kCombineSqrtn = 2 };

// The attributes both ops share: a combiner per table and how each table is sharded (the shard holds
// id i at row i / strides[t] when i mod strides[t] == offsets[t]; offset -1: no id). Empty strides
// and offsets attrs: every table whole (world size 1).
struct PooledAttrs {
  std::vector<int32_t> combiners;  // PooledCombinerCode
  std::vector<int64_t> strides;
  std::vector<int64_t> offsets;
};

inline ::tensorflow::Status parse_pooled_attrs(::tensorflow::OpKernelConstruction* ctx, PooledAttrs* out) {
  namespace errors = ::tensorflow::errors;
  std::vector<std::string> names;
  TF_RETURN_IF_ERROR(ctx->GetAttr("combiners", &names));
  out->combiners.assign(names.size(), kCombineSum);
  for (size_t t = 0; t < names.size(); ++t) {
    if (names[t] == "mean") {
      out->combiners[t] = kCombineMean;
    } else if (names[t] == "sqrtn") {
      out->combiners[t] = kCombineSqrtn;
    } else if (names[t] != "sum") {
      return errors::InvalidArgument("combiners[", t, "] = '", names[t], "' is not valid; valid: sum, mean, sqrtn");
    }
  }
  const size_t n = names.size();
  TF_RETURN_IF_ERROR(ctx->GetAttr("strides", &out->strides));
  TF_RETURN_IF_ERROR(ctx->GetAttr("offsets", &out->offsets));
  if (out->strides.empty() && out->offsets.empty()) {
    out->strides.assign(n, 1);
    out->offsets.assign(n, 0);
  }
  if (out->strides.size() != n || out->offsets.size() != n) {
    return errors::InvalidArgument("strides has ", out->strides.size(), " entries and offsets ", out->offsets.size(),
                                   " for ", n, " tables; valid: both empty or one per table");
  }
  for (size_t t = 0; t < n; ++t) {
    if (out->strides[t] < 1 || out->offsets[t] < -1 || out->offsets[t] >= out->strides[t]) {
      return errors::InvalidArgument("strides[", t, "] = ", out->strides[t], ", offsets[", t, "] = ", out->offsets[t],
                                     "; valid: stride >= 1 and -1 <= offset < stride");
    }
  }
  return ::tensorflow::Status();
}

// SokPooledLookup's names and positions attrs (a table's name and its place among the call's
// sp_ids, for its errors), one per combiner.
inline ::tensorflow::Status parse_lookup_attrs(::tensorflow::OpKernelConstruction* ctx, size_t num_tables,
                                               std::vector<std::string>* names, std::vector<int64_t>* positions) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("names", names));
  TF_RETURN_IF_ERROR(ctx->GetAttr("positions", positions));
  if (names->size() != num_tables || positions->size() != num_tables) {
    return ::tensorflow::errors::InvalidArgument("SokPooledLookup: ", num_tables, " combiners but ", names->size(),
                                                 " names and ", positions->size(), " positions");
  }
  return ::tensorflow::Status();
}

// SokPooledLookupGrad's table_rows (a row count per table) and padded attrs.
inline ::tensorflow::Status parse_grad_attrs(::tensorflow::OpKernelConstruction* ctx, size_t num_tables,
                                             std::vector<int64_t>* table_rows, bool* padded) {
  TF_RETURN_IF_ERROR(ctx->GetAttr("table_rows", table_rows));
  TF_RETURN_IF_ERROR(ctx->GetAttr("padded", padded));
  if (table_rows->size() != num_tables) {
    return ::tensorflow::errors::InvalidArgument("SokPooledLookupGrad: ", num_tables, " combiners but ",
                                                 table_rows->size(), " row counts");
  }
  return ::tensorflow::Status();
}

// The attributes of each op, read when its kernel is made: the kernels of both devices derive from
// PooledLookupKernel (SokPooledLookup) and PooledLookupGradKernel (SokPooledLookupGrad).
class PooledOpKernel : public ::tensorflow::OpKernel {
 public:
  explicit PooledOpKernel(::tensorflow::OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, parse_pooled_attrs(ctx, &attrs_));
  }

 protected:
  PooledAttrs attrs_;
};

class PooledLookupKernel : public PooledOpKernel {
 public:
  explicit PooledLookupKernel(::tensorflow::OpKernelConstruction* ctx) : PooledOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, parse_lookup_attrs(ctx, attrs_.combiners.size(), &names_, &positions_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("checked", &checked_));
    ::tensorflow::DataType dtype = ::tensorflow::DT_INVALID;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("T", &dtype));
    OP_REQUIRES(ctx, row_type_of(dtype, &row_type_),
                ::tensorflow::errors::InvalidArgument("SokPooledLookup: params of dtype ",
                                                      ::tensorflow::DataTypeString(dtype), "; valid: ",
                                                      kRowDtypesText));
  }

 protected:
  std::vector<std::string> names_;
  std::vector<int64_t> positions_;
  bool checked_ = false;  // the caller checked ids and row splits (the op's "checked" attr)
  sok_gpu::RowType row_type_ = sok_gpu::kRowFloat32;  // the params' dtype (the op's "T" attr)
};

class PooledLookupGradKernel : public PooledOpKernel {
 public:
  explicit PooledLookupGradKernel(::tensorflow::OpKernelConstruction* ctx) : PooledOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, parse_grad_attrs(ctx, attrs_.combiners.size(), &table_rows_, &padded_));
  }

 protected:
  std::vector<int64_t> table_rows_;
  bool padded_ = false;
};

// The rows and dim of each of SokPooledLookup's params, one per table.
inline ::tensorflow::Status params_shapes(::tensorflow::OpKernelContext* ctx, size_t num_tables,
                                          std::vector<int64_t>* rows, std::vector<int64_t>* dims) {
  namespace errors = ::tensorflow::errors;
  ::tensorflow::OpInputList params;
  TF_RETURN_IF_ERROR(ctx->input_list("params", &params));
  if (params.size() != static_cast<int>(num_tables)) {
    return errors::InvalidArgument("SokPooledLookup: ", params.size(), " params for ", num_tables, " combiners");
  }
  rows->assign(num_tables, 0);
  dims->assign(num_tables, 0);
  for (int t = 0; t < params.size(); ++t) {
    if (params[t].dims() != 2) {
      return errors::InvalidArgument("params[", t, "] must be [rows, dim], got ", params[t].shape());
    }
    (*rows)[t] = params[t].dim_size(0);
    (*dims)[t] = params[t].dim_size(1);
  }
  return ::tensorflow::Status();
}

// The dim of each of SokPooledLookupGrad's grads.
inline ::tensorflow::Status grads_dims(::tensorflow::OpKernelContext* ctx, std::vector<int64_t>* dims) {
  ::tensorflow::OpInputList grads;
  TF_RETURN_IF_ERROR(ctx->input_list("grads", &grads));
  dims->assign(grads.size(), 0);
  for (int t = 0; t < grads.size(); ++t) {
    if (grads[t].dims() != 2) {
      return ::tensorflow::errors::InvalidArgument("grads[", t, "] must be [batch, dim], got ", grads[t].shape());
    }
    (*dims)[t] = grads[t].dim_size(1);
  }
  return ::tensorflow::Status();
}

// The row count of each table of SokPooledLookupGrad: its table_rows entry, or for -1 (ids that
// number the distinct keys of a lookup: SokUniqueIndexList's positions) the count of its ids, which
// bounds them.
inline ::tensorflow::Status resolve_table_rows(::tensorflow::OpKernelContext* ctx,
                                               const std::vector<int64_t>& table_rows, std::vector<int64_t>* out) {
  ::tensorflow::OpInputList ids;
  TF_RETURN_IF_ERROR(ctx->input_list("ids", &ids));
  if (ids.size() != static_cast<int>(table_rows.size())) {
    return ::tensorflow::errors::InvalidArgument("SokPooledLookupGrad: ", table_rows.size(), " row counts but ",
                                                 ids.size(), " ids");
  }
  out->resize(table_rows.size());
  for (size_t t = 0; t < table_rows.size(); ++t) {
    if (table_rows[t] < -1) {
      return ::tensorflow::errors::InvalidArgument("table_rows[", t, "] = ", table_rows[t],
                                                   "; valid: the table's rows (>= 0), or -1 for ids that number "
                                                   "distinct keys");
    }
    (*out)[t] = table_rows[t] >= 0 ? table_rows[t] : ids[t].NumElements();
  }
  return ::tensorflow::Status();
}

// The errors of the inputs' values, in the order the CPU kernels check them: the list lengths, then
// per table its ids' rank, its row_splits' shape and values, its weights' count; the gradient's rows;
// the ids each shard holds.
namespace pooled_errors {

namespace errors = ::tensorflow::errors;
using ::tensorflow::Status;
using ::tensorflow::TensorShape;

inline Status list_lengths(int tables, int ids, int splits, int weights) {
  return errors::InvalidArgument("SokPooledLookup: ", tables, " tables but ", ids, " ids, ", splits, " row_splits and ",
                                 weights, " weights (valid: 0 or ", tables, ")");
}

inline Status ids_rank(int64_t t, const TensorShape& shape) {
  return errors::InvalidArgument("ids[", t, "] must be 1-D, got ", shape);
}

inline Status splits_shape(int64_t t, int64_t batch, const TensorShape& shape) {
  return errors::InvalidArgument("row_splits[", t, "] must have shape [", batch + 1, "] (batch + 1), got ", shape);
}

inline Status splits_range(int64_t t, int64_t nnz, int64_t first, int64_t last) {
  return errors::InvalidArgument("row_splits[", t, "] must run from 0 to ", nnz, " (the ids), got ", first, " .. ",
                                 last);
}

inline Status splits_decrease(int64_t t, int64_t row) {
  return errors::InvalidArgument("row_splits[", t, "] decreases at row ", row);
}

inline Status weights_count(int64_t t, int64_t weights, int64_t nnz) {
  return errors::InvalidArgument("weights[", t, "] has ", weights, " values for ", nnz, " ids");
}

inline Status grads_rows(int64_t t, int64_t rows, int64_t batch) {
  return errors::InvalidArgument("grads[", t, "] has ", rows, " rows for a batch of ", batch);
}

// SokPooledLookupGrad: held ids outside the shard's rows.
inline Status shard_rows(int64_t t, int64_t rows) {
  return errors::InvalidArgument("ids[", t, "] has ids outside [0, ", rows, "), the rows of its shard");
}

// SokPooledLookup: `count` held ids of table `name` (sp_ids[position]) outside [0, rows), e.g. `example`.
inline Status out_of_range(int64_t position, int64_t rows, int64_t stride, const std::string& name, int64_t count,
                           int64_t example) {
  const std::string shard = stride == 1 ? "" : " (this rank holds id i at row i / " + std::to_string(stride) + ")";
  return errors::InvalidArgument("sp_ids[", position, "] has ids outside [0, ", rows, ")", shard, " for table ", name,
                                 ": ", count, " of them, e.g. ", example, "; static tables take ids 0 .. rows-1");
}

}  // namespace pooled_errors
}  // namespace sok_tf

#endif  // SOK_TF_OPS_POOLED_LOOKUP_OPS_H_
