// What the CPU kernels (pooled_lookup_ops.cc, libsok_tf_ops.so) and the GPU kernels
// (pooled_lookup_ops_gpu.cc, libsok_tf_ops_gpu.so) of SokPooledLookupGrad share. Inline only: the
// two libraries are loaded separately and neither links the other.
#ifndef SOK_TF_OPS_POOLED_LOOKUP_OPS_H_
#define SOK_TF_OPS_POOLED_LOOKUP_OPS_H_

#include <cstdint>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"

namespace sok_tf {

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
      return ::tensorflow::errors::InvalidArgument(
          "table_rows[", t, "] = ", table_rows[t], "; valid: the table's rows (>= 0), or -1 for ids that number distinct keys");
    }
    (*out)[t] = table_rows[t] >= 0 ? table_rows[t] : ids[t].NumElements();
  }
  return ::tensorflow::Status();
}

}  // namespace sok_tf

#endif  // SOK_TF_OPS_POOLED_LOOKUP_OPS_H_
