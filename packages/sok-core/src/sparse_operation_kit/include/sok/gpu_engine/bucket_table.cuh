// The GPU storage shared by the CUDA builds of det ("hbm": every row on the device, grows, never
// evicts) and hkv ("hybrid": rows past a device-memory budget in pinned host memory, evicts at
// max_capacity). A backend includes this from one .cu file and configures it with BucketConfig;
// the kernels and the table layout are described in sok/gpu_engine/bucket_kernels.cuh.
//
// Host side. Every call is stream-ordered on the caller's CUDA stream: no host lock is held while
// the GPU works and the hot path never synchronises. Calls from several streams are chained with
// an event, so they take effect in the order they were made. Duplicate keys of a batch are
// resolved on the device first (the last occurrence acts for its duplicates; accumulations are
// summed), so the table kernels see distinct keys. Growth: the host keeps an upper bound of the
// key count (refreshed without waiting from a size snapshot copied after each call); only when
// a batch could push the load past max_load_factor does it wait for the exact count, count the
// batch's new keys, and rehash into twice the buckets in one kernel.
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "sok/gpu_engine/bucket_kernels.cuh"
#include "sok/gpu_engine/cuda_check.hpp"
#include "sok/gpu_engine/device_guard.hpp"
#include "sok/kit/error.hpp"
#include "sok/kit/keys.hpp"
#include "sok/kit/rows.hpp"
#include "sok/kit/storage.hpp"

namespace sok {
namespace gpu {

struct BucketConfig {
  const char* backend;      // "det" / "hkv", for messages
  int32_t bucket_size;      // slots per bucket: 16, 32, 64 or 128
  int64_t init_slots;       // a power of two >= bucket_size
  int64_t max_slots;        // the most slots growth reaches (a power of two), 0 = unlimited
  int64_t max_keys;         // more keys fail with SOK_ERROR_CAPACITY (det's max_capacity), 0 = unlimited
  double max_load_factor;   // grow before keys exceed this fraction of the slots
  Policy policy;
  bool evicts;              // at max_slots, a full bucket evicts its lowest score (hkv)
  double hbm_bytes;         // device memory for rows; the other rows live in pinned host memory
};

inline unsigned int blocks_for(int64_t items, int64_t per_block) {
  const int64_t b = (items + per_block - 1) / per_block;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(b, int64_t{1} << 20)));
}

// Stream-ordered scratch memory, freed on the stream when it goes out of scope.
class Scratch {
 public:
  Scratch(cudaStream_t stream, size_t bytes) : stream_(stream) {
    if (bytes > 0) SOK_CHECK_CUDA(cudaMallocAsync(&ptr_, bytes, stream));
  }
  ~Scratch() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as(size_t offset_bytes = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + offset_bytes);
  }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

// A zeroed device counter for one call; read() waits for the stream and returns its value.
class DeviceCounter {
 public:
  explicit DeviceCounter(cudaStream_t stream) : stream_(stream), memory_(stream, sizeof(unsigned long long)) {
    SOK_CHECK_CUDA(cudaMemsetAsync(get(), 0, sizeof(unsigned long long), stream));
  }
  unsigned long long* get() const { return memory_.as<unsigned long long>(); }
  int64_t read() const {
    unsigned long long value = 0;
    SOK_CHECK_CUDA(cudaMemcpyAsync(&value, get(), sizeof(value), cudaMemcpyDeviceToHost, stream_));
    SOK_CHECK_CUDA(cudaStreamSynchronize(stream_));
    return static_cast<int64_t>(value);
  }

 private:
  cudaStream_t stream_;
  Scratch memory_;
};

// Makes the table's device current for the scope (see sok/gpu_engine/device_guard.hpp).
class DeviceScope {
 public:
  explicit DeviceScope(int device) { SOK_CHECK_CUDA(guard_.enter(device)); }

 private:
  DeviceGuard guard_;
};

class BucketTable final : public sok::Storage {
 public:
  BucketTable(const sok_storage_config& config, const BucketConfig& c)
      : sok::Storage(config.key_type, config.row_width), cfg_(c), device_(config.device_id) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      sok::fail(SOK_ERROR_UNSUPPORTED, std::string(c.backend) + ": no CUDA device is visible to this process");
    }
    if (device_ >= count) {
      sok::invalid("device_id " + std::to_string(device_) + " does not exist; this process sees " +
                   std::to_string(count) + " CUDA device(s): 0 .. " + std::to_string(count - 1));
    }
    DeviceScope scope(device_);
    SOK_CHECK_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_));
    // Scratch memory of calls comes from the device's stream-ordered pool: keep it cached.
    cudaMemPool_t pool;
    SOK_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, device_));
    uint64_t threshold = ~uint64_t{0};
    SOK_CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    SOK_CHECK_CUDA(cudaEventCreateWithFlags(&last_done_, cudaEventDisableTiming));
    SOK_CHECK_CUDA(cudaEventCreateWithFlags(&size_ready_, cudaEventDisableTiming));
    SOK_CHECK_CUDA(cudaMalloc(&d_size_, sizeof(unsigned long long)));
    SOK_CHECK_CUDA(cudaMemset(d_size_, 0, sizeof(unsigned long long)));
    SOK_CHECK_CUDA(cudaMallocHost(&h_size_, sizeof(unsigned long long)));
    *h_size_ = 0;
    view_ = allocate(cfg_.init_slots);
    evicting_ = cfg_.evicts && cfg_.max_slots > 0 && capacity_slots() >= cfg_.max_slots;
  }

  ~BucketTable() override {
    DeviceScope scope(device_);
    cudaDeviceSynchronize();
    release(view_);
    cudaFree(d_size_);
    cudaFreeHost(h_size_);
    cudaEventDestroy(last_done_);
    cudaEventDestroy(size_ready_);
  }

  bool supports_device(int32_t device_type) const override { return device_type == SOK_DEVICE_CUDA; }
  bool accepts_scores() const override {
    return cfg_.policy == Policy::kLfu || cfg_.policy == Policy::kEpochLfu || cfg_.policy == Policy::kCustom;
  }
  bool requires_scores() const override { return cfg_.policy == Policy::kCustom; }

  int64_t capacity() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return capacity_slots();
  }

  int64_t size(const sok_exec_context& ctx) override {
    Call call(this, ctx);
    return exact_size(call.stream);
  }

  void find(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols, float* values,
            const float* default_row, uint8_t* found) override {
    find_rows(ctx, FindArgs{n, keys, key_type(), cols.begin, cols.end, values, default_row, found, true});
  }

  void find_hits(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols, float* values,
                 uint8_t* found) override {
    find_rows(ctx, FindArgs{n, keys, key_type(), cols.begin, cols.end, values, nullptr, found, false});
  }

  void find_or_insert(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols, float* values,
                      uint8_t* found, const uint64_t* scores, const sok_initializer* inits,
                      int32_t num_inits) override {
    Call call(this, ctx);
    if (n == 0) return;
    if (hits_before_dedup(n)) {
      find_or_insert_hits_first(call.stream, n, keys, cols, values, found, inits, num_inits);
      return;
    }
    Batch batch(this, call.stream, n, keys, scores);
    prepare_insert(call.stream, batch);
    UpsertArgs a = upsert_args(batch, cols, Mode::kFindOrInsert, inits, num_inits);
    a.out = values;
    a.found = found;
    run_upsert(call.stream, a);
    copy_from_leaders_kernel<<<blocks_for(n, kBlock), kBlock, 0, call.stream>>>(
        n, cols.width(), batch.leader, values, nullptr, found);
    SOK_CHECK_CUDA(cudaGetLastError());
    after_insert(call.stream, n);
  }

  // find_or_insert with the rows' addresses in place of their copies, then the caller's visit, all
  // under one Call (the lock, and the end event after the visit's work). Declined where a row's
  // address would not hold for the batch: a hybrid table moves device rows to host slots while it
  // places a batch, and an evicting table may hand a row placed early in the batch to a later key.
  void find_or_insert_rows(const sok_exec_context& ctx, int64_t n, const void* keys, uint8_t* found,
                           const uint64_t* scores, const sok_initializer* inits, int32_t num_inits,
                           sok_device_rows_visitor visit, void* user_data) override {
    Call call(this, ctx);
    if (n == 0) return;
    if (view_.hb < view_.B || evicting_) decline_rows("it is a hybrid table or has started to evict");
    const sok::Columns row{0, row_width()};
    Scratch rows(call.stream, sizeof(float*) * static_cast<size_t>(n));
    if (hits_before_dedup(n)) {
      UpsertArgs a = base_args(n, keys, row, Mode::kFindOrInsert, inits, num_inits);
      a.out_rows = rows.as<float*>();
      a.found = found;
      upsert_hits_first(call.stream, a);
    } else {
      Batch batch(this, call.stream, n, keys, scores);
      prepare_insert(call.stream, batch);
      if (evicting_) decline_rows("it has started to evict");  // nothing placed yet: unchanged
      UpsertArgs a = upsert_args(batch, row, Mode::kFindOrInsert, inits, num_inits);
      a.out_rows = rows.as<float*>();
      a.found = found;
      run_upsert(call.stream, a);
      copy_from_leaders_kernel<<<blocks_for(n, kBlock), kBlock, 0, call.stream>>>(n, 0, batch.leader, nullptr,
                                                                                 a.out_rows, found);
      SOK_CHECK_CUDA(cudaGetLastError());
      after_insert(call.stream, n);
    }
    const sok_exec_context on{SOK_DEVICE_CUDA, device_, call.stream};
    const int32_t code = visit(user_data, n, rows.as<float*>(), &on);
    if (code != 0) {
      sok::fail(SOK_ERROR_INTERNAL, "the caller's row visitor failed with code " + std::to_string(code) +
                                        "; the keys were inserted, the rows may be partly updated");
    }
  }

  void insert_or_assign(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
                        const float* values, const uint64_t* scores, const sok_initializer* inits,
                        int32_t num_inits) override {
    write(ctx, n, keys, cols, values, scores, inits, num_inits, Mode::kAssign, nullptr);
  }

  // With SOK_HINT_UNIQUE_KEYS, where the batch cannot make the table grow, the keys present are
  // written before any deduplication, and only the missing ones are deduplicated (assign_unique).
  void insert_or_assign_hinted(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
                               const float* values, const uint64_t* scores, const sok_initializer* inits,
                               int32_t num_inits, uint32_t hints) override {
    if ((hints & SOK_HINT_UNIQUE_KEYS) == 0) {
      insert_or_assign(ctx, n, keys, cols, values, scores, inits, num_inits);
      return;
    }
    Call call(this, ctx);
    if (n == 0) return;
    if (cannot_grow(n)) {
      assign_unique(call.stream, n, keys, cols, values, scores, inits, num_inits);
    } else {
      write_on(call.stream, n, keys, cols, values, scores, inits, num_inits, Mode::kAssign, nullptr);
    }
  }

  void accum_or_assign(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
                       const float* values, const uint64_t* scores, const sok_initializer* inits,
                       int32_t num_inits) override {
    write(ctx, n, keys, cols, values, scores, inits, num_inits, Mode::kAccumulate, nullptr);
  }

  void import_batch(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
                    const float* values, const uint64_t* scores, const sok_initializer* inits,
                    int32_t num_inits) override {
    write(ctx, n, keys, cols, values, scores, inits, num_inits, Mode::kImport, nullptr);
  }

  int64_t insert_and_evict(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols,
                           const float* values, const uint64_t* scores, const sok_initializer* inits,
                           int32_t num_inits, void* evicted_keys, float* evicted_values,
                           uint64_t* evicted_scores) override {
    Evicted ev{evicted_keys, evicted_values, evicted_scores, 0};
    write(ctx, n, keys, cols, values, scores, inits, num_inits, Mode::kAssign, &ev);
    return ev.count;
  }

  int64_t erase(const sok_exec_context& ctx, int64_t n, const void* keys) override {
    Call call(this, ctx);
    if (n == 0) return 0;
    DeviceCounter erased(call.stream);
    erase_kernel<<<group_blocks(n), kBlock, 0, call.stream>>>(view_, n, keys, key_type(), erased.get(), d_size_);
    SOK_CHECK_CUDA(cudaGetLastError());
    snapshot_size(call.stream);
    return erased.read();
  }

  // The live slots of [offset, offset + limit) in slot order, a chunk at a time: cub selects a
  // chunk's live slots (one pass over its state bytes), then a group of export_lanes(width) lanes
  // per selected slot copies its key, score and row.
  int64_t export_batch(const sok_exec_context& ctx, int64_t offset, int64_t limit, sok::Columns cols,
                       const uint64_t* threshold, void* keys, float* values, uint64_t* scores) override {
    Call call(this, ctx);
    const int64_t begin = std::min(offset, capacity_slots());
    const int64_t end = std::min(capacity_slots(), offset + limit);
    if (end <= begin) return 0;
    constexpr int64_t kChunk = int64_t{1} << 24;  // slots per pass: bounds the scratch memory
    const int64_t span = std::min(kChunk, end - begin);
    const int32_t chunks = static_cast<int32_t>((end - begin + span - 1) / span);
    LiveSlot live{view_, begin, threshold != nullptr, threshold ? *threshold : 0};  // .from: per chunk
    const thrust::counting_iterator<int32_t> offsets(0);
    size_t select_bytes = 0;
    SOK_CHECK_CUDA(cub::DeviceSelect::If(nullptr, select_bytes, offsets, static_cast<int32_t*>(nullptr),
                                     static_cast<int32_t*>(nullptr), span, live, call.stream));
    const size_t picked_bytes = align(sizeof(int32_t) * span);
    const size_t counts_bytes = align(sizeof(int32_t) * chunks);
    Scratch scratch(call.stream, picked_bytes + counts_bytes + select_bytes);
    int32_t* picked = scratch.as<int32_t>();
    int32_t* counts = scratch.as<int32_t>(picked_bytes);
    void* select_tmp = scratch.as<char>(picked_bytes + counts_bytes);
    for (int32_t c = 0; c < chunks; ++c) {
      const int64_t from = begin + c * span;
      const int64_t m = std::min(span, end - from);
      live.from = from;
      size_t bytes = select_bytes;
      SOK_CHECK_CUDA(cub::DeviceSelect::If(select_tmp, bytes, offsets, picked, counts + c, m, live, call.stream));
      export_gather(call.stream, from, m, picked, counts, c, cols, keys, values, scores);
      SOK_CHECK_CUDA(cudaGetLastError());
    }
    std::vector<int32_t> selected(chunks);
    SOK_CHECK_CUDA(cudaMemcpyAsync(selected.data(), counts, sizeof(int32_t) * chunks, cudaMemcpyDeviceToHost, call.stream));
    SOK_CHECK_CUDA(cudaStreamSynchronize(call.stream));
    int64_t count = 0;
    for (const int32_t n : selected) count += n;
    return count;
  }

  void clear(const sok_exec_context& ctx) override {
    Call call(this, ctx);
    const int64_t slots = capacity_slots();
    SOK_CHECK_CUDA(cudaMemsetAsync(view_.digests, 0, slots, call.stream));
    SOK_CHECK_CUDA(cudaMemsetAsync(view_.flags, 0, sizeof(uint32_t) * flag_words(view_.nb), call.stream));
    SOK_CHECK_CUDA(cudaMemsetAsync(view_.spills, 0, spill_bytes(view_.nb), call.stream));
    SOK_CHECK_CUDA(cudaMemsetAsync(d_size_, 0, sizeof(unsigned long long), call.stream));
    snapshot_size(call.stream);
    bound_ = 0;
  }

  void set_global_epoch(uint64_t epoch) override {
    if (cfg_.policy != Policy::kEpochLru && cfg_.policy != Policy::kEpochLfu) {
      sok::fail(SOK_ERROR_UNSUPPORTED, std::string("set_global_epoch needs evict_strategy epoch_lru or epoch_lfu; ") +
                                           "this " + cfg_.backend + " table's policy has no epoch");
    }
    if (epoch > 0xFFFFFFFFull) {
      sok::invalid("epoch=" + std::to_string(epoch) + " does not fit the 32 high bits of a score; valid: 0 .. 2**32-1");
    }
    std::lock_guard<std::mutex> lock(mutex_);
    epoch_ = epoch;
  }

  std::string describe() override {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceScope scope(device_);
    SOK_CHECK_CUDA(cudaEventSynchronize(last_done_));
    unsigned long long keys = 0;
    SOK_CHECK_CUDA(cudaMemcpy(&keys, d_size_, sizeof(keys), cudaMemcpyDeviceToHost));
    const int64_t slots = capacity_slots();
    std::string out = std::string(cfg_.backend) + " (CUDA:" + std::to_string(device_) + "): " + std::to_string(keys) +
                      " keys, capacity " + std::to_string(slots);
    if (cfg_.max_slots > 0) out += " of max " + std::to_string(cfg_.max_slots);
    out += " (" + std::to_string(view_.nb) + " buckets x " + std::to_string(view_.B) + ", load " +
           sok::fmt(static_cast<double>(keys) / static_cast<double>(slots)) + "), row width " +
           std::to_string(row_width()) + ", key " + sok::key_type_name(key_type()) + ", rows: " +
           std::to_string(view_.hb) + " of " + std::to_string(view_.B) + " slots per bucket in device memory" +
           (view_.hb < view_.B ? ", the rest in pinned host memory" : "");
    return out;
  }

 private:
  struct Evicted {
    void* keys;
    float* values;
    uint64_t* scores;
    int64_t count;
  };

  // One ABI call: the table's lock for the enqueueing, its device current, the caller's stream
  // ordered after the previous call (from any stream), and this call's end recorded for the next.
  struct Call {
    Call(BucketTable* t, const sok_exec_context& ctx) : table(t), lock(t->mutex_), scope(t->device_) {
      if (ctx.device_id != t->device_) {
        sok::invalid("the call's arrays are on cuda:" + std::to_string(ctx.device_id) + " but the table is on cuda:" +
                     std::to_string(t->device_));
      }
      stream = static_cast<cudaStream_t>(ctx.stream);
      if (t->has_last_ && t->last_stream_ != stream) {
        SOK_CHECK_CUDA(cudaStreamWaitEvent(stream, t->last_done_, 0));
      }
    }
    ~Call() {
      if (cudaEventRecord(table->last_done_, stream) == cudaSuccess) {
        table->has_last_ = true;
        table->last_stream_ = stream;
      } else {
        cudaGetLastError();
      }
    }
    BucketTable* table;
    std::lock_guard<std::mutex> lock;
    DeviceScope scope;
    cudaStream_t stream;
  };

  // A batch's keys with each duplicate's leader (its last occurrence) and, for LFU policies, the
  // summed score increments. With `only`, just the keys i with only[i] != 0 are deduplicated (the
  // others lead themselves).
  struct Batch {
    Batch(BucketTable* t, cudaStream_t stream, int64_t n_, const void* keys_, const uint64_t* scores_,
          const uint8_t* only = nullptr)
        : n(n_), keys(keys_), scores(scores_), memory(stream, bytes_for(n_, t->lfu_like())) {
      if (n >= (int64_t{1} << 31) - 1) {
        sok::invalid("a batch holds at most 2**31 - 2 keys, got " + std::to_string(n) + "; split it");
      }
      const int64_t slots = index_slots(n);
      auto* entries = memory.as<uint32_t>();
      auto* slot_of = reinterpret_cast<int32_t*>(entries + slots);
      leader = slot_of + n;
      SOK_CHECK_CUDA(cudaMemsetAsync(entries, 0xFF, sizeof(uint32_t) * slots, stream));
      dedup_insert_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(n, keys, t->key_type(), slots, entries,
                                                                        slot_of, only);
      dedup_leader_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(n, entries, slot_of, leader);
      SOK_CHECK_CUDA(cudaGetLastError());
      if (t->lfu_like()) {
        auto* sums = memory.as<unsigned long long>(index_bytes(n));
        SOK_CHECK_CUDA(cudaMemsetAsync(sums, 0, sizeof(unsigned long long) * n, stream));
        sum_increments_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(n, leader, scores, sums);
        SOK_CHECK_CUDA(cudaGetLastError());
        scores = reinterpret_cast<const uint64_t*>(sums);
      }
    }
    static int64_t index_slots(int64_t n) {
      int64_t s = 64;
      while (s < 2 * n) s <<= 1;
      return s;
    }
    // The index entries, slot_of and leader.
    static size_t index_bytes(int64_t n) {
      return align(sizeof(uint32_t) * index_slots(n) + sizeof(int32_t) * 2 * n);
    }
    static size_t bytes_for(int64_t n, bool lfu) { return index_bytes(n) + (lfu ? sizeof(unsigned long long) * n : 0); }
    int64_t n;
    const void* keys;
    const uint64_t* scores;
    Scratch memory;
    int32_t* leader = nullptr;
  };

  // The keys present (update_hits_kernel), reading home windows first where find does.
  void update_hits(cudaStream_t stream, const UpsertArgs& a, uint8_t* missing) {
    if (windowed_lookups()) {
      update_hits_kernel<true><<<group_blocks(a.n), kBlock, 0, stream>>>(view_, a, missing);
    } else {
      update_hits_kernel<false><<<group_blocks(a.n), kBlock, 0, stream>>>(view_, a, missing);
    }
  }

  // Home windows pay while buckets have room (find gets faster at loads of 0.5 and 0.75), but not
  // in full tables, where most windows have spilled and the window read is one round trip more
  // before the bucket's. So tables fuller than 7/8 (the host's bound of the key count) scan whole
  // buckets; either kernel finds every key.
  bool windowed_lookups() {
    if (view_.windows == 1) return false;
    refresh_bound();
    return bound_ * 8 <= capacity_slots() * 7;
  }

  void find_rows(const sok_exec_context& ctx, const FindArgs& a) {
    Call call(this, ctx);
    if (a.n == 0) return;
    if (windowed_lookups()) {
      find_kernel<true><<<group_blocks(a.n), kBlock, 0, call.stream>>>(view_, a);
    } else {
      find_kernel<false><<<group_blocks(a.n), kBlock, 0, call.stream>>>(view_, a);
    }
    SOK_CHECK_CUDA(cudaGetLastError());
  }

  void export_gather(cudaStream_t stream, int64_t from, int64_t m, const int32_t* picked, const int32_t* counts,
                     int32_t chunk, sok::Columns cols, void* keys, float* values, uint64_t* scores) const {
    const int lanes = export_lanes(cols.width());
    const auto launch = [&](auto kernel) {
      kernel<<<group_blocks(m, kBlock / lanes), kBlock, 0, stream>>>(view_, from, picked, counts, chunk, key_type(),
                                                                     cols.begin, cols.end, keys, values, scores);
    };
    switch (lanes) {
      case 1: launch(export_gather_kernel<1>); break;
      case 2: launch(export_gather_kernel<2>); break;
      case 4: launch(export_gather_kernel<4>); break;
      case 8: launch(export_gather_kernel<8>); break;
      case 16: launch(export_gather_kernel<16>); break;
      default: launch(export_gather_kernel<32>); break;
    }
  }

  static size_t align(size_t bytes) { return (bytes + 255) & ~size_t{255}; }
  // Blocks for a kernel with one group per item (per_block groups a block): enough to fill the
  // GPU, the rest by grid stride (a grid of many short blocks spends its time starting them).
  unsigned int group_blocks(int64_t items, int64_t per_block = kKeysPerBlock) const {
    return static_cast<unsigned int>(std::min<int64_t>(blocks_for(items, per_block), int64_t{8} * sm_count_));
  }
  bool lfu_like() const { return cfg_.policy == Policy::kLfu || cfg_.policy == Policy::kEpochLfu; }
  int64_t capacity_slots() const { return view_.nb << view_.log_b; }

  void write(const sok_exec_context& ctx, int64_t n, const void* keys, sok::Columns cols, const float* values,
             const uint64_t* scores, const sok_initializer* inits, int32_t num_inits, Mode mode, Evicted* ev) {
    Call call(this, ctx);
    if (n == 0) return;
    write_on(call.stream, n, keys, cols, values, scores, inits, num_inits, mode, ev);
  }

  // The write of n > 0 keys, deduplicated first, on the stream of a Call in progress.
  void write_on(cudaStream_t stream, int64_t n, const void* keys, sok::Columns cols, const float* values,
                const uint64_t* scores, const sok_initializer* inits, int32_t num_inits, Mode mode, Evicted* ev) {
    Batch batch(this, stream, n, keys, mode == Mode::kImport ? nullptr : scores);
    if (mode == Mode::kImport) batch.scores = scores;  // stored as given: never summed
    prepare_insert(stream, batch);
    UpsertArgs a = upsert_args(batch, cols, mode, inits, num_inits);
    a.values = values;
    Scratch segments(stream, mode == Mode::kAccumulate ? segment_bytes(n) : 0);
    if (mode == Mode::kAccumulate) order_duplicates(stream, batch, segments, &a);
    std::optional<DeviceCounter> evicted;
    if (ev != nullptr) {
      evicted.emplace(stream);
      a.ev_keys = ev->keys;
      a.ev_values = ev->values;
      a.ev_scores = ev->scores;
      a.ev_count = evicted->get();
    }
    run_upsert(stream, a);
    after_insert(stream, n);
    if (ev != nullptr) ev->count = evicted->read();
  }

  static size_t segment_bytes(int64_t n) {
    size_t sort_bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const int32_t*>(nullptr),
                                    static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                    static_cast<int32_t*>(nullptr), static_cast<int>(n));
    return 5 * align(sizeof(int32_t) * n) + sort_bytes;
  }

  // accumulate: the batch indices of every key's occurrences, in batch order, so that duplicates
  // are added one after another as on the CPU (a stable radix sort of (leader, index) pairs).
  void order_duplicates(cudaStream_t stream, const Batch& batch, const Scratch& memory, UpsertArgs* a) {
    const int64_t n = batch.n;
    const size_t part = align(sizeof(int32_t) * n);
    auto* index = memory.as<int32_t>();
    auto* sorted_leader = memory.as<int32_t>(part);
    auto* order = memory.as<int32_t>(2 * part);
    auto* first = memory.as<int32_t>(3 * part);
    auto* end = memory.as<int32_t>(4 * part);
    void* sort_tmp = memory.as<char>(5 * part);
    iota_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(n, index);
    size_t sort_bytes = segment_bytes(n) - 5 * part;
    int end_bit = 1;
    while (end_bit < 31 && (int64_t{1} << end_bit) < n) ++end_bit;
    SOK_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, batch.leader, sorted_leader, index, order,
                                               static_cast<int>(n), 0, end_bit, stream));
    duplicate_segments_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream>>>(n, sorted_leader, first, end);
    SOK_CHECK_CUDA(cudaGetLastError());
    a->order = order;
    a->first = first;
    a->end = end;
  }

  UpsertArgs upsert_args(const Batch& batch, sok::Columns cols, Mode mode, const sok_initializer* inits,
                         int32_t num_inits) {
    UpsertArgs a = base_args(batch.n, batch.keys, cols, mode, inits, num_inits);
    a.scores = batch.scores;
    a.leader = batch.leader;
    return a;
  }

  // The arguments of an upsert of n keys without scores or leaders (every key leads itself).
  UpsertArgs base_args(int64_t n, const void* keys, sok::Columns cols, Mode mode, const sok_initializer* inits,
                       int32_t num_inits) {
    if (num_inits > kMaxInits) {
      sok::invalid(std::to_string(num_inits) + " initializers in one call; the CUDA table takes at most " +
                   std::to_string(kMaxInits));
    }
    UpsertArgs a{};
    a.n = n;
    a.keys = keys;
    a.key_type = key_type();
    a.cb = cols.begin;
    a.ce = cols.end;
    a.mode = mode;
    a.policy = cfg_.policy;
    a.admit_all = mode != Mode::kImport && (cfg_.policy == Policy::kLru || cfg_.policy == Policy::kLfu);
    a.evicting = evicting_;
    a.now = tick();
    a.epoch = epoch_;
    a.inits.count = num_inits;
    for (int32_t i = 0; i < num_inits; ++i) a.inits.items[i] = inits[i];
    a.size = d_size_;
    return a;
  }

  // Updates the keys present, places the others, and in an evicting table evicts for the keys
  // whose home bucket was full (sok/gpu_engine/bucket_kernels.cuh).
  void run_upsert(cudaStream_t stream, const UpsertArgs& a) {
    Upsert upsert(stream, a.n, a.evicting);
    update_hits(stream, a, upsert.missing);
    place(stream, a, upsert);
  }

  // Scratch of one upsert of n keys: update_hits_kernel's missing flags and the placing kernel's
  // lists (PlaceLists; the list for pass B only in an evicting table), with their two counts zeroed.
  struct Upsert {
    Upsert(cudaStream_t stream, int64_t n, bool evicting)
        : memory(stream, align(n) + (evicting ? 2 : 1) * (align(sizeof(int32_t) * n) + align(sizeof(uint64_t) * n)) +
                             align(2 * sizeof(unsigned int))) {
      size_t at = 0;
      missing = memory.as<uint8_t>(at);
      at += align(n);
      lists.todo_count = memory.as<unsigned int>(at);
      lists.full_count = lists.todo_count + 1;
      at += align(2 * sizeof(unsigned int));
      lists.todo = memory.as<int32_t>(at);
      at += align(sizeof(int32_t) * n);
      lists.todo_keys = memory.as<uint64_t>(at);
      at += align(sizeof(uint64_t) * n);
      if (evicting) {
        lists.full = memory.as<int32_t>(at);
        at += align(sizeof(int32_t) * n);
        lists.full_keys = memory.as<uint64_t>(at);
      }
      SOK_CHECK_CUDA(cudaMemsetAsync(lists.todo_count, 0, 2 * sizeof(unsigned int), stream));
    }
    Scratch memory;
    uint8_t* missing = nullptr;
    PlaceLists lists{};
  };

  // find_or_insert may look every occurrence up before deduplicating when a repeated hit changes
  // nothing (LRU-like policies: every hit of a call gets the same score; hits write no row) and
  // the batch cannot make the table grow (growth needs the exact count of distinct new keys
  // first). Then only the missing keys are deduplicated, which shortens the deduplication and
  // with it find_or_insert.
  bool hits_before_dedup(int64_t n) {
    return (cfg_.policy == Policy::kLru || cfg_.policy == Policy::kEpochLru) && cannot_grow(n);
  }

  [[noreturn]] void decline_rows(const std::string& why) const {
    sok::fail(SOK_ERROR_UNSUPPORTED, std::string(cfg_.backend) + " table declines find_or_insert_rows: " + why +
                                         "; use find_or_insert and insert_or_assign");
  }

  // Whether a batch of n keys cannot make the table grow (it evicts instead, or n more keys fit by
  // the latest size snapshot): a hits-first upsert needs no count of distinct new keys then.
  bool cannot_grow(int64_t n) {
    refresh_bound();
    return evicting_ || fits_without_growth(n);
  }

  void find_or_insert_hits_first(cudaStream_t stream, int64_t n, const void* keys, sok::Columns cols, float* values,
                                 uint8_t* found, const sok_initializer* inits, int32_t num_inits) {
    UpsertArgs a = base_args(n, keys, cols, Mode::kFindOrInsert, inits, num_inits);
    a.out = values;
    a.found = found;
    upsert_hits_first(stream, a);
  }

  // insert_or_assign of keys the caller promises are distinct: every key is looked up and, where
  // present, written before any deduplication; deduplicating the missing ones is all a broken
  // promise needs to keep every key in one slot (a repeated present key keeps one of its
  // occurrences' rows).
  void assign_unique(cudaStream_t stream, int64_t n, const void* keys, sok::Columns cols, const float* values,
                     const uint64_t* scores, const sok_initializer* inits, int32_t num_inits) {
    UpsertArgs a = base_args(n, keys, cols, Mode::kAssign, inits, num_inits);
    a.values = values;
    a.scores = scores;
    upsert_hits_first(stream, a);
  }

  // The upsert `a` (without leaders) with the keys present looked up first (update_hits_kernel:
  // every occurrence), then only the missing keys deduplicated (Batch, which also sums their LFU
  // increments) and placed; find_or_insert's duplicates then copy their leader's row.
  void upsert_hits_first(cudaStream_t stream, UpsertArgs a) {
    Upsert upsert(stream, a.n, a.evicting);
    update_hits(stream, a, upsert.missing);
    Batch batch(this, stream, a.n, a.keys, a.scores, upsert.missing);
    a.leader = batch.leader;
    a.scores = batch.scores;
    place(stream, a, upsert);
    if (a.mode == Mode::kFindOrInsert) {
      copy_from_leaders_kernel<<<blocks_for(a.n, kBlock), kBlock, 0, stream>>>(a.n, a.ce - a.cb, batch.leader, a.out,
                                                                               a.out_rows,
                                                                               a.found);
      SOK_CHECK_CUDA(cudaGetLastError());
    }
    after_insert(stream, a.n);
  }

  // Lists the missing leaders (in bucket order in a hybrid table: BucketOrder), then places them
  // (pass A, and pass B in an evicting table) with the placing kernel compiled for this table and
  // these initializers.
  void place(cudaStream_t stream, const UpsertArgs& a, const Upsert& upsert) {
    const bool hybrid = view_.hb < view_.B;
    std::optional<BucketOrder> order;
    if (hybrid) order.emplace(stream, a.n, view_.nb);
    list_missing_kernel<<<blocks_for(a.n, kBlock), kBlock, 0, stream>>>(
        a.n, a.keys, a.key_type, a.leader, upsert.missing, upsert.lists.todo, upsert.lists.todo_keys,
        upsert.lists.todo_count, hybrid ? order->buckets : nullptr, view_.nb);
    if (hybrid) order->sort(stream, a, upsert.lists, sm_count_);
    const unsigned int blocks = group_blocks(a.n);
    const bool constant = std::all_of(a.inits.items, a.inits.items + a.inits.count,
                                      [](const sok_initializer& i) { return i.kind == SOK_INIT_CONSTANT; });
    const bool evict_only = a.evicting && nearly_full();
    if (hybrid && constant) {
      place_missing<true, true>(blocks, stream, a, upsert.lists, evict_only);
    } else if (hybrid) {
      place_missing<true, false>(blocks, stream, a, upsert.lists, evict_only);
    } else if (constant) {
      place_missing<false, true>(blocks, stream, a, upsert.lists, evict_only);
    } else {
      place_missing<false, false>(blocks, stream, a, upsert.lists, evict_only);
    }
    SOK_CHECK_CUDA(cudaGetLastError());
  }

  // Pass A, then in an evicting table pass B, of the placing kernel compiled for this table. With
  // `evict_only`, pass B alone places the whole todo list (it takes an empty slot where the key's
  // bucket has one): one kernel instead of two where nearly every bucket is full.
  template <bool kHybrid, bool kConstInits>
  void place_missing(unsigned int blocks, cudaStream_t stream, const UpsertArgs& a, const PlaceLists& lists,
                     bool evict_only) {
    if (evict_only) {
      PlaceLists todo = lists;  // pass B reads the list for pass B
      todo.full = lists.todo;
      todo.full_keys = lists.todo_keys;
      todo.full_count = lists.todo_count;
      place_missing_kernel<true, kHybrid, kConstInits><<<blocks, kBlock, 0, stream>>>(view_, a, todo);
      return;
    }
    place_missing_kernel<false, kHybrid, kConstInits><<<blocks, kBlock, 0, stream>>>(view_, a, lists);
    if (a.evicting) place_missing_kernel<true, kHybrid, kConstInits><<<blocks, kBlock, 0, stream>>>(view_, a, lists);
  }

  // Whether the table holds 15/16 of its slots or more by the latest size snapshot (an upper bound
  // while a snapshot is on its way): pass A of an evicting table would then find few empty slots.
  bool nearly_full() {
    refresh_bound();
    return bound_ * 16 >= capacity_slots() * 15;
  }

  // Scratch of a hybrid table's placing list in bucket order: each entry's home bucket
  // (list_missing_kernel), one radix sort of (bucket, batch index) pairs over the bucket bits, and
  // order_list_kernel, which rewrites the list in that order. Unused entries keep bucket ~0, which
  // sorts after every bucket (one bit past them).
  struct BucketOrder {
    BucketOrder(cudaStream_t stream, int64_t n_, int64_t nb) : n(n_) {
      end_bit = 1;
      while ((int64_t{1} << (end_bit - 1)) < nb) ++end_bit;
      SOK_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, static_cast<const uint32_t*>(nullptr),
                                                 static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                 static_cast<int32_t*>(nullptr), static_cast<int>(n), 0, end_bit, stream));
      const size_t words = align(sizeof(uint32_t) * n);
      memory.emplace(stream, 3 * words + sort_bytes);
      buckets = memory->as<uint32_t>(0);
      sorted_buckets = memory->as<uint32_t>(words);
      sorted_index = memory->as<int32_t>(2 * words);
      sort_tmp = memory->as<char>(3 * words);
      SOK_CHECK_CUDA(cudaMemsetAsync(buckets, 0xFF, sizeof(uint32_t) * n, stream));
    }
    void sort(cudaStream_t stream, const UpsertArgs& a, const PlaceLists& lists, int sm_count) {
      SOK_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, buckets, sorted_buckets, lists.todo,
                                                 sorted_index, static_cast<int>(n), 0, end_bit, stream));
      const unsigned int blocks =
          static_cast<unsigned int>(std::min<int64_t>(blocks_for(n, kBlock), int64_t{4} * sm_count));
      order_list_kernel<<<blocks, kBlock, 0, stream>>>(lists.todo_count, sorted_index, a.keys, a.key_type, lists.todo,
                                                       lists.todo_keys);
      SOK_CHECK_CUDA(cudaGetLastError());
    }
    int64_t n;
    int end_bit = 1;
    size_t sort_bytes = 0;
    std::optional<Scratch> memory;
    uint32_t* buckets = nullptr;
    uint32_t* sorted_buckets = nullptr;
    int32_t* sorted_index = nullptr;
    char* sort_tmp = nullptr;
  };

  // LRU clock: ns since the Unix epoch, strictly increasing per table (as on the CPU).
  uint64_t tick() {
    last_tick_ = std::max(sok::now_ns(), last_tick_ + 1);
    return last_tick_;
  }

  // Queues a copy of the key count for the host (read later without waiting when it is done).
  void snapshot_size(cudaStream_t stream) {
    SOK_CHECK_CUDA(cudaMemcpyAsync(h_size_, d_size_, sizeof(unsigned long long), cudaMemcpyDeviceToHost, stream));
    SOK_CHECK_CUDA(cudaEventRecord(size_ready_, stream));
    snapshot_pending_ = true;
  }

  void after_insert(cudaStream_t stream, int64_t n) {
    bound_ += n;
    snapshot_size(stream);
  }

  int64_t exact_size(cudaStream_t stream) {
    unsigned long long keys = 0;
    SOK_CHECK_CUDA(cudaMemcpyAsync(&keys, d_size_, sizeof(keys), cudaMemcpyDeviceToHost, stream));
    SOK_CHECK_CUDA(cudaStreamSynchronize(stream));
    bound_ = static_cast<int64_t>(keys);
    return bound_;
  }

  // The upper bound of the key count, from the latest size snapshot if it has arrived.
  void refresh_bound() {
    if (snapshot_pending_ && cudaEventQuery(size_ready_) == cudaSuccess) {
      bound_ = static_cast<int64_t>(*h_size_);
      snapshot_pending_ = false;
    }
    cudaGetLastError();  // cudaEventQuery's cudaErrorNotReady is not an error here
  }

  // Whether n more keys fit under max_capacity and max_load_factor even if all of them are new.
  bool fits_without_growth(int64_t n) const {
    const bool within_keys = cfg_.max_keys == 0 || bound_ + n <= cfg_.max_keys;
    return within_keys && static_cast<double>(bound_ + n) <= cfg_.max_load_factor * static_cast<double>(capacity_slots());
  }

  // Before inserting a batch: make sure the table can take every new key of it (growing it if the
  // load would pass max_load_factor), or fail with nothing changed.
  void prepare_insert(cudaStream_t stream, const Batch& batch) {
    refresh_bound();
    if (evicting_ || fits_without_growth(batch.n)) return;
    const int64_t slots = capacity_slots();
    const int64_t size = exact_size(stream);
    const int64_t fresh = count_missing(stream, batch);
    if (cfg_.max_keys > 0 && size + fresh > cfg_.max_keys) {
      sok::fail(SOK_ERROR_CAPACITY, std::string(cfg_.backend) + " table is full: " + std::to_string(size) + " keys + " +
                                        std::to_string(fresh) + " new keys exceed max_capacity=" +
                                        std::to_string(cfg_.max_keys) +
                                        "; raise max_capacity or use var_type 'hybrid' for eviction");
    }
    int64_t target = slots;
    while (static_cast<double>(size + fresh) > cfg_.max_load_factor * static_cast<double>(target) &&
           (cfg_.max_slots == 0 || target < cfg_.max_slots)) {
      target *= 2;
    }
    if (target > slots) rehash(stream, target);
    evicting_ = cfg_.evicts && cfg_.max_slots > 0 && capacity_slots() >= cfg_.max_slots;
    if (!evicting_ && size + fresh > capacity_slots()) {
      sok::fail(SOK_ERROR_CAPACITY, std::string(cfg_.backend) + " table is full: " + std::to_string(size) + " keys + " +
                                        std::to_string(fresh) + " new keys exceed its " +
                                        std::to_string(capacity_slots()) + " slots");
    }
  }

  int64_t count_missing(cudaStream_t stream, const Batch& batch) {
    DeviceCounter missing(stream);
    count_missing_kernel<<<group_blocks(batch.n), kBlock, 0, stream>>>(view_, batch.n, batch.keys, key_type(),
                                                                        batch.leader, missing.get());
    SOK_CHECK_CUDA(cudaGetLastError());
    return missing.read();
  }

  // Device slots per bucket for nb buckets under the device-memory budget.
  int32_t device_slots(int64_t nb) const {
    const double row_bytes = static_cast<double>(row_width()) * sizeof(float);
    const double per_bucket = std::floor(cfg_.hbm_bytes / (static_cast<double>(nb) * row_bytes));
    return static_cast<int32_t>(std::max(0.0, std::min<double>(cfg_.bucket_size, per_bucket)));
  }

  View allocate(int64_t slots) {
    View v{};
    v.B = cfg_.bucket_size;
    v.log_b = 0;
    while ((1 << v.log_b) < v.B) ++v.log_b;
    v.nb = slots / v.B;
    v.hb = device_slots(v.nb);
    v.W = row_width();
    v.windows = v.hb == v.B ? std::max(1, v.B / kWindow) : 1;  // hybrid buckets fill device slots first
    try {
      SOK_CHECK_CUDA(cudaMalloc(&v.digests, slots));
      SOK_CHECK_CUDA(cudaMalloc(&v.keys, sizeof(uint64_t) * slots));
      SOK_CHECK_CUDA(cudaMalloc(&v.scores, sizeof(uint64_t) * slots));
      SOK_CHECK_CUDA(cudaMalloc(&v.flags, sizeof(uint32_t) * flag_words(v.nb)));
      SOK_CHECK_CUDA(cudaMalloc(&v.spills, spill_bytes(v.nb)));
      const int64_t dev_rows = v.nb * v.hb;
      const int64_t host_rows = v.nb * (v.B - v.hb);
      if (dev_rows > 0) SOK_CHECK_CUDA(cudaMalloc(&v.vdev, sizeof(float) * dev_rows * v.W));
      if (host_rows > 0) {
        void* host = nullptr;
        SOK_CHECK_CUDA(cudaHostAlloc(&host, sizeof(float) * host_rows * v.W, cudaHostAllocMapped | cudaHostAllocPortable));
        void* mapped = nullptr;
        SOK_CHECK_CUDA(cudaHostGetDevicePointer(&mapped, host, 0));
        v.vhost = static_cast<float*>(mapped);
      }
      SOK_CHECK_CUDA(cudaMemset(v.digests, 0, slots));
      SOK_CHECK_CUDA(cudaMemset(v.keys, 0, sizeof(uint64_t) * slots));
      SOK_CHECK_CUDA(cudaMemset(v.scores, 0, sizeof(uint64_t) * slots));
      SOK_CHECK_CUDA(cudaMemset(v.flags, 0, sizeof(uint32_t) * flag_words(v.nb)));
      SOK_CHECK_CUDA(cudaMemset(v.spills, 0, spill_bytes(v.nb)));
      // The memsets ran on the legacy stream; callers may use non-blocking streams.
      SOK_CHECK_CUDA(cudaDeviceSynchronize());
    } catch (...) {
      release(v);
      throw;
    }
    return v;
  }

  static void release(View& v) {
    cudaFree(v.digests);
    cudaFree(v.keys);
    cudaFree(v.scores);
    cudaFree(v.flags);
    cudaFree(v.spills);
    cudaFree(v.vdev);
    if (v.vhost != nullptr) {
      void* host = nullptr;
      // The mapped address is the host address under unified addressing (every 64-bit platform).
      cudaPointerAttributes attrs{};
      if (cudaPointerGetAttributes(&attrs, v.vhost) == cudaSuccess && attrs.hostPointer != nullptr) host = attrs.hostPointer;
      cudaFreeHost(host != nullptr ? host : v.vhost);
    }
    v = View{};
  }

  void rehash(cudaStream_t stream, int64_t slots) {
    View next = allocate(slots);  // may throw: the table is unchanged then
    const int64_t old_slots = capacity_slots();
    rehash_kernel<<<blocks_for(old_slots, kKeysPerBlock), kBlock, 0, stream>>>(view_, next);
    SOK_CHECK_CUDA(cudaGetLastError());
    SOK_CHECK_CUDA(cudaStreamSynchronize(stream));
    release(view_);
    view_ = next;
  }

  BucketConfig cfg_;
  int device_;
  int sm_count_ = 132;
  std::mutex mutex_;
  View view_{};
  bool evicting_ = false;
  uint64_t epoch_ = 0;
  uint64_t last_tick_ = 0;
  unsigned long long* d_size_ = nullptr;  // live keys, on the device
  unsigned long long* h_size_ = nullptr;  // its latest snapshot (pinned)
  cudaEvent_t size_ready_ = nullptr;
  bool snapshot_pending_ = false;
  int64_t bound_ = 0;                     // an upper bound of the key count
  cudaEvent_t last_done_ = nullptr;
  cudaStream_t last_stream_ = nullptr;
  bool has_last_ = false;
};

}  // namespace gpu
}  // namespace sok
