#include "det_table.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "sok/kit/error.hpp"
#include "sok/kit/initializers.hpp"
#include "sok/kit/parallel.hpp"
#include "sok/kit/prefetch.hpp"

namespace sok_det {

namespace {

constexpr int64_t kMinSlots = 64;
constexpr int64_t kParallelMin = 1 << 14;  // keys per call before bulk loops use threads
constexpr int64_t kOwnerRows = 64;         // for_each_row: rows per block a worker owns

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

DetOptions DetOptions::parse(sok::Options& options) {
  DetOptions o;
  o.init_capacity = options.integer("init_capacity", 1024);
  o.max_capacity = options.integer("max_capacity", 0);
  o.max_load_factor = options.real("max_load_factor", 0.5);
  options.reject_unknown("det", {"init_capacity", "max_capacity", "max_load_factor"});
  if (o.init_capacity < 1 || o.init_capacity > (int64_t{1} << 40)) {
    sok::invalid("init_capacity=" + std::to_string(o.init_capacity) + " is out of range; valid: 1 .. 2**40 keys");
  }
  if (o.max_capacity < 0) {
    sok::invalid("max_capacity=" + std::to_string(o.max_capacity) + " must be >= 0 (0 = unlimited)");
  }
  if (!(o.max_load_factor >= 0.1 && o.max_load_factor <= 0.9)) {
    sok::invalid("max_load_factor=" + std::to_string(o.max_load_factor) + " is out of range; valid: 0.1 .. 0.9");
  }
  return o;
}

sok::Storage* create_storage(const sok_storage_config& config, sok::Options& options) {
  const DetOptions parsed = DetOptions::parse(options);
  if (config.device_type == SOK_DEVICE_CUDA) {
#ifdef SOK_WITH_CUDA
    return create_cuda_storage(config, parsed);
#else
    sok::fail(SOK_ERROR_UNSUPPORTED,
              "this build of sok-backend-det has no CUDA implementation (it was built without a CUDA "
              "toolkit); create the table on the CPU, or rebuild it where nvcc is on PATH");
#endif
  }
  return new DetTable(config, parsed);
}

DetTable::DetTable(const sok_storage_config& config, const DetOptions& options)
    : sok::Storage(config.key_type, config.row_width),
      max_load_factor_(options.max_load_factor),
      max_capacity_(options.max_capacity) {
  const int64_t init_capacity = options.init_capacity;
  int64_t slots = next_pow2(std::max<int64_t>(kMinSlots, static_cast<int64_t>(init_capacity / max_load_factor_) + 1));
  slots_.assign(slots, Slot{0, kEmpty});
  mask_ = static_cast<uint64_t>(slots - 1);
  // Rows for init_capacity keys are allocated and touched now (in parallel), so filling the table
  // up to its initial capacity does not pay page faults.
  const int64_t chunks = (init_capacity + kChunkRows - 1) / kChunkRows;
  for (int64_t c = 0; c < chunks; ++c) add_chunk();
  sok::parallel_for(chunks, 2, [&](int, int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      std::memset(chunks_[c].get(), 0, sizeof(float) * kChunkRows * row_width());
      std::memset(score_chunks_[c].get(), 0, sizeof(uint64_t) * kChunkRows);
      std::memset(key_chunks_[c].get(), 0, sizeof(uint64_t) * kChunkRows);
      std::memset(live_chunks_[c].get(), 0, kChunkRows);
    }
  });
}

void DetTable::add_chunk() {
  std::unique_ptr<float[]> chunk(new float[kChunkRows * row_width()]);
  std::unique_ptr<uint64_t[]> scores(new uint64_t[kChunkRows]);
  std::unique_ptr<uint64_t[]> keys(new uint64_t[kChunkRows]);
  std::unique_ptr<uint8_t[]> live(new uint8_t[kChunkRows]);
  chunks_.push_back(std::move(chunk));
  score_chunks_.push_back(std::move(scores));
  key_chunks_.push_back(std::move(keys));
  live_chunks_.push_back(std::move(live));
}

int64_t DetTable::size(const sok_exec_context&) {
  std::shared_lock lock(mutex_);
  return size_;
}

int64_t DetTable::capacity() {
  std::shared_lock lock(mutex_);
  return static_cast<int64_t>(slots_.size());
}

int64_t DetTable::lookup(uint64_t key) const {
  uint64_t i = sok::hash_key(key) & mask_;
  while (true) {
    const Slot& s = slots_[i];
    if (s.row == kEmpty) return kEmpty;
    if (s.row >= 0 && s.key == key) return s.row;
    i = (i + 1) & mask_;
  }
}

void DetTable::lookup_all(int64_t n, const void* keys, int64_t* rows) const {
  const int32_t kt = key_type();
  sok::parallel_for(n, kParallelMin, [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i + sok::kPrefetchDistance < e) sok::prefetch(home(sok::load_key(keys, kt, i + sok::kPrefetchDistance)));
      rows[i] = lookup(sok::load_key(keys, kt, i));
    }
  });
}

void DetTable::check_capacity(int64_t more_keys) const {
  if (max_capacity_ > 0 && size_ + more_keys > max_capacity_) {
    sok::fail(SOK_ERROR_CAPACITY, "det table is full: " + std::to_string(size_) + " keys + " +
                                      std::to_string(more_keys) + " new keys exceed max_capacity=" +
                                      std::to_string(max_capacity_) +
                                      "; raise max_capacity or use var_type 'hybrid' for eviction");
  }
}

void DetTable::reserve(int64_t more_keys) {
  int64_t slots = static_cast<int64_t>(slots_.size());
  if (static_cast<double>(size_ + erased_ + more_keys) <= max_load_factor_ * slots) return;
  int64_t needed = next_pow2(static_cast<int64_t>((size_ + more_keys) / max_load_factor_) + 1);
  rehash(std::max(needed, slots));
}

void DetTable::rehash(int64_t new_slots) {
  std::vector<Slot> fresh(new_slots, Slot{0, kEmpty});
  uint64_t mask = static_cast<uint64_t>(new_slots - 1);
  for (const Slot& s : slots_) {
    if (s.row < 0) continue;
    uint64_t i = sok::hash_key(s.key) & mask;
    while (fresh[i].row != kEmpty) i = (i + 1) & mask;
    fresh[i] = s;
  }
  slots_.swap(fresh);
  mask_ = mask;
  erased_ = 0;
}

int64_t DetTable::allocate_row() {
  if (!free_rows_.empty()) {
    int64_t row = free_rows_.back();
    free_rows_.pop_back();
    return row;
  }
  if ((next_row_ >> kChunkBits) >= static_cast<int64_t>(chunks_.size())) add_chunk();
  return next_row_++;
}

int64_t DetTable::insert(uint64_t key, bool* created) {
  uint64_t i = sok::hash_key(key) & mask_;
  int64_t reuse = -1;
  while (true) {
    Slot& s = slots_[i];
    if (s.row == kEmpty) break;
    if (s.row == kErased) {
      if (reuse < 0) reuse = static_cast<int64_t>(i);
    } else if (s.key == key) {
      *created = false;
      return s.row;
    }
    i = (i + 1) & mask_;
  }
  int64_t row = allocate_row();
  if (reuse >= 0) {
    i = static_cast<uint64_t>(reuse);
    --erased_;
  }
  slots_[i] = Slot{key, row};
  row_key(row) = key;
  row_live(row) = 1;
  ++size_;
  *created = true;
  return row;
}

void DetTable::insert_missing(int64_t n, const void* keys, int64_t* rows, uint8_t* found,
                              const sok_initializer* inits, int32_t num_inits, bool skip_init,
                              std::vector<int64_t>* created_rows) {
  const int64_t misses = sok::mark_found(n, rows, kEmpty, found);
  if (misses == 0) return;
  // `misses` bounds the new keys from above (duplicates count several times); the exact count
  // needs a sort, so it is only computed when the bound would break max_capacity.
  int64_t fresh = misses;
  if (max_capacity_ > 0 && size_ + misses > max_capacity_) {
    std::vector<uint64_t> unique_misses;
    unique_misses.reserve(misses);
    for (int64_t i = 0; i < n; ++i)
      if (rows[i] == kEmpty) unique_misses.push_back(sok::load_key(keys, key_type(), i));
    std::sort(unique_misses.begin(), unique_misses.end());
    fresh = std::unique(unique_misses.begin(), unique_misses.end()) - unique_misses.begin();
    check_capacity(fresh);
  }
  reserve(fresh);  // slots for every new key: no rehash while inserting
  created_rows->reserve(fresh);
  const int32_t kt = key_type();
  try {
    for (int64_t i = 0; i < n; ++i) {
      if (i + sok::kPrefetchDistance < n && rows[i + sok::kPrefetchDistance] == kEmpty) {
        sok::prefetch(home(sok::load_key(keys, kt, i + sok::kPrefetchDistance)));
      }
      if (rows[i] != kEmpty) continue;
      bool created = false;
      rows[i] = insert(sok::load_key(keys, kt, i), &created);
      if (created) created_rows->push_back(i);
    }
  } catch (...) {
    // A row chunk could not be allocated: take the keys of this call out again (all or nothing).
    for (int64_t i : *created_rows) remove(sok::load_key(keys, kt, i));
    throw;
  }
  // Initialise the new rows (by the key of their first occurrence) in parallel.
  if (skip_init) return;
  const int32_t w = row_width();
  sok::parallel_for(static_cast<int64_t>(created_rows->size()), 4096, [&](int, int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      int64_t i = (*created_rows)[j];
      sok::init_row(row_ptr(rows[i]), w, sok::load_key(keys, key_type(), i), inits, num_inits);
    }
  });
}

void DetTable::find(const sok_exec_context&, int64_t n, const void* keys, sok::Columns cols,
                    float* values, const float* default_row, uint8_t* found) {
  find_rows(n, keys, cols, values, sok::MissingRow{default_row, true}, found);
}

void DetTable::find_hits(const sok_exec_context&, int64_t n, const void* keys, sok::Columns cols, float* values,
                         uint8_t* found) {
  find_rows(n, keys, cols, values, sok::MissingRow{nullptr, false}, found);
}

void DetTable::find_rows(int64_t n, const void* keys, sok::Columns cols, float* values, sok::MissingRow missing,
                         uint8_t* found) const {
  std::shared_lock lock(mutex_);
  const int32_t kt = key_type();
  const int32_t w = cols.width();
  const size_t bytes = sizeof(float) * w;
  sok::parallel_for(n, kParallelMin, [&](int, int64_t b, int64_t e) {
    // Two-stage pipeline: slots are prefetched kPrefetchDistance keys ahead, rows half as far.
    constexpr int kRing = sok::kPrefetchDistance / 2;
    int64_t ring[kRing];
    auto stage = [&](int64_t i) {
      int64_t row = lookup(sok::load_key(keys, kt, i));
      if (row >= 0) sok::prefetch_range(row_ptr(row) + cols.begin, bytes);
      ring[i % kRing] = row;
    };
    for (int64_t i = b; i < std::min(e, b + kRing); ++i) stage(i);
    for (int64_t i = b; i < e; ++i) {
      if (i + sok::kPrefetchDistance < e) sok::prefetch(home(sok::load_key(keys, kt, i + sok::kPrefetchDistance)));
      int64_t row = ring[i % kRing];
      if (i + kRing < e) stage(i + kRing);
      float* out = values + i * w;
      if (row >= 0) {
        sok::copy_row(out, row_ptr(row) + cols.begin, w);
      } else {
        missing.fill(out, w);
      }
      if (found != nullptr) found[i] = row >= 0;
    }
  });
}

void DetTable::find_or_insert(const sok_exec_context&, int64_t n, const void* keys,
                              sok::Columns cols, float* values, uint8_t* found, const uint64_t*,
                              const sok_initializer* inits, int32_t num_inits) {
  std::unique_lock lock(mutex_);
  std::vector<int64_t> rows(n);
  lookup_all(n, keys, rows.data());
  std::vector<int64_t> created;
  insert_missing(n, keys, rows.data(), found, inits, num_inits, false, &created);
  const uint64_t now = sok::now_ns();
  const int32_t w = cols.width();
  sok::parallel_for(n, kParallelMin, [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i + sok::kPrefetchDistance < e) {
        sok::prefetch_range(row_ptr(rows[i + sok::kPrefetchDistance]) + cols.begin, sizeof(float) * w);
      }
      sok::copy_row(values + i * w, row_ptr(rows[i]) + cols.begin, w);
    }
  });
  // Scores: every row gets the same time, so concurrent stores of duplicates agree; still, give
  // each row one owner to keep the writes race-free.
  sok::parallel_workers(n, kParallelMin, [&](int worker, int workers) {
    for (int64_t i = 0; i < n; ++i)
      if (rows[i] % workers == worker) row_score(rows[i]) = now;
  });
}

template <class Fn>
void DetTable::for_each_row(int64_t n, const int64_t* rows, sok::Columns cols, Fn&& fn) {
  const size_t bytes = sizeof(float) * cols.width();
  sok::parallel_workers(n, kParallelMin, [&](int worker, int workers) {
    auto owner = [workers](int64_t row) { return (row / kOwnerRows) % workers; };
    for (int64_t i = 0; i < n; ++i) {
      if (i + sok::kPrefetchDistance < n && owner(rows[i + sok::kPrefetchDistance]) == worker) {
        sok::prefetch_write_range(row_ptr(rows[i + sok::kPrefetchDistance]) + cols.begin, bytes);
      }
      if (owner(rows[i]) == worker) fn(i, rows[i]);
    }
  });
}

void DetTable::write_rows(int64_t n, const int64_t* rows, sok::Columns cols, const float* values,
                          WriteMode mode, uint64_t score, const uint64_t* scores) {
  const int32_t w = cols.width();
  for_each_row(n, rows, cols, [&](int64_t i, int64_t row) {
    float* dst = row_ptr(row) + cols.begin;
    const float* src = values + i * w;
    if (mode == WriteMode::kAssign) {
      sok::copy_row(dst, src, w);
    } else {
      for (int32_t c = 0; c < w; ++c) dst[c] += src[c];
    }
    row_score(row) = scores != nullptr ? scores[i] : score;
  });
}

void DetTable::upsert(int64_t n, const void* keys, sok::Columns cols, const float* values,
                      const sok_initializer* inits, int32_t num_inits, WriteMode mode,
                      const uint64_t* scores) {
  std::unique_lock lock(mutex_);
  std::vector<int64_t> rows(n, kEmpty);
  if (size_ > 0) lookup_all(n, keys, rows.data());  // an empty table (a load) has nothing to find
  std::vector<int64_t> created;
  // A write of whole rows overwrites every column of a new row: no need to initialise it.
  const bool whole_rows = cols.begin == 0 && cols.end == row_width();
  insert_missing(n, keys, rows.data(), nullptr, inits, num_inits, whole_rows && mode == WriteMode::kAssign, &created);
  if (mode == WriteMode::kAccumulate) {
    // A new key takes the sum of its values in the batch: start its columns from zero.
    for (int64_t i : created) std::memset(row_ptr(rows[i]) + cols.begin, 0, sizeof(float) * cols.width());
  }
  write_rows(n, rows.data(), cols, values, mode, sok::now_ns(), scores);
}

int64_t DetTable::update_rows(const sok_exec_context&, int64_t n, const void* keys, sok::Columns cols,
                              const uint64_t*, sok_row_visitor visit, void* user_data, uint8_t* found) {
  std::unique_lock lock(mutex_);
  std::vector<int64_t> rows(n);
  lookup_all(n, keys, rows.data());
  const int64_t missing = sok::mark_found(n, rows.data(), kEmpty, found);
  if (missing > 0) return missing;
  const uint64_t now = sok::now_ns();
  for_each_row(n, rows.data(), cols, [&](int64_t i, int64_t row) {
    visit(user_data, i, row_ptr(row) + cols.begin);
    row_score(row) = now;
  });
  return 0;
}

void DetTable::import_batch(const sok_exec_context&, int64_t n, const void* keys, sok::Columns cols,
                            const float* values, const uint64_t* scores, const sok_initializer* inits,
                            int32_t num_inits) {
  upsert(n, keys, cols, values, inits, num_inits, WriteMode::kAssign, scores);
}

void DetTable::insert_or_assign(const sok_exec_context&, int64_t n, const void* keys,
                                sok::Columns cols, const float* values, const uint64_t*,
                                const sok_initializer* inits, int32_t num_inits) {
  upsert(n, keys, cols, values, inits, num_inits, WriteMode::kAssign);
}

void DetTable::accum_or_assign(const sok_exec_context&, int64_t n, const void* keys,
                               sok::Columns cols, const float* values, const uint64_t*,
                               const sok_initializer* inits, int32_t num_inits) {
  upsert(n, keys, cols, values, inits, num_inits, WriteMode::kAccumulate);
}

int64_t DetTable::insert_and_evict(const sok_exec_context&, int64_t n, const void* keys,
                                   sok::Columns cols, const float* values, const uint64_t*,
                                   const sok_initializer* inits, int32_t num_inits, void*, float*,
                                   uint64_t*) {
  // det grows instead of evicting: nothing is ever displaced.
  upsert(n, keys, cols, values, inits, num_inits, WriteMode::kAssign);
  return 0;
}

bool DetTable::remove(uint64_t key) {
  uint64_t j = sok::hash_key(key) & mask_;
  while (slots_[j].row != kEmpty) {
    Slot& s = slots_[j];
    if (s.row >= 0 && s.key == key) {
      free_rows_.push_back(s.row);
      row_live(s.row) = 0;
      s.row = kErased;
      --size_;
      ++erased_;
      return true;
    }
    j = (j + 1) & mask_;
  }
  return false;
}

int64_t DetTable::erase(const sok_exec_context&, int64_t n, const void* keys) {
  std::unique_lock lock(mutex_);
  int64_t erased = 0;
  for (int64_t i = 0; i < n; ++i) erased += remove(sok::load_key(keys, key_type(), i));
  return erased;
}

int64_t DetTable::export_batch(const sok_exec_context&, int64_t offset, int64_t limit,
                               sok::Columns cols, const uint64_t* threshold, void* keys,
                               float* values, uint64_t* scores) {
  std::shared_lock lock(mutex_);
  // Positions are arena rows (every row index is below the slot count, so [0, capacity) covers
  // them): the rows are read in memory order, and rows >= next_row_ were never handed out.
  const int64_t end = std::min(next_row_, offset + limit);
  const int64_t begin = std::min(offset, end);
  const int32_t w = cols.width();
  auto selected = [&](int64_t row) { return row_live(row) && (threshold == nullptr || row_score(row) >= *threshold); };
  // Two passes over contiguous parts of the row range: count per part, then copy each part to its
  // place in the output (row order is kept).
  const int parts = (end - begin) >= kParallelMin ? sok::num_workers() : 1;
  const int64_t span = (end - begin + parts - 1) / std::max(1, parts);
  std::vector<int64_t> first(parts + 1, 0);
  sok::parallel_for(parts, 2, [&](int, int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      int64_t c = 0;
      for (int64_t r = begin + p * span; r < std::min(end, begin + (p + 1) * span); ++r) c += selected(r);
      first[p + 1] = c;
    }
  });
  for (int p = 0; p < parts; ++p) first[p + 1] += first[p];
  sok::parallel_for(parts, 2, [&](int, int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      int64_t out = first[p];
      const int64_t stop = std::min(end, begin + (p + 1) * span);
      for (int64_t r = begin + p * span; r < stop; ++r) {
        if (!selected(r)) continue;
        sok::store_key(keys, key_type(), out, row_key(r));
        if (values != nullptr) sok::copy_row(values + out * w, row_ptr(r) + cols.begin, w);
        if (scores != nullptr) scores[out] = row_score(r);
        ++out;
      }
    }
  });
  return first[parts];
}

void DetTable::clear(const sok_exec_context&) {
  std::unique_lock lock(mutex_);
  std::fill(slots_.begin(), slots_.end(), Slot{0, kEmpty});
  size_ = 0;
  erased_ = 0;
  next_row_ = 0;
  free_rows_.clear();
}

std::string DetTable::describe() {
  std::shared_lock lock(mutex_);
  return "det (CPU): " + std::to_string(size_) + " keys, " + std::to_string(slots_.size()) + " slots (load " +
         sok::fmt(static_cast<double>(size_) / static_cast<double>(slots_.size())) + ", max " +
         sok::fmt(max_load_factor_) + "), " + std::to_string(chunks_.size() * kChunkRows) +
         " rows allocated of width " + std::to_string(row_width()) + ", key " + sok::key_type_name(key_type());
}

}  // namespace sok_det
