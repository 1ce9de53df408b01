// sok::hps::HashMapTier (hash_map_tier.hpp says what it does and how).
#include "hash_map_tier.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <utility>

#include "key_index.hpp"
#include "overflow.hpp"
#include "partition.hpp"
#include "sok/kit/keys.hpp"
#include "sok/kit/parallel.hpp"

namespace sok {
namespace hps {
namespace {

constexpr int64_t kMinGrowthRows = 64;
// How many keys ahead a bulk loop prefetches the index line of (a few cache misses in flight).
constexpr int64_t kPrefetchAhead = 16;

const HashMapOptions& checked(const HashMapOptions& o) {
  if (o.num_partitions < 1 || o.num_partitions > kMaxPartitions) {
    throw std::invalid_argument("num_partitions must be in [1, " + std::to_string(kMaxPartitions) + "], got " +
                                std::to_string(o.num_partitions));
  }
  if (o.max_batch_size < 1 || o.overflow_margin < 1 || o.allocation_rate < 1) {
    throw std::invalid_argument("max_batch_size, overflow_margin and allocation_rate must be >= 1, got " +
                                std::to_string(o.max_batch_size) + ", " + std::to_string(o.overflow_margin) + ", " +
                                std::to_string(o.allocation_rate));
  }
  check_overflow_resolution_target(o.overflow_resolution_target);
  return o;
}

}  // namespace

OverflowPolicy parse_overflow_policy(const std::string& name) {
  if (name == "evict_random") return OverflowPolicy::kEvictRandom;
  if (name == "evict_least_used") return OverflowPolicy::kEvictLeastUsed;
  if (name == "evict_oldest") return OverflowPolicy::kEvictOldest;
  throw std::invalid_argument("overflow_policy '" + name +
                              "' is not one of ['evict_least_used', 'evict_oldest', 'evict_random']");
}

// The rows of one partition of one table; every member is used under `lock`.
struct Partition {
  Partition(int64_t dim, int64_t growth_rows, bool counts, uint64_t seed)
      : dim(dim), growth_rows(growth_rows), counts(counts), rng(seed) {}

  // A row for a new key: a freed one (last freed first), else the next never handed out.
  int64_t allocate() {
    if (!free.empty()) {
      const int64_t row = free.back();
      free.pop_back();
      return row;
    }
    if (high == capacity) {
      capacity = std::max(high + 1, capacity + std::max(std::min(capacity, growth_rows), kMinGrowthRows));
      values.reserve(capacity * dim);  // reserve first: resize alone may double the allocation
      values.resize(capacity * dim);
      if (counts) {
        last_access.resize(capacity);
        access_count.resize(capacity);
      }
    }
    return high++;
  }

  // Evicts rows by policy until keep remain; returns how many went.
  int64_t evict(uint64_t keep, OverflowPolicy policy) {
    const int64_t size = index.size();
    if (static_cast<uint64_t>(size) <= keep) return 0;
    const int64_t excess = size - static_cast<int64_t>(keep);
    std::vector<std::pair<int64_t, int64_t>> entries;  // (key, row)
    entries.reserve(size);
    index.for_each([&](int64_t key, int64_t row) { entries.emplace_back(key, row); });
    if (policy == OverflowPolicy::kEvictRandom) {
      for (int64_t i = 0; i < excess; ++i) {  // the first `excess` of a partial Fisher-Yates shuffle
        std::uniform_int_distribution<int64_t> pick(i, size - 1);
        std::swap(entries[i], entries[pick(rng)]);
      }
    } else {
      const std::vector<int64_t>& score = policy == OverflowPolicy::kEvictLeastUsed ? access_count : last_access;
      std::nth_element(entries.begin(), entries.begin() + excess, entries.end(), [&](const auto& a, const auto& b) {
        return score[a.second] != score[b.second] ? score[a.second] < score[b.second] : a.first < b.first;
      });
    }
    index.clear();
    for (int64_t i = 0; i < size; ++i) {
      if (i < excess) {
        free.push_back(entries[i].second);
      } else {
        index.insert(entries[i].first, entries[i].second);
      }
    }
    if (policy == OverflowPolicy::kEvictLeastUsed && excess < size) {
      int64_t smallest = access_count[entries[excess].second];
      for (int64_t i = excess; i < size; ++i) smallest = std::min(smallest, access_count[entries[i].second]);
      for (int64_t i = excess; i < size; ++i) {
        int64_t& count = access_count[entries[i].second];
        count = (count - smallest) / 2;
      }
    }
    return excess;
  }

  std::mutex lock;
  const int64_t dim;
  const int64_t growth_rows;  // the most rows the row array grows by at a time
  const bool counts;          // keeps last_access and access_count (the tier evicts)
  std::mt19937_64 rng;        // kEvictRandom's choices
  KeyIndex index;
  std::vector<float> values;         // (capacity, dim)
  std::vector<int64_t> last_access;  // (capacity): the clock of the last fetch or write
  std::vector<int64_t> access_count;  // (capacity): fetches since written (faded by evictions)
  std::vector<int64_t> free;          // rows of evicted keys, to reuse
  int64_t high = 0;                   // rows ever handed out
  int64_t capacity = 0;
};

// The partitions of one table by number, each made when its first row arrives.
struct HashMapTier::Table {
  Table(int64_t dim, int64_t num_partitions, int64_t growth_rows, bool counts, uint64_t seed)
      : dim(dim),
        growth_rows(growth_rows),
        counts(counts),
        seed(seed),
        partitions(new std::atomic<Partition*>[num_partitions]),
        num_partitions(num_partitions) {
    for (int64_t p = 0; p < num_partitions; ++p) partitions[p].store(nullptr, std::memory_order_relaxed);
  }
  ~Table() {
    for (int64_t p = 0; p < num_partitions; ++p) delete partitions[p].load(std::memory_order_relaxed);
  }

  // Partition p, nullptr if no row has reached it yet.
  Partition* find(int64_t p) const { return partitions[p].load(std::memory_order_acquire); }

  // Partition p, made empty if it has none yet. Partition p draws from a seed of its own, so its
  // random evictions do not depend on the order partitions are made in.
  Partition& make(int64_t p) {
    Partition* part = find(p);
    if (part != nullptr) return *part;
    auto made = std::make_unique<Partition>(dim, growth_rows, counts, mix64(seed ^ mix64(static_cast<uint64_t>(p))));
    if (partitions[p].compare_exchange_strong(part, made.get(), std::memory_order_acq_rel)) return *made.release();
    return *part;  // another thread made it first
  }

  const int64_t dim;
  const int64_t growth_rows;
  const bool counts;
  const uint64_t seed;
  std::unique_ptr<std::atomic<Partition*>[]> partitions;  // (num_partitions), owned
  const int64_t num_partitions;
};

HashMapTier::HashMapTier(const HashMapOptions& options)
    : options_(checked(options)),
      name_(options.parallel ? "parallel_hash_map" : "hash_map"),
      keep_rows_(keep_rows_of(options.overflow_margin, options.overflow_resolution_target)),
      seed_(options.seed ? *options.seed : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()) {}

HashMapTier::~HashMapTier() = default;

void HashMapTier::check_open() const {
  if (closed_.load(std::memory_order_acquire)) {
    throw TierClosed("this " + name_ + " is closed and holds no rows; make a new HashMapTier");
  }
}

std::shared_ptr<HashMapTier::Table> HashMapTier::find_table(const std::string& tag) {
  std::shared_lock<std::shared_mutex> read(tables_mutex_);
  const auto it = tables_.find(tag);
  return it == tables_.end() ? nullptr : it->second;
}

std::shared_ptr<HashMapTier::Table> HashMapTier::table_for_insert(const std::string& tag, int64_t dim) {
  std::shared_ptr<Table> table = find_table(tag);
  if (table == nullptr) {
    std::unique_lock<std::shared_mutex> write(tables_mutex_);
    std::shared_ptr<Table>& slot = tables_[tag];
    if (slot == nullptr) {
      const int64_t growth = std::max<int64_t>(1, options_.allocation_rate / (4 * dim));
      slot = std::make_shared<Table>(dim, options_.num_partitions, growth, evicts(), mix64(seed_ + tables_made_++));
    }
    table = slot;
  }
  if (table->dim != dim) {
    throw std::invalid_argument(tag + ": the " + name_ + " holds rows of dim " + std::to_string(table->dim) +
                                ", got rows of dim " + std::to_string(dim));
  }
  return table;
}

namespace {

// Runs work(group) for every group of `groups`: on sok-core's WorkerPool when parallel and the call
// is large enough to gain from it, else one after another on this thread.
template <class Work>
void run_groups(const Groups& groups, int64_t n, bool parallel, Work&& work) {
  const int64_t count = static_cast<int64_t>(groups.groups.size());
  if (parallel && count >= 2 && n >= kParallelMinKeys) {
    parallel_for(count, 2, [&](int, int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) work(groups.groups[g]);
    });
  } else {
    for (const Groups::Group& group : groups.groups) work(group);
  }
}

}  // namespace

void HashMapTier::fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows,
                        bool* found) {
  check_open();
  check_dim(tag, dim);
  std::shared_ptr<Table> table = find_table(tag);
  if (table == nullptr || n == 0) {
    std::fill(rows, rows + n * dim, 0.0f);
    std::fill(found, found + n, false);
    return;
  }
  if (table->dim != dim) {
    throw std::invalid_argument(tag + ": the " + name_ + " holds rows of dim " + std::to_string(table->dim) +
                                ", asked for dim " + std::to_string(dim));
  }
  const int64_t now = clock_.fetch_add(1, std::memory_order_relaxed);
  const Groups groups = group_by_partition(keys, n, options_.num_partitions);
  run_groups(groups, n, options_.parallel, [&](const Groups::Group& group) {
    Partition* part = table->find(group.partition);
    std::unique_lock<std::mutex> lock;
    if (part != nullptr) lock = std::unique_lock<std::mutex>(part->lock);
    // Two passes, each with its misses in flight: the keys' rows from the index (its lines
    // prefetched ahead), then the rows' values (prefetched ahead) into the output.
    std::vector<int64_t> slots(group.end - group.begin, -1);
    if (part != nullptr) {
      for (int64_t i = group.begin; i < group.end; ++i) {
        if (i + kPrefetchAhead < group.end) part->index.prefetch(keys[groups.order[i + kPrefetchAhead]]);
        slots[i - group.begin] = part->index.find(keys[groups.order[i]]);
      }
    }
    for (int64_t i = group.begin; i < group.end; ++i) {
      if (i + kPrefetchAhead < group.end && slots[i + kPrefetchAhead - group.begin] >= 0) {
        __builtin_prefetch(part->values.data() + slots[i + kPrefetchAhead - group.begin] * dim);
      }
      const int64_t at = groups.order[i];
      float* out = rows + at * dim;
      const int64_t row = slots[i - group.begin];
      found[at] = row >= 0;
      if (row < 0) {
        std::fill(out, out + dim, 0.0f);
        continue;
      }
      std::memcpy(out, part->values.data() + row * dim, dim * sizeof(float));
      if (part->counts && part->last_access[row] != now) {  // a key repeated in this fetch counts once
        part->last_access[row] = now;
        ++part->access_count[row];
      }
    }
  });
}

void HashMapTier::insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows, int64_t dim) {
  check_open();
  check_dim(tag, dim);
  std::shared_ptr<Table> table = table_for_insert(tag, dim);
  for (int64_t first = 0; first < n; first += options_.max_batch_size) {
    const int64_t count = std::min(options_.max_batch_size, n - first);
    const int64_t* chunk_keys = keys + first;
    const float* chunk_rows = rows + first * dim;
    const int64_t now = clock_.fetch_add(1, std::memory_order_relaxed);
    const Groups groups = group_by_partition(chunk_keys, count, options_.num_partitions);
    run_groups(groups, count, options_.parallel, [&](const Groups::Group& group) {
      Partition& part = table->make(group.partition);
      std::lock_guard<std::mutex> lock(part.lock);
      for (int64_t i = group.begin; i < group.end; ++i) {  // positions ascending: the last row of a key wins
        const int64_t at = groups.order[i];
        int64_t row = part.index.find(chunk_keys[at]);
        if (row < 0) {
          row = part.allocate();
          part.index.insert(chunk_keys[at], row);
          if (part.counts) part.access_count[row] = 0;
        }
        std::memcpy(part.values.data() + row * dim, chunk_rows + at * dim, dim * sizeof(float));
        if (part.counts) part.last_access[row] = now;
      }
      if (static_cast<uint64_t>(part.index.size()) > options_.overflow_margin) {
        part.evict(keep_rows_, options_.overflow_policy);
      }
    });
  }
}

int64_t HashMapTier::size(const std::string& tag) {
  check_open();
  std::shared_ptr<Table> table = find_table(tag);
  if (table == nullptr) return 0;
  int64_t total = 0;
  for (int64_t p = 0; p < table->num_partitions; ++p) {
    Partition* part = table->find(p);
    if (part == nullptr) continue;
    std::lock_guard<std::mutex> lock(part->lock);
    total += part->index.size();
  }
  return total;
}

void HashMapTier::close() {
  closed_.store(true, std::memory_order_release);
  std::unique_lock<std::shared_mutex> write(tables_mutex_);
  tables_.clear();  // a call in flight keeps its table alive until it returns
}

std::map<int64_t, PartitionContents> HashMapTier::partition_contents(const std::string& tag) {
  check_open();
  std::map<int64_t, PartitionContents> out;
  std::shared_ptr<Table> table = find_table(tag);
  if (table == nullptr) return out;
  for (int64_t p = 0; p < table->num_partitions; ++p) {
    Partition* part = table->find(p);
    if (part == nullptr) continue;
    std::lock_guard<std::mutex> lock(part->lock);
    std::vector<std::pair<int64_t, int64_t>> entries;
    part->index.for_each([&](int64_t key, int64_t row) { entries.emplace_back(key, row); });
    std::sort(entries.begin(), entries.end());
    PartitionContents& contents = out[p];
    contents.rows_allocated = part->high;
    for (const auto& [key, row] : entries) {
      contents.keys.push_back(key);
      contents.access_counts.push_back(part->counts ? part->access_count[row] : 0);
    }
  }
  return out;
}

}  // namespace hps
}  // namespace sok
