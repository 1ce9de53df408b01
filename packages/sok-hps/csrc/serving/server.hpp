// sok::hps::Server: the C++ server of a ps_config (docs/design/hps-serving.md, step 3), what a
// process with no Python serves HPS's lookups with (native_calls.cc). One per ps_config file in the
// process (Server::of), made at its first lookup: the ps_config read by read_ps_config (ps_config.hpp,
// the reader config.py is held equal to), every model file loaded when it is made
// (model_files.hpp: all checked before any row is stored) into one sok-backend-det CPU storage per
// table (det's open-addressing table, which the Python server's cache of every row is too), reached
// through the storage C ABI (sok/storage_api.h) of libsok_det_storage.so, which the process loads
// before libsok_hps_serving.so (det_storage_api()); a key the model files lack reads the table's
// default_value.
//
// What it serves: a ps_config whose rows all live in the process, so that a lookup is exact (the
// rows of the model files, or the default): no persistent DB, no update source, and a volatile DB
// of type hash_map or parallel_hash_map that never evicts (no overflow_margin), or none (the
// Python server's cache then holds every row). Any other config is refused at its first lookup with
// a ConfigError that names the setting (its tiers are served by the Python server). The rows are
// held in det storages whatever the volatile DB says (its partitions and allocation settings are the
// Python tier's, and do not change what a lookup reads). Unlike the Python server there is no cache
// to warm: a lookup is exact whatever its hit rate, where the Python server's evicting cache gives a
// batch below hit_rate_threshold the default for its misses.
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
#include <vector>

#include "ps_config.hpp"
#include "sok/storage_api.h"

namespace sok {
namespace hps {

// One table of one model as the server serves it.
struct ServedTable {
  std::string model;
  int64_t table_id = 0;
  std::string tag;  // hps_et.<model>.<table name>, the table's name in the tiers
  int64_t dim = 0;
  std::vector<float> default_row;  // [dim] of default_value_for_each_table: what a key the files lack reads
  int64_t max_keys = 0;        // max_batch_size x maxnum_catfeature_query_per_table_per_sample
  bool int64_keys = false;     // supportlonglong
  int64_t rows = 0;            // of its model file
  sok_storage* storage = nullptr;  // its rows: a det CPU storage (int64 keys, dim columns), the Server's
};

// sok-backend-det's function table, from libsok_det_storage.so (sok_det_storage_api), which the
// process must have loaded (TF_LoadLibrary, dlopen) before; found by dlopen RTLD_NOLOAD, so sok-hps
// needs no det at build time. Throws std::runtime_error, naming the library to load, where it is not
// loaded or is of another storage API version.
const sok_storage_api* det_storage_api();

class Server {
 public:
  // The process's server of the ps_config at `path` (made, and its config checked, on first use;
  // a path that failed is tried again). Throws ConfigError.
  static std::shared_ptr<Server> of(const std::string& path);

  // Checks that this server can serve `config` (see above), then opens and verifies every model
  // file, then loads them (server.py's order). Throws ConfigError and ModelFileError (model_files.hpp),
  // and std::runtime_error where det's library is not loaded (det_storage_api) or a det call fails.
  Server(PsConfig config, std::string path);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Table table_id of model. Throws ConfigError: no such model or table.
  const ServedTable& table(const std::string& model, int64_t table_id) const;

  // rows [n, table.dim] of keys [n]: the model file's row, or table.default_row.
  // Throws std::runtime_error (the det storage's message).
  void lookup(const ServedTable& table, const int64_t* keys, int64_t n, float* rows);

  // The det function table the tables' storages (ServedTable::storage) are driven through.
  const sok_storage_api* storage_api() const { return det_; }

  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  const sok_storage_api* const det_;
  std::map<std::pair<std::string, int64_t>, std::unique_ptr<ServedTable>> tables_;
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_SERVER_HPP_
