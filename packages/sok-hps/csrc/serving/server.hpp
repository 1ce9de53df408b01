// sok::hps::Server: the C++ server of a ps_config (docs/design/hps-serving.md, steps 3 and 4), what a
// process with no Python serves HPS's lookups with (native_calls.cc). One per ps_config file in the
// process (Server::of), made at its first lookup: the ps_config read by read_ps_config (ps_config.hpp,
// the reader config.py calls too), the databases made (server_tiers.hpp), every model file opened and
// verified (model_files.hpp) and each shared database's recorded width checked before a row is
// written, then every table loaded into the writable databases and its cache, as server.py's
// ParameterServer does; the rows a re-deploy lacks are erased from the shared databases.
//
// A lookup is server.py's ServedTable.lookup: the cache (a det CPU storage of every row of the
// model files, never evicting: det_tier.hpp), where the table has one; else, without a cache, the
// volatile hash map's det storage of the table where it never evicts; the keys not found there
// from the databases in order (volatile, persistent, then the table's default_value), a database
// that cannot be reached skipped with a warning; hit_rate_threshold as the Python server applies it
// (a batch at or above it gets the default for its misses, which are fetched in the background);
// cache_missed_embeddings' copy-back of the persistent DB's rows into the volatile DB in the
// background, skipped where an online update came between.
//
// Online updates (update_source: a directory): the source (update_source.hpp, the one updates.py
// calls) made before the load and started after it; each update applied as server.py's
// apply_update does, to the databases whose update_filters take its model, then to the cache (the
// rows it holds, or every row where it holds every row), ordered against the copy-backs.
//
// What it serves: every ps_config the Python server serves, except the database types this build has
// no tier for (server_tiers.hpp): those are refused at the first lookup with a ConfigError that names
// the setting. Its caches are the Python server's tables (det's of every row, hkv's where it evicts),
// on the GPU where the process sees one; which keys an evicting cache holds after the same lookups
// may still differ (hkv's scores are write times, fills run in the background), and with
// hit_rate_threshold below 1.0 so may which misses of a batch get the default value; with
// hit_rate_threshold 1.0 (or more) every lookup is exact in both.
//
// Example:
//   std::shared_ptr<Server> server = Server::of("/models/ps.json");
//   const ServedTable& t = server->table("foo", 0);
//   server->lookup(t, keys, n, rows);        // rows: float [n, t.dim]
#ifndef SOK_HPS_SERVING_SERVER_HPP_
#define SOK_HPS_SERVING_SERVER_HPP_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "det_tier.hpp"
#include "evicting_cache.hpp"
#include "model_files.hpp"
#include "model_filters.hpp"
#include "ps_config.hpp"
#include "tier.hpp"
#include "update_source.hpp"

namespace sok {
namespace hps {

// One table of one model as the server serves it.
struct ServedTable {
  std::string model;
  int64_t table_id = 0;
  std::string tag;  // hps_et.<model>.<table name>, the table's name in the tiers
  int64_t dim = 0;
  float default_value = 0.0f;      // default_value_for_each_table's: every column of a key no tier has
  std::vector<float> default_row;  // [dim] of default_value
  int64_t max_keys = 0;            // max_batch_size x maxnum_catfeature_query_per_table_per_sample
  bool int64_keys = false;         // supportlonglong
  int64_t rows = 0;                // of its model file
  double hit_rate_threshold = 0.9;
  // The embedding cache, null where the model has none (gpucache false, or gpucacheper 0.0): with a
  // database behind it and gpucacheper below 1.0 (embedding_cache_type dynamic) an EvictingCache
  // (an hkv storage), else a det storage of every row of the model file and of the online updates;
  // either on the GPU where there is one (cache_device, as the Python server's cache), with keys of
  // the table's key type (int32 where supportlonglong is false), so a graph's find reads it in place.
  std::unique_ptr<GraphRows> cache;
  RowStorage* full_cache = nullptr;         // cache, where it never evicts
  EvictingCache* evicting_cache = nullptr;  // cache, where it evicts
  // Whether the cache alone answers every lookup (no database can hold a row it lacks: none, or only
  // an in-process hash map, which takes the same loads): a key it lacks gets the default value.
  bool cache_answers_all = false;
  // Without a cache: the volatile hash map's storage of the table where it never evicts, else null.
  std::shared_ptr<const RowStorage> volatile_rows;
  // Orders an online update against a copy-back of rows read before it (server.py's lock).
  mutable std::mutex lock;
  // Online updates applied to the table (under lock): a copy-back of rows read before one is skipped.
  mutable std::atomic<int64_t> generation{0};
};

class Server {
 public:
  // The process's server of the ps_config at `path` (made, and its config checked, on first use;
  // a path that failed is tried again). Throws ConfigError.
  static std::shared_ptr<Server> of(const std::string& path);

  // Checks that this server can serve `config` (see above), makes the databases, then opens and
  // verifies every model file and checks the shared databases' widths, then loads them (server.py's
  // order). Throws ConfigError and ModelFileError (model_files.hpp), TierUnavailable (a database
  // cannot be reached), and std::runtime_error where det's or hkv's library is not loaded (row_storage.hpp).
  Server(PsConfig config, std::string path);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Table table_id of model. Throws ConfigError: no such model or table.
  const ServedTable& table(const std::string& model, int64_t table_id) const;

  // rows [n, table.dim] of keys [n]: ServedTable.lookup (see above). Throws std::runtime_error.
  void lookup(const ServedTable& table, const int64_t* keys, int64_t n, float* rows);

  // rows [n, table.dim] of keys [n] from the databases, the default value where none has a key
  // (ServedTable.fetch, what a lookup graph's misses call). Throws std::runtime_error.
  void fetch(const ServedTable& table, const int64_t* keys, int64_t n, float* rows);

  // fetch, and the rows into an evicting cache (not the defaults of keys a database that could not be
  // reached may hold): ServedTable.fill, what a lookup graph's misses of a cache call.
  void fill(const ServedTable& table, const int64_t* keys, int64_t n, float* rows);

  // fill, in the server's background threads (ServedTable.schedule_fill: the misses of a batch at or
  // above the hit-rate threshold).
  void schedule_fill(const ServedTable& table, const int64_t* keys, int64_t n);

  // The rows a lookup graph's SokFind reads for `tier` ("cache" or "volatile"). Throws
  // std::invalid_argument (graph_calls' message) where the table has no such table.
  const GraphRows& graph_table(const ServedTable& table, const std::string& tier) const;

  // Waits until the background work submitted so far (fills, copy-backs) is done.
  void wait_for_background_work();

  // server.py's apply_update: one online update written to the databases whose update_filters take
  // its model, then to the table's cache. Throws UpdateRejected (rows of another width, keys beyond
  // int32 with supportlonglong false: nothing written) and TierUnavailable (a database could not be
  // reached: the others and the cache have it; the source applies it again later).
  void apply_update(const Update& update);

  const std::string& path() const { return path_; }

 private:
  class Background;

  void load(const ModelConfig& model, ServedTable& table, const TableSource& source);
  std::vector<SharedTier*> shared_dbs(bool writable) const;
  std::vector<Tier*> writable_dbs() const;
  // fn(), or false (a warning the first time) where db cannot be reached.
  bool guarded(Tier& db, const char* what, const std::function<void()>& fn);
  // ServedTable's rows [n, dim] of keys from the cache or the volatile storage, the misses completed.
  void complete(const ServedTable& table, const int64_t* keys, int64_t n, float* rows, const uint8_t* found,
                bool cache);
  // server.py's fetch_from_databases: rows [n, dim]; known [n] (may be null) false where a key got
  // the default while a database could not be reached.
  void fetch_from_databases(const ServedTable& table, const int64_t* keys, int64_t n, float* rows,
                            std::vector<uint8_t>* known);

  const std::string path_;
  const PsConfig config_;
  std::unique_ptr<Tier> volatile_;
  DetTier* volatile_det_ = nullptr;  // volatile_, where it is the hash map that never evicts
  std::unique_ptr<Tier> persistent_;
  ModelFilters volatile_filters_, persistent_filters_;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<ServedTable>> tables_;
  std::map<std::string, ServedTable*> by_tag_;
  std::mutex unavailable_mu_;
  std::set<std::string> unavailable_;  // the names of the databases that did not answer last time
  std::unique_ptr<Background> background_;
  std::unique_ptr<DirectoryUpdateSource> updates_;  // null without an update_source
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_SERVER_HPP_
