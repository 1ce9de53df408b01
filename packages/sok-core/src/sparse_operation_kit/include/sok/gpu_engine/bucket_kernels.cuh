// CUDA kernels of the GPU bucket table (sok/gpu_engine/bucket_table.cuh): the device half, kept apart
// from the host class so each file reads on its own.
//
// Layout. The table is `nb` buckets of `B` slots (B a power of two, 16..128). Per slot: a one-byte
// state in `digests` (0 empty, 1 busy = claimed by a thread of the running kernel, 2..255 the
// digest of the live key), its 64-bit key in `keys` and its 64-bit score in `scores`. Scores in an
// array of their own let the victim search of a full bucket read B scores (1 KiB for B = 128), not
// B key-score pairs, and the evicting pass is bound by those bytes; the price is that a hit's score
// and a new slot's key and score land in sectors of their own (one partial-sector write more per
// key). Every 64-bit key value is valid: emptiness lives in the state byte, never in the key. A
// slot's row of W floats lives in device memory for slots j < hb of each bucket and in mapped
// pinned host memory for the others. A new key takes the lowest empty device slot; in a hybrid
// table whose bucket has none, it takes a device slot all the same when it outscores the bucket's
// lowest device row, which moves to the free (or evicted) host slot (claim_for_new,
// device_slot_for; the placing list is in bucket order, so the moves write host memory in nearly
// ascending address order).
//
// Probing. A key hashes (splitmix64, as on the CPU) to a home bucket; a group of kGroup lanes scans
// the bucket's B state bytes at once (16-byte chunks, one 128-byte line for B = 128), then compares
// the full key only where the digest matches. Pure device tables with buckets of 64 or 128 slots
// split them into windows of 32 (one 32-byte sector of state bytes) and give each key a home
// window too: a new key takes a slot of its home window when one is free, and where it cannot the
// bucket's spill bit of that window is set (sticky until a rehash or clear). A lookup reads its
// home window first and the whole bucket only when the window spilled, so below full buckets it
// costs one sector of state bytes instead of a 128-byte line. A key whose home bucket is full
// while the table is still growing goes to the next bucket with room, and its home bucket's
// overflow flag (sticky until a rehash or clear) tells lookups to follow the chain. A table at its
// size limit that evicts (hkv) instead replaces the lowest-score slot of the home bucket (setting
// the spill bit of the newcomer's window when the slot lies outside it).
//
// Concurrency. Callers deduplicate a batch first, so the keys of one kernel are distinct (except
// the hit pass of an LRU find_or_insert, whose repeated hits only read rows and store equal
// scores), and an upsert runs as three kernels (see "Upserts" below): keys present need no locks.
// A thread claims an empty slot by CAS of its state byte to busy, writes row, key and score, then
// publishes the digest with an atomic XOR (after a fence where other threads may read the slot
// meanwhile). A victim to evict or a device row to move is locked the same way (readers and other
// evictors skip busy slots) and its score checked again after locking it.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sok/kit/initializers.hpp"
#include "sok/kit/keys.hpp"

namespace sok {
namespace gpu {

namespace cg = cooperative_groups;

#ifndef SOK_GPU_GROUP
#define SOK_GPU_GROUP 4
#endif
constexpr int kGroup = SOK_GPU_GROUP;    // lanes per key: 2, 4 or 8
constexpr int kChunks = 8 / kGroup;      // 16-byte chunks of state bytes per lane (buckets <= 128 slots)
static_assert(kGroup == 2 || kGroup == 4 || kGroup == 8, "SOK_GPU_GROUP must be 2, 4 or 8");
constexpr int kBlock = 256;         // threads per block
constexpr int kKeysPerBlock = kBlock / kGroup;
constexpr int kMaxInits = 8;        // initializers per call (embedding + optimizer slots)
// Resident blocks per SM that update_hits_kernel is compiled for (__launch_bounds__): its random
// reads are latency bound, so warps in flight count: this bound trims its registers without spills
// and raises occupancy, which shortens the kernel. Tighter bounds spill and slow it down;
// find_kernel gains nothing from a bound.
constexpr int kHitsMinBlocks = 4;
// The same for each placing kernel: the residency its registers allowed without spills. The
// evicting pass needs the bound to keep two blocks (twice the bucket scans in flight); every
// instantiation takes one, since a bound of 1 lets ptxas take more registers and lose a block.
constexpr int place_min_blocks(bool evict, bool hybrid, bool constant) { return !evict && !hybrid && constant ? 3 : 2; }
constexpr uint8_t kEmptyState = 0;
constexpr uint8_t kBusyState = 1;

enum class Mode : int { kFindOrInsert = 0, kAssign = 1, kAccumulate = 2, kImport = 3 };
// Score policies, numbered as HierarchicalKV's (and sok_hkv::Policy).
enum class Policy : int { kLru = 0, kLfu = 1, kEpochLru = 2, kEpochLfu = 3, kCustom = 4 };

struct Inits {
  int32_t count;
  sok_initializer items[kMaxInits];
};

// 32-bit words of the overflow bitmap of nb buckets.
constexpr int64_t flag_words(int64_t nb) { return (nb + 31) / 32; }
// Bytes of the spill bits of nb buckets: whole 32-bit words, which the atomics set.
constexpr int64_t spill_bytes(int64_t nb) { return (nb + 3) & ~int64_t{3}; }

constexpr int kRefusalWaits = 1024;  // looks at a bucket with busy slots before refusing a newcomer
constexpr int32_t kWindow = 32;  // slots of a home window: one 32-byte sector of state bytes
constexpr int kWindowChunks = kWindow / 16;  // 16-byte chunks of state bytes in a window
static_assert(kGroup >= kWindowChunks, "a window's chunks are read by one lane each");

// The table's arrays as kernels see them.
struct View {
  uint8_t* digests;   // nb * B state bytes
  uint64_t* keys;     // nb * B keys
  uint64_t* scores;   // nb * B scores
  uint32_t* flags;    // overflow bits: bit b % 32 of word b / 32 for bucket b (flag_words(nb) words)
  uint8_t* spills;    // per bucket, bit w: a key of home window w lives outside it (windows > 1 only)
  float* vdev;        // nb * hb rows of W floats (device)
  float* vhost;       // nb * (B - hb) rows (mapped pinned host memory, device address)
  int64_t nb;         // a power of two
  int32_t B;
  int32_t log_b;
  int32_t hb;
  int32_t W;
  int32_t windows;    // home windows per bucket (a power of two): B / kWindow in pure device tables, else 1

  __device__ uint64_t* key_at(int64_t slot) const { return keys + slot; }
  __device__ uint64_t* score_at(int64_t slot) const { return scores + slot; }
  __device__ void set_record(int64_t slot, uint64_t key, uint64_t score) const {
    keys[slot] = key;
    scores[slot] = score;
  }

  // Whether some key homed in bucket b lives further on (the bit is sticky until a rehash or clear).
  // One bit a bucket keeps the bitmap in L2 (1 MiB for 8 Mi buckets), so the miss path of a lookup
  // reads it without a DRAM access.
  template <bool kFresh>
  __device__ bool overflows(int64_t b) const {
    const uint32_t word = kFresh ? __ldcg(flags + (b >> 5)) : flags[b >> 5];
    return (word >> (b & 31)) & 1u;
  }
  __device__ void mark_overflow(int64_t b) const { atomicOr(flags + (b >> 5), 1u << (b & 31)); }

  // The home window of a key of hash h (hash bits that pick neither the bucket nor the digest); 0
  // in tables without windows.
  __device__ int32_t home_window(uint64_t h) const { return static_cast<int32_t>((h >> 40) & (windows - 1)); }
  template <bool kFresh>
  __device__ bool spilled(int64_t b, int32_t w) const {
    const uint8_t bits = kFresh ? __ldcg(spills + b) : spills[b];
    return (bits >> w) & 1u;
  }
  // Records that a key of home window w was placed in slot j of bucket b, if outside its window.
  __device__ void note_placement(int64_t b, int32_t j, int32_t w) const {
    if (windows > 1 && j / kWindow != w) {
      atomicOr(reinterpret_cast<unsigned int*>(spills + (b & ~int64_t{3})), (1u << w) << (8 * (b & 3)));
    }
  }

  __device__ float* row(int64_t slot) const {
    const int64_t b = slot >> log_b;
    const int32_t j = static_cast<int32_t>(slot & (B - 1));
    return j < hb ? vdev + (b * hb + j) * W : vhost + (b * (B - hb) + (j - hb)) * W;
  }
};

__device__ __forceinline__ uint8_t digest_of(uint64_t h) { return static_cast<uint8_t>(2 + (h >> 56) % 254); }

__device__ __forceinline__ uint64_t load_key_d(const void* keys, int32_t key_type, int64_t i) {
  if (key_type == SOK_KEY_INT32) return static_cast<uint64_t>(static_cast<int64_t>(static_cast<const int32_t*>(keys)[i]));
  return static_cast<const uint64_t*>(keys)[i];
}

__device__ __forceinline__ void store_key_d(void* keys, int32_t key_type, int64_t i, uint64_t key) {
  if (key_type == SOK_KEY_INT32) {
    static_cast<int32_t*>(keys)[i] = static_cast<int32_t>(static_cast<int64_t>(key));
  } else {
    static_cast<uint64_t*>(keys)[i] = key;
  }
}

// Bit k (0 .. 3) of the result is set where byte k of x is zero. Exact: (x & 0x7F) + 0x7F never
// carries out of its byte, so a byte's top bit ends up clear only where the byte is zero; the
// multiply gathers the four top bits (7, 15, 23, 31) into bits 28 .. 31 without carries (the other
// partial products land on distinct lower bits).
__device__ __forceinline__ uint32_t zero_bytes4(uint32_t x) {
  const uint32_t top = ~(((x & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) | x) & 0x80808080u;
  return (top * 0x00204081u) >> 28;
}

// Bit k of the result is set where byte k of the 16 bytes equals `byte`. About 7 instructions a
// word: __vcmpeq4 is emulated on sm_90 and its per-byte bit extraction took 14.
__device__ __forceinline__ uint32_t match16(uint4 v, uint8_t byte) {
  const uint32_t pattern = 0x01010101u * byte;
  return zero_bytes4(v.x ^ pattern) | (zero_bytes4(v.y ^ pattern) << 4) | (zero_bytes4(v.z ^ pattern) << 8) |
         (zero_bytes4(v.w ^ pattern) << 12);
}

// State bytes 2..255 (live) where bit k is set.
__device__ __forceinline__ uint32_t live16(uint4 v) {
  return ~(match16(v, kEmptyState) | match16(v, kBusyState)) & 0xFFFFu;
}

// The 16 state bytes of chunk `c` of bucket `b` (all "busy", which never matches, past the
// bucket). kFresh bypasses L1, for kernels where other SMs write the table meanwhile.
template <bool kFresh>
__device__ __forceinline__ uint4 states16(const View& t, int64_t b, int c) {
  if (c * 16 >= t.B) return make_uint4(0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u);
  const uint4* p = reinterpret_cast<const uint4*>(t.digests + (b << t.log_b) + c * 16);
  return kFresh ? __ldcg(p) : *p;
}

template <bool kFresh>
__device__ __forceinline__ uint64_t read_u64(const uint64_t* p) {
  return kFresh ? __ldcg(reinterpret_cast<const unsigned long long*>(p)) : *p;
}

// The slot of bucket b (0 .. B-1) in chunk c that holds key among the chunk's digest matches
// `mask`, else `hit` unchanged. Written as the loop that update_hits_kernel was measured with:
// with an early `return` instead of the `break` (and a branch around the call instead of an empty
// mask), ptxas placed the kernel's reconvergence points differently and its row copies of wide rows
// became much slower (same instructions and bytes, by ncu), though its PTX differed by three
// instructions.
template <bool kFresh>
__device__ __forceinline__ int32_t match_in_chunk(const View& t, int64_t b, int c, uint32_t mask, uint64_t key,
                                                  int32_t hit) {
  while (mask != 0) {
    const int k = __ffs(mask) - 1;
    mask &= mask - 1;
    if (read_u64<kFresh>(t.key_at((b << t.log_b) + c * 16 + k)) == key) {
      hit = c * 16 + k;
      break;
    }
  }
  return hit;
}

// The slot holding key, or -1; the same on every lane of the group. Lane l scans chunks l,
// l + kGroup, ... (all its loads are issued before any is used). kWindowed (tables with home
// windows only) reads the key's home window first and the whole bucket only where it spilled: find
// and update_hits_kernel use it (it shortens hkv's update kernel at every row width; an earlier
// try, before the kernel's register cap and the digest-match rework, had slowed its row copies).
// The placing kernels scan whole buckets, which finds a key wherever it lives.
template <bool kFresh, bool kWindowed = false, class Group>
__device__ int64_t locate(const View& t, const Group& g, uint64_t key, uint64_t h, uint8_t d) {
  const int lane = static_cast<int>(g.thread_rank());
  int64_t b = static_cast<int64_t>(h & static_cast<uint64_t>(t.nb - 1));
  for (int64_t step = 0; step < t.nb; ++step) {
    if constexpr (kWindowed) {
      const int32_t w = t.home_window(h);
      // The home window's chunks (one per lane), its spill bit and the overflow bit at once.
      const int c = kWindowChunks * w + lane;
      const uint4 hv = lane < kWindowChunks ? states16<kFresh>(t, b, c) : make_uint4(0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u);
      const bool spill = t.spilled<kFresh>(b, w);
      const bool overflow = t.overflows<kFresh>(b);
      const int32_t hit = match_in_chunk<kFresh>(t, b, c, match16(hv, d), key, -1);
      const uint32_t any = g.ballot(hit >= 0);
      if (any != 0) return (b << t.log_b) + g.shfl(hit, __ffs(any) - 1);
      if (!spill) {
        if (!overflow) return -1;
        b = (b + 1) & (t.nb - 1);
        continue;
      }
    }
    uint4 v[kChunks];
#pragma unroll
    for (int q = 0; q < kChunks; ++q) v[q] = states16<kFresh>(t, b, lane + q * kGroup);
    const bool overflow = t.overflows<kFresh>(b);  // loaded with the states: a miss waits for one access
    int32_t hit = -1;
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      hit = match_in_chunk<kFresh>(t, b, lane + q * kGroup, hit < 0 ? match16(v[q], d) : 0u, key, hit);
    }
    const uint32_t any = g.ballot(hit >= 0);
    if (any != 0) return (b << t.log_b) + g.shfl(hit, __ffs(any) - 1);
    if (!overflow) return -1;
    b = (b + 1) & (t.nb - 1);
  }
  return -1;
}

// Word k (0 .. 3) of a chunk of 16 state bytes.
__device__ __forceinline__ uint32_t word_of(uint4 v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

// The 32-bit word holding a state byte, and the byte's shift in it.
__device__ __forceinline__ unsigned int* state_word(const View& t, int64_t slot) {
  return reinterpret_cast<unsigned int*>(t.digests + (slot & ~int64_t{3}));
}
__device__ __forceinline__ int state_shift(int64_t slot) { return static_cast<int>(slot & 3) * 8; }

// Locks a live slot: CAS of its state byte from `d` to busy, waiting while another thread holds it
// (with `wait`; else a busy slot is not locked). Returns false if the slot no longer holds digest d
// (the caller looks the key up again) or, without `wait`, is busy.
__device__ bool lock_slot(const View& t, int64_t slot, uint8_t d, bool wait = true) {
  unsigned int* word = state_word(t, slot);
  const int shift = state_shift(slot);
  while (true) {
    const unsigned int cur = __ldcg(word);
    const uint8_t state = static_cast<uint8_t>(cur >> shift);
    if (state == kBusyState) {
      if (!wait) return false;
      __nanosleep(32);
      continue;
    }
    if (state != d) return false;
    const unsigned int next = (cur & ~(0xFFu << shift)) | (static_cast<unsigned int>(kBusyState) << shift);
    if (atomicCAS(word, cur, next) == cur) return true;
  }
}

// Sets the state byte of a slot this thread holds busy to `state` (a digest, or empty).
__device__ __forceinline__ void release_slot(const View& t, int64_t slot, uint8_t state) {
  __threadfence();
  atomicXor(state_word(t, slot), static_cast<unsigned int>(kBusyState ^ state) << state_shift(slot));
}

// Claims the lowest empty slot of bucket b below slot `limit` (its state becomes busy): the slot,
// or -1 when there is none. Lowest first: device-memory rows (the low slots of each bucket) fill
// first. In a table with home windows, the lowest empty slot of window w comes first, and a slot
// outside it sets the window's spill bit.
template <class Group>
__device__ int64_t claim_empty(const View& t, const Group& g, int64_t b, int32_t limit, int32_t w = 0) {
  const int lane = static_cast<int>(g.thread_rank());
  while (true) {
    uint4 v[kChunks];
#pragma unroll
    for (int q = 0; q < kChunks; ++q) v[q] = states16<true>(t, b, lane + q * kGroup);
    int32_t first = t.B;
    int32_t first_home = t.B;
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int c = lane + q * kGroup;
      const uint32_t empties = match16(v[q], kEmptyState);
      if (empties != 0) {
        first = min(first, c * 16 + __ffs(empties) - 1);
        if (c / kWindowChunks == w) first_home = min(first_home, c * 16 + __ffs(empties) - 1);
      }
    }
    for (int offset = kGroup / 2; offset > 0; offset /= 2) {
      first = min(first, g.shfl_xor(first, offset));
      first_home = min(first_home, g.shfl_xor(first_home, offset));
    }
    if (t.windows > 1 && first_home < limit) first = first_home;
    if (first >= limit) return -1;
    // The CAS expects the 32-bit word of state bytes as this scan read it (from the lane that loaded
    // its chunk), not as a second read would: one round trip less per new key. A word changed since
    // fails the CAS, and the bucket is read again.
    const int chunk = first / 16;
    uint32_t seen = 0;
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      if (chunk == lane + q * kGroup) seen = word_of(v[q], (first % 16) / 4);
    }
    seen = g.shfl(seen, chunk % kGroup);
    int64_t got = -1;
    if (lane == 0) {
      const int64_t slot = (b << t.log_b) + first;
      if (atomicCAS(state_word(t, slot), seen, seen | (static_cast<unsigned int>(kBusyState) << state_shift(slot))) == seen) {
        got = slot;
      }
    }
    got = g.shfl(got, 0);
    if (got >= 0) {
      if (lane == 0) t.note_placement(b, first, w);
      return got;
    }
  }
}

// What a scan of a bucket's slots below a limit saw (scan_bucket).
struct BucketScan {
  int64_t slot;    // the live slot with the lowest score (ties: the lowest slot), or -1
  uint64_t score;  // its score
  uint32_t word;   // the 32-bit word of state bytes holding the slot's, as the scan read it
  bool empty;      // an empty slot was seen: no score was read
  bool busy;       // a busy slot was seen (its score unknown: a row being written or moved)
};

// The scan of bucket b's slots below `limit` for a victim (take_victim: the whole bucket;
// device_slot_for: its device slots): the state bytes (one round trip), then, where no slot is
// empty, every live slot's score (a second; a batch's loads are all issued before any score is
// compared), and the live slot of the lowest score with the state word seen for it, which
// lock_scanned locks by one CAS. `cached` reads the scores through L1. A score cached in L1 may be
// older than the slot's (L1 is not coherent): in an evicting pass a slot's score only changes when
// a newcomer of the same kernel replaces its key, so a stale score is that of a key already
// evicted, which the victim's score, read again after locking, exposes (take_victim then scans
// again with `cached` false), or (lfu's low-scoring newcomers) hides a newcomer of this kernel as
// concurrent replacements can anyway. (Issuing the score loads with the state loads, one round
// trip in all, needed registers that cost the evicting pass its second resident block, and it ran
// slower.)
// Who reads which scores: kAcrossLanes spreads each 16-byte load of the group over neighbouring
// pairs of scores (a group's load covers kGroup * 16 contiguous bytes, a quarter of the cache lines
// per warp load that a lane per chunk touches), the chunks' live bits shared by shuffles; the
// pure device evicting pass is faster so, the hybrid one (which also scans for device rows) was
// not. Else each lane reads the scores of the chunks whose state bytes it read.
template <bool kAcrossLanes, class Group>
__device__ BucketScan scan_bucket(const View& t, const Group& g, int64_t b, int32_t limit, bool cached) {
  const int lane = static_cast<int>(g.thread_rank());
  uint4 v[kChunks];
  uint32_t below[kChunks];
#pragma unroll
  for (int q = 0; q < kChunks; ++q) {
    const int c = lane + q * kGroup;
    v[q] = states16<true>(t, b, c);
    below[q] = c * 16 >= limit ? 0u : c * 16 + 16 > limit ? (1u << (limit - c * 16)) - 1u : 0xFFFFu;
  }
  uint32_t empties = 0;
  uint32_t busy_bits = 0;
#pragma unroll
  for (int q = 0; q < kChunks; ++q) {
    empties |= match16(v[q], kEmptyState) & below[q];
    busy_bits |= match16(v[q], kBusyState) & below[q];
  }
  BucketScan s{-1, ~uint64_t{0}, 0, g.any(empties != 0) != 0, g.any(busy_bits != 0) != 0};
  if (s.empty) return s;
  const ulonglong2* pairs = reinterpret_cast<const ulonglong2*>(t.score_at(b << t.log_b));  // 2 scores a load
  int32_t best_j = -1;  // slots ascend in each lane's loads, so a strict < keeps the lowest slot of a tie
  if constexpr (kAcrossLanes) {
    // Pair p (slots 2p, 2p + 1) is read by lane p % kGroup in round p / kGroup; the live bits of
    // chunk c are bits 16 * (c / kGroup) .. of lane c % kGroup's `pack`.
    uint64_t pack = 0;
#pragma unroll
    for (int q = 0; q < kChunks; ++q) pack |= static_cast<uint64_t>(live16(v[q]) & below[q]) << (16 * q);
    uint64_t packs[kGroup];
#pragma unroll
    for (int l = 0; l < kGroup; ++l) packs[l] = g.shfl(pack, l);
    const int rounds = t.B / (2 * kGroup);
    constexpr int kRounds = 8;  // loads in flight per lane
#pragma unroll 1
    for (int r0 = 0; r0 < rounds; r0 += kRounds) {
      ulonglong2 sc[kRounds];
      uint32_t live[kRounds];
#pragma unroll
      for (int u = 0; u < kRounds; ++u) {
        const int pair = (r0 + u) * kGroup + lane;
        const int c = pair / 8;
        uint64_t pk = 0;
#pragma unroll
        for (int l = 0; l < kGroup; ++l) pk = c % kGroup == l ? packs[l] : pk;
        live[u] = r0 + u < rounds ? static_cast<uint32_t>(pk >> (16 * (c / kGroup) + (2 * pair) % 16)) & 3u : 0u;
        sc[u] = make_ulonglong2(0, 0);
        if (live[u] != 0) sc[u] = cached ? pairs[pair] : __ldcg(pairs + pair);
      }
#pragma unroll
      for (int u = 0; u < kRounds; ++u) {
        const int j = 2 * ((r0 + u) * kGroup + lane);
        if ((live[u] & 1u) && (best_j < 0 || sc[u].x < s.score)) {
          s.score = sc[u].x;
          best_j = j;
        }
        if ((live[u] & 2u) && (best_j < 0 || sc[u].y < s.score)) {
          s.score = sc[u].y;
          best_j = j + 1;
        }
      }
    }
  } else {
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      const int c = lane + q * kGroup;
      const uint32_t live = live16(v[q]) & below[q];
      uint64_t sc[16];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        ulonglong2 p = make_ulonglong2(0, 0);
        if ((live >> (2 * k)) & 3u) p = cached ? pairs[c * 8 + k] : __ldcg(pairs + c * 8 + k);
        sc[2 * k] = p.x;
        sc[2 * k + 1] = p.y;
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) {
        if (((live >> k) & 1u) && (best_j < 0 || sc[k] < s.score)) {
          s.score = sc[k];
          best_j = c * 16 + k;
        }
      }
    }
  }
  for (int offset = kGroup / 2; offset > 0; offset /= 2) {
    const uint64_t other = g.shfl_xor(s.score, offset);
    const int32_t other_j = g.shfl_xor(best_j, offset);
    if (other_j >= 0 && (best_j < 0 || other < s.score || (other == s.score && other_j < best_j))) {
      s.score = other;
      best_j = other_j;
    }
  }
  // The state word of the chosen slot, as the lane that read its chunk saw it.
  uint32_t seen = 0;
#pragma unroll
  for (int q = 0; q < kChunks; ++q) {
    if (best_j >= 0 && best_j / 16 == lane + q * kGroup) seen = word_of(v[q], (best_j % 16) / 4);
  }
  s.word = g.shfl(seen, best_j < 0 ? 0 : (best_j / 16) % kGroup);
  s.slot = best_j < 0 ? -1 : (b << t.log_b) + best_j;
  return s;
}

// Locks the victim a scan chose (one lane): a CAS of the state word as the scan read it, or, where
// the word changed since (a neighbour's state), lock_slot without waiting; then checks that it still
// holds the score the scan compared. Sets *state to the victim's state byte (to release it with).
// False where it is held by another group, or changed: choose again.
__device__ bool lock_scanned(const View& t, const BucketScan& s, uint8_t* state) {
  const int shift = state_shift(s.slot);
  *state = static_cast<uint8_t>(s.word >> shift);
  const unsigned int locked = (s.word & ~(0xFFu << shift)) | (static_cast<unsigned int>(kBusyState) << shift);
  if (atomicCAS(state_word(t, s.slot), s.word, locked) != s.word && !lock_slot(t, s.slot, *state, false)) return false;
  if (read_u64<true>(t.score_at(s.slot)) == s.score) return true;
  release_slot(t, s.slot, *state);
  return false;
}

// Copies w floats (group-parallel: the lanes of g, a static tile, take neighbouring 16-byte vectors
// where aligned); kAdd adds instead. Each lane issues up to four loads before its stores, so the
// reads of a row overlap instead of waiting for one another (the pointers never alias: a table row
// and a caller's array). kFresh reads past L1 (rows other SMs wrote during the running kernel).
template <bool kAdd, bool kFresh = false, class Group>
__device__ void copy_floats(const Group& g, float* __restrict__ dst, const float* __restrict__ src, int32_t w) {
  constexpr int kBatch = 4;
  constexpr int kLanes = static_cast<int>(Group::num_threads());
  const int lane = static_cast<int>(g.thread_rank());
  const bool vec = (w % 4 == 0) && (reinterpret_cast<uintptr_t>(dst) % 16 == 0) && (reinterpret_cast<uintptr_t>(src) % 16 == 0);
  if (vec) {
    float4* d4 = reinterpret_cast<float4*>(dst);
    const float4* s4 = reinterpret_cast<const float4*>(src);
    const int32_t n4 = w / 4;
    for (int32_t base = lane; base < n4; base += kBatch * kLanes) {
      float4 v[kBatch];
      float4 o[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int32_t c = base + u * kLanes;
        if (c < n4) {
          v[u] = kFresh ? __ldcg(s4 + c) : s4[c];
          if (kAdd) o[u] = d4[c];
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int32_t c = base + u * kLanes;
        if (c >= n4) continue;
        if (kAdd) {
          v[u].x += o[u].x;
          v[u].y += o[u].y;
          v[u].z += o[u].z;
          v[u].w += o[u].w;
        }
        d4[c] = v[u];
      }
    }
  } else {
    for (int32_t c = lane; c < w; c += kLanes) dst[c] = (kAdd ? dst[c] : 0.0f) + (kFresh ? __ldcg(src + c) : src[c]);
  }
}

// Zeroes w floats (group-parallel, 16-byte stores where aligned: whole sectors per instruction).
template <class Group>
__device__ void zero_floats(const Group& g, float* dst, int32_t w) {
  constexpr int kLanes = static_cast<int>(Group::num_threads());
  const int lane = static_cast<int>(g.thread_rank());
  if (w % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    float4* d4 = reinterpret_cast<float4*>(dst);
    for (int32_t c = lane; c < w / 4; c += kLanes) d4[c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  } else {
    for (int32_t c = lane; c < w; c += kLanes) dst[c] = 0.0f;
  }
}

// Asks L2 for the 128-byte lines holding bytes [p, p + bytes) (the group's lanes take turns), without
// waiting or registers: a later load of them then waits for L2 instead of DRAM.
template <class Group>
__device__ __forceinline__ void prefetch_l2(const Group& g, const void* p, int64_t bytes) {
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{127};
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  for (uintptr_t line = first + 128 * g.thread_rank(); line < end; line += 128 * kGroup) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
}

// Hybrid tables: host_slot of bucket b is held busy for a new key with score new_score. If the
// bucket's lowest-score device row scores lower, that row moves into host_slot (written there and
// published) and its device slot, held busy, is returned for the new key; else host_slot. The
// moved row is locked and its score checked again; rows placed by the running kernel are published
// after a fence in hybrid tables, so the row, key and score read here are complete. Newcomers to
// one bucket in one call all choose the same lowest row first: a group that loses it scans again
// (the locked row is busy, so the next lowest is chosen) instead of leaving its new key in host
// memory while older rows stay in device memory. A lost lock means another group took a device
// row, which then holds a newcomer (no longer a candidate), so hb + 1 scans always settle;
// kMoveSlack more for lock attempts that met a neighbour's state change.
// The moved rows go straight over PCIe. Scattered row writes into mapped host memory are bound by
// the GPU's translation of host pages (a table with gigabytes of host rows touches a new page with
// nearly every row); the host sorts a hybrid table's placing list by bucket (BucketOrder), so
// the groups in flight write neighbouring buckets' host rows, and the writes overlap the kernel's
// other work.
constexpr int kMoveSlack = 8;
template <class Group>
__device__ int64_t device_slot_for(const View& t, const Group& g, int64_t b, int64_t host_slot, uint64_t new_score) {
  if (t.hb == 0) return host_slot;
  const int lane = static_cast<int>(g.thread_rank());
  int64_t victim = -1;
  uint64_t low = 0;
  uint8_t dv = 0;
#pragma unroll 1
  for (int tries = 0; tries <= t.hb + kMoveSlack && victim < 0; ++tries) {
    const BucketScan s = scan_bucket<false>(t, g, b, t.hb, false);
    if (s.slot < 0 || s.score >= new_score) return host_slot;
    int got = 0;
    if (lane == 0) got = lock_scanned(t, s, &dv) ? 1 : 0;
    if (g.shfl(got, 0)) {
      victim = s.slot;
      low = s.score;
    }
  }
  if (victim < 0) return host_slot;
  if (lane == 0) t.set_record(host_slot, read_u64<true>(t.key_at(victim)), low);
  copy_floats<false, true>(g, t.row(host_slot), t.row(victim), t.W);
  g.sync();  // the row is in host memory before it is published and the new key's row overwrites it
  if (lane == 0) release_slot(t, host_slot, dv);
  return victim;
}

__device__ __forceinline__ bool in_host(const View& t, int64_t slot) {
  return static_cast<int32_t>(slot & (t.B - 1)) >= t.hb;
}

// A slot for a new key with score new_score in bucket b, held busy, or -1 when the bucket is full:
// a free device slot, else a free host slot (or the device slot device_slot_for frees for it).
template <bool kHybrid, class Group>
__device__ int64_t claim_for_new(const View& t, const Group& g, int64_t b, uint64_t new_score, int32_t w) {
  const int64_t device_slot = claim_empty(t, g, b, t.hb, w);
  if (!kHybrid || device_slot >= 0) return device_slot;
  const int64_t host_slot = claim_empty(t, g, b, t.B, w);
  return host_slot < 0 ? -1 : device_slot_for(t, g, b, host_slot, new_score);
}

// The initial value of column c of key's row: zero, then each initializer covering c (later ones
// win, as on the CPU). kConstant: every initializer is a constant (the caller checked), which
// spares the random generators' registers.
template <bool kConstant>
__device__ __forceinline__ float init_column(uint64_t key, int32_t c, const Inits& inits) {
  float v = 0.0f;
  for (int32_t i = 0; i < inits.count; ++i) {
    const sok_initializer& init = inits.items[i];
    if (c >= init.col_begin && c < init.col_end) v = kConstant ? static_cast<float>(init.a) : sok::init_value(init, key, c);
  }
  return v;
}

// Initial rows kept in shared memory by the placing kernels when every initializer is a constant:
// rows of up to this many floats (wider ones are computed column by column).
constexpr int32_t kConstantRowFloats = 512;

// The initial values of columns [begin, end) of key's row, to dst[0 .. end - begin). With `copy`
// (not null), columns [copy_begin, copy_end) within [begin, end) also go to
// copy[0 .. copy_end - copy_begin): find_or_insert returns a new row without reading it back.
// `constant_row` (not null: every initializer is a constant) holds the whole initial row, the same
// for every key: both are copied from it (a faster placing kernel: ncu had counted many more
// sectors written to L2 per new key than carry data, the row's lanes storing apart). Else four
// columns a lane-step with 16-byte stores where the columns and pointers are aligned (faster than
// one at a time).
template <bool kConstant, class Group>
__device__ void init_columns_d(const Group& g, float* dst, int32_t begin, int32_t end, uint64_t key, const Inits& inits,
                               const float* constant_row, float* copy = nullptr, int32_t copy_begin = 0,
                               int32_t copy_end = 0) {
  if (constant_row != nullptr) {
    copy_floats<false>(g, dst, constant_row + begin, end - begin);
    if (copy != nullptr) copy_floats<false>(g, copy, constant_row + copy_begin, copy_end - copy_begin);
    return;
  }
  const int lane = static_cast<int>(g.thread_rank());
  const bool vec = begin % 4 == 0 && end % 4 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 &&
                   (copy == nullptr ||
                    (copy_begin % 4 == 0 && copy_end % 4 == 0 && reinterpret_cast<uintptr_t>(copy) % 16 == 0));
  if (vec) {
    for (int32_t c = begin + 4 * lane; c < end; c += 4 * kGroup) {
      const float4 v = make_float4(init_column<kConstant>(key, c, inits), init_column<kConstant>(key, c + 1, inits),
                                   init_column<kConstant>(key, c + 2, inits), init_column<kConstant>(key, c + 3, inits));
      *reinterpret_cast<float4*>(dst + (c - begin)) = v;
      if (copy != nullptr && c >= copy_begin && c < copy_end) *reinterpret_cast<float4*>(copy + (c - copy_begin)) = v;
    }
    return;
  }
  for (int32_t c = begin + lane; c < end; c += kGroup) {
    const float v = init_column<kConstant>(key, c, inits);
    dst[c - begin] = v;
    if (copy != nullptr && c >= copy_begin && c < copy_end) copy[c - copy_begin] = v;
  }
}

__device__ __forceinline__ uint64_t next_score(Policy policy, bool has_old, uint64_t old, uint64_t caller, uint64_t now,
                                               uint64_t epoch) {
  switch (policy) {
    case Policy::kLru: return now;
    case Policy::kLfu: return has_old ? (old > ~uint64_t{0} - caller ? ~uint64_t{0} : old + caller) : caller;
    case Policy::kEpochLru: return (epoch << 32) | ((now >> 20) & 0xFFFFFFFFull);
    case Policy::kEpochLfu: {
      uint64_t low = has_old ? (old & 0xFFFFFFFFull) : 0;
      const uint64_t inc = caller < 0xFFFFFFFFull ? caller : 0xFFFFFFFFull;
      low = low + inc > 0xFFFFFFFFull ? 0xFFFFFFFFull : low + inc;
      return (epoch << 32) | low;
    }
    default: return caller;
  }
}

// Hybrid tables (hb < B): a new key takes a device slot of its bucket, moving the bucket's
// lowest-score device row to the free (or evicted) host slot when its own score is higher
// (claim_for_new, device_slot_for), so the rows written last stay in device memory.
struct UpsertArgs {
  int64_t n;
  const void* keys;
  int32_t key_type;
  int32_t cb;
  int32_t ce;
  Mode mode;
  Policy policy;
  bool admit_all;      // lru/lfu (not import): a newcomer always takes the lowest-score slot
  bool evicting;       // full buckets evict (table at its size limit) instead of overflowing
  const float* values; // (n, w) input rows (assign, accumulate, import)
  float* out;          // (n, w) output rows (find_or_insert), or null with out_rows
  float** out_rows;    // (n,) the rows' addresses instead (find_or_insert_rows), or null
  uint8_t* found;      // (n,) or null (find_or_insert)
  const uint64_t* scores;  // per key: caller scores (or summed increments), null = 1 each
  const int32_t* leader;   // per key: the batch index that acts for its duplicates, or null
  // accumulate: a leader's duplicates in batch order are order[first[l] .. end[l]).
  const int32_t* order;
  const int32_t* first;
  const int32_t* end;
  uint64_t now;
  uint64_t epoch;
  Inits inits;
  void* ev_keys;        // evicted / refused rows, or null
  float* ev_values;     // (n, W)
  uint64_t* ev_scores;
  unsigned long long* ev_count;
  unsigned long long* size;  // live keys
};

// accumulate: adds the values of every occurrence of leader l's key to dst in batch order, so the
// sums round exactly as sequential adds do (with assign_first, the first occurrence is copied).
template <class Group>
__device__ void add_duplicates(const Group& g, const UpsertArgs& a, int64_t l, float* dst, int32_t w,
                               bool assign_first) {
  const int32_t begin = a.first[l];
  const int32_t end = a.end[l];
  for (int32_t k = begin; k < end; ++k) {
    const float* src = a.values + static_cast<int64_t>(a.order[k]) * w;
    if (k == begin && assign_first) {
      copy_floats<false>(g, dst, src, w);
    } else {
      copy_floats<true>(g, dst, src, w);
    }
    g.sync();
  }
}

// Records a row that left the table (or was refused) in the evicted outputs.
template <class Group>
__device__ void spill(const Group& g, const UpsertArgs& a, int32_t W, uint64_t key, const float* row, uint64_t score) {
  unsigned long long idx = 0;
  if (g.thread_rank() == 0) idx = atomicAdd(a.ev_count, 1ull);
  idx = g.shfl(idx, 0);
  if (g.thread_rank() == 0) {
    store_key_d(a.ev_keys, a.key_type, static_cast<int64_t>(idx), key);
    if (a.ev_scores != nullptr) a.ev_scores[idx] = score;
  }
  // Past L1: other SMs rewrite a slot's row during the kernel, and this SM's L1 may still hold the
  // row of the slot's previous key (a row spilled with the wrong key on the H100).
  if (a.ev_values != nullptr) copy_floats<false, true>(g, a.ev_values + static_cast<int64_t>(idx) * W, row, W);
}

// Upserts. The keys placed by a call are distinct (callers deduplicate; an LRU find_or_insert and
// an insert_or_assign of keys promised unique deduplicate only the keys their hit pass did not
// find), so no two groups ever place the same key and keys already present need no lock. The
// kernels: update_hits_kernel writes the keys present (no slot changes hands) and marks the others
// missing; list_missing_kernel lists the missing leaders (in bucket order in a hybrid table);
// place_missing_kernel<false> (pass A) places them in empty slots and, in an evicting table, lists
// the keys whose home bucket is full; place_missing_kernel<true> (pass B) evicts for those (in a
// nearly full table it takes the whole list instead, without pass A). Rows updated by the first
// kernel are complete before anyone evicts, so an evicted row is always whole. A pure device
// table's pass A publishes new slots without a fence (nobody reads them during that kernel); pass
// B, and pass A of a hybrid table (whose device_slot_for moves rows placed in the same kernel),
// publish after a fence.

// The mode's write of `in` (w columns) to a row that already holds the key.
template <class Group>
__device__ void apply_to_existing(const Group& g, const UpsertArgs& a, int64_t i, float* row, const float* in, int32_t w) {
  if (a.mode == Mode::kAssign || a.mode == Mode::kImport) {
    copy_floats<false>(g, row + a.cb, in, w);
  } else if (a.mode == Mode::kAccumulate) {
    add_duplicates(g, a, i, row + a.cb, w, false);
  }
}

// A key the table does not hold and could not take (an evicting table refused it): find_or_insert
// still returns the initial values; insert_and_evict reports it as evicted with the row it would
// have had.
template <bool kConstInits, class Group>
__device__ void refuse(const Group& g, const View& t, const UpsertArgs& a, int64_t i, uint64_t key, uint64_t new_score,
                       const float* in, int32_t w, const float* constant_row) {
  const int lane = static_cast<int>(g.thread_rank());
  if (a.mode == Mode::kFindOrInsert) {
    if (a.out_rows != nullptr) {
      if (lane == 0) a.out_rows[i] = nullptr;  // no row: the caller leaves this key alone
    } else {
      init_columns_d<kConstInits>(g, a.out + i * w, a.cb, a.ce, key, a.inits, constant_row);
    }
    if (lane == 0 && a.found != nullptr) a.found[i] = 0;
  } else if (a.ev_keys != nullptr && a.mode != Mode::kImport) {
    unsigned long long idx = 0;
    if (lane == 0) idx = atomicAdd(a.ev_count, 1ull);
    idx = g.shfl(idx, 0);
    if (lane == 0) {
      store_key_d(a.ev_keys, a.key_type, static_cast<int64_t>(idx), key);
      if (a.ev_scores != nullptr) a.ev_scores[idx] = new_score;
    }
    if (a.ev_values != nullptr) {
      float* dst = a.ev_values + static_cast<int64_t>(idx) * t.W;
      init_columns_d<kConstInits>(g, dst, 0, t.W, key, a.inits, constant_row);
      g.sync();
      copy_floats<false>(g, dst + a.cb, in, w);
    }
  }
}

// In an evicting table whose home bucket b is full: locks the slot of the bucket's lowest score
// (spilling its key, row and score to the evicted outputs) and returns it, or -1 when the policy
// refuses the newcomer (its score is below every score of the bucket). A slot freed meanwhile is
// taken instead (*replaced false). kHybrid: the table keeps rows in host memory (scan_bucket's
// choice of who reads which scores).
template <bool kHybrid, class Group>
__device__ int64_t take_victim(const Group& g, const View& t, const UpsertArgs& a, int64_t b, uint64_t new_score,
                               int32_t w, bool* replaced) {
  const int lane = static_cast<int>(g.thread_rank());
  int waits = 0;
  for (int tries = 0;; ++tries) {
    *replaced = false;
    const BucketScan s = scan_bucket<!kHybrid>(t, g, b, t.B, tries == 0);
    if (s.empty) {
      const int64_t empty = claim_empty(t, g, b, t.B, w);
      if (empty >= 0) return empty;
      continue;
    }
    const int64_t victim = s.slot;
    const uint64_t low = s.score;
    if (victim < 0) continue;  // every slot busy for a moment: look again
    // Under a refusing policy the bucket keeps its top scores, so the choice must see every score:
    // a busy slot may be taking a newcomer that scores below this one (which then goes in, in its
    // place, or is the one to evict instead of the lowest score seen). Wait for it; bounded, as a
    // safeguard (a slot is busy only while a group writes it).
    if (!a.admit_all && s.busy && ++waits < kRefusalWaits) {
      __nanosleep(64);
      continue;
    }
    if (!a.admit_all && new_score < low) return -1;
    // A victim another group holds is not waited for: choose again.
    int ok = 0;
    uint8_t vd = 0;
    if (lane == 0) ok = lock_scanned(t, s, &vd) ? 1 : 0;
    if (!g.shfl(ok, 0)) continue;
    if (a.ev_keys != nullptr) {
      spill(g, a, t.W, read_u64<true>(t.key_at(victim)), t.row(victim), low);
      g.sync();
    }
    if (lane == 0) t.note_placement(b, static_cast<int32_t>(victim & (t.B - 1)), w);
    *replaced = true;
    return victim;
  }
}

// Writes key i's row, key and score into `slot` (held busy by this group) and publishes its digest.
template <bool kFence, bool kConstInits, class Group>
__device__ void fill_slot(const Group& g, const View& t, const UpsertArgs& a, int64_t i, uint64_t key, uint8_t d,
                          int64_t slot, uint64_t new_score, const float* in, int32_t w, const float* constant_row) {
  const int lane = static_cast<int>(g.thread_rank());
  float* row = t.row(slot);
  if (a.mode == Mode::kFindOrInsert) {
    init_columns_d<kConstInits>(g, row, 0, t.W, key, a.inits, constant_row,
                                a.out_rows != nullptr ? nullptr : a.out + i * w, a.cb, a.ce);
    if (lane == 0 && a.out_rows != nullptr) a.out_rows[i] = row;
  } else {
    if (a.cb != 0 || a.ce != t.W) {
      init_columns_d<kConstInits>(g, row, 0, t.W, key, a.inits, constant_row);
      g.sync();
    }
    if (a.mode == Mode::kAccumulate) {
      add_duplicates(g, a, i, row + a.cb, w, true);  // the first occurrence's values, then the others
    } else {
      copy_floats<false>(g, row + a.cb, in, w);
    }
  }
  if (lane == 0) {
    if (a.found != nullptr) a.found[i] = 0;
    t.set_record(slot, key, new_score);
  }
  // With kFence, the group barrier orders the lanes' row writes before lane 0's fence (fences are
  // cumulative), and the fence orders them and the key and score before the digest.
  g.sync();
  if (lane == 0) {
    if (kFence) __threadfence();
    atomicXor(state_word(t, slot), static_cast<unsigned int>(kBusyState ^ d) << state_shift(slot));
  }
}

// One group of kGroup lanes per (leader) key: the mode's write and a new score if the key is
// present, else missing[i] = 1. Without leaders (a.leader null: find_or_insert under LRU-like
// policies, where repeated hits copy the same row out and store the same score, and
// insert_or_assign of keys promised unique) every occurrence is looked up. kWindowed: keys are
// looked up home window first (locate), under find's rule (BucketTable::windowed_lookups).
template <bool kWindowed>
__global__ void __launch_bounds__(kBlock, kHitsMinBlocks) update_hits_kernel(View t, UpsertArgs a, uint8_t* missing) {
  auto block = cg::this_thread_block();
  auto g = cg::tiled_partition<kGroup>(block);
  const int lane = static_cast<int>(g.thread_rank());
  const int32_t w = a.ce - a.cb;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kKeysPerBlock;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kKeysPerBlock + block.thread_rank() / kGroup; i < a.n; i += groups) {
    if (a.leader != nullptr && a.leader[i] != i) continue;
    const uint64_t key = load_key_d(a.keys, a.key_type, i);
    const uint64_t h = sok::hash_key(key);
    const int64_t slot = locate<false, kWindowed>(t, g, key, h, digest_of(h));
    if (lane == 0) missing[i] = slot < 0 ? 1 : 0;
    if (slot < 0) continue;
    float* row = t.row(slot);
    const uint64_t caller = a.scores != nullptr ? a.scores[i] : 1;
    apply_to_existing(g, a, i, row, a.values != nullptr ? a.values + i * w : nullptr, w);
    if (a.mode == Mode::kFindOrInsert && a.out_rows == nullptr) copy_floats<false>(g, a.out + i * w, row + a.cb, w);
    if (lane == 0) {
      if (a.out_rows != nullptr) a.out_rows[i] = row;
      if (a.found != nullptr) a.found[i] = 1;
      uint64_t* score = t.score_at(slot);
      const bool counts = a.policy == Policy::kLfu || a.policy == Policy::kEpochLfu;  // reads the old score
      *score = a.mode == Mode::kImport ? caller : next_score(a.policy, true, counts ? *score : 0, caller, a.now, a.epoch);
    }
  }
}

// Lists the keys that pass A of the placing kernel places: the leaders (every key where there are
// no leaders) that update_hits_kernel marked missing, their batch index in todo[0 .. *count) and
// their key in todo_keys (the placing kernel reads both at once), in batch order within
// a block (one atomic per block: one per warp made the kernel slow). A dense list keeps every
// group of the placing kernel busy: scanning the whole batch, a warp ran its placing path for a
// few of its keys only and paid a round trip for the others, which made the evicting pass of a
// full table much slower. With `buckets` (hybrid tables), each entry's home bucket goes there
// instead of its key, for the sort that puts the list in bucket order (order_list_kernel, which
// then writes todo_keys).
__global__ void __launch_bounds__(kBlock) list_missing_kernel(int64_t n, const void* keys, int32_t key_type,
                                                              const int32_t* leader, const uint8_t* missing,
                                                              int32_t* todo, uint64_t* todo_keys, unsigned int* count,
                                                              uint32_t* buckets, int64_t nb) {
  constexpr int kWarps = kBlock / 32;
  __shared__ unsigned int warp_base[kWarps];
  __shared__ unsigned int block_base;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;
  const bool take = i < n && (leader == nullptr || leader[i] == i) && missing[i] == 1;
  const unsigned int ballot = __ballot_sync(0xFFFFFFFFu, take);
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (lane == 0) warp_base[warp] = __popc(ballot);
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int total = 0;
    for (int k = 0; k < kWarps; ++k) {
      const unsigned int c = warp_base[k];
      warp_base[k] = total;
      total += c;
    }
    block_base = total != 0 ? atomicAdd(count, total) : 0;
  }
  __syncthreads();
  if (take) {
    const unsigned int at = block_base + warp_base[warp] + __popc(ballot & ((1u << lane) - 1u));
    const uint64_t key = load_key_d(keys, key_type, i);
    todo[at] = static_cast<int32_t>(i);
    if (buckets == nullptr) {
      todo_keys[at] = key;
    } else {  // order_list_kernel writes the keys, in bucket order
      buckets[at] = static_cast<uint32_t>(sok::hash_key(key) & static_cast<uint64_t>(nb - 1));
    }
  }
}

// Hybrid tables: the placing list rewritten in bucket order, from the batch indices of its entries
// sorted by home bucket (`sorted`), so the groups in flight move rows into neighbouring buckets'
// host rows (device_slot_for).
__global__ void order_list_kernel(const unsigned int* count, const int32_t* sorted, const void* keys, int32_t key_type,
                                  int32_t* todo, uint64_t* todo_keys) {
  const int64_t n = *count;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    const int32_t i = sorted[j];
    todo[j] = i;
    todo_keys[j] = load_key_d(keys, key_type, i);
  }
}

// The placing kernel's work lists (device memory, batch indices and their keys): pass A places
// todo[0 .. *todo_count); in an evicting table it lists the keys whose home bucket is full in
// full[0 .. *full_count) for pass B.
struct PlaceLists {
  int32_t* todo;  // written by list_missing_kernel
  uint64_t* todo_keys;
  unsigned int* todo_count;
  int32_t* full;
  uint64_t* full_keys;
  unsigned int* full_count;
};

// Places the listed missing (leader) keys. Pass A (kEvict false) takes the todo list: an empty slot
// of the home bucket in an evicting table (a full one lists the key for pass B), else of the first
// bucket of its chain with room. Pass B takes the full list, returning at once when it is empty:
// an empty slot or the bucket's lowest-score slot (take_victim), or refuses the key.
// kHybrid (hb < B) compiles the moves of device rows to host slots in; kConstInits (constant
// initializers only) leaves the random generators out and builds the initial row once per block
// in shared memory: without both, fewer registers (ptxas -v) and more resident blocks per SM.
// Capping pass A's registers further spilled and made it slower.
template <bool kEvict, bool kHybrid, bool kConstInits>
__global__ void __launch_bounds__(kBlock, place_min_blocks(kEvict, kHybrid, kConstInits)) place_missing_kernel(View t, UpsertArgs a, PlaceLists lists) {
  const unsigned int listed = *(kEvict ? lists.full_count : lists.todo_count);
  // The grid covers the batch, the list only part of it: blocks past the list leave at once.
  if (static_cast<int64_t>(blockIdx.x) * kKeysPerBlock >= listed) return;
  const int32_t* list = kEvict ? lists.full : lists.todo;
  const uint64_t* list_keys = kEvict ? lists.full_keys : lists.todo_keys;
  auto block = cg::this_thread_block();
  auto g = cg::tiled_partition<kGroup>(block);
  __shared__ unsigned long long created;
  if (block.thread_rank() == 0) created = 0;
  const float* constant_row = nullptr;  // the initial row of every key, where it is one constant row
  if constexpr (kConstInits) {
    __shared__ float4 constant_row4[kConstantRowFloats / 4];
    if (t.W <= kConstantRowFloats) {
      float* row = reinterpret_cast<float*>(constant_row4);
      for (int32_t c = static_cast<int32_t>(block.thread_rank()); c < t.W; c += kBlock) {
        row[c] = init_column<true>(0, c, a.inits);
      }
      constant_row = row;
    }
  }
  block.sync();
  const int lane = static_cast<int>(g.thread_rank());
  const int32_t w = a.ce - a.cb;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kKeysPerBlock;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * kKeysPerBlock + block.thread_rank() / kGroup; j < listed;
       j += groups) {
    const int64_t i = list[j];
    const uint64_t key = list_keys[j];
    const uint64_t h = sok::hash_key(key);
    const uint64_t caller = a.scores != nullptr ? a.scores[i] : 1;
    const float* in = a.values != nullptr ? a.values + i * w : nullptr;
    const uint64_t new_score = a.mode == Mode::kImport ? caller : next_score(a.policy, false, 0, caller, a.now, a.epoch);
    int64_t b = static_cast<int64_t>(h & static_cast<uint64_t>(t.nb - 1));
    if (kEvict) {  // the scores the victim search reads and the input row, while it reads the states
      prefetch_l2(g, t.score_at(b << t.log_b), sizeof(uint64_t) * t.B);
      if (a.mode == Mode::kAssign || a.mode == Mode::kImport) prefetch_l2(g, in, sizeof(float) * w);
    }
    const int32_t window = t.home_window(h);
    int64_t slot = -1;
    bool replaced = false;
    if (kEvict) {
      slot = take_victim<kHybrid>(g, t, a, b, new_score, window, &replaced);
      if (kHybrid && slot >= 0 && in_host(t, slot)) slot = device_slot_for(t, g, b, slot, new_score);
    } else if (a.evicting) {
      slot = claim_for_new<kHybrid>(t, g, b, new_score, window);
      if (slot < 0) {
        if (lane == 0) {
          const unsigned int at = atomicAdd(lists.full_count, 1u);
          lists.full[at] = static_cast<int32_t>(i);
          lists.full_keys[at] = key;
        }
        continue;
      }
    } else {
      for (int64_t step = 0; step < t.nb && slot < 0; ++step) {
        slot = claim_for_new<kHybrid>(t, g, b, new_score, window);
        if (slot < 0) {
          if (lane == 0) t.mark_overflow(b);
          b = (b + 1) & (t.nb - 1);
        }
      }
    }
    if (slot < 0) {  // refused by the policy (pass B), or a full growing table (ruled out by the host)
      refuse<kConstInits>(g, t, a, i, key, new_score, in, w, constant_row);
      continue;
    }
    // Evictors read victims, and in hybrid tables device_slot_for reads rows this kernel placed:
    // there slots are published in order.
    if (kEvict || kHybrid) {
      fill_slot<true, kConstInits>(g, t, a, i, key, digest_of(h), slot, new_score, in, w, constant_row);
    } else {
      fill_slot<false, kConstInits>(g, t, a, i, key, digest_of(h), slot, new_score, in, w, constant_row);
    }
    if (lane == 0 && !replaced) atomicAdd(&created, 1ull);
  }
  block.sync();
  if (block.thread_rank() == 0 && created != 0) atomicAdd(a.size, created);
}

struct FindArgs {
  int64_t n;
  const void* keys;
  int32_t key_type;
  int32_t cb;
  int32_t ce;
  float* out;
  const float* default_row;  // a missing key's row; zeros when null
  uint8_t* found;
  bool write_missing;        // false: a missing key's row is not written (find_hits)
};

template <bool kWindowed>
__global__ void find_kernel(View t, FindArgs a) {
  auto block = cg::this_thread_block();
  auto g = cg::tiled_partition<kGroup>(block);
  const int32_t w = a.ce - a.cb;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kKeysPerBlock;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kKeysPerBlock + block.thread_rank() / kGroup; i < a.n; i += groups) {
    const uint64_t key = load_key_d(a.keys, a.key_type, i);
    const uint64_t h = sok::hash_key(key);
    const int64_t slot = locate<false, kWindowed>(t, g, key, h, digest_of(h));
    float* dst = a.out + i * w;
    if (slot >= 0) {
      copy_floats<false>(g, dst, t.row(slot) + a.cb, w);
    } else if (a.write_missing && a.default_row != nullptr) {
      copy_floats<false>(g, dst, a.default_row, w);
    } else if (a.write_missing) {
      zero_floats(g, dst, w);
    }
    if (a.found != nullptr && g.thread_rank() == 0) a.found[i] = slot >= 0 ? 1 : 0;
  }
}

// Counts the keys of a batch that are not in the table (capacity checks before inserting).
__global__ void count_missing_kernel(View t, int64_t n, const void* keys, int32_t key_type, const int32_t* leader,
                                     unsigned long long* missing) {
  auto block = cg::this_thread_block();
  auto g = cg::tiled_partition<kGroup>(block);
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kKeysPerBlock;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kKeysPerBlock + block.thread_rank() / kGroup; i < n; i += groups) {
    if (leader[i] != i) continue;
    const uint64_t key = load_key_d(keys, key_type, i);
    const uint64_t h = sok::hash_key(key);
    if (locate<false>(t, g, key, h, digest_of(h)) < 0 && g.thread_rank() == 0) atomicAdd(missing, 1ull);
  }
}

__global__ void erase_kernel(View t, int64_t n, const void* keys, int32_t key_type, unsigned long long* erased,
                             unsigned long long* size) {
  auto block = cg::this_thread_block();
  auto g = cg::tiled_partition<kGroup>(block);
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kKeysPerBlock;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kKeysPerBlock + block.thread_rank() / kGroup; i < n; i += groups) {
    const uint64_t key = load_key_d(keys, key_type, i);
    const uint64_t h = sok::hash_key(key);
    const uint8_t d = digest_of(h);
    while (true) {
      const int64_t slot = locate<true>(t, g, key, h, d);
      if (slot < 0) break;
      int done = 0;
      if (g.thread_rank() == 0 && lock_slot(t, slot, d)) {
        if (read_u64<true>(t.key_at(slot)) == key) {
          *t.score_at(slot) = 0;
          release_slot(t, slot, kEmptyState);
          atomicAdd(erased, 1ull);
          atomicAdd(size, ~0ull);  // -1
          done = 1;
        } else {
          release_slot(t, slot, d);
        }
      }
      if (g.shfl(done, 0)) break;
    }
  }
}

// Moves every live slot of `from` into `to` (a larger, empty table). Keys are distinct.
__global__ void rehash_kernel(View from, View to) {
  auto block = cg::this_thread_block();
  auto g = cg::tiled_partition<kGroup>(block);
  const int lane = static_cast<int>(g.thread_rank());
  const int64_t slots = from.nb << from.log_b;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kKeysPerBlock;
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * kKeysPerBlock + block.thread_rank() / kGroup; s < slots; s += groups) {
    const uint8_t d = from.digests[s];
    if (d < 2) continue;
    const uint64_t key = *from.key_at(s);
    const uint64_t h = sok::hash_key(key);
    int64_t b = static_cast<int64_t>(h & static_cast<uint64_t>(to.nb - 1));
    const int32_t window = to.home_window(h);
    int64_t slot = -1;
    for (int64_t step = 0; step < to.nb && slot < 0; ++step) {
      slot = claim_empty(to, g, b, to.B, window);
      if (slot < 0) {
        if (lane == 0) to.mark_overflow(b);
        b = (b + 1) & (to.nb - 1);
      }
    }
    copy_floats<false>(g, to.row(slot), from.row(s), to.W);
    if (lane == 0) to.set_record(slot, key, *from.score_at(s));
    __threadfence();
    g.sync();
    if (lane == 0) release_slot(to, slot, d);
  }
}

// Export, pass 1 (cub::DeviceSelect::If over the chunk's slot offsets j): slot from + j is live,
// and with `filter` scored >= threshold.
struct LiveSlot {
  View t;
  int64_t from;
  bool filter;
  uint64_t threshold;
  __device__ bool operator()(int32_t j) const {
    const int64_t s = from + j;
    return t.digests[s] >= 2 && (!filter || t.scores[s] >= threshold);
  }
};

// Export, pass 2: the live slots of chunk `chunk` (their offsets from `from` in `picked`, in slot
// order, counts[chunk] of them) go to the outputs after the rows of the earlier chunks. kLanes
// lanes copy a row (export_lanes: about two 16-byte loads each).
template <int kLanes>
__global__ void export_gather_kernel(View t, int64_t from, const int32_t* picked, const int32_t* counts, int32_t chunk,
                                     int32_t key_type, int32_t cb, int32_t ce, void* keys, float* values,
                                     uint64_t* scores) {
  __shared__ int64_t start_shared;
  if (threadIdx.x == 0) {
    int64_t start = 0;
    for (int32_t c = 0; c < chunk; ++c) start += counts[c];
    start_shared = start;
  }
  __syncthreads();
  auto block = cg::this_thread_block();
  auto g = cg::tiled_partition<kLanes>(block);
  constexpr int kRowsPerBlock = kBlock / kLanes;
  const int32_t w = ce - cb;
  const int64_t start = start_shared;
  const int64_t n = counts[chunk];
  const int64_t groups = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + block.thread_rank() / kLanes; i < n; i += groups) {
    const int64_t s = from + picked[i];
    const int64_t out = start + i;
    if (g.thread_rank() == 0) {
      store_key_d(keys, key_type, out, *t.key_at(s));
      if (scores != nullptr) scores[out] = *t.score_at(s);
    }
    if (values != nullptr) copy_floats<false>(g, values + out * w, t.row(s) + cb, w);
  }
}

// Lanes per exported row of w floats: a power of two near half its 16-byte pieces, 1 .. 32.
inline int export_lanes(int32_t w) {
  const int32_t pieces = (w + 3) / 4;
  int lanes = 1;
  while (lanes < 32 && 2 * lanes < pieces) lanes *= 2;
  return lanes;
}

// Deduplication index entries: a batch index of the entry's key (the highest so far, once every
// occurrence has been inserted); all ones while empty (never a batch index: they are below
// 2**31 - 1). An entry only ever goes from empty to an index of one key and then to higher indices
// of the same key, so any value read from it names an occurrence of its key to compare with.
constexpr uint32_t kEmptyEntry = ~0u;

// Deduplication, pass 1: every key (with `only`, every key i with only[i] != 0; the others get
// slot_of -1) claims an entry of an open-addressing index of `slots` entries with i, or, where an
// occurrence of its key holds one, raises it to i with atomicMax. A key met once costs one atomic,
// not a claim and then a maximum.
__global__ void dedup_insert_kernel(int64_t n, const void* keys, int32_t key_type, int64_t slots, uint32_t* entries,
                                    int32_t* slot_of, const uint8_t* only) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (only != nullptr && only[i] == 0) {
      slot_of[i] = -1;
      continue;
    }
    const uint64_t key = load_key_d(keys, key_type, i);
    int64_t s = static_cast<int64_t>(sok::hash_key(key) & static_cast<uint64_t>(slots - 1));
    const uint32_t index = static_cast<uint32_t>(i);
    // CAS first: a free entry costs one round trip, not a read and then the CAS.
    while (true) {
      const uint32_t e = atomicCAS(entries + s, kEmptyEntry, index);
      if (e == kEmptyEntry) break;
      if (load_key_d(keys, key_type, static_cast<int64_t>(e)) == key) {
        atomicMax(entries + s, index);
        break;
      }
      s = (s + 1) & (slots - 1);
    }
    slot_of[i] = static_cast<int32_t>(s);
  }
}

// Pass 2: leader[i] = the last batch index of key i (it acts for all its duplicates); i for a key
// left out of pass 1.
__global__ void dedup_leader_kernel(int64_t n, const uint32_t* entries, const int32_t* slot_of, int32_t* leader) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    leader[i] = slot_of[i] < 0 ? static_cast<int32_t>(i) : static_cast<int32_t>(entries[slot_of[i]]);
  }
}

__global__ void iota_kernel(int64_t n, int32_t* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = static_cast<int32_t>(i);
  }
}

// accumulate, after a stable sort of (leader, index) pairs: the segment of each leader.
__global__ void duplicate_segments_kernel(int64_t n, const int32_t* sorted_leader, int32_t* first, int32_t* end) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n; p += stride) {
    const int32_t l = sorted_leader[p];
    if (p == 0 || sorted_leader[p - 1] != l) first[l] = static_cast<int32_t>(p);
    if (p == n - 1 || sorted_leader[p + 1] != l) end[l] = static_cast<int32_t>(p + 1);
  }
}

// LFU policies: a leader's score increment is the sum over its duplicates (saturating).
__global__ void sum_increments_kernel(int64_t n, const int32_t* leader, const uint64_t* scores,
                                      unsigned long long* sums) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    atomicAdd(sums + leader[i], static_cast<unsigned long long>(scores != nullptr ? scores[i] : 1));
  }
}

// find_or_insert: duplicates copy their leader's row (or, with out_rows, its address) and found
// flag (one thread per key).
__global__ void copy_from_leaders_kernel(int64_t n, int32_t w, const int32_t* leader, float* out, float** out_rows,
                                         uint8_t* found) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int32_t l = leader[i];
    if (l == i) continue;
    if (out_rows != nullptr) {
      out_rows[i] = out_rows[l];
    } else {
      for (int32_t c = 0; c < w; ++c) out[i * w + c] = out[static_cast<int64_t>(l) * w + c];
    }
    if (found != nullptr) found[i] = found[l];
  }
}

}  // namespace gpu
}  // namespace sok
