// sok::hps::RocksDbTier (rocks_db_tier.hpp says what it does and how).
#include "rocks_db_tier.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/options_util.h>
#include <rocksdb/version.h>
#include <rocksdb/write_batch.h>

#include "py_text.hpp"
#include "sok/kit/parallel.hpp"

namespace sok {
namespace hps {
namespace {

constexpr uint64_t kPointLookupCacheMb = 8;                      // its block cache's, replaced by the tier's
constexpr uint64_t kMemtableMemoryBudget = 512ull * 1024 * 1024;  // OptimizeLevelStyleCompaction's
constexpr const char* kDimKeyPrefix = "hps_dim:";                 // the width records' keys, + tag

const RocksDbOptions& checked(const RocksDbOptions& o) {
  if (o.num_threads < 1 || o.max_batch_size < 1) {
    throw std::invalid_argument("num_threads and max_batch_size must be >= 1, got " + std::to_string(o.num_threads) +
                                ", " + std::to_string(o.max_batch_size));
  }
  return o;
}

// The options of a table's column family: OptimizeForPointLookup, its table files of
// kRocksDbTableFormatVersion and their blocks in block_cache (the rest of the table options as
// OptimizeForPointLookup makes them).
rocksdb::ColumnFamilyOptions family_options(const std::shared_ptr<rocksdb::Cache>& block_cache) {
  rocksdb::ColumnFamilyOptions options;
  options.OptimizeForPointLookup(kPointLookupCacheMb);
  rocksdb::BlockBasedTableOptions tables = *options.table_factory->GetOptions<rocksdb::BlockBasedTableOptions>();
  tables.format_version = kRocksDbTableFormatVersion;
  tables.block_cache = block_cache;
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(tables));
  return options;
}

// The key of a row: the key's 8 bytes, little-endian.
std::array<char, 8> encode_key(int64_t key) {
  std::array<char, 8> out;
  const uint64_t bits = static_cast<uint64_t>(key);
  for (int b = 0; b < 8; ++b) out[b] = static_cast<char>(bits >> (8 * b));
  return out;
}

// The order of a key's row in RocksDB (its 8 bytes compared bytewise) as a number: its bytes read
// big-endian.
uint64_t stored_order(int64_t key) { return __builtin_bswap64(static_cast<uint64_t>(key)); }

int64_t decode_key(const char* bytes) {
  uint64_t bits = 0;
  for (int b = 0; b < 8; ++b) bits |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[b])) << (8 * b);
  return static_cast<int64_t>(bits);
}

std::string dim_key(const std::string& tag) { return kDimKeyPrefix + tag; }

std::string version_text(int major, int minor, int patch) {
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// The RocksDB version that last opened the database at path, as its newest OPTIONS file records it
// ("rocksdb_version=9.8.4"); {} where there is no such file or line.
std::array<int, 3> writer_version(const std::string& path) {
  std::string name;
  if (!rocksdb::GetLatestOptionsFileName(path, rocksdb::Env::Default(), &name).ok()) return {};
  std::ifstream file(path + "/" + name);
  const std::string field = "rocksdb_version=";
  for (std::string line; std::getline(file, line);) {
    const size_t at = line.find(field);
    if (at == std::string::npos) continue;
    std::array<int, 3> version{};
    const char* p = line.data() + at + field.size();
    const char* end = line.data() + line.size();
    for (int i = 0; i < 3 && p < end; ++i) {
      p = std::from_chars(p, end, version[i]).ptr;
      if (p < end && *p == '.') ++p;
    }
    return version;
  }
  return {};
}

// Whether this process holds a lock on the database's LOCK file. RocksDB finds a lock of its own library
// in this process, but not one of another RocksDB library (rocksdict's, of the Python tier): POSIX
// record locks never conflict within a process, so it would open the database a second time. An
// open file description lock conflicts with them (Linux), so F_OFD_GETLK finds them.
bool locked_by_this_process(const std::string& path) {
#ifdef F_OFD_GETLK
  const int fd = ::open((path + "/LOCK").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  const bool held = ::fcntl(fd, F_OFD_GETLK, &lock) == 0 && lock.l_type != F_UNLCK && lock.l_pid == ::getpid();
  ::close(fd);
  return held;
#else
  return false;
#endif
}

}  // namespace

RocksDbTier::RocksDbTier(const RocksDbOptions& options)
    : options_(checked(options)),
      quoted_path_(py_repr(options.path)),
      block_cache_(rocksdb::NewLRUCache(static_cast<size_t>(kRocksDbBlockCacheBytes))) {
  const std::string open_failed = "rocks_db at " + quoted_path_ + " cannot be opened: ";
  rocksdb::Options db_options(rocksdb::DBOptions(), family_options(block_cache_));
  db_options.create_if_missing = !options_.read_only;
  db_options.create_missing_column_families = !options_.read_only;
  db_options.IncreaseParallelism(options_.num_threads);
  db_options.OptimizeLevelStyleCompaction(kMemtableMemoryBudget);
  // RocksDB's own default, which a RocksDB built without NDEBUG (Debian's) lowers to DEBUG_LEVEL.
  db_options.info_log_level = rocksdb::InfoLogLevel::INFO_LEVEL;

  namespace fs = std::filesystem;
  std::error_code error;
  if (!options_.read_only) {
    fs::create_directories(options_.path, error);
    if (error) throw TierUnavailable(open_failed + "making the directory failed: " + error.message());
  }
  if (!options_.read_only && locked_by_this_process(options_.path)) {
    throw TierUnavailable(open_failed + "this process holds its LOCK already (another tier open on the path, "
                          "maybe the Python tier's, whose RocksDB library this one cannot see); close that tier "
                          "first, or open this one read_only");
  }
  std::vector<std::string> families = {rocksdb::kDefaultColumnFamilyName};
  if (fs::is_regular_file(fs::path(options_.path) / "CURRENT", error)) {
    const rocksdb::Status listed = rocksdb::DB::ListColumnFamilies(db_options, options_.path, &families);
    if (!listed.ok()) throw TierUnavailable(open_failed + listed.ToString());
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const std::string& family : families) {
    descriptors.emplace_back(family, family == rocksdb::kDefaultColumnFamilyName
                                         ? static_cast<rocksdb::ColumnFamilyOptions>(db_options)
                                         : family_options(block_cache_));
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  const rocksdb::Status opened =
      options_.read_only ? rocksdb::DB::OpenForReadOnly(db_options, options_.path, descriptors, &handles, &db)
                         : rocksdb::DB::Open(db_options, options_.path, descriptors, &handles, &db);
  if (!opened.ok()) {
    std::string message = open_failed + opened.ToString();
    const std::array<int, 3> writer = writer_version(options_.path);
    const std::array<int, 3> mine = {ROCKSDB_MAJOR, ROCKSDB_MINOR, ROCKSDB_PATCH};
    if ((opened.IsCorruption() || opened.IsNotSupported()) && writer > mine) {
      const std::string newer = version_text(writer[0], writer[1], writer[2]);
      const std::string built = version_text(mine[0], mine[1], mine[2]);
      message += ". It was written by RocksDB " + newer + " (its OPTIONS file says), newer than the RocksDB " +
                 built + " this C++ tier is built with, in a format " + built +
                 " cannot read. Rewrite its table files in format_version " +
                 std::to_string(kRocksDbTableFormatVersion) +
                 ", which both read, with the Python tier: "
                 "hierarchical_parameter_server.tiers.rocks_db.RocksDBTier(path).rewrite_tables(); or build "
                 "sok-hps against RocksDB " +
                 newer + " or newer";
    }
    throw TierUnavailable(message);
  }
  db_.reset(db);
  for (size_t i = 0; i < handles.size(); ++i) {
    if (families[i] == rocksdb::kDefaultColumnFamilyName) {
      default_family_ = handles[i];
    } else {
      families_[families[i]] = handles[i];
    }
  }
}

RocksDbTier::~RocksDbTier() { shut(); }  // a destructor cannot throw: close() first to see a failure

std::shared_lock<std::shared_mutex> RocksDbTier::enter() const {
  if (!closing_.load(std::memory_order_acquire)) {
    std::shared_lock<std::shared_mutex> lock(calls_mutex_);
    if (db_ != nullptr) return lock;
  }
  throw TierClosed("rocks_db at " + quoted_path_ + " is closed; open the path again with a new tier");
}

void RocksDbTier::check_writable(const std::string& tag) const {
  if (options_.read_only) {
    throw TierReadOnly("rocks_db at " + quoted_path_ + " is opened read-only (persistent_db.read_only); " + tag +
                       " not written");
  }
}

void RocksDbTier::fail(const std::string& what, const std::string& status) const {
  throw TierUnavailable("rocks_db at " + quoted_path_ + ": " + what + " failed: " + status);
}

rocksdb::ColumnFamilyHandle* RocksDbTier::find_family(const std::string& tag) {
  std::lock_guard<std::mutex> lock(families_mutex_);
  const auto it = families_.find(tag);
  return it == families_.end() ? nullptr : it->second;
}

rocksdb::ColumnFamilyHandle* RocksDbTier::family_for_insert(const std::string& tag) {
  std::lock_guard<std::mutex> lock(families_mutex_);
  rocksdb::ColumnFamilyHandle*& family = families_[tag];
  if (family == nullptr) {
    const rocksdb::Status made = db_->CreateColumnFamily(family_options(block_cache_), tag, &family);
    if (!made.ok()) {
      families_.erase(tag);
      fail("making the table " + tag, made.ToString());
    }
  }
  return family;
}

void RocksDbTier::fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows,
                        bool* found) {
  check_dim(tag, dim);
  const auto lock = enter();
  std::fill(rows, rows + n * dim, 0.0f);
  std::fill(found, found + n, false);
  rocksdb::ColumnFamilyHandle* family = find_family(tag);
  if (family == nullptr || n == 0) return;
  // The keys in RocksDB's order, each with its position: equal keys side by side, read once.
  std::vector<std::pair<uint64_t, int64_t>> sorted(n);  // (stored_order(key), position in keys)
  for (int64_t i = 0; i < n; ++i) sorted[i] = {stored_order(keys[i]), i};
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> starts;  // where each distinct key's run in sorted starts; n after the last
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || sorted[i].first != sorted[i - 1].first) starts.push_back(i);
  }
  const auto distinct = static_cast<int64_t>(starts.size());
  starts.push_back(n);
  const size_t row_bytes = sizeof(float) * dim;
  const int64_t parts = std::clamp<int64_t>(distinct / kRocksDbKeysPerThread, 1, sok::num_workers());
  // The widths of the rows found, checked once every part is read: of rows of dim floats, of others.
  std::vector<char> dim_found(parts, 0);
  std::vector<std::set<size_t>> other_sizes(parts);
  // Part p reads distinct keys [distinct * p / parts, distinct * (p + 1) / parts) in MultiGets of at
  // most max_batch_size sorted keys, writing each row found of dim floats to every position of its key.
  const auto read_part = [&](int64_t part) {
    const int64_t begin = distinct * part / parts, end = distinct * (part + 1) / parts;
    const int64_t most = std::min(end - begin, options_.max_batch_size);
    std::vector<std::array<char, 8>> raw(most);
    std::vector<rocksdb::Slice> slices(most);
    std::vector<rocksdb::PinnableSlice> values(most);
    std::vector<rocksdb::Status> statuses(most);
    for (int64_t first = begin; first < end; first += options_.max_batch_size) {
      const int64_t count = std::min(options_.max_batch_size, end - first);
      for (int64_t j = 0; j < count; ++j) {
        raw[j] = encode_key(keys[sorted[starts[first + j]].second]);
        slices[j] = rocksdb::Slice(raw[j].data(), raw[j].size());
      }
      db_->MultiGet(rocksdb::ReadOptions(), family, count, slices.data(), values.data(), statuses.data(),
                    /*sorted_input=*/true);
      for (int64_t j = 0; j < count; ++j) {
        if (statuses[j].ok()) {
          if (values[j].size() == row_bytes) {
            dim_found[part] = 1;
            for (int64_t at = starts[first + j]; at < starts[first + j + 1]; ++at) {
              const int64_t position = sorted[at].second;
              std::memcpy(rows + position * dim, values[j].data(), row_bytes);
              found[position] = true;
            }
          } else {
            other_sizes[part].insert(values[j].size());
          }
        } else if (!statuses[j].IsNotFound()) {
          fail("reading " + tag, statuses[j].ToString());
        }
        values[j].Reset();
      }
    }
  };
  sok::parallel_for(parts, 2, [&](int, int64_t begin, int64_t end) {
    for (int64_t part = begin; part < end; ++part) read_part(part);
  });
  std::set<size_t> sizes;
  for (int64_t part = 0; part < parts; ++part) {
    sizes.insert(other_sizes[part].begin(), other_sizes[part].end());
    if (dim_found[part]) sizes.insert(row_bytes);
  }
  if (sizes.size() > 1 || (sizes.size() == 1 && *sizes.begin() != row_bytes)) {
    std::fill(rows, rows + n * dim, 0.0f);
    std::fill(found, found + n, false);
    std::vector<int64_t> widths;
    for (const size_t size : sizes) widths.push_back(static_cast<int64_t>(size / sizeof(float)));
    throw std::invalid_argument(tag + ": rocks_db holds rows of " + py_repr(widths) + " floats, asked for dim " +
                                std::to_string(dim));
  }
}

void RocksDbTier::insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows, int64_t dim) {
  check_dim(tag, dim);
  const auto lock = enter();
  check_writable(tag);
  if (n == 0) return;
  rocksdb::ColumnFamilyHandle* family = family_for_insert(tag);
  const size_t row_bytes = sizeof(float) * dim;
  for (int64_t first = 0; first < n; first += options_.max_batch_size) {
    rocksdb::WriteBatch batch;
    for (int64_t i = first; i < std::min(n, first + options_.max_batch_size); ++i) {
      const std::array<char, 8> key = encode_key(keys[i]);
      const rocksdb::Status put = batch.Put(family, rocksdb::Slice(key.data(), key.size()),
                                            rocksdb::Slice(reinterpret_cast<const char*>(rows + i * dim), row_bytes));
      if (!put.ok()) fail("writing " + tag, put.ToString());
    }
    const rocksdb::Status written = db_->Write(rocksdb::WriteOptions(), &batch);
    if (!written.ok()) fail("writing " + tag, written.ToString());
  }
}

int64_t RocksDbTier::size(const std::string& tag) {
  const auto lock = enter();
  rocksdb::ColumnFamilyHandle* family = find_family(tag);
  if (family == nullptr) return 0;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), family));
  int64_t count = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) ++count;
  if (!it->status().ok()) fail("counting the rows of " + tag, it->status().ToString());
  return count;
}

int64_t RocksDbTier::stored_dim(const std::string& tag) {
  const auto lock = enter();
  std::string recorded;
  const rocksdb::Status got = db_->Get(rocksdb::ReadOptions(), default_family_, dim_key(tag), &recorded);
  if (got.ok()) {
    int64_t dim = 0;
    const char* end = recorded.data() + recorded.size();
    const auto [p, error] = std::from_chars(recorded.data(), end, dim);
    if (error != std::errc() || p != end || recorded.empty()) {
      throw std::invalid_argument("rocks_db at " + quoted_path_ + ": the width of " + tag + " recorded under " +
                                  py_repr(dim_key(tag)) + " is " + py_repr(recorded) +
                                  ", not a decimal integer; record it again with set_stored_dim");
    }
    return dim;
  }
  if (!got.IsNotFound()) fail("reading the width of " + tag, got.ToString());
  rocksdb::ColumnFamilyHandle* family = find_family(tag);
  if (family == nullptr) return -1;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), family));
  it->SeekToFirst();
  if (!it->status().ok()) fail("reading a row of " + tag, it->status().ToString());
  return it->Valid() ? static_cast<int64_t>(it->value().size() / sizeof(float)) : -1;
}

void RocksDbTier::set_stored_dim(const std::string& tag, int64_t dim) {
  const auto lock = enter();
  check_writable(tag);
  const rocksdb::Status put = db_->Put(rocksdb::WriteOptions(), default_family_, dim_key(tag), std::to_string(dim));
  if (!put.ok()) fail("recording the width of " + tag, put.ToString());
}

int64_t RocksDbTier::retain_only(const std::string& tag, const int64_t* keys, int64_t n) {
  const auto lock = enter();
  check_writable(tag);
  rocksdb::ColumnFamilyHandle* family = find_family(tag);
  if (family == nullptr) return 0;
  std::vector<int64_t> keep(keys, keys + n);
  std::sort(keep.begin(), keep.end());
  const auto absent = [&](const std::string& stored) {
    return stored.size() != 8 || !std::binary_search(keep.begin(), keep.end(), decode_key(stored.data()));
  };
  int64_t erased = 0;
  std::vector<std::string> stored;
  const auto erase_absent = [&] {
    rocksdb::WriteBatch batch;
    for (const std::string& key : stored) {
      if (!absent(key)) continue;
      const rocksdb::Status deleted = batch.Delete(family, key);
      if (!deleted.ok()) fail("erasing rows of " + tag, deleted.ToString());
      ++erased;
    }
    const rocksdb::Status written = db_->Write(rocksdb::WriteOptions(), &batch);
    if (!written.ok()) fail("erasing rows of " + tag, written.ToString());
    stored.clear();
  };
  // The iterator reads the table as it was when it was made: the erasures do not disturb it.
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), family));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    stored.push_back(it->key().ToString());
    if (static_cast<int64_t>(stored.size()) == options_.max_batch_size) erase_absent();
  }
  if (!it->status().ok()) fail("reading the keys of " + tag, it->status().ToString());
  if (!stored.empty()) erase_absent();
  const rocksdb::Status flushed = db_->Flush(rocksdb::FlushOptions(), family);
  if (!flushed.ok()) fail("flushing " + tag, flushed.ToString());
  return erased;
}

void RocksDbTier::close() {
  const std::string failed = shut();
  if (!failed.empty()) fail("closing", failed);
}

std::string RocksDbTier::shut() {
  closing_.store(true, std::memory_order_release);
  std::unique_lock<std::shared_mutex> lock(calls_mutex_);  // once the calls in flight have returned
  if (db_ == nullptr) return "";
  std::vector<rocksdb::ColumnFamilyHandle*> handles = {default_family_};
  for (const auto& [tag, family] : families_) handles.push_back(family);
  rocksdb::Status status;
  if (!options_.read_only) status = db_->Flush(rocksdb::FlushOptions(), handles);
  for (rocksdb::ColumnFamilyHandle* family : handles) {
    const rocksdb::Status destroyed = db_->DestroyColumnFamilyHandle(family);
    if (status.ok()) status = destroyed;
  }
  families_.clear();
  default_family_ = nullptr;
  const rocksdb::Status closed = db_->Close();
  if (status.ok()) status = closed;
  db_.reset();
  return status.ok() ? "" : status.ToString();
}

}  // namespace hps
}  // namespace sok
