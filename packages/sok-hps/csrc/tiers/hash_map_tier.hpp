// sok::hps::HashMapTier: the in-process volatile DB (``hash_map``, ``parallel_hash_map``), in C++,
// doing what hierarchical_parameter_server.tiers.hash_map.HashMapTier does.
//
// Each table is split into num_partitions partitions by partition_of (partition.hpp, the function
// of the Python tier and of Redis), each made when its first row arrives. A partition is a mutex, a
// KeyIndex (key_index.hpp: open addressing, key -> row) and the rows of one growable float array
// (grown by at most allocation_rate bytes at a time, freed rows reused); with an overflow_margin
// also, per row, the clock of its last access and an access count. Any number of threads may fetch
// and insert at once: a call holds one partition's lock at a time, the table map is read under a
// shared lock, and a partition is published with a compare-and-swap.
//
// Without an overflow_margin (kNoOverflowLimit, the default) nothing is ever evicted and nothing is
// counted; the partitions are then only the unit of locking (the Python tier keeps such a table in
// one det storage of sok-core, which TensorFlow's SokFind reads in the graph; this tier has no
// graph table: the C++ server of the serving plan calls fetch).
//
// Overflow (overflow_margin rows per partition): after each max_batch_size chunk of an insert, a
// partition holding more than overflow_margin rows is evicted down to
// round(overflow_margin * overflow_resolution_target) rows (half to even, as Python's round):
//  * kEvictRandom: rows chosen uniformly at random by the partition's std::mt19937_64, seeded from
//    the tier's seed, the table's ordinal (tables in the order they were made) and the partition
//    number: reproducible for one seed and one order of calls, but not the rows NumPy's generator
//    of the Python tier picks;
//  * kEvictLeastUsed: the rows fetched least often, ties broken by the smaller key (as the Python
//    tier's stable sort of its key-ordered rows); a fetch counts once per key however often the key
//    repeats in it (as NumPy's `count[rows] += 1`). The survivors' counts then become
//    (count - smallest) / 2, so old popularity fades;
//  * kEvictOldest: the rows least recently fetched or written, ties broken by the smaller key.
//    Time is a counter of calls (one tick per fetch, one per insert chunk), as in the Python tier.
// So for the two deterministic policies the same calls leave the same rows in both tiers.
//
// parallel: a call's partitions are worked on by sok-core's WorkerPool (sok/kit/parallel.hpp; at
// most 16 threads) when the call has at least kParallelMinKeys keys in two partitions or more;
// smaller calls run on the caller's thread, where handing work to threads costs more than it saves.
#ifndef SOK_HPS_TIERS_HASH_MAP_TIER_HPP_
#define SOK_HPS_TIERS_HASH_MAP_TIER_HPP_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "limits.hpp"
#include "tier.hpp"

namespace sok {
namespace hps {

// The fewest keys of a call that a parallel tier hands to its worker threads.
inline constexpr int64_t kParallelMinKeys = 4096;

enum class OverflowPolicy { kEvictRandom, kEvictLeastUsed, kEvictOldest };

// The policy named name ("evict_random", "evict_least_used", "evict_oldest"); std::invalid_argument
// naming the three otherwise.
OverflowPolicy parse_overflow_policy(const std::string& name);

// The settings of a HashMapTier, as volatile_db of a ps_config gives them (config.py says what each
// means); HashMapTier's constructor checks them.
struct HashMapOptions {
  int64_t num_partitions = 8;            // 1 .. kMaxPartitions
  bool parallel = true;                  // parallel_hash_map: a call's partitions on worker threads
  int64_t allocation_rate = 268435456;   // the most bytes a partition's rows grow by at a time
  int64_t max_batch_size = 65536;        // rows per insert chunk (overflow is checked after each)
  uint64_t overflow_margin = kNoOverflowLimit;  // the most rows per partition
  OverflowPolicy overflow_policy = OverflowPolicy::kEvictRandom;
  double overflow_resolution_target = 0.8;  // evict down to this fraction of overflow_margin, (0, 1]
  std::optional<uint64_t> seed;             // of kEvictRandom's choices; none: from std::random_device
};

// What one partition of a table holds, for tests and diagnostics.
struct PartitionContents {
  std::vector<int64_t> keys;           // ascending
  std::vector<int64_t> access_counts;  // of each key; zeros where the tier never evicts
  int64_t rows_allocated;              // rows of the row array ever handed out (freed ones are reused)
};

class HashMapTier final : public Tier {
 public:
  // Throws std::invalid_argument, with the Python tier's messages, for settings out of range.
  explicit HashMapTier(const HashMapOptions& options);
  ~HashMapTier() override;

  const std::string& name() const override { return name_; }
  void fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows,
             bool* found) override;
  void insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows, int64_t dim) override;
  int64_t size(const std::string& tag) override;
  void close() override;

  // Whether rows evict by policy (an overflow_margin is set).
  bool evicts() const { return options_.overflow_margin != kNoOverflowLimit; }
  const HashMapOptions& options() const { return options_; }
  // The partitions of tag that hold rows, by number (empty for a tag the tier does not hold).
  std::map<int64_t, PartitionContents> partition_contents(const std::string& tag);

  struct Table;  // hash_map_tier.cpp

 private:
  std::shared_ptr<Table> find_table(const std::string& tag);
  std::shared_ptr<Table> table_for_insert(const std::string& tag, int64_t dim);
  void check_open() const;

  const HashMapOptions options_;
  const std::string name_;
  const uint64_t keep_rows_;  // rows an overflowing partition keeps
  const uint64_t seed_;
  std::atomic<bool> closed_{false};
  std::atomic<int64_t> clock_{1};
  std::shared_mutex tables_mutex_;  // guards tables_ and tables_made_
  std::unordered_map<std::string, std::shared_ptr<Table>> tables_;
  uint64_t tables_made_ = 0;
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_TIERS_HASH_MAP_TIER_HPP_
