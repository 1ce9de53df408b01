#include "hkv_table.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "sok/kit/error.hpp"
#include "sok/kit/initializers.hpp"
#include "sok/kit/parallel.hpp"
#include "sok/kit/prefetch.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sok_hkv {

namespace {

constexpr int64_t kParallelMin = 1 << 14;

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

Policy parse_policy(const std::string& name) {
  // HierarchicalKV / SOK spellings first, then the short ones.
  static const std::pair<const char*, Policy> names[] = {
      {"kLru", Policy::kLru},           {"kLfu", Policy::kLfu},
      {"kEpochLru", Policy::kEpochLru}, {"kEpochLfu", Policy::kEpochLfu},
      {"kCustomized", Policy::kCustom}, {"lru", Policy::kLru},
      {"lfu", Policy::kLfu},            {"epoch_lru", Policy::kEpochLru},
      {"epoch_lfu", Policy::kEpochLfu}, {"custom", Policy::kCustom},
      {"customized", Policy::kCustom}};
  for (const auto& p : names)
    if (name == p.first) return p.second;
  sok::invalid("evict_strategy=" + sok::Options::quote(name) +
               " is not a policy; valid: lru, lfu, epoch_lru, epoch_lfu, custom (or kLru, kLfu, "
               "kEpochLru, kEpochLfu, kCustomized)");
}

// The smallest power of two >= v, for error messages; the largest int64 one (2**62) when v is
// above it (doubling past it would overflow and never end).
std::string pow2_hint(int64_t v) {
  constexpr int64_t kLargest = int64_t{1} << 62;
  int64_t p = 1;
  while (p < v && p < kLargest) p <<= 1;
  return std::to_string(p);
}

}  // namespace

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::kLru: return "lru";
    case Policy::kLfu: return "lfu";
    case Policy::kEpochLru: return "epoch_lru";
    case Policy::kEpochLfu: return "epoch_lfu";
    default: return "custom";
  }
}

HkvOptions HkvOptions::parse(sok::Options& options) {
  HkvOptions o;
  o.init_capacity = options.integer("init_capacity", 8192);
  o.max_capacity = options.integer("max_capacity", int64_t{64} << 20);
  o.bucket_size = options.integer("max_bucket_size", 128);
  o.max_load_factor = options.real("max_load_factor", 0.5);
  o.max_hbm_gb = options.real("max_hbm_for_vectors", 16.0);
  o.policy = parse_policy(options.text("evict_strategy", "lru"));
  o.device_id = options.integer("device_id", -1);
  o.block_size = options.integer("block_size", 1024);
  const std::string io_by_cpu = options.text("io_by_cpu", "false");
  options.reject_unknown("hkv", {"init_capacity", "max_capacity", "max_bucket_size",
                                 "max_load_factor", "max_hbm_for_vectors", "evict_strategy",
                                 "device_id", "block_size", "io_by_cpu"});
  if (o.bucket_size < 16 || o.bucket_size > 128 || !is_pow2(o.bucket_size)) {
    sok::invalid("max_bucket_size=" + std::to_string(o.bucket_size) + " is not valid; valid: 16, 32, 64, 128");
  }
  if (!is_pow2(o.max_capacity) || o.max_capacity < o.bucket_size) {
    sok::invalid("max_capacity=" + std::to_string(o.max_capacity) +
                 " must be a power of two >= max_bucket_size (" + std::to_string(o.bucket_size) +
                 "); for example " + pow2_hint(std::max(o.max_capacity, o.bucket_size)));
  }
  if (!is_pow2(o.init_capacity) || o.init_capacity < o.bucket_size || o.init_capacity > o.max_capacity) {
    sok::invalid("init_capacity=" + std::to_string(o.init_capacity) +
                 " must be a power of two between max_bucket_size (" + std::to_string(o.bucket_size) +
                 ") and max_capacity (" + std::to_string(o.max_capacity) + "); for example " +
                 pow2_hint(std::min(o.max_capacity, std::max(o.init_capacity, o.bucket_size))));
  }
  if (!(o.max_load_factor > 0.0 && o.max_load_factor <= 1.0)) {
    sok::invalid("max_load_factor=" + std::to_string(o.max_load_factor) + " is out of range; valid: (0, 1]");
  }
  if (!(o.max_hbm_gb >= 0.0)) {
    sok::invalid("max_hbm_for_vectors=" + std::to_string(o.max_hbm_gb) + " must be >= 0 (GB)");
  }
  if (o.device_id < -1) sok::invalid("device_id=" + std::to_string(o.device_id) + " must be >= -1");
  if (o.block_size < 1) sok::invalid("block_size=" + std::to_string(o.block_size) + " must be >= 1");
  if (io_by_cpu != "true" && io_by_cpu != "false") {
    sok::invalid("io_by_cpu=" + sok::Options::quote(io_by_cpu) + " is not valid; valid: true, false");
  }
  o.io_by_cpu = io_by_cpu == "true";
  return o;
}

sok::Storage* create_storage(const sok_storage_config& config, sok::Options& options) {
  const HkvOptions parsed = HkvOptions::parse(options);
  if (config.device_type == SOK_DEVICE_CUDA) {
#ifdef SOK_WITH_CUDA
    return create_cuda_storage(config, parsed);
#else
    sok::fail(SOK_ERROR_UNSUPPORTED,
              "this build of sok-backend-hkv has no CUDA implementation (it was built without a CUDA "
              "toolkit); create the table on the CPU, or rebuild it where nvcc is on PATH");
#endif
  }
  return new HkvTable(config, parsed);
}

HkvTable::HkvTable(const sok_storage_config& config, const HkvOptions& options)
    : sok::Storage(config.key_type, config.row_width),
      policy_(options.policy),
      bucket_size_(options.bucket_size),
      max_capacity_(options.max_capacity),
      max_load_factor_(options.max_load_factor) {
  allocate(options.init_capacity);
}

bool HkvTable::accepts_scores() const {
  return policy_ == Policy::kLfu || policy_ == Policy::kEpochLfu || policy_ == Policy::kCustom;
}

void HkvTable::allocate(int64_t capacity) {
  // Everything is allocated before anything changes: an allocation failure leaves the table as is.
  const int64_t num_buckets = capacity / bucket_size_;
  std::vector<uint8_t> digests(capacity, 0);
  std::vector<Entry> entries(capacity, Entry{0, 0});
  std::vector<int32_t> fill(num_buckets, 0);
  std::vector<float> values(static_cast<size_t>(capacity) * row_width(), 0.0f);
  // Moving to twice the buckets splits each bucket in two, so every live slot finds room.
  for (int64_t s = 0; s < static_cast<int64_t>(digests_.size()); ++s) {
    if (digests_[s] == 0) continue;
    const uint64_t h = sok::hash_key(entries_[s].key);
    const int64_t b = static_cast<int64_t>(h & (num_buckets - 1));
    const int64_t j = b * bucket_size_ + fill[b]++;
    digests[j] = digests_[s];
    entries[j] = entries_[s];
    sok::copy_row(values.data() + j * row_width(), row(s), row_width());
  }
  digests_.swap(digests);
  entries_.swap(entries);
  fill_.swap(fill);
  values_.swap(values);
  num_buckets_ = num_buckets;
}

void HkvTable::prefetch_bucket(uint64_t key) const {
  int64_t b = bucket_of(sok::hash_key(key));
  sok::prefetch_range(&digests_[b * bucket_size_], static_cast<size_t>(bucket_size_));
}

template <bool kCheckKey>
int64_t HkvTable::scan(uint64_t key, uint64_t hash) const {
  const int64_t base = bucket_of(hash) * bucket_size_;
  const uint8_t d = digest_of(hash);
  const uint8_t* dg = &digests_[base];
#if defined(__SSE2__)
  const __m128i needle = _mm_set1_epi8(static_cast<char>(d));
  for (int64_t g = 0; g < bucket_size_; g += 16) {
    __m128i group = _mm_loadu_si128(reinterpret_cast<const __m128i*>(dg + g));
    unsigned mask = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(group, needle)));
    while (mask != 0) {
      int bit = __builtin_ctz(mask);
      if (!kCheckKey || entries_[base + g + bit].key == key) return base + g + bit;
      mask &= mask - 1;
    }
  }
#else
  for (int64_t j = 0; j < bucket_size_; ++j)
    if (dg[j] == d && (!kCheckKey || entries_[base + j].key == key)) return base + j;
#endif
  return kNotFound;
}

int64_t HkvTable::locate(uint64_t key, uint64_t hash) const { return scan<true>(key, hash); }

int64_t HkvTable::first_empty(int64_t base) const {
  const uint8_t* dg = &digests_[base];
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  for (int64_t g = 0; g < bucket_size_; g += 16) {
    __m128i group = _mm_loadu_si128(reinterpret_cast<const __m128i*>(dg + g));
    unsigned mask = static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(group, zero)));
    if (mask != 0) return base + g + __builtin_ctz(mask);
  }
#else
  for (int64_t j = 0; j < bucket_size_; ++j)
    if (dg[j] == 0) return base + j;
#endif
  return kNotFound;  // callers check fill_ first: never reached
}

template <class Index, class Fn>
int64_t HkvTable::pipelined(int64_t count, Index&& index, const void* keys, sok::Columns cols, Fn&& fn) const {
  constexpr int64_t kRing = sok::kPrefetchDistance / 2;
  const int32_t kt = key_type();
  int64_t ring[kRing];
  // The candidate is the first slot whose digest matches (digests only, no key read): its key
  // and row are prefetched, and fn's holds() check confirms it.
  auto stage = [&](int64_t j) {
    uint64_t key = sok::load_key(keys, kt, index(j));
    int64_t slot = scan<false>(key, sok::hash_key(key));
    if (slot == kNotFound) {  // a new key will most likely take the bucket's first empty slot
      const int64_t base = bucket_of(sok::hash_key(key)) * bucket_size_;
      slot = fill_[base / bucket_size_] < bucket_size_ ? first_empty(base) : kNotFound;
      if (slot != kNotFound) {
        sok::prefetch_write(&entries_[slot]);
        sok::prefetch_write(values_.data() + slot * row_width() + cols.begin);
      }
    } else {
      sok::prefetch(&entries_[slot]);
      sok::prefetch_range(values_.data() + slot * row_width() + cols.begin, sizeof(float) * cols.width());
    }
    ring[j % kRing] = slot;
  };
  for (int64_t j = 0; j < std::min(count, kRing); ++j) stage(j);
  for (int64_t j = 0; j < count; ++j) {
    if (j + 2 * kRing < count) prefetch_bucket(sok::load_key(keys, kt, index(j + 2 * kRing)));
    const int64_t i = index(j);
    if (!fn(i, sok::load_key(keys, kt, i), ring[j % kRing])) return j;
    if (j + kRing < count) stage(j + kRing);
  }
  return count;
}

template <class Op>
std::vector<HkvTable::Lane> HkvTable::bulk_update(int64_t n, const void* keys, sok::Columns cols,
                                                  bool spill, Op&& op) {
  const int workers = n >= kParallelMin ? sok::num_workers() : 1;
  std::vector<Lane> lanes(workers + 1);  // the last lane serves the serial remainder
  for (Lane& lane : lanes) {
    lane.spill = spill;
    lane.scratch.resize(row_width());
  }
  for (int w = 0; w < workers; ++w) lanes[w].lanes = workers;
  auto fold_sizes = [&] {
    for (Lane& lane : lanes) {
      size_ += lane.added;
      lane.added = 0;
    }
  };
  // Keys per worker, by bucket at the current capacity.
  std::vector<std::vector<int64_t>> mine(workers);
  const int32_t kt = key_type();
  if (workers == 1) {
    mine[0].resize(n);
    for (int64_t i = 0; i < n; ++i) mine[0][i] = i;
  } else {
    for (auto& m : mine) m.reserve(n / workers + n / 16);
    for (int64_t i = 0; i < n; ++i) mine[bucket_of(sok::hash_key(sok::load_key(keys, kt, i))) % workers].push_back(i);
  }
  std::vector<int64_t> reached(workers, 0);
  sok::parallel_for(workers, 2, [&](int, int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      const auto& list = mine[w];
      reached[w] = pipelined(static_cast<int64_t>(list.size()), [&](int64_t j) { return list[j]; }, keys, cols,
                             [&](int64_t i, uint64_t key, int64_t hint) { return op(i, key, hint, false, &lanes[w]); });
    }
  });
  fold_sizes();
  std::vector<int64_t> rest;
  for (int w = 0; w < workers; ++w) rest.insert(rest.end(), mine[w].begin() + reached[w], mine[w].end());
  if (!rest.empty()) {
    std::sort(rest.begin(), rest.end());
    for (int w = 0; w < workers; ++w) lanes[workers].created.absorb(lanes[w].created);
    pipelined(static_cast<int64_t>(rest.size()), [&](int64_t j) { return rest[j]; }, keys, cols,
              [&](int64_t i, uint64_t key, int64_t hint) { return op(i, key, hint, true, &lanes[workers]); });
    fold_sizes();
  }
  return lanes;
}

uint64_t HkvTable::tick() {
  last_tick_ = std::max(sok::now_ns(), last_tick_ + 1);
  return last_tick_;
}

uint64_t HkvTable::next_score(bool has_old, uint64_t old, uint64_t caller, uint64_t now) const {
  switch (policy_) {
    case Policy::kLru: return now;
    case Policy::kLfu: return has_old ? (old > UINT64_MAX - caller ? UINT64_MAX : old + caller) : caller;
    case Policy::kEpochLru: return (epoch_ << 32) | ((now >> 20) & 0xFFFFFFFFull);
    case Policy::kEpochLfu: {
      uint64_t low = has_old ? (old & 0xFFFFFFFFull) : 0;
      low = std::min<uint64_t>(0xFFFFFFFFull, low + std::min<uint64_t>(caller, 0xFFFFFFFFull));
      return (epoch_ << 32) | low;
    }
    default: return caller;
  }
}

void HkvTable::spill_row(Lane* lane, uint64_t key, const float* r, uint64_t score) const {
  if (lane == nullptr || !lane->spill) return;
  lane->spilled_keys.push_back(key);
  lane->spilled_rows.insert(lane->spilled_rows.end(), r, r + row_width());
  lane->spilled_scores.push_back(score);
}

int64_t HkvTable::place(uint64_t key, uint64_t score, bool may_grow, bool* created, Lane* lane,
                        bool admit_all) {
  const uint64_t h = sok::hash_key(key);
  while (true) {
    int64_t slot = locate(key, h);
    if (slot != kNotFound) {
      *created = false;
      return slot;
    }
    const int64_t capacity = static_cast<int64_t>(digests_.size());
    const int64_t b = bucket_of(h);
    const bool can_grow = capacity < max_capacity_;
    if (can_grow && (fill_[b] == bucket_size_ || static_cast<double>(size_ + lane->added * lane->lanes + 1) > max_load_factor_ * capacity)) {
      *created = false;
      if (!may_grow) return kMustGrow;
      allocate(capacity * 2);
      continue;
    }
    const int64_t base = b * bucket_size_;
    *created = true;
    if (fill_[b] < bucket_size_) {
      const int64_t j = first_empty(base);
      digests_[j] = digest_of(h);
      entries_[j].key = key;
      ++fill_[b];
      ++lane->added;
      return j;
    }
    // Full bucket at max_capacity: the lowest score goes, unless the policy refuses the newcomer.
    int64_t victim = base;
    for (int64_t j = base + 1; j < base + bucket_size_; ++j)
      if (entries_[j].score < entries_[victim].score) victim = j;
    if (!admit_all && score < entries_[victim].score) {
      *created = false;
      return kNotFound;
    }
    spill_row(lane, entries_[victim].key, row(victim), entries_[victim].score);
    digests_[victim] = digest_of(h);
    entries_[victim].key = key;
    return victim;
  }
}

int64_t HkvTable::size(const sok_exec_context&) {
  std::shared_lock lock(mutex_);
  return size_;
}

int64_t HkvTable::capacity() {
  std::shared_lock lock(mutex_);
  return static_cast<int64_t>(digests_.size());
}

void HkvTable::find(const sok_exec_context&, int64_t n, const void* keys, sok::Columns cols,
                    float* values, const float* default_row, uint8_t* found) {
  find_rows(n, keys, cols, values, sok::MissingRow{default_row, true}, found);
}

void HkvTable::find_hits(const sok_exec_context&, int64_t n, const void* keys, sok::Columns cols, float* values,
                         uint8_t* found) {
  find_rows(n, keys, cols, values, sok::MissingRow{nullptr, false}, found);
}

void HkvTable::find_rows(int64_t n, const void* keys, sok::Columns cols, float* values, sok::MissingRow missing,
                         uint8_t* found) const {
  std::shared_lock lock(mutex_);
  const int32_t w = cols.width();
  sok::parallel_for(n, kParallelMin, [&](int, int64_t b, int64_t e) {
    pipelined(e - b, [b](int64_t j) { return b + j; }, keys, cols, [&](int64_t i, uint64_t key, int64_t hint) {
      const int64_t slot = holds(hint, key) ? hint : locate(key, sok::hash_key(key));
      float* out = values + i * w;
      if (slot != kNotFound) {
        sok::copy_row(out, values_.data() + slot * row_width() + cols.begin, w);
      } else {
        missing.fill(out, w);
      }
      if (found != nullptr) found[i] = slot != kNotFound;
      return true;
    });
  });
}

void HkvTable::find_or_insert(const sok_exec_context&, int64_t n, const void* keys,
                              sok::Columns cols, float* values, uint8_t* found,
                              const uint64_t* scores, const sok_initializer* inits,
                              int32_t num_inits) {
  std::unique_lock lock(mutex_);
  const int32_t w = cols.width();
  const uint64_t now = tick();
  bulk_update(n, keys, cols, false, [&](int64_t i, uint64_t key, int64_t hint, bool may_grow, Lane* lane) {
    const uint64_t caller = scores ? scores[i] : 1;
    bool created = false;
    int64_t slot = holds(hint, key) ? hint : place(key, next_score(false, 0, caller, now), may_grow, &created, lane, admits_all(Write::kAssign));
    if (slot == kMustGrow) return false;
    const float* src;
    if (slot == kNotFound) {  // refused: the caller still gets the initial values
      sok::init_row(lane->scratch.data(), row_width(), key, inits, num_inits);
      src = lane->scratch.data();
    } else {
      if (created) {
        sok::init_row(row(slot), row_width(), key, inits, num_inits);
        lane->created.insert(key);
      }
      entries_[slot].score = next_score(!created, entries_[slot].score, caller, now);
      src = row(slot);
    }
    sok::copy_row(values + i * w, src + cols.begin, w);
    // A later duplicate of a key this call created hits it, but it did not exist before the call
    // (duplicates share a bucket, so they meet in the same lane, in batch order).
    if (found != nullptr) found[i] = slot != kNotFound && !created && !lane->created.contains(key);
    return true;
  });
}

std::vector<HkvTable::Lane> HkvTable::write(int64_t n, const void* keys, sok::Columns cols,
                                            const float* values, const uint64_t* scores,
                                            const sok_initializer* inits, int32_t num_inits,
                                            Write mode, bool spill) {
  const int32_t w = cols.width();
  const uint64_t now = tick();
  return bulk_update(n, keys, cols, spill, [&](int64_t i, uint64_t key, int64_t hint, bool may_grow, Lane* lane) {
    const uint64_t caller = scores ? scores[i] : 1;
    const uint64_t new_score = mode == Write::kImport ? scores[i] : next_score(false, 0, caller, now);
    const float* src = values + i * w;
    bool created = false;
    int64_t slot = holds(hint, key) ? hint : place(key, new_score, may_grow, &created, lane, admits_all(mode));
    if (slot == kMustGrow) return false;
    if (slot == kNotFound) {  // refused: report it as evicted, with the row it would have had
      sok::init_row(lane->scratch.data(), row_width(), key, inits, num_inits);
      sok::copy_row(lane->scratch.data() + cols.begin, src, w);
      spill_row(lane, key, lane->scratch.data(), new_score);
      return true;
    }
    float* dst = row(slot);
    // A new row gets its initial values, except where this write covers the whole row anyway.
    if (created && (cols.begin > 0 || cols.end < row_width())) sok::init_row(dst, row_width(), key, inits, num_inits);
    if (created || mode != Write::kAccumulate) {
      sok::copy_row(dst + cols.begin, src, w);
    } else {
      for (int32_t c = 0; c < w; ++c) dst[cols.begin + c] += src[c];
    }
    entries_[slot].score = created || mode == Write::kImport ? new_score : next_score(true, entries_[slot].score, caller, now);
    return true;
  });
}

void HkvTable::insert_or_assign(const sok_exec_context&, int64_t n, const void* keys,
                                sok::Columns cols, const float* values, const uint64_t* scores,
                                const sok_initializer* inits, int32_t num_inits) {
  std::unique_lock lock(mutex_);
  write(n, keys, cols, values, scores, inits, num_inits, Write::kAssign, false);
}

void HkvTable::accum_or_assign(const sok_exec_context&, int64_t n, const void* keys,
                               sok::Columns cols, const float* values, const uint64_t* scores,
                               const sok_initializer* inits, int32_t num_inits) {
  std::unique_lock lock(mutex_);
  write(n, keys, cols, values, scores, inits, num_inits, Write::kAccumulate, false);
}

int64_t HkvTable::insert_and_evict(const sok_exec_context&, int64_t n, const void* keys,
                                   sok::Columns cols, const float* values, const uint64_t* scores,
                                   const sok_initializer* inits, int32_t num_inits,
                                   void* evicted_keys, float* evicted_values,
                                   uint64_t* evicted_scores) {
  std::unique_lock lock(mutex_);
  auto lanes = write(n, keys, cols, values, scores, inits, num_inits, Write::kAssign, true);
  // At most one row leaves per input key, so n slots always suffice.
  int64_t count = 0;
  for (const Lane& lane : lanes) {
    for (size_t j = 0; j < lane.spilled_keys.size(); ++j, ++count) {
      sok::store_key(evicted_keys, key_type(), count, lane.spilled_keys[j]);
      if (evicted_values != nullptr) {
        sok::copy_row(evicted_values + count * row_width(), lane.spilled_rows.data() + j * row_width(), row_width());
      }
      if (evicted_scores != nullptr) evicted_scores[count] = lane.spilled_scores[j];
    }
  }
  return count;
}

void HkvTable::import_batch(const sok_exec_context&, int64_t n, const void* keys, sok::Columns cols,
                            const float* values, const uint64_t* scores, const sok_initializer* inits,
                            int32_t num_inits) {
  std::unique_lock lock(mutex_);
  write(n, keys, cols, values, scores, inits, num_inits, Write::kImport, false);
}

int64_t HkvTable::update_rows(const sok_exec_context&, int64_t n, const void* keys, sok::Columns cols,
                              const uint64_t* scores, sok_row_visitor visit, void* user_data, uint8_t* found) {
  std::unique_lock lock(mutex_);
  std::vector<int64_t> slots(n);
  sok::parallel_for(n, kParallelMin, [&](int, int64_t b, int64_t e) {
    pipelined(e - b, [b](int64_t j) { return b + j; }, keys, cols, [&](int64_t i, uint64_t key, int64_t hint) {
      slots[i] = holds(hint, key) ? hint : locate(key, sok::hash_key(key));
      return true;
    });
  });
  const int64_t missing = sok::mark_found(n, slots.data(), kNotFound, found);
  if (missing > 0) return missing;
  const uint64_t now = tick();
  const size_t bytes = sizeof(float) * cols.width();
  // Worker w visits the slots of the buckets b % workers == w, in batch order: duplicates (one
  // slot) are visited and rescored in order by one thread.
  sok::parallel_workers(n, kParallelMin, [&](int worker, int workers) {
    auto owner = [&](int64_t slot) { return (slot / bucket_size_) % workers; };
    for (int64_t i = 0; i < n; ++i) {
      const int64_t ahead = i + sok::kPrefetchDistance < n ? slots[i + sok::kPrefetchDistance] : kNotFound;
      if (ahead != kNotFound && owner(ahead) == worker) {
        sok::prefetch_write(&entries_[ahead]);
        sok::prefetch_write_range(row(ahead) + cols.begin, bytes);
      }
      const int64_t slot = slots[i];
      if (owner(slot) != worker) continue;
      visit(user_data, i, row(slot) + cols.begin);
      entries_[slot].score = next_score(true, entries_[slot].score, scores != nullptr ? scores[i] : 1, now);
    }
  });
  return 0;
}

int64_t HkvTable::erase(const sok_exec_context&, int64_t n, const void* keys) {
  std::unique_lock lock(mutex_);
  int64_t erased = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t key = sok::load_key(keys, key_type(), i);
    uint64_t h = sok::hash_key(key);
    int64_t slot = locate(key, h);
    if (slot == kNotFound) continue;
    digests_[slot] = 0;
    entries_[slot].score = 0;
    --fill_[bucket_of(h)];
    --size_;
    ++erased;
  }
  return erased;
}

int64_t HkvTable::export_batch(const sok_exec_context&, int64_t offset, int64_t limit,
                               sok::Columns cols, const uint64_t* threshold, void* keys,
                               float* values, uint64_t* scores) {
  std::shared_lock lock(mutex_);
  const int64_t end = std::min<int64_t>(static_cast<int64_t>(digests_.size()), offset + limit);
  const int32_t w = cols.width();
  int64_t count = 0;
  for (int64_t s = offset; s < end; ++s) {
    if (digests_[s] == 0) continue;
    if (threshold != nullptr && entries_[s].score < *threshold) continue;
    sok::store_key(keys, key_type(), count, entries_[s].key);
    if (values != nullptr) sok::copy_row(values + count * w, values_.data() + s * row_width() + cols.begin, w);
    if (scores != nullptr) scores[count] = entries_[s].score;
    ++count;
  }
  return count;
}

void HkvTable::clear(const sok_exec_context&) {
  std::unique_lock lock(mutex_);
  std::fill(digests_.begin(), digests_.end(), 0);
  std::fill(entries_.begin(), entries_.end(), Entry{0, 0});
  std::fill(fill_.begin(), fill_.end(), 0);
  size_ = 0;
}

void HkvTable::set_global_epoch(uint64_t epoch) {
  std::unique_lock lock(mutex_);
  if (policy_ != Policy::kEpochLru && policy_ != Policy::kEpochLfu) {
    sok::fail(SOK_ERROR_UNSUPPORTED, std::string("set_global_epoch needs evict_strategy epoch_lru or epoch_lfu; this table uses ") + policy_name(policy_));
  }
  if (epoch > 0xFFFFFFFFull) {
    sok::invalid("epoch=" + std::to_string(epoch) + " does not fit the 32 high bits of a score; valid: 0 .. 2**32-1");
  }
  epoch_ = epoch;
}

std::string HkvTable::describe() {
  std::shared_lock lock(mutex_);
  const auto capacity = static_cast<int64_t>(digests_.size());
  return "hkv (CPU): " + std::to_string(size_) + " keys, capacity " + std::to_string(capacity) + " of max " +
         std::to_string(max_capacity_) + " (" + std::to_string(num_buckets_) + " buckets x " +
         std::to_string(bucket_size_) + ", load " +
         sok::fmt(static_cast<double>(size_) / static_cast<double>(capacity)) + "), policy " +
         policy_name(policy_) + ", row width " + std::to_string(row_width()) + ", key " +
         sok::key_type_name(key_type()) + ", all rows in host memory";
}

}  // namespace sok_hkv
