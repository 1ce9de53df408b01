// The order in which SokPooledLookup adds a sample's held rows when it has no weights, one fact for
// the CPU kernel (pooled_lookup_ops.cc) and the GPU kernels (gpu/pooled_lookup_kernels.cu):
// tf.sparse.segment_sum's order, so that both give TensorFlow's bits. The first `head` rows are
// added one after another, then each further 8 are summed apart (left to right) and their sum added.
// Plain C++ that nvcc compiles for the device too; no TensorFlow header.
#ifndef SOK_TF_OPS_POOLED_ORDER_H_
#define SOK_TF_OPS_POOLED_ORDER_H_

#include <cstdint>

#ifdef __CUDACC__
#define SOK_POOLED_ORDER_FN __host__ __device__ inline
#else
#define SOK_POOLED_ORDER_FN inline
#endif

namespace sok_pooled {

// The rows added one after another before the groups of 8, for a sample of `num` held rows: num mod 8
// (8 or 9 when that is 0 or 1; num itself below 8), so that num - head is a multiple of 8.
SOK_POOLED_ORDER_FN int64_t order_head(int64_t num) {
  const int64_t rest = num & 7;
  return num == 1 ? 1 : (rest == 0 ? (num < 8 ? num : 8) : (rest == 1 ? 9 : rest));
}

}  // namespace sok_pooled

#undef SOK_POOLED_ORDER_FN

#endif  // SOK_TF_OPS_POOLED_ORDER_H_
