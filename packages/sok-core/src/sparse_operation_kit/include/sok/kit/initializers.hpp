// The initializers of new rows (sok_initializer): the random stream, a pure function of
// (seed, key, column, draw), and init_row, which fills a whole new row on the host.
#ifndef SOK_KIT_INITIALIZERS_HPP_
#define SOK_KIT_INITIALIZERS_HPP_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "sok/kit/keys.hpp"
#include "sok/storage_api.h"

namespace sok {

// The random stream of initializers: a pure function of (seed, key, column, draw), defined once
// here and mirrored by sparse_operation_kit/initializers.py (the NumPy reference). CUDA builds
// compile it with --fmad=false so that device results equal the host's bit for bit. stream_base
// is the part of a row's stream that depends on (seed, key) only.
SOK_HD inline uint64_t stream_base(uint64_t seed, uint64_t key) { return mix64(key ^ mix64(seed)); }

SOK_HD inline double uniform01_at(uint64_t base, int32_t col, uint32_t draw) {
  const uint64_t r = mix64(base + ((static_cast<uint64_t>(col) << 8) | draw));
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

SOK_HD inline double uniform01(uint64_t seed, uint64_t key, int32_t col, uint32_t draw) {
  return uniform01_at(stream_base(seed, key), col, draw);
}

// A uniform initializer's value at column col of the row whose stream_base is base.
SOK_HD inline float uniform_value(const sok_initializer& init, uint64_t base, int32_t col) {
  return static_cast<float>(init.a + (init.b - init.a) * uniform01_at(base, col, 0));
}

SOK_HD inline double normal01(uint64_t seed, uint64_t key, int32_t col, uint32_t attempt) {
  double u1 = 1.0 - uniform01(seed, key, col, 2 * attempt);  // (0, 1]
  double u2 = uniform01(seed, key, col, 2 * attempt + 1);
  return ::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2);
}

constexpr uint32_t kTruncatedNormalAttempts = 64;

SOK_HD inline float init_value(const sok_initializer& init, uint64_t key, int32_t col) {
  switch (init.kind) {
    case SOK_INIT_CONSTANT: return static_cast<float>(init.a);
    case SOK_INIT_UNIFORM: return uniform_value(init, stream_base(init.seed, key), col);
    case SOK_INIT_NORMAL:
      return static_cast<float>(init.a + init.b * normal01(init.seed, key, col, 0));
    case SOK_INIT_TRUNCATED_NORMAL: {
      double z = 0.0;
      for (uint32_t t = 0; t < kTruncatedNormalAttempts; ++t) {
        z = normal01(init.seed, key, col, t);
        if (::fabs(z) <= 2.0) break;
      }
      z = z > 2.0 ? 2.0 : (z < -2.0 ? -2.0 : z);
      return static_cast<float>(init.a + init.b * z);
    }
    default: return 0.0f;  // rejected by the ABI adapter's check_inits before any row is touched
  }
}

// A full new row of `width` floats for `key`: zeros, then each initializer over its columns.
inline void init_row(float* row, int32_t width, uint64_t key, const sok_initializer* inits,
                     int32_t num_inits) {
  std::fill(row, row + width, 0.0f);
  for (int32_t i = 0; i < num_inits; ++i) {
    const sok_initializer& init = inits[i];
    if (init.kind == SOK_INIT_CONSTANT) {
      std::fill(row + init.col_begin, row + init.col_end, static_cast<float>(init.a));
    } else if (init.kind == SOK_INIT_UNIFORM) {
      // The row's part of the stream computed once ("random", the default, fills new rows faster
      // than one init_value per column, with the same bits).
      const uint64_t base = stream_base(init.seed, key);
      for (int32_t c = init.col_begin; c < init.col_end; ++c) row[c] = uniform_value(init, base, c);
    } else {
      for (int32_t c = init.col_begin; c < init.col_end; ++c) row[c] = init_value(init, key, c);
    }
  }
}

}  // namespace sok

#endif  // SOK_KIT_INITIALIZERS_HPP_
