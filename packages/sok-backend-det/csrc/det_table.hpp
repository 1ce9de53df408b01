// det: a dynamic, growing embedding table (var_type "hbm"). CPU implementation.
//
// Index: open addressing with linear probing over 16-byte slots {key, row}; the row field marks
// empty and erased slots, so every 64-bit key value is a valid key (no sentinel keys).
// Rows: a chunked arena of fixed-width float rows that never moves, so growing the index only
// rehashes 16-byte slots. Each row carries a score: the time (ns since the Unix epoch) of the last
// call that wrote or inserted it, used by export_if and incremental dumps; and its key and a live
// flag, so export_batch walks the arena in row order (sequential reads) instead of the slots.
//
// The CUDA implementation (det_table_cuda.cu, in CUDA builds) keeps every row in device memory;
// create_storage() picks one by the config's device type.
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "sok/kit/keys.hpp"
#include "sok/kit/options.hpp"
#include "sok/kit/rows.hpp"
#include "sok/kit/storage.hpp"

namespace sok_det {

// The options of a det table, the same on the CPU and the GPU.
struct DetOptions {
  int64_t init_capacity;    // keys the table holds before it first grows
  int64_t max_capacity;     // most keys (0 = unlimited); more fail with SOK_ERROR_CAPACITY
  double max_load_factor;   // keys per slot before the table grows
  static DetOptions parse(sok::Options& options);
};

// A det storage on the config's device: DetTable on the CPU, the CUDA table in CUDA builds.
sok::Storage* create_storage(const sok_storage_config& config, sok::Options& options);
#ifdef SOK_WITH_CUDA
sok::Storage* create_cuda_storage(const sok_storage_config& config, const DetOptions& options);
#endif

class DetTable final : public sok::Storage {
 public:
  DetTable(const sok_storage_config& config, const DetOptions& options);

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
  // One probe per key (lookup_all), then the visits in place; scores become the time of the call,
  // as insert_or_assign sets them.
  int64_t update_rows(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
                      const uint64_t* scores, sok_row_visitor visit, void* user_data, uint8_t* found) override;
  void clear(const sok_exec_context& ctx) override;
  std::string describe() override;

 private:
  struct Slot {
    uint64_t key;
    int64_t row;  // >= 0: live; kEmpty / kErased otherwise
  };
  static constexpr int64_t kEmpty = -1;
  static constexpr int64_t kErased = -2;
  static constexpr int kChunkBits = 14;  // rows per arena chunk: 16384
  static constexpr int64_t kChunkRows = int64_t{1} << kChunkBits;

  enum class WriteMode { kAssign, kAccumulate };

  float* row_ptr(int64_t row) const {
    return chunks_[row >> kChunkBits].get() + (row & (kChunkRows - 1)) * row_width();
  }
  uint64_t& row_score(int64_t row) const {
    return score_chunks_[row >> kChunkBits][row & (kChunkRows - 1)];
  }
  uint64_t& row_key(int64_t row) const { return key_chunks_[row >> kChunkBits][row & (kChunkRows - 1)]; }
  // 1 for a row in use, 0 for one on the free list (rows >= next_row_ were never handed out).
  uint8_t& row_live(int64_t row) const { return live_chunks_[row >> kChunkBits][row & (kChunkRows - 1)]; }
  const Slot* home(uint64_t key) const { return &slots_[sok::hash_key(key) & mask_]; }

  // find and find_hits: rows of present keys to values, `missing` for the others.
  void find_rows(int64_t n, const void* keys, sok::Columns cols, float* values, sok::MissingRow missing,
                 uint8_t* found) const;
  // The row of key, or kEmpty. Needs at least a shared lock.
  int64_t lookup(uint64_t key) const;
  // Rows of keys[0, n) (kEmpty for misses), in parallel with prefetching.
  void lookup_all(int64_t n, const void* keys, int64_t* rows) const;
  // The row of key, inserting it with a fresh row if absent; *created tells which.
  int64_t insert(uint64_t key, bool* created);
  // Removes key if present (its row goes to the free list); returns whether it was there.
  bool remove(uint64_t key);
  // Inserts the misses of rows[] (kEmpty) serially, initialises new rows (unless skip_init), and
  // fills found[].
  void insert_missing(int64_t n, const void* keys, int64_t* rows, uint8_t* found,
                      const sok_initializer* inits, int32_t num_inits, bool skip_init,
                      std::vector<int64_t>* created_rows);
  // Runs fn(i, row) for every position i of rows (n,), the row's columns cols prefetched for
  // writing. Each worker owns the rows of every workers-th block of kOwnerRows rows and walks the
  // batch in order, so duplicates are handled in batch order (last write wins, sums in a fixed
  // order) without locks, and rows in arena order (a fresh table, a load) stream in blocks.
  template <class Fn>
  void for_each_row(int64_t n, const int64_t* rows, sok::Columns cols, Fn&& fn);
  // Writes values to rows; the score of row i is scores[i], or `score` when scores is null.
  void write_rows(int64_t n, const int64_t* rows, sok::Columns cols, const float* values,
                  WriteMode mode, uint64_t score, const uint64_t* scores);
  void upsert(int64_t n, const void* keys, sok::Columns cols, const float* values,
              const sok_initializer* inits, int32_t num_inits, WriteMode mode,
              const uint64_t* scores = nullptr);
  int64_t allocate_row();
  void add_chunk();
  void reserve(int64_t more_keys);
  void rehash(int64_t new_slots);
  void check_capacity(int64_t more_keys) const;

  mutable std::shared_mutex mutex_;
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  int64_t size_ = 0;
  int64_t erased_ = 0;  // erased slots still in probe chains
  std::vector<std::unique_ptr<float[]>> chunks_;
  std::vector<std::unique_ptr<uint64_t[]>> score_chunks_;
  std::vector<std::unique_ptr<uint64_t[]>> key_chunks_;
  std::vector<std::unique_ptr<uint8_t[]>> live_chunks_;
  int64_t next_row_ = 0;
  std::vector<int64_t> free_rows_;
  double max_load_factor_;
  int64_t max_capacity_;
};

}  // namespace sok_det
