// sok::hps::Server (server.hpp).
#include "server.hpp"

#include <algorithm>
#include <climits>
#include <set>
#include <stdexcept>
#include <vector>

#include "model_files.hpp"
#include "py_text.hpp"
#include "sok/kit/loaded_library.hpp"

namespace sok {
namespace hps {
namespace {

// Rows per insert into a table's storage while a model file loads (server.py's _LOAD_CHUNK_ROWS).
constexpr int64_t kLoadChunkRows = int64_t{1} << 16;

// sok-backend-det's library and its entry point (sok_det_storage.h, which sok-hps does not include:
// det is reached at run time only).
constexpr char kDetLibrary[] = "libsok_det_storage.so";
constexpr char kDetEntry[] = "sok_det_storage_api";
using DetEntry = const sok_storage_api* (*)();

constexpr sok_exec_context kHost{SOK_DEVICE_CPU, 0, nullptr};

// Throws the det storage's message of a failed call.
void check(const sok_storage_api* api, sok_storage* storage, sok_status status, const std::string& what) {
  if (status != SOK_OK) throw std::runtime_error(what + ": " + api->last_error(storage));
}

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

// A det CPU storage of `table`'s rows: int64 keys, dim columns, slots for every row of its model file
// made at once (no rehash while it loads).
sok_storage* create_storage(const sok_storage_api* api, const ServedTable& table) {
  const std::string capacity = std::to_string(std::max<int64_t>(table.rows, 1));
  const char* names[] = {"init_capacity"};
  const char* values[] = {capacity.c_str()};
  sok_storage_config config{};
  config.struct_size = sizeof(sok_storage_config);
  config.key_type = SOK_KEY_INT64;
  config.row_width = static_cast<int32_t>(table.dim);
  config.device_type = SOK_DEVICE_CPU;
  config.device_id = 0;
  config.num_options = 1;
  config.option_names = names;
  config.option_values = values;
  sok_storage* storage = nullptr;
  check(api, nullptr, api->create(&config, &storage), "creating the det storage of " + table.tag);
  return storage;
}

// `path`, after ConfigError where `config` (its ps_config) is not one this server serves.
std::string checked(const PsConfig& config, std::string path) {
  const std::string what = unservable(config);
  if (!what.empty()) {
    throw ConfigError("ps_config " + py_repr(path) + " cannot be served without Python: its " + what +
                      ". Serve it from a Python process (the Python server has every tier), or change the setting");
  }
  check_rows_somewhere(config);
  return path;
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

const sok_storage_api* det_storage_api() {
  static const sok_storage_api* const api = [] {
    auto entry = reinterpret_cast<DetEntry>(loaded_library_symbol(kDetLibrary, kDetEntry));
    const sok_storage_api* found = entry != nullptr ? entry() : nullptr;
    if (found == nullptr) {
      throw std::runtime_error(
          std::string("the C++ server keeps its tables' rows in sok-backend-det's storage, and this process has "
                      "not loaded its library ") +
          kDetLibrary +
          ": load it (TF_LoadLibrary) before libsok_hps_serving.so, as graph_calls.serving_libraries() lists them "
          "(python -c \"from hierarchical_parameter_server import graph_calls; "
          "print(*graph_calls.serving_libraries())\"); it is in the package directory of sok-backend-det");
    }
    if (found->api_version != SOK_STORAGE_API_VERSION || !sok_storage_api_has(found, find)) {
      throw std::runtime_error(std::string(kDetLibrary) + " has storage API version " +
                               std::to_string(found->api_version) + ", and libsok_hps_serving.so was built for " +
                               std::to_string(SOK_STORAGE_API_VERSION) +
                               ": install sok-backend-det and sok-hps of the same release");
    }
    return found;
  }();
  return api;
}

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
    : path_(checked(config, std::move(path))), det_(det_storage_api()) {
  // server.py's order: every model file opened, verified and its keys checked before a row is stored
  std::vector<std::pair<std::unique_ptr<ServedTable>, TableSource>> sources;
  for (const ModelConfig& m : config.models) {
    for (int64_t id = 0; id < static_cast<int64_t>(m.sparse_files.size()); ++id) {
      auto served = std::make_unique<ServedTable>();
      served->model = m.model;
      served->table_id = id;
      served->tag = "hps_et." + m.model + "." + m.embedding_table_names[id];
      served->dim = m.embedding_vecsize_per_table[id];
      served->default_row.assign(static_cast<size_t>(served->dim),
                                 static_cast<float>(m.default_value_for_each_table[id]));
      served->max_keys = m.max_batch_size * m.maxnum_catfeature_query_per_table_per_sample[id];
      served->int64_keys = config.supportlonglong;
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
    // owned by tables_ from here, so that ~Server destroys it if a later table fails
    ServedTable& table = *served;
    tables_.emplace(std::make_pair(table.model, table.table_id), std::move(served));
    table.storage = create_storage(det_, table);
    TableChunks chunks = source.chunks(kLoadChunkRows);
    rows.resize(static_cast<size_t>(kLoadChunkRows * table.dim));
    const auto dim = static_cast<int32_t>(table.dim);
    for (int64_t n; (n = chunks.next(keys.data(), rows.data())) > 0;) {
      check(det_, table.storage,
            det_->insert_or_assign(table.storage, &kHost, n, keys.data(), 0, dim, rows.data(), nullptr, nullptr, 0),
            "loading " + source.path() + " into the det storage of " + table.tag);
    }
  }
}

Server::~Server() {
  for (auto& [key, table] : tables_) {
    if (table->storage != nullptr) det_->destroy(table->storage);
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

void Server::lookup(const ServedTable& table, const int64_t* keys, int64_t n, float* rows) {
  check(det_, table.storage,
        det_->find(table.storage, &kHost, n, keys, 0, static_cast<int32_t>(table.dim), rows, table.default_row.data(),
                   nullptr),
        "HPS lookup of " + table.tag);
}

}  // namespace hps
}  // namespace sok
