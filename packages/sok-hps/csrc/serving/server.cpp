// sok::hps::Server (server.hpp).
#include "server.hpp"

#include <algorithm>
#include <climits>
#include <set>
#include <vector>

#include "model_files.hpp"
#include "py_text.hpp"

namespace sok {
namespace hps {
namespace {

// Rows per insert into the tier while a model file loads (server.py's _LOAD_CHUNK_ROWS).
constexpr int64_t kLoadChunkRows = int64_t{1} << 16;

// The settings of `config` whose rows a C++ server cannot hold in the process, or "".
std::string unservable(const PsConfig& config) {
  const auto& v = config.volatile_db;
  const bool hash_map = v.type == "hash_map" || v.type == "parallel_hash_map";
  if (!hash_map && v.type != "disabled") {
    return "volatile_db.type " + py_repr(v.type) + " (served here: 'hash_map', 'parallel_hash_map', 'disabled')";
  }
  if (hash_map && v.overflow_margin != kNoOverflowLimit) {
    return "volatile_db.overflow_margin " + std::to_string(v.overflow_margin) +
           " (served here: none, so that no row is ever evicted)";
  }
  if (config.persistent_db.type != "disabled") {
    return "persistent_db.type " + py_repr(config.persistent_db.type) + " (served here: 'disabled')";
  }
  if (config.update_source.type != "null") {
    return "update_source.type " + py_repr(config.update_source.type) +
           " (served here: 'null'; its updates would be missed)";
  }
  return "";
}

// server.py's refusal of a model whose rows would be in no tier.
void check_rows_somewhere(const PsConfig& config) {
  if (config.volatile_db.type != "disabled") return;  // no persistent DB: unservable() said so
  for (const ModelConfig& m : config.models) {
    if (m.gpucache && m.gpucacheper > 0.0) continue;
    const std::string why = !m.gpucache ? "gpucache: false" : "gpucacheper: " + py_repr(m.gpucacheper) + " (no cache)";
    throw ConfigError("model " + py_repr(m.model) + " has " + why +
                      " and the ps_config has no database (volatile_db and persistent_db disabled): its rows would be "
                      "nowhere. Set gpucache: true with gpucacheper above 0 (1.0: the cache holds every row) or "
                      "configure a volatile_db or persistent_db");
  }
}

HashMapOptions volatile_options(const PsConfig& config) {
  HashMapOptions options;
  options.num_partitions = config.volatile_db.num_partitions;
  // Parallel whatever the type says: the server's tier is read by lookups only once loaded, and a
  // lookup's keys fetched by the worker pool give the same rows as on the caller's thread.
  options.parallel = true;
  options.allocation_rate = config.volatile_db.allocation_rate;
  options.max_batch_size = config.volatile_db.max_batch_size;
  return options;
}

const PsConfig& checked(const PsConfig& config, const std::string& path) {
  const std::string what = unservable(config);
  if (!what.empty()) {
    throw ConfigError("ps_config " + py_repr(path) + " cannot be served without Python: its " + what +
                      ". Serve it from a Python process (the Python server has every tier), or change the setting");
  }
  check_rows_somewhere(config);
  return config;
}

// server.py's _check_key_range: int32 keys (supportlonglong false) must hold the model file's.
void check_key_range(const ServedTable& table, const TableSource& source) {
  if (table.int64_keys) return;
  for (int64_t key : source.keys()) {
    if (key < INT32_MIN || key > INT32_MAX) {
      throw ModelFileError("the model file " + source.path() + " of " + table.tag + " has key " + std::to_string(key) +
                           ", outside int32, but supportlonglong is false (int32 keys); set \"supportlonglong\": "
                           "true in the ps_config and look up int64 ids");
    }
  }
}

}  // namespace

std::shared_ptr<Server> Server::of(const std::string& path) {
  static std::mutex mu;
  static auto* servers = new std::map<std::string, std::shared_ptr<Server>>;  // for the process's life
  std::lock_guard<std::mutex> lock(mu);
  auto it = servers->find(path);
  if (it != servers->end()) return it->second;
  auto server = std::make_shared<Server>(read_ps_config(path), path);
  servers->emplace(path, server);
  return server;
}

Server::Server(PsConfig config, std::string path)
    : config_(std::move(checked(config, path))), path_(std::move(path)), volatile_(volatile_options(config_)) {
  // server.py's order: every model file opened, verified and its keys checked before a row is stored
  std::vector<std::pair<std::unique_ptr<ServedTable>, TableSource>> sources;
  for (const ModelConfig& m : config_.models) {
    for (int64_t id = 0; id < static_cast<int64_t>(m.sparse_files.size()); ++id) {
      auto served = std::make_unique<ServedTable>();
      served->model = m.model;
      served->table_id = id;
      served->tag = "hps_et." + m.model + "." + m.embedding_table_names[id];
      served->dim = m.embedding_vecsize_per_table[id];
      served->default_value = static_cast<float>(m.default_value_for_each_table[id]);
      served->max_keys = m.max_batch_size * m.maxnum_catfeature_query_per_table_per_sample[id];
      served->int64_keys = config_.supportlonglong;
      TableSource source = open_table(m.sparse_files[id], served->dim);
      source.verify();
      check_key_range(*served, source);
      served->rows = source.rows();
      sources.emplace_back(std::move(served), std::move(source));
    }
  }
  std::vector<int64_t> keys(kLoadChunkRows);
  std::vector<float> rows;
  for (auto& [served, source] : sources) {
    TableChunks chunks = source.chunks(kLoadChunkRows);
    rows.resize(static_cast<size_t>(kLoadChunkRows * served->dim));
    for (int64_t n; (n = chunks.next(keys.data(), rows.data())) > 0;) {
      volatile_.insert(served->tag, keys.data(), n, rows.data(), served->dim);
    }
    const auto key = std::make_pair(served->model, served->table_id);
    tables_.emplace(key, std::move(served));
  }
}

const ServedTable& Server::table(const std::string& model, int64_t table_id) const {
  auto it = tables_.find({model, table_id});
  if (it != tables_.end()) return *it->second;
  std::set<std::string> names;
  int64_t count = 0;
  for (const auto& [key, served] : tables_) {
    names.insert(key.first);
    count += key.first == model;
  }
  if (names.count(model) == 0) {
    const std::vector<std::string> valid(names.begin(), names.end());
    throw ConfigError("model_name " + py_repr(model) + " is not in the ps_config; valid: " + py_repr(valid) +
                      "; fix model_name or the ps_config");
  }
  throw ConfigError("table_id " + std::to_string(table_id) + " of model " + py_repr(model) +
                    " is out of range; valid: 0 .. " + std::to_string(count - 1) + " (" + std::to_string(count) +
                    " tables in its sparse_files)");
}

void Server::fetch(const ServedTable& table, const int64_t* keys, int64_t n, float* rows, bool* found) {
  volatile_.fetch(table.tag, keys, n, table.dim, rows, found);
}

void Server::lookup(const ServedTable& table, const int64_t* keys, int64_t n, float* rows) {
  std::unique_ptr<bool[]> found(new bool[static_cast<size_t>(std::max<int64_t>(n, 1))]);
  fetch(table, keys, n, rows, found.get());
  for (int64_t i = 0; i < n; ++i) {
    if (!found[i]) std::fill(rows + i * table.dim, rows + (i + 1) * table.dim, table.default_value);
  }
}

}  // namespace hps
}  // namespace sok
