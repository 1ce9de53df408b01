// The dtypes of a static table's rows on the TensorFlow side of the ops: which DataTypes a table
// may have (the kernels' RowType numbering: gpu/row_type.h), and a dispatch of a CPU kernel's
// work on the row's C++ type (float, Eigen::half, Eigen::bfloat16: loads widened to float, stores
// rounded to nearest even as Eigen's conversions and TensorFlow's casts round).
#ifndef SOK_TF_OPS_ROW_DTYPES_H_
#define SOK_TF_OPS_ROW_DTYPES_H_

#include "gpu/row_type.h"
#include "tensorflow/core/framework/numeric_types.h"
#include "tensorflow/core/framework/types.h"

namespace sok_tf {

// What the errors say is valid.
inline constexpr char kRowDtypesText[] = "float32, float16 or bfloat16";

// The kernels' RowType of a table's DataType; false for a dtype rows cannot have.
inline bool row_type_of(::tensorflow::DataType dtype, sok_gpu::RowType* out) {
  switch (dtype) {
    case ::tensorflow::DT_FLOAT:
      *out = sok_gpu::kRowFloat32;
      return true;
    case ::tensorflow::DT_HALF:
      *out = sok_gpu::kRowFloat16;
      return true;
    case ::tensorflow::DT_BFLOAT16:
      *out = sok_gpu::kRowBFloat16;
      return true;
    default:
      return false;
  }
}

// fn(Row{}) with Row the C++ type of rows of `type`.
template <class Fn>
void with_row_type(sok_gpu::RowType type, Fn&& fn) {
  switch (type) {
    case sok_gpu::kRowFloat16:
      fn(Eigen::half{});
      return;
    case sok_gpu::kRowBFloat16:
      fn(Eigen::bfloat16{});
      return;
    default:
      fn(float{});
  }
}

}  // namespace sok_tf

#endif  // SOK_TF_OPS_ROW_DTYPES_H_
