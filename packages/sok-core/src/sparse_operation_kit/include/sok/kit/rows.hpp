// Row helpers of the CPU tables and ops: copy_row, what a find writes for a missing key
// (MissingRow), counting probe misses (mark_found) and the clock of row scores (now_ns).
#ifndef SOK_KIT_ROWS_HPP_
#define SOK_KIT_ROWS_HPP_

#include <chrono>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <emmintrin.h>
#endif

namespace sok {

// Nanoseconds since the Unix epoch: the clock of LRU scores and of incremental dumps.
inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// How many of places (n,) equal `absent` (a probe's "not found"); found (n,), unless null, gets 1
// for the others and 0 for those.
inline int64_t mark_found(int64_t n, const int64_t* places, int64_t absent, uint8_t* found) {
  int64_t missing = 0;
  for (int64_t i = 0; i < n; ++i) missing += places[i] == absent;
  if (found != nullptr) {
    for (int64_t i = 0; i < n; ++i) found[i] = places[i] != absent;
  }
  return missing;
}

// Copies a row of w floats (the arrays do not overlap) inline, 16 bytes a step: rows are short
// (tens of floats), and a memmove call per row costs more than the copy itself (profiles of a
// dynamic training step showed it). Written with SSE2 loads and stores because GCC turns a plain
// copy loop back into a memcpy call.
inline void copy_row(float* dst, const float* src, int64_t w) {
  int64_t c = 0;
#if defined(__SSE2__) && !defined(__CUDACC__)
  for (; c + 4 <= w; c += 4) _mm_storeu_ps(dst + c, _mm_loadu_ps(src + c));
#endif
  for (; c < w; ++c) dst[c] = src[c];
}

// What a CPU find writes for a missing key's row: the default row, zeros when there is none, or
// nothing at all (find_hits).
struct MissingRow {
  const float* default_row;
  bool write;

  void fill(float* out, int64_t w) const {
    if (!write) return;
    if (default_row != nullptr) {
      copy_row(out, default_row, w);
    } else {
      std::memset(out, 0, sizeof(float) * static_cast<size_t>(w));
    }
  }
};

}  // namespace sok

#endif  // SOK_KIT_ROWS_HPP_
