// hkv: a bucketed embedding table with per-key scores and eviction (var_type "hybrid").
// CPU implementation.
//
// Layout (as HierarchicalKV): the table is `capacity / bucket_size` buckets of `bucket_size`
// slots. A key hashes to one bucket; inside it, a one-byte digest per slot (0 = empty) filters the
// keys, compared 16 at a time. Each slot has a key, a score and a row of `row_width` floats.
// Inserting into a full bucket grows the table (doubling, up to max_capacity); at max_capacity it
// evicts the bucket's lowest-score slot, or refuses the new key when the policy says its score is
// too low. Every 64-bit key value is valid: emptiness lives in the digest, not in the key.
//
// Scores by policy (HierarchicalKV's, ns clock = system clock since the Unix epoch):
//   lru        time of the last write or find_or_insert (strictly increasing per table)
//   lfu        access count: + caller score (default 1) per write or find_or_insert
//   epoch_lru  (epoch << 32) | (time >> 20)
//   epoch_lfu  (epoch << 32) | saturating 32-bit count
//   custom     the caller's score
//
// On the CPU every row lives in host memory; max_hbm_for_vectors matters to the CUDA
// implementation (issue "CUDA backends"), which goes beside this file as hkv_table_cuda.cu.
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <string>
#include <vector>

#include "sok/backend.hpp"

namespace sok_hkv {

enum class Policy { kLru = 0, kLfu = 1, kEpochLru = 2, kEpochLfu = 3, kCustom = 4 };

class HkvTable final : public sok::Storage {
 public:
  HkvTable(const sok_storage_config& config, sok::Options& options);

  bool accepts_scores() const override;
  bool requires_scores() const override { return policy_ == Policy::kCustom; }

  int64_t size(const sok_exec_context& ctx) override;
  int64_t capacity() override;
  void find(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
            float* values, const float* default_row, uint8_t* found) override;
  void find_or_insert(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
                      float* values, uint8_t* found, const uint64_t* scores,
                      const sok_initializer* inits, int32_t num_inits) override;
  void insert_or_assign(const sok_exec_context& ctx, int64_t n, const void* keys,
                        sok::Columns cols, const float* values, const uint64_t* scores,
                        const sok_initializer* inits, int32_t num_inits) override;
  void accum_or_assign(const sok_exec_context& ctx, int64_t n, const void* keys,
                       sok::Columns cols, const float* values, const uint64_t* scores,
                       const sok_initializer* inits, int32_t num_inits) override;
  int64_t erase(const sok_exec_context& ctx, int64_t n, const void* keys) override;
  int64_t export_batch(const sok_exec_context& ctx, int64_t offset, int64_t limit,
                       sok::Columns cols, const uint64_t* threshold, void* keys, float* values,
                       uint64_t* scores) override;
  int64_t insert_and_evict(const sok_exec_context& ctx, int64_t n, const void* keys,
                           sok::Columns cols, const float* values, const uint64_t* scores,
                           const sok_initializer* inits, int32_t num_inits, void* evicted_keys,
                           float* evicted_values, uint64_t* evicted_scores) override;
  void clear(const sok_exec_context& ctx) override;
  void set_global_epoch(uint64_t epoch) override;
  std::string describe() override;

 private:
  enum class Write { kAssign, kAccumulate };
  // Where evicted and refused rows go (insert_and_evict); null pointers drop them.
  struct Spill {
    void* keys = nullptr;
    float* values = nullptr;
    uint64_t* scores = nullptr;
    int64_t count = 0;
  };
  static constexpr int64_t kNotFound = -1;

  float* row(int64_t slot) { return values_.data() + slot * row_width(); }
  int64_t bucket_of(uint64_t hash) const { return static_cast<int64_t>(hash & (num_buckets_ - 1)); }
  static uint8_t digest_of(uint64_t hash) { return static_cast<uint8_t>(1 + (hash >> 56) % 255); }
  void prefetch_bucket(uint64_t key) const;

  // The slot of key in its bucket, or kNotFound. Needs at least a shared lock.
  int64_t locate(uint64_t key, uint64_t hash) const;
  // Score of a key by the policy: old = its score if present (has_old), inc = caller score.
  uint64_t next_score(bool has_old, uint64_t old, uint64_t caller, uint64_t now) const;
  uint64_t tick();
  // Finds or places key (growing or evicting as needed). Returns the slot, or kNotFound when the
  // policy refused it. *created is true for a new slot; an evicted row is appended to spill.
  int64_t place(uint64_t key, uint64_t score, bool* created, Spill* spill);
  void grow();
  void allocate(int64_t capacity);
  void write(int64_t n, const void* keys, sok::Columns cols, const float* values,
             const uint64_t* scores, const sok_initializer* inits, int32_t num_inits, Write mode,
             Spill* spill);
  void spill_row(Spill* spill, uint64_t key, const float* row, uint64_t score) const;

  mutable std::shared_mutex mutex_;
  Policy policy_;
  int64_t bucket_size_;
  int64_t num_buckets_ = 0;
  int64_t max_capacity_;
  double max_load_factor_;
  double max_hbm_gb_;
  uint64_t epoch_ = 0;
  uint64_t last_tick_ = 0;
  int64_t size_ = 0;
  std::vector<uint8_t> digests_;  // (capacity,)
  std::vector<uint64_t> keys_;    // (capacity,)
  std::vector<uint64_t> scores_;  // (capacity,)
  std::vector<int32_t> fill_;     // (num_buckets,) live slots per bucket
  std::vector<float> values_;     // (capacity, row_width)
};

}  // namespace sok_hkv
