// sok::hps::Server: the C++ server of a ps_config (docs/design/hps-serving.md, step 3), what a
// process with no Python serves HPS's lookups with (native_calls.cc). One per ps_config file in the
// process (Server::of), made at its first lookup: the ps_config read by read_ps_config (ps_config.hpp,
// the reader config.py is held equal to), every model file loaded when it is made
// (model_files.hpp: all checked before any row is stored) into the in-process volatile DB
// (HashMapTier), a key the model files lack given the table's default_value.
//
// What it serves: a ps_config whose rows all live in the process, so that a lookup is exact (the
// rows of the model files, or the default): no persistent DB, no update source, and a volatile DB
// of type hash_map or parallel_hash_map that never evicts (no overflow_margin), or none (the
// Python server's cache then holds every row). Any other config is refused at its first lookup with
// a ConfigError that names the setting (its tiers are served by the Python server). The rows are
// held in one HashMapTier whatever the volatile DB says (that of the config when it has one). Unlike
// the Python server there is no cache to warm: a lookup is exact whatever its hit rate, where the
// Python server's evicting cache gives a batch below hit_rate_threshold the default for its misses.
//
// Example:
//   std::shared_ptr<Server> server = Server::of("/models/ps.json");
//   const ServedTable& t = server->table("foo", 0);
//   server->lookup(t, keys, n, rows);        // rows: float [n, t.dim]
#ifndef SOK_HPS_SERVING_SERVER_HPP_
#define SOK_HPS_SERVING_SERVER_HPP_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "hash_map_tier.hpp"
#include "ps_config.hpp"

namespace sok {
namespace hps {

// One table of one model as the server serves it.
struct ServedTable {
  std::string model;
  int64_t table_id = 0;
  std::string tag;  // hps_et.<model>.<table name>, the table's name in the tiers
  int64_t dim = 0;
  float default_value = 0.0f;
  int64_t max_keys = 0;        // max_batch_size x maxnum_catfeature_query_per_table_per_sample
  bool int64_keys = false;     // supportlonglong
  int64_t rows = 0;            // of its model file
};

class Server {
 public:
  // The process's server of the ps_config at `path` (made, and its config checked, on first use;
  // a path that failed is tried again). Throws ConfigError.
  static std::shared_ptr<Server> of(const std::string& path);

  // Checks that this server can serve `config` (see above), then opens and verifies every model
  // file, then loads them (server.py's order). Throws ConfigError and ModelFileError (model_files.hpp).
  Server(PsConfig config, std::string path);

  // Table table_id of model. Throws ConfigError: no such model or table.
  const ServedTable& table(const std::string& model, int64_t table_id) const;

  // rows [n, table.dim] of keys [n]: the model file's row, or table.default_value in every column.
  void lookup(const ServedTable& table, const int64_t* keys, int64_t n, float* rows);
  // rows [n, table.dim] of the keys found (found[i]); the others' rows are unspecified.
  void fetch(const ServedTable& table, const int64_t* keys, int64_t n, float* rows, bool* found);

  const std::string& path() const { return path_; }

 private:
  const PsConfig config_;
  const std::string path_;
  HashMapTier volatile_;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<ServedTable>> tables_;
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_SERVER_HPP_
