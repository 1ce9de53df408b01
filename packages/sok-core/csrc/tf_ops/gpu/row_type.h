// The dtypes of a static table's rows (sok.Variable's dtype=) as SOK's CUDA kernels number them:
// the one numbering of the GPU kernels (gpu/*.cu, no TensorFlow headers) and the ops that describe
// tables to them (row_type_of in row_dtypes.h maps TensorFlow's DataType onto it). Python's list of
// the same dtypes is sparse_operation_kit.dtypes.STATIC_ROW_DTYPES.
//
// Rows of any of them are read widened to float32 and summed and updated in float32; an update
// stores its float32 result rounded to the nearest value of the row's dtype (ties to even), as
// TensorFlow's casts round.
#ifndef SOK_TF_OPS_GPU_ROW_TYPE_H_
#define SOK_TF_OPS_GPU_ROW_TYPE_H_

#include <cstdint>

namespace sok_gpu {

enum RowType : int32_t { kRowFloat32 = 0, kRowFloat16 = 1, kRowBFloat16 = 2 };

// Bytes of one element of a row of `type`.
inline constexpr int64_t row_type_bytes(RowType type) { return type == kRowFloat32 ? 4 : 2; }

}  // namespace sok_gpu

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace sok_gpu {

// Element `i` of rows of type R, as float32.
template <RowType R>
__device__ inline float load_row_element(const void* rows, int64_t i) {
  if constexpr (R == kRowFloat16) {
    return __half2float(static_cast<const __half*>(rows)[i]);
  } else if constexpr (R == kRowBFloat16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(rows)[i]);
  } else {
    return static_cast<const float*>(rows)[i];
  }
}

// Elements i .. i + 3 of rows of type R as float32, in one load (i a multiple of 4, the rows
// aligned to 4 elements).
template <RowType R>
__device__ inline void load_row_elements4(const void* rows, int64_t i, float* x) {
  if constexpr (R == kRowFloat32) {
    const float4 q = *reinterpret_cast<const float4*>(static_cast<const float*>(rows) + i);
    x[0] = q.x;
    x[1] = q.y;
    x[2] = q.z;
    x[3] = q.w;
  } else {
    const uint2 q = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(rows) + i);
    const uint32_t words[2] = {q.x, q.y};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const auto lo = static_cast<unsigned short>(words[h] & 0xffffu);
      const auto hi = static_cast<unsigned short>(words[h] >> 16);
      if constexpr (R == kRowFloat16) {
        x[2 * h] = __half2float(__ushort_as_half(lo));
        x[2 * h + 1] = __half2float(__ushort_as_half(hi));
      } else {
        x[2 * h] = __bfloat162float(__ushort_as_bfloat16(lo));
        x[2 * h + 1] = __bfloat162float(__ushort_as_bfloat16(hi));
      }
    }
  }
}

// Elements i .. i + 7 of half-width rows of type R (float16 or bfloat16) as float32, in one
// 16-byte load (i a multiple of 8, the rows aligned to 8 elements).
template <RowType R>
__device__ inline void load_row_elements8(const void* rows, int64_t i, float* x) {
  static_assert(R != kRowFloat32, "8 elements in one load: half-width rows only");
  const uint4 q = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(rows) + i);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const auto lo = static_cast<unsigned short>(words[h] & 0xffffu);
    const auto hi = static_cast<unsigned short>(words[h] >> 16);
    if constexpr (R == kRowFloat16) {
      x[2 * h] = __half2float(__ushort_as_half(lo));
      x[2 * h + 1] = __half2float(__ushort_as_half(hi));
    } else {
      x[2 * h] = __bfloat162float(__ushort_as_bfloat16(lo));
      x[2 * h + 1] = __bfloat162float(__ushort_as_bfloat16(hi));
    }
  }
}

// Stores `value` as element `i` of rows of type R, rounded to nearest (ties to even).
template <RowType R>
__device__ inline void store_row_element(void* rows, int64_t i, float value) {
  if constexpr (R == kRowFloat16) {
    static_cast<__half*>(rows)[i] = __float2half_rn(value);
  } else if constexpr (R == kRowBFloat16) {
    static_cast<__nv_bfloat16*>(rows)[i] = __float2bfloat16_rn(value);
  } else {
    static_cast<float*>(rows)[i] = value;
  }
}

}  // namespace sok_gpu
#endif  // __CUDACC__

#endif  // SOK_TF_OPS_GPU_ROW_TYPE_H_
