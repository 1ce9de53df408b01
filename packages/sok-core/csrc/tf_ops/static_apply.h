// What the CPU kernel (static_apply_ops.cc, libsok_tf_ops.so) and the GPU kernel
// (static_apply_ops_gpu.cc, libsok_tf_ops_gpu.so) of SokSparseApplyAdagradTables share: the checks
// of the inputs, the locks of the variables, and their copy before an in-place write when a read
// still holds their buffer. Everything is inline: the two libraries never link each other.
//
// The op is Keras 3 Adagrad's update_step on an IndexedSlices gradient, for several static tables
// at once (each a resource variable and its accumulator):
//   accumulator[i] += g_i * g_i           for every row i of the gradient, in order;
//   table[i] -= lr * g_i / sqrt(accumulator[i] + epsilon)    for every row i, in order,
// the accumulator being read after all its additions (a row repeated in the gradient adds twice).
// With row_wise, sok.RowWiseAdagrad's step on distinct rows (SokPooledLookupGrad's), one
// accumulator per row ([rows, 1]):
//   accumulator[i] += mean_j(g_ij * g_ij);  table[i] -= lr * g_i / (sqrt(accumulator[i]) + epsilon).
#ifndef SOK_TF_OPS_STATIC_APPLY_H_
#define SOK_TF_OPS_STATIC_APPLY_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "row_dtypes.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/platform/strcat.h"

namespace sok_tf {
namespace static_apply {

using ::tensorflow::OpInputList;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::Var;
namespace errors = ::tensorflow::errors;

// One table of the call: its variable and accumulator (locked) and its gradient.
struct Table {
  Var* var = nullptr;
  Var* accumulator = nullptr;
  const Tensor* indices = nullptr;
  const Tensor* grads = nullptr;
  int64_t rows = 0;
  int64_t dim = 0;
  int64_t count = 0;  // rows of the gradient
  sok_gpu::RowType row_type = sok_gpu::kRowFloat32;  // the table's dtype
};

// The variables of a call, looked up, referenced and locked in address order (as TensorFlow locks
// several variables), released in the destructor.
class LockedVariables {
 public:
  LockedVariables() = default;
  LockedVariables(const LockedVariables&) = delete;
  LockedVariables& operator=(const LockedVariables&) = delete;
  ~LockedVariables() {
    for (Var* v : locked_) v->mu()->unlock();
    for (const Entry& e : all_) e.var->Unref();
  }

  // Looks up the resource variable of input `index`, `label` naming it in messages (a reference is
  // kept until destruction). A handle with no variable behind it (never assigned, or deleted) is a
  // FailedPrecondition, as for a variable not initialized.
  Status add(OpKernelContext* ctx, int index, const std::string& label, Var** out) {
    Var* v = nullptr;
    const Status found = ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, index), &v);
    if (absl::IsNotFound(found)) {
      return errors::FailedPrecondition(label, " has no variable: it was never assigned a value, or was deleted; ",
                                        "assign it one before the step (", found.message(), ")");
    }
    if (!found.ok()) return Status(found.code(), ::tensorflow::strings::StrCat(label, ": ", found.message()));
    all_.push_back({v, label});
    *out = v;
    return Status();
  }

  // Locks every variable added, in address order; refuses a variable given twice (before locking).
  Status lock() {
    std::vector<Entry> sorted = all_;
    std::stable_sort(sorted.begin(), sorted.end(), [](const Entry& a, const Entry& b) { return a.var < b.var; });
    for (size_t i = 1; i < sorted.size(); ++i) {
      if (sorted[i].var == sorted[i - 1].var) {
        return errors::InvalidArgument(sorted[i - 1].label, " and ", sorted[i].label,
                                       " are the same variable; nothing was updated. Every table and every "
                                       "accumulator of one call must be a different variable: give each table "
                                       "once, its gradients concatenated, with its own accumulator");
      }
    }
    for (const Entry& e : sorted) {
      e.var->mu()->lock();
      locked_.push_back(e.var);
    }
    return Status();
  }

 private:
  struct Entry {
    Var* var;
    std::string label;
  };
  std::vector<Entry> all_;
  std::vector<Var*> locked_;
};

// Checks the inputs (names[t] in messages), fills `tables` and points `learning_rate` at its input
// (a float32 scalar: in host memory for the CPU kernel, device memory for the GPU one); looks up and
// locks the variables.
inline Status gather(OpKernelContext* ctx, const std::vector<std::string>& names, bool row_wise,
                     LockedVariables* locks, std::vector<Table>* tables, const Tensor** learning_rate) {
  OpInputList indices, grads;
  TF_RETURN_IF_ERROR(ctx->input_list("indices", &indices));
  TF_RETURN_IF_ERROR(ctx->input_list("grads", &grads));
  const int n = indices.size();
  if (static_cast<int>(names.size()) != n) {
    return errors::InvalidArgument("SokSparseApplyAdagradTables has ", n, " tables but ", names.size(),
                                   " names; give one name per table");
  }
  const Tensor& lr = ctx->input(2 * n);
  if (!::tensorflow::TensorShapeUtils::IsScalar(lr.shape())) {
    return errors::InvalidArgument("learning_rate must be a float32 scalar, got shape ", lr.shape().DebugString());
  }
  *learning_rate = &lr;
  tables->assign(n, Table());
  for (int t = 0; t < n; ++t) {
    Table& x = (*tables)[t];
    const std::string position = ::tensorflow::strings::StrCat("[", t, "] (table ", names[t], ")");
    TF_RETURN_IF_ERROR(locks->add(ctx, t, "tables" + position, &x.var));
    TF_RETURN_IF_ERROR(locks->add(ctx, n + t, "accumulators" + position, &x.accumulator));
    x.indices = &indices[t];
    x.grads = &grads[t];
  }
  TF_RETURN_IF_ERROR(locks->lock());
  for (int t = 0; t < n; ++t) {
    Table& x = (*tables)[t];
    const std::string& name = names[t];
    for (Var* v : {x.var, x.accumulator}) {
      if (!v->is_initialized) {
        return errors::FailedPrecondition(v == x.var ? "tables[" : "accumulators[", t, "] (table ", name,
                                          ") is not initialized; assign it a value before the step");
      }
    }
    const Tensor& w = *x.var->tensor();
    const Tensor& a = *x.accumulator->tensor();
    // Row-wise steps take rows of any row dtype (float32 accumulators); Keras' Adagrad float32 rows.
    const bool row_type_ok = row_type_of(w.dtype(), &x.row_type) && (row_wise || x.row_type == sok_gpu::kRowFloat32);
    if (!row_type_ok || w.dims() != 2) {
      return errors::InvalidArgument("tables[", t, "] (table ", name, ") must be a [rows, dim] variable of ",
                                     row_wise ? kRowDtypesText : "float32", ", got ",
                                     ::tensorflow::DataTypeString(w.dtype()), " ", w.shape().DebugString());
    }
    ::tensorflow::TensorShape want = w.shape();
    if (row_wise && want.dims() == 2) want.set_dim(1, 1);
    if (a.dtype() != ::tensorflow::DT_FLOAT || a.shape() != want) {
      return errors::InvalidArgument("accumulators[", t, "] (table ", name, ") is ",
                                     ::tensorflow::DataTypeString(a.dtype()), " ", a.shape().DebugString(),
                                     "; it must be float32 with the table's ",
                                     row_wise ? "rows and one column" : "shape",
                                     ": float ", want.DebugString());
    }
    x.rows = w.dim_size(0);
    x.dim = w.dim_size(1);
    if (x.indices->dims() != 1) {
      return errors::InvalidArgument("indices[", t, "] (table ", name, ") must be 1-D, got shape ",
                                     x.indices->shape().DebugString());
    }
    x.count = x.indices->dim_size(0);
    if (x.grads->dims() != 2 || x.grads->dim_size(0) != x.count || x.grads->dim_size(1) != x.dim) {
      return errors::InvalidArgument("grads[", t, "] (table ", name, ") must be [", x.count, ", ", x.dim,
                                     "] (one row of the table's width per index), got ",
                                     x.grads->shape().DebugString());
    }
  }
  return Status();
}

// The error of index `value` at position `position` of table t (outside [0, rows)).
inline Status bad_index(const std::vector<std::string>& names, const Table& x, int t, int64_t position,
                        int64_t value, int64_t how_many) {
  return errors::InvalidArgument("indices[", t, "][", position, "] = ", value, " is outside [0, ", x.rows,
                                 ") for table ", names[t], " (", how_many,
                                 " such indices); nothing was updated. Valid indices are the rows of the table "
                                 "(of this rank's shard): 0 .. ",
                                 x.rows - 1);
}

// Makes the buffer of v safe to write in place: a copy when a read still holds it and reads do not
// copy (TensorFlow's copy-on-write of variables). `copy(from, to, bytes)` copies on the op's device.
template <class Copy>
Status prepare_in_place_write(OpKernelContext* ctx, Var* v, Copy copy) {
  Tensor* tensor = v->tensor();
  if (v->copy_on_read_mode.load() || tensor->RefCountIsOne()) return Status();
  ::tensorflow::AllocatorAttributes attr;
  attr.set_gpu_compatible(true);
  attr.set_nic_compatible(true);
  Tensor fresh;
  TF_RETURN_IF_ERROR(ctx->allocate_temp(tensor->dtype(), tensor->shape(), &fresh, attr));
  TF_RETURN_IF_ERROR(copy(tensor->tensor_data().data(), const_cast<char*>(fresh.tensor_data().data()),
                          tensor->TotalBytes()));
  *tensor = fresh;
  return Status();
}

// prepare_in_place_write for every table and accumulator of the call.
template <class Copy>
Status prepare_in_place_writes(OpKernelContext* ctx, const std::vector<Table>& tables, Copy copy) {
  for (const Table& x : tables) {
    TF_RETURN_IF_ERROR(prepare_in_place_write(ctx, x.var, copy));
    TF_RETURN_IF_ERROR(prepare_in_place_write(ctx, x.accumulator, copy));
  }
  return Status();
}

}  // namespace static_apply
}  // namespace sok_tf

#endif  // SOK_TF_OPS_STATIC_APPLY_H_
