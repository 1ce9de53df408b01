// Software prefetch helpers for the CPU paths of backends.
#ifndef SOK_KIT_PREFETCH_HPP_
#define SOK_KIT_PREFETCH_HPP_

#include <cstddef>

namespace sok {

// Distance, in keys, between issuing a prefetch and using the line: covers DRAM latency on
// the bulk loops of the CPU tables without flooding the line-fill buffers.
constexpr int kPrefetchDistance = 16;

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }
inline void prefetch_write(const void* p) { __builtin_prefetch(p, 1, 3); }

// Prefetches `bytes` bytes from p, one request per 64-byte line.
inline void prefetch_range(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
}

// Prefetches `bytes` bytes at p for writing, one request per 64-byte line.
inline void prefetch_write_range(void* p, size_t bytes) {
  char* c = static_cast<char*>(p);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 1, 3);
}

}  // namespace sok

#endif  // SOK_KIT_PREFETCH_HPP_
