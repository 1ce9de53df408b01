// The GPU half of SokLookupDistinct and SokSparseApply: checking positions, copying the rows of
// distinct keys to their positions, and the fused optimizer step on rows read from a CUDA table,
// equal bit for bit to the CPU kernels (cpu_ops.h: check_positions; storage_ops.cc: LookupDistinctOp;
// training_ops.cc: sum_rows + RowRule::apply), but for keys with more than 32 gradient rows, which sparse_apply_rows
// sums in a fixed parallel order (deterministic; the CPU's within float rounding).
//
// Plain C++ launchers over raw device pointers, compiled by nvcc without TensorFlow's headers;
// everything is ordered on `stream`. Workspaces are device memory the caller allocates (sizes from
// the *_bytes functions) and keeps until the stream has run the work (stream order suffices).
// Counts of zero launch nothing.
#ifndef SOK_TF_OPS_GPU_SPARSE_APPLY_KERNELS_H_
#define SOK_TF_OPS_GPU_SPARSE_APPLY_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace sok_gpu {

// The first i with positions[i] outside [0, u): *bad_index (host) = i and *bad_value (host) =
// positions[i], or *bad_index = -1 when every position is a row of the u distinct keys. flag is one
// int32 of device scratch. Synchronizes `stream` (once, twice when a position is bad).
cudaError_t find_bad_position(const int32_t* positions,  // (n,) device
                              int32_t n, int64_t u, int32_t* flag, int64_t* bad_index, int32_t* bad_value,
                              cudaStream_t stream);

// out (n, w) = row positions[i] of rows (u, w) for each i. Positions must be valid.
cudaError_t gather_rows(const float* rows,         // (u, w) device
                        const int32_t* positions,  // (n,) device
                        int32_t n, int64_t w,
                        float* out,  // (n, w) device
                        cudaStream_t stream);

// The rules of SokSparseApply, as RowRule in training_ops.cc.
enum SparseRuleKind : int32_t { kRuleSgd = 0, kRuleMomentum = 1, kRuleAdagrad = 2, kRuleRowWiseAdagrad = 3 };

struct SparseRule {
  int32_t kind;    // SparseRuleKind
  float hyper[2];  // momentum: momentum, nesterov (0/1); adagrad: epsilon, epsilon after sqrt (0/1);
                   // rowwise adagrad: epsilon
};

// *bytes = the workspace of sparse_apply_rows for n gradient rows of u distinct keys.
cudaError_t sparse_apply_workspace_bytes(int32_t n, int32_t u, size_t* bytes);

// One optimizer step on rows (u, W) in place, W = d * (1 + state blocks of the rule) + its state
// floats per row (sparse_rules.h): per distinct
// key r, g = 0.0f plus the rows i of grads (n, d) with positions[i] == r in batch order, then the
// rule on [embedding | state] of row r with learning rate lr. Positions must be valid.
cudaError_t sparse_apply_rows(const int32_t* positions,  // (n,) device
                              const float* grads,        // (n, d) device
                              int32_t n, int32_t u, int32_t d, int32_t row_width, SparseRule rule, float lr,
                              float* rows,  // (u, row_width) device
                              void* workspace, size_t workspace_bytes, cudaStream_t stream);

// sparse_apply_rows on rows a table lent (find_or_insert_rows of the storage ABI): rows (u,) holds
// the address of each distinct key's row (row_width floats); a null address is skipped.
cudaError_t sparse_apply_lent_rows(const int32_t* positions,  // (n,) device
                                   const float* grads,        // (n, d) device
                                   int32_t n, int32_t u, int32_t d, int32_t row_width, SparseRule rule, float lr,
                                   float* const* rows,  // (u,) device
                                   void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace sok_gpu

#endif  // SOK_TF_OPS_GPU_SPARSE_APPLY_KERNELS_H_
