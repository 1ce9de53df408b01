// The GPU half of SokSparseApplyAdagradTables (static_apply.h says what it computes): Keras 3
// Adagrad's sparse step on several static tables, two kernels per launch of up to kApplyTables
// tables, their descriptors passed by value (no copy to the device, no synchronisation).
//
// Plain C++ launchers over raw device pointers, compiled by nvcc without TensorFlow's headers;
// everything is ordered on `stream`. A row repeated in a gradient is added with atomics, in an
// order that may change from run to run (as TensorFlow's scatter kernels that Keras uses on a GPU).
#ifndef SOK_TF_OPS_GPU_STATIC_APPLY_KERNELS_H_
#define SOK_TF_OPS_GPU_STATIC_APPLY_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu/row_type.h"

namespace sok_gpu {

// One table of the step: all pointers in device memory.
struct AdagradTable {
  void* table;               // (rows, dim) of row_type (kRowFloat32 unless row-wise)
  float* accumulator;        // (rows, dim); row-wise: (rows, 1)
  const int64_t* indices;    // (count,)
  const float* grads;        // (count, dim)
  int64_t count;
  int64_t dim;
  int64_t rows;
  RowType row_type;
};

// Tables per launch (the descriptors travel as kernel parameters).
constexpr int kApplyTables = 32;

// The step on tables[0 .. num_tables) with the learning rate *lr (device memory): every index must be
// in [0, rows) (check_adagrad_indices), but for padding at the end of a table's indices (-1: the
// rows from the first negative index on are skipped).
cudaError_t sparse_apply_adagrad(const AdagradTable* tables, int num_tables, const float* lr, float epsilon,
                                 cudaStream_t stream);

// sok.RowWiseAdagrad's step (accumulators (rows, 1)) on tables whose indices are distinct (a
// warp per row, no atomics), up to the first negative index of each, as sparse_apply_adagrad.
cudaError_t sparse_apply_row_wise_adagrad(const AdagradTable* tables, int num_tables, const float* lr, float epsilon,
                                          cudaStream_t stream);

// Per table t, first_bad[t] = the first position of an index outside [0, rows) (INT64_MAX when
// none) and bad_count[t] their number: int64 device arrays of num_tables entries each.
cudaError_t check_adagrad_indices(const AdagradTable* tables, int num_tables, int64_t* first_bad,
                                  int64_t* bad_count, cudaStream_t stream);

}  // namespace sok_gpu

#endif  // SOK_TF_OPS_GPU_STATIC_APPLY_KERNELS_H_
