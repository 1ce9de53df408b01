// CUDA kernels of SokPooledLookup and SokPooledLookupGrad (pooled_lookup_ops_gpu.cc), behind plain
// C++ launchers: device pointers, sizes and a CUDA stream in, a cudaError_t out. Compiled by nvcc
// without TensorFlow's headers; the op kernels allocate every buffer (workspace sizes come from the
// *_workspace_bytes functions) and read the per-table PooledCheck back to raise TensorFlow's errors.
//
// The results equal the CPU kernels' (pooled_lookup_ops.cc) to the bit: each output element is
// summed by one thread in the CPU's order, with round-to-nearest intrinsics (no FMA contraction):
//   forward, unweighted: the first `head` held rows one after another, then each further 8 summed
//     apart and added (sum_rows: tf.sparse.segment_sum's order);
//   forward, weighted: row * w added one after another; divisors: sequential sums, then sqrt;
//   gradient: per distinct held id (first-occurrence order), (grad / divisor) * w of its
//     occurrences added in id order, starting from 0; except for an id of more than one segment
//     (kHotSegment occurrences of the .cu): each segment summed so, then the segments' sums added
//     in order, deterministic and equal to the CPU's within float rounding.
//
// Launch sequences (all on `stream`, nothing waits on the host):
//   pooled_forward: descriptors up, checks zeroed, row_splits and ids checked, samples pooled (runs
//     of consecutive samples per warp, about 32 ids each, so that short samples' loads overlap).
//   pooled_grad_distinct: the same checks, then the distinct held ids of every table: a stable
//     radix sort of (table, row) keys with their positions, the first occurrence of each key
//     marked at its position, an exclusive scan of the marks (the rank of each distinct id in
//     first-occurrence order), per-table counts into PooledCheck::distinct.
//   pooled_grad_accumulate (outputs of `bound` rows per table: the counts the host read, or any
//     upper bound of them, such as the table's ids, when the host reads nothing): up to a warp per
//     span of as many sorted keys sums the occurrences of the ids whose runs start there, in order,
//     a column (or 4) per thread, and lists the hot ids;
//     with `padded`, the ids past a table's distinct ones are -1 (their rows are left as they were);
//     then each hot id's run is measured and cut into segments (a scan gives each its place), up to
//     a warp per segment (lanes from the widest table's dim) sums them, and the ids of several
//     segments get the segments' sums added in order.
#ifndef SOK_TF_OPS_GPU_POOLED_LOOKUP_KERNELS_H_
#define SOK_TF_OPS_GPU_POOLED_LOOKUP_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gpu/row_type.h"

namespace sok_gpu {

enum PooledCombiner : int32_t { kPooledSum = 0, kPooledMean = 1, kPooledSqrtn = 2 };

// One table of a call: device pointers into the op's inputs and outputs, and its sharding (the
// shard holds id i at row i / stride when i mod stride == offset; offset -1: no id).
struct PooledTable {
  const void* params;     // (rows, dim) of row_type: forward only
  const float* grads;     // (batch, dim): gradient only
  const void* ids;        // (nnz,) int32, or int64 when ids_int64
  const int64_t* splits;  // (batch + 1,); nullptr: not checked (pooled_validate only)
  const float* weights;   // (nnz,) or nullptr
  float* out;             // forward: (batch, dim); gradient: (bound, dim), rows past the ids unwritten
  int64_t* out_ids;       // gradient: (bound,) rows of the shard, then -1
  int64_t rows;
  int64_t dim;
  int64_t nnz;
  int64_t stride;
  int64_t offset;
  int32_t ids_int64;
  int32_t combiner;  // PooledCombiner
  RowType row_type;  // the params' dtype (read widened to float32), the same for every table of a call
};

// A position that was not found.
constexpr uint64_t kPooledNone = ~uint64_t{0};

// What the device found about one table; the launchers reset it first.
struct PooledCheck {
  int64_t first_split;      // row_splits[0]
  int64_t last_split;       // row_splits[batch]
  uint64_t first_decrease;  // the first b with row_splits[b + 1] < row_splits[b], else kPooledNone
  uint64_t bad_ids;         // how many ids the shard holds are outside [0, rows)
  uint64_t first_bad;       // the position in ids of the first of them, else kPooledNone
  uint64_t distinct;        // pooled_grad_distinct: how many distinct ids the shard holds
};

// Bytes of the workspace of pooled_validate and pooled_forward (the tables' descriptors).
size_t pooled_forward_workspace_bytes(int num_tables);

// checks (num_tables,) = the row_splits and ids checks of the tables (a table whose splits is
// nullptr gets its ids checked only).
cudaError_t pooled_validate(const PooledTable* tables, int num_tables, int64_t batch, void* workspace,
                            PooledCheck* checks, cudaStream_t stream);

// tables[t].out (batch, dim) = the pooled rows of each sample, with no checks (after
// pooled_validate's were read: the same pooling as pooled_forward's). Safe as pooled_forward.
cudaError_t pooled_pool(const PooledTable* tables, int num_tables, int64_t batch, void* workspace,
                        cudaStream_t stream);

// tables[t].out (batch, dim) = the pooled rows of each sample; checks as pooled_validate. Safe
// (no read outside the inputs) whatever the row_splits and ids: outputs are then unspecified.
cudaError_t pooled_forward(const PooledTable* tables, int num_tables, int64_t batch, void* workspace,
                           PooledCheck* checks, cudaStream_t stream);

// Why pooled_grad_* cannot take these tables (a static message), or nullptr: positions and samples
// are 32-bit, and a sort key holds the table index and the row.
const char* pooled_grad_unsupported(const PooledTable* tables, int num_tables, int64_t batch);

// *bytes = the workspace of pooled_grad_distinct and pooled_grad_accumulate (the same one).
cudaError_t pooled_grad_workspace_bytes(const PooledTable* tables, int num_tables, int64_t batch, size_t* bytes);

// checks as pooled_validate, and checks[t].distinct; the distinct ids stay in the workspace.
cudaError_t pooled_grad_distinct(const PooledTable* tables, int num_tables, int64_t batch, void* workspace,
                                 size_t workspace_bytes, PooledCheck* checks, cudaStream_t stream);

// tables[t].out (bound[t], dim) and tables[t].out_ids (bound[t],) = the gradient rows of the
// distinct ids and the ids; bound (host, num_tables): the distinct counts of pooled_grad_distinct,
// or with `padded` any upper bound of them, the ids then -1 up to bound[t] (those rows unwritten).
// checks (device) and the workspace as pooled_grad_distinct left them. A table whose checks failed
// (row_splits or ids not valid) gets no row: with `padded`, index -1 throughout.
cudaError_t pooled_grad_accumulate(const PooledTable* tables, const uint64_t* bound, bool padded,
                                   const PooledCheck* checks, int num_tables, int64_t batch, void* workspace,
                                   size_t workspace_bytes, cudaStream_t stream);

}  // namespace sok_gpu

#endif  // SOK_TF_OPS_GPU_POOLED_LOOKUP_KERNELS_H_
