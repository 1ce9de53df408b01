// Keys of the storage ABI: their types' names and sizes, reading and writing them as 64-bit
// patterns, and the key hash (splitmix64) shared by the CPU tables, the GPU engine and the ops.
#ifndef SOK_KIT_KEYS_HPP_
#define SOK_KIT_KEYS_HPP_

#include <cstddef>
#include <cstdint>

#include "sok/storage_api.h"

// Functions shared by host code and CUDA kernels (the key hash, the initializers' random stream).
#if defined(__CUDACC__)
#define SOK_HD __host__ __device__
#else
#define SOK_HD
#endif

namespace sok {

inline const char* key_type_name(int32_t key_type) {
  switch (key_type) {
    case SOK_KEY_INT64: return "int64";
    case SOK_KEY_UINT64: return "uint64";
    case SOK_KEY_INT32: return "int32";
    default: return "unknown";
  }
}

inline size_t key_size(int32_t key_type) { return key_type == SOK_KEY_INT32 ? 4 : 8; }

// Keys are stored as 64-bit patterns: int32 keys are sign-extended, so every key value is valid.
inline uint64_t load_key(const void* keys, int32_t key_type, int64_t i) {
  if (key_type == SOK_KEY_INT32) {
    return static_cast<uint64_t>(static_cast<int64_t>(static_cast<const int32_t*>(keys)[i]));
  }
  return static_cast<const uint64_t*>(keys)[i];
}
inline void store_key(void* keys, int32_t key_type, int64_t i, uint64_t key) {
  if (key_type == SOK_KEY_INT32) {
    static_cast<int32_t*>(keys)[i] = static_cast<int32_t>(static_cast<int64_t>(key));
  } else {
    static_cast<uint64_t*>(keys)[i] = key;
  }
}

// splitmix64's finaliser: a bijective 64-bit mixer, used for hashing keys and for initializers.
SOK_HD inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

SOK_HD inline uint64_t hash_key(uint64_t key) { return mix64(key); }

}  // namespace sok

#endif  // SOK_KIT_KEYS_HPP_
