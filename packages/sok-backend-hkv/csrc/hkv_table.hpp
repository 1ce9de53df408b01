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
// implementation (hkv_table_cuda.cu, in CUDA builds), which create_storage() picks by device type.
#pragma once

#include <cstdint>
#include <shared_mutex>
#include <string>
#include <vector>

#include "sok/kit/keys.hpp"
#include "sok/kit/options.hpp"
#include "sok/kit/rows.hpp"
#include "sok/kit/storage.hpp"

namespace sok_hkv {

enum class Policy { kLru = 0, kLfu = 1, kEpochLru = 2, kEpochLfu = 3, kCustom = 4 };
const char* policy_name(Policy p);

// The options of an hkv table (SOK's HKV config names), the same on the CPU and the GPU.
struct HkvOptions {
  int64_t init_capacity;
  int64_t max_capacity;
  int64_t bucket_size;      // max_bucket_size
  double max_load_factor;
  double max_hbm_gb;        // max_hbm_for_vectors: GB of row memory on the GPU, the rest in host memory
  Policy policy;            // evict_strategy
  int64_t device_id;        // SOK's HKV tuning settings: validated; device_id -1 = the config's device
  int64_t block_size;
  bool io_by_cpu;
  static HkvOptions parse(sok::Options& options);
};

// An hkv storage on the config's device: HkvTable on the CPU, the CUDA table in CUDA builds.
sok::Storage* create_storage(const sok_storage_config& config, sok::Options& options);
#ifdef SOK_WITH_CUDA
sok::Storage* create_cuda_storage(const sok_storage_config& config, const HkvOptions& options);
#endif

// The keys a bulk call created (open addressing, linear probing): a later duplicate of such a key
// hits it in the table, yet did not exist before the call.
class CreatedSet {
 public:
  void insert(uint64_t key) {
    if (2 * (count_ + 1) > static_cast<int64_t>(used_.size())) rehash(std::max<size_t>(64, used_.size() * 2));
    if (place(key)) ++count_;
  }
  void absorb(const CreatedSet& other) {
    for (size_t i = 0; i < other.used_.size(); ++i)
      if (other.used_[i]) insert(other.keys_[i]);
  }
  bool contains(uint64_t key) const {
    if (count_ == 0) return false;
    for (size_t i = sok::hash_key(key) & (used_.size() - 1);; i = (i + 1) & (used_.size() - 1)) {
      if (!used_[i]) return false;
      if (keys_[i] == key) return true;
    }
  }

 private:
  bool place(uint64_t key) {
    for (size_t i = sok::hash_key(key) & (used_.size() - 1);; i = (i + 1) & (used_.size() - 1)) {
      if (!used_[i]) {
        used_[i] = 1;
        keys_[i] = key;
        return true;
      }
      if (keys_[i] == key) return false;
    }
  }
  void rehash(size_t slots) {
    std::vector<uint64_t> keys;
    std::vector<uint8_t> used;
    keys.swap(keys_);
    used.swap(used_);
    keys_.assign(slots, 0);
    used_.assign(slots, 0);
    for (size_t i = 0; i < used.size(); ++i)
      if (used[i]) place(keys[i]);
  }
  std::vector<uint64_t> keys_;
  std::vector<uint8_t> used_;
  int64_t count_ = 0;
};

class HkvTable final : public sok::Storage {
 public:
  HkvTable(const sok_storage_config& config, const HkvOptions& options);

  bool accepts_scores() const override;
  bool requires_scores() const override { return policy_ == Policy::kCustom; }

  int64_t size(const sok_exec_context& ctx) override;
  int64_t capacity() override;
  void find(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
            float* values, const float* default_row, uint8_t* found) override;
  void find_hits(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols, float* values,
                 uint8_t* found) override;
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
  void import_batch(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
                    const float* values, const uint64_t* scores, const sok_initializer* inits,
                    int32_t num_inits) override;
  // One probe per key (the slots of all keys first), then the visits in place; scores change as
  // insert_or_assign changes those of existing keys.
  int64_t update_rows(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
                      const uint64_t* scores, sok_row_visitor visit, void* user_data, uint8_t* found) override;
  void clear(const sok_exec_context& ctx) override;
  void set_global_epoch(uint64_t epoch) override;
  std::string describe() override;

 private:
  // kImport: assign, storing the caller's scores as they are (custom admission at capacity).
  enum class Write { kAssign, kAccumulate, kImport };
  // What one worker of a bulk update collects: evicted and refused rows (when `spill` is on),
  // the keys it created, and a scratch row.
  struct Lane {
    bool spill = false;
    std::vector<uint64_t> spilled_keys;
    std::vector<float> spilled_rows;
    std::vector<uint64_t> spilled_scores;
    CreatedSet created;
    std::vector<float> scratch;
    int64_t added = 0;  // keys this lane placed, folded into size_ when the bulk call ends
    int64_t lanes = 1;  // lanes writing at once: the load-factor check extrapolates `added`
  };
  static constexpr int64_t kNotFound = -1;
  static constexpr int64_t kMustGrow = -2;

  // find and find_hits: rows of present keys to values, `missing` for the others.
  void find_rows(int64_t n, const void* keys, sok::Columns cols, float* values, sok::MissingRow missing,
                 uint8_t* found) const;
  float* row(int64_t slot) { return values_.data() + slot * row_width(); }
  int64_t bucket_of(uint64_t hash) const { return static_cast<int64_t>(hash & (num_buckets_ - 1)); }
  static uint8_t digest_of(uint64_t hash) { return static_cast<uint8_t>(1 + (hash >> 56) % 255); }
  void prefetch_bucket(uint64_t key) const;
  bool holds(int64_t slot, uint64_t key) const {
    return slot != kNotFound && digests_[slot] != 0 && entries_[slot].key == key;
  }
  // Software pipeline over a list of keys: the bucket of the key 2R ahead is prefetched, a
  // candidate slot of the key R ahead is picked by digest and its key and row prefetched, then
  // fn(i, key, hint) runs for the current key i. The hint may be wrong (a digest collision, or fn changed the table): fn
  // confirms it with holds() and falls back to locate()/place().
  // index(j) gives the batch position of the j-th key to visit (j < count); fn returns false to
  // stop. Returns how many keys fn accepted.
  template <class Index, class Fn>
  int64_t pipelined(int64_t count, Index&& index, const void* keys, sok::Columns cols, Fn&& fn) const;

  // The slot of key in its bucket, or kNotFound. Needs at least a shared lock.
  int64_t locate(uint64_t key, uint64_t hash) const;
  // The first empty slot of the bucket starting at slot base.
  int64_t first_empty(int64_t base) const;
  // The first slot of key's bucket whose digest matches (kCheckKey: and whose key is key).
  template <bool kCheckKey>
  int64_t scan(uint64_t key, uint64_t hash) const;
  // Score of a key by the policy: old = its score if present (has_old), inc = caller score.
  uint64_t next_score(bool has_old, uint64_t old, uint64_t caller, uint64_t now) const;
  // The policy's admission rule for a newcomer with `score` against the bucket minimum.
  bool admits_all(Write mode) const {
    return mode != Write::kImport && (policy_ == Policy::kLru || policy_ == Policy::kLfu);
  }
  uint64_t tick();
  // Finds or places key, evicting as needed. Returns the slot, kNotFound when the policy refused
  // it, or kMustGrow when the table should grow first and may_grow is false (bulk workers never
  // grow the table; the caller grows it and goes on serially). *created is true for a new slot; an
  // evicted row goes to lane.
  int64_t place(uint64_t key, uint64_t score, bool may_grow, bool* created, Lane* lane,
                bool admit_all);
  // Runs op(i, key, hint, may_grow, lane) over the batch. With enough keys, worker w takes the keys
  // whose bucket % workers == w, in batch order, so every bucket (and every key) has one writer and
  // duplicates apply in batch order. op returns false to stop its worker (kMustGrow); the keys the
  // workers did not reach then run serially, in batch order, with growth allowed. Returns the
  // lanes for the caller to merge.
  template <class Op>
  std::vector<Lane> bulk_update(int64_t n, const void* keys, sok::Columns cols, bool spill, Op&& op);
  // Resizes to `capacity` slots (growth doubles), moving every live slot.
  void allocate(int64_t capacity);
  std::vector<Lane> write(int64_t n, const void* keys, sok::Columns cols, const float* values,
                          const uint64_t* scores, const sok_initializer* inits, int32_t num_inits,
                          Write mode, bool spill);
  void spill_row(Lane* lane, uint64_t key, const float* row, uint64_t score) const;

  mutable std::shared_mutex mutex_;
  Policy policy_;
  int64_t bucket_size_;
  int64_t num_buckets_ = 0;
  int64_t max_capacity_;
  double max_load_factor_;
  uint64_t epoch_ = 0;
  uint64_t last_tick_ = 0;
  int64_t size_ = 0;
  // A slot's key and score share a 16-byte entry: one cache line fill serves both.
  struct Entry {
    uint64_t key;
    uint64_t score;
  };
  std::vector<uint8_t> digests_;  // (capacity,)
  std::vector<Entry> entries_;    // (capacity,)
  std::vector<int32_t> fill_;     // (num_buckets,) live slots per bucket
  std::vector<float> values_;     // (capacity, row_width)
};

}  // namespace sok_hkv
