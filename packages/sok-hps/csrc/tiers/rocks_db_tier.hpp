// sok::hps::RocksDbTier: the persistent DB (persistent_db.type "rocks_db") in C++, doing what
// hierarchical_parameter_server.tiers.rocks_db.RocksDBTier (rocksdict) does, on the same files: a
// database either tier wrote, the other opens.
//
// Layout (the original's, reference §3.3): one column family per table tag; a key is the key's 8
// little-endian bytes and its value the row's raw float32 bytes. The default family holds each
// table's width: key "hps_dim:<tag>", value the width as decimal text (set_stored_dim).
//
// Options, as the Python tier sets them: every family OptimizeForPointLookup's (a hash index in each
// data block, a Bloom filter) with its table files of format_version kRocksDbTableFormatVersion and
// its blocks in the tier's one LRU block cache of kRocksDbBlockCacheBytes, which all its families
// share; the database IncreaseParallelism(num_threads) and OptimizeLevelStyleCompaction(512 MiB)
// besides, create_if_missing and create_missing_column_families unless read_only (then
// OpenForReadOnly), RocksDB's LOG at INFO_LEVEL. Writes go through the write-ahead log, so every row
// written before close() (or a crash) is there when the path is opened again; writes are WriteBatches
// of max_batch_size rows each.
//
// Reads: a fetch reads each distinct key once, in the order RocksDB keeps keys (by their bytes), in
// MultiGets of at most max_batch_size keys told that their keys are sorted (RocksDB then skips its
// own sort of them, and the keys of one block come one after another), on sok-core's worker pool in
// parts of at least kRocksDbKeysPerThread keys where a fetch has that many. retain_only, which the servers
// call once they have written a table (the end of its deploy), then flushes the table's memtable into
// a table file: a table file is faster to search than a memtable of many rows.
//
// A writable open refuses a database this process holds open already, also through another RocksDB
// library (the Python tier's rocksdict), whose lock RocksDB itself does not see (Linux only).
//
// Where the Python tier does so too, this tier does not check widths on insert: a row of any width
// is written as it is; a fetch of a table whose stored rows are of another width than asked throws.
//
// Threads: any number may fetch, insert and call the other methods at once (RocksDB is thread-safe;
// the map of column families has a mutex). close() waits for the calls in flight, then flushes and
// closes the database; calls after it throw TierClosed.
#ifndef SOK_HPS_TIERS_ROCKS_DB_TIER_HPP_
#define SOK_HPS_TIERS_ROCKS_DB_TIER_HPP_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "tier.hpp"

namespace rocksdb {
class Cache;
class ColumnFamilyHandle;
class DB;
}  // namespace rocksdb

namespace sok {
namespace hps {

// The format of the table files the tier writes (BlockBasedTableOptions::format_version): 5, which
// RocksDB reads since 6.6, so that a database either tier wrote the other opens whichever RocksDB
// each is built with (rocksdict's 9.8.4 writes 6 unless told otherwise, which RocksDB before 8.6
// cannot read). tiers/rocks_db.py's TABLE_FORMAT_VERSION (the tests compare them).
inline constexpr int kRocksDbTableFormatVersion = 5;

// The capacity of a tier's block cache, one LRU cache for all its tables (OptimizeForPointLookup(8)
// gives each table one of 8 MiB): blocks read from table files stay there, uncompressed and
// checksummed, up to this many bytes; the rest are read again from the files (the OS's page cache).
// tiers/rocks_db.py's BLOCK_CACHE_BYTES (the tests compare them).
inline constexpr int64_t kRocksDbBlockCacheBytes = int64_t{256} << 20;

// The fewest distinct keys of a fetch per thread of sok-core's worker pool: a fetch of fewer reads
// on the caller's thread.
inline constexpr int64_t kRocksDbKeysPerThread = 1024;

// The settings of a RocksDbTier, as persistent_db of a ps_config gives them (config.py says what each
// means); the defaults are the Python tier's.
struct RocksDbOptions {
  std::string path;                // the database directory (made with its parents unless read_only)
  int num_threads = 16;            // RocksDB's background threads (IncreaseParallelism), >= 1
  bool read_only = false;          // open for reading only; writes throw TierReadOnly
  int64_t max_batch_size = 65536;  // rows per MultiGet and per WriteBatch, >= 1
};

class RocksDbTier final : public SharedTier {
 public:
  // Opens (or makes) the database at options.path. Throws std::invalid_argument for num_threads or
  // max_batch_size < 1; TierUnavailable, naming the path and RocksDB's status, where it cannot be
  // opened (a process holds its LOCK, a read-only open of a path without a database, a database
  // written by a newer RocksDB in a format this one cannot read: the message says what to do).
  explicit RocksDbTier(const RocksDbOptions& options);
  ~RocksDbTier() override;
  RocksDbTier(const RocksDbTier&) = delete;
  RocksDbTier& operator=(const RocksDbTier&) = delete;

  const std::string& name() const override { return name_; }
  const std::string& location() const override { return options_.path; }
  const RocksDbOptions& options() const { return options_; }

  // Throws std::invalid_argument where rows of tag are stored of another width than dim, naming every
  // width among the rows of keys (the Python tier's message; rows and found are then zeros and
  // false); TierUnavailable where RocksDB fails to read.
  void fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows,
             bool* found) override;
  // Writes the rows (of any width, as the Python tier). An insert of no keys makes no table.
  // Throws TierReadOnly; TierUnavailable where RocksDB fails to write.
  void insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows, int64_t dim) override;
  // Rows of tag, counted by iterating them: exact, linear in the table's size.
  int64_t size(const std::string& tag) override;
  // Flushes and closes the database (idempotent) once the calls in flight have returned; the rows
  // stay on disk.
  void close() override;

  // The width recorded for tag, else the size of its first row (in key order), else -1. Throws
  // std::invalid_argument where the record is not a decimal integer.
  int64_t stored_dim(const std::string& tag) override;
  void set_stored_dim(const std::string& tag, int64_t dim) override;
  // One pass over tag's keys in batches of max_batch_size, each batch's absent keys erased in one
  // WriteBatch; then tag's memtable is flushed into a table file (the servers call it once they have
  // written a table's rows).
  int64_t retain_only(const std::string& tag, const int64_t* keys, int64_t n) override;

 private:
  // The family of tag, nullptr where the database has none.
  rocksdb::ColumnFamilyHandle* find_family(const std::string& tag);
  // The family of tag, made where the database has none.
  rocksdb::ColumnFamilyHandle* family_for_insert(const std::string& tag);
  // A shared lock on calls_mutex_ once the tier is known open; throws TierClosed otherwise.
  std::shared_lock<std::shared_mutex> enter() const;
  void check_writable(const std::string& tag) const;
  // Throws TierUnavailable: what failed, with RocksDB's status.
  [[noreturn]] void fail(const std::string& what, const std::string& status) const;
  // Flushes (unless read_only) and closes the database once the calls in flight have returned;
  // RocksDB's status where that failed, else "".
  std::string shut();

  const RocksDbOptions options_;
  const std::string name_ = "rocks_db";
  const std::string quoted_path_;  // the path as Python's repr writes it, for messages
  const std::shared_ptr<rocksdb::Cache> block_cache_;  // of every family's table files
  std::atomic<bool> closing_{false};
  // Held shared by every call while it uses db_, uniquely by close().
  mutable std::shared_mutex calls_mutex_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ColumnFamilyHandle* default_family_ = nullptr;  // owned: destroyed by close()
  std::mutex families_mutex_;                                // guards families_
  std::unordered_map<std::string, rocksdb::ColumnFamilyHandle*> families_;  // by tag, owned
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_TIERS_ROCKS_DB_TIER_HPP_
