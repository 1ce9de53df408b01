// sok::hps::Server (server.hpp).
#include "server.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "hash_map_tier.hpp"
#include "log.hpp"
#include "model_files.hpp"
#include "py_errors.hpp"
#include "py_text.hpp"
#include "server_tiers.hpp"

namespace sok {
namespace hps {
namespace {

// Rows per chunk while a model file loads into the tiers (server.py's _LOAD_CHUNK_ROWS).
constexpr int64_t kLoadChunkRows = int64_t{1} << 16;

// Whether the model's tables have a cache (config.py's ModelConfig.has_cache).
bool has_cache(const ModelConfig& m) { return m.gpucache && m.gpucacheper > 0.0; }

bool has_database(const PsConfig& config) {
  return config.volatile_db.type != "disabled" || config.persistent_db.type != "disabled";
}

// The settings of `config` this server cannot serve, or "".
std::string unservable(const PsConfig& config) { return unbuilt_tier(config); }

// The source of update_source (a directory), made (its directory too) but not started; null
// without one. Throws ConfigError (server.py's message) where its path cannot be the directory.
std::unique_ptr<DirectoryUpdateSource> make_update_source(const UpdateSourceConfig& config) {
  if (config.type != "directory") return nullptr;
  UpdateSourceOptions options;
  options.poll_interval_s = static_cast<double>(config.poll_interval_ms) / 1000.0;
  options.log = [](LogLevel level, const std::string& message, const std::exception_ptr& error) {
    std::string line = message;
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        line += " (" + error_type_name(e) + ": " + e.what() + ")";
      } catch (...) {
        line += " (an exception of no std::exception type)";
      }
    }
    log(level, line);
  };
  try {
    return std::make_unique<DirectoryUpdateSource>(config.path, std::move(options));
  } catch (const OsError& error) {
    throw ConfigError("update_source.path " + py_repr(config.path) + " cannot be the directory of online updates: " +
                      std::strerror(error.code()) +
                      "; nothing was written. Give the path of a directory this process can create or write (not "
                      "a file), or remove what is in the way");
  }
}

// server.py's refusal of a model whose rows would be in no tier.
void check_rows_somewhere(const PsConfig& config) {
  if (has_database(config)) return;
  for (const ModelConfig& m : config.models) {
    if (has_cache(m)) continue;
    const std::string why = !m.gpucache ? "gpucache: false" : "gpucacheper: " + py_repr(m.gpucacheper) + " (no cache)";
    throw ConfigError("model " + py_repr(m.model) + " has " + why +
                      " and the ps_config has no database (volatile_db and persistent_db disabled): its rows would be "
                      "nowhere. Set gpucache: true with gpucacheper above 0 (1.0: the cache holds every row) or "
                      "configure a volatile_db or persistent_db");
  }
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

// A database's update_filters (`section`: "volatile_db"), or ConfigError naming the setting where
// the C++ server cannot run one (py_regex.hpp's checks passed when the ps_config was read).
ModelFilters update_filters(const std::vector<std::string>& patterns, const std::string& section) {
  try {
    return ModelFilters(patterns, section + ".update_filters entry");
  } catch (const ModelFilterError& e) {
    throw ConfigError(e.what());
  }
}

// The distinct keys of keys [n] in the order they first appear, and where each key's is.
void distinct_keys(const int64_t* keys, int64_t n, std::vector<int64_t>* distinct, std::vector<int64_t>* positions) {
  std::unordered_map<int64_t, int64_t> index;
  index.reserve(static_cast<size_t>(n));
  distinct->clear();
  positions->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    auto [it, made] = index.emplace(keys[i], static_cast<int64_t>(distinct->size()));
    if (made) distinct->push_back(keys[i]);
    (*positions)[i] = it->second;
  }
}

}  // namespace

// The server's background threads (server.py's ThreadPoolExecutor): fills and copy-backs, errors
// logged. Started at the first submit; the destructor runs what was submitted, then joins.
class Server::Background {
 public:
  explicit Background(int64_t threads) : threads_(std::max<int64_t>(1, threads)) {}
  ~Background() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void submit(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
      ++pending_;
      if (static_cast<int64_t>(workers_.size()) < threads_ && idle_ == 0) workers_.emplace_back([this] { run(); });
    }
    work_cv_.notify_one();
  }

  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // stopping, and nothing left
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      try {
        fn();
      } catch (const std::exception& e) {
        log(LogLevel::kError, std::string("HPS background work failed: ") + e.what());
      }
      lock.lock();
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  const int64_t threads_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> workers_;
  int64_t pending_ = 0, idle_ = 0;
  bool stopping_ = false;
};

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
    : path_(checked(config, std::move(path))),
      config_(std::move(config)),
      volatile_filters_(update_filters(config_.volatile_db.update_filters, "volatile_db")),
      persistent_filters_(update_filters(config_.persistent_db.update_filters, "persistent_db")) {
  int64_t threads = 1;
  for (const ModelConfig& m : config_.models) threads = std::max(threads, m.thread_pool_size);
  background_ = std::make_unique<Background>(threads);
  volatile_ = make_volatile_tier(config_.volatile_db);
  volatile_det_ = dynamic_cast<DetTier*>(volatile_.get());
  persistent_ = make_persistent_tier(config_.persistent_db);
  bool wrote_shared = false;
  try {
    updates_ = make_update_source(config_.update_source);
    // every model file opened, verified and its keys checked, then every shared database's width,
    // before a row is written anywhere
    std::vector<std::tuple<const ModelConfig*, std::unique_ptr<ServedTable>, TableSource>> sources;
    for (const ModelConfig& m : config_.models) {
      for (int64_t id = 0; id < static_cast<int64_t>(m.sparse_files.size()); ++id) {
        auto served = std::make_unique<ServedTable>();
        served->model = m.model;
        served->table_id = id;
        served->tag = "hps_et." + m.model + "." + m.embedding_table_names[id];
        served->dim = m.embedding_vecsize_per_table[id];
        served->default_value = static_cast<float>(m.default_value_for_each_table[id]);
        served->default_row.assign(static_cast<size_t>(served->dim), served->default_value);
        served->max_keys = m.max_batch_size * m.maxnum_catfeature_query_per_table_per_sample[id];
        served->int64_keys = config_.supportlonglong;
        served->hit_rate_threshold = m.hit_rate_threshold;
        TableSource source = open_table(m.sparse_files[id], served->dim);
        source.verify();
        check_key_range(*served, source);
        served->rows = source.rows();
        sources.emplace_back(&m, std::move(served), std::move(source));
      }
    }
    for (const auto& [m, served, source] : sources) {
      for (SharedTier* db : shared_dbs(/*writable=*/false)) {
        const int64_t stored = db->stored_dim(served->tag);
        if (stored >= 0 && stored != served->dim) {
          throw ConfigError(db->name() + " at " + db->location() + " holds table " + served->tag + " (table " +
                            std::to_string(served->table_id) + " of model " + py_repr(m->model) + ") with rows of " +
                            std::to_string(stored) + " floats, but embedding_vecsize_per_table gives " +
                            std::to_string(served->dim) + "; nothing was written. Set embedding_vecsize_per_table to " +
                            std::to_string(stored) +
                            ", or serve the new width from another database (persistent_db.path, "
                            "volatile_db.address) or under another model name, or remove the table's rows from " +
                            db->location());
        }
      }
    }
    for (auto& [m, served, source] : sources) {
      ServedTable& table = *served;
      by_tag_[table.tag] = &table;
      tables_.emplace(std::make_pair(table.model, table.table_id), std::move(served));
      wrote_shared = wrote_shared || !shared_dbs(/*writable=*/true).empty();
      load(*m, table, source);
    }
    if (updates_ != nullptr) {
      updates_->start([this](const Update& update) { apply_update(update); });
      log(LogLevel::kInfo, "HPS applies the online updates written to " + config_.update_source.path);
    }
  } catch (const std::exception& e) {
    if (wrote_shared) {
      std::string where;
      for (SharedTier* db : shared_dbs(/*writable=*/true)) {
        where += (where.empty() ? "" : " and ") + db->name() + " at " + db->location();
      }
      log(LogLevel::kError, "HPS start failed after it began writing " + where + " (" + e.what() +
                                "): the databases are partly re-deployed (the tables' rows of both models, rows the "
                                "new model lacks possibly erased) and lookups that read them get either; deploy again "
                                "(Init or reload) once the cause is fixed");
    }
    throw;
  }
}

Server::~Server() {
  if (updates_ != nullptr) updates_->stop();
  updates_.reset();
  background_.reset();  // its work reads the tables and the databases
  tables_.clear();
  for (Tier* db : {volatile_.get(), persistent_.get()}) {
    if (db == nullptr) continue;
    try {
      db->close();
    } catch (const std::exception& e) {
      log(LogLevel::kError, "HPS: closing " + db->name() + " failed: " + e.what());
    }
  }
}

std::vector<SharedTier*> Server::shared_dbs(bool writable) const {
  std::vector<SharedTier*> out;
  std::vector<Tier*> dbs = writable ? writable_dbs() : std::vector<Tier*>{volatile_.get(), persistent_.get()};
  for (Tier* db : dbs) {
    if (auto* shared = dynamic_cast<SharedTier*>(db)) out.push_back(shared);
  }
  return out;
}

std::vector<Tier*> Server::writable_dbs() const {
  std::vector<Tier*> out;
  if (volatile_ != nullptr) out.push_back(volatile_.get());
  if (persistent_ != nullptr && !config_.persistent_db.read_only) out.push_back(persistent_.get());
  return out;
}

void Server::load(const ModelConfig& model, ServedTable& table, const TableSource& source) {
  const std::vector<Tier*> writable = writable_dbs();
  const std::vector<SharedTier*> shared = shared_dbs(/*writable=*/true);
  for (SharedTier* db : shared) db->set_stored_dim(table.tag, table.dim);
  int64_t room = 0;  // rows the evicting cache is pre-filled with
  const int32_t key_type = table.int64_keys ? SOK_KEY_INT64 : SOK_KEY_INT32;  // of the cache, as the graph's keys
  if (has_cache(model) && has_database(config_) && model.gpucacheper < 1.0 &&
      model.embedding_cache_type != "static" && model.embedding_cache_type != "uvm") {
    auto cache = std::make_unique<EvictingCache>(table.tag, table.dim, capacity_of(table.rows, model.gpucacheper),
                                                 key_type);
    table.evicting_cache = cache.get();
    if (model.cache_refresh_percentage_per_iteration > 0 && model.init_ec) room = cache->capacity();
    table.cache = std::move(cache);
  } else if (has_cache(model)) {
    auto cache = std::make_unique<RowStorage>(det_storage_api(), "the cache of " + table.tag, table.dim, key_type,
                                              cache_device(), det_options(table.rows));
    table.full_cache = cache.get();
    table.cache = std::move(cache);
    table.cache_answers_all = persistent_ == nullptr && (volatile_ == nullptr || volatile_det_ != nullptr ||
                                                         dynamic_cast<HashMapTier*>(volatile_.get()) != nullptr);
  } else if (volatile_det_ != nullptr) {
    table.volatile_rows = volatile_det_->storage(table.tag, table.dim, table.rows);
  }
  std::vector<int64_t> keys(kLoadChunkRows);
  std::vector<float> rows(static_cast<size_t>(kLoadChunkRows * table.dim));
  TableChunks chunks = source.chunks(kLoadChunkRows);
  int64_t loaded = 0;
  for (int64_t n; (n = chunks.next(keys.data(), rows.data())) > 0; loaded += n) {
    for (Tier* db : writable) db->insert(table.tag, keys.data(), n, rows.data(), table.dim);
    if (table.full_cache != nullptr) {
      table.full_cache->insert(keys.data(), n, rows.data());
    } else if (loaded < room) {
      table.evicting_cache->insert(keys.data(), std::min(n, room - loaded), rows.data());
    }
  }
  int64_t stale = 0;
  for (SharedTier* db : shared) {
    stale += db->retain_only(table.tag, source.keys().data(), static_cast<int64_t>(source.keys().size()));
  }
  std::string names;
  for (Tier* db : writable) names += (names.empty() ? "" : ", ") + db->name();
  log(LogLevel::kInfo, "HPS table " + table.tag + ": " + std::to_string(loaded) + " rows loaded (" +
                           (names.empty() ? std::string("cache only") : names) + ")" +
                           (room > 0 ? "; cache pre-filled with " + std::to_string(std::min(loaded, room)) + " rows"
                                     : std::string()) +
                           (stale > 0 ? "; " + std::to_string(stale) + " rows of keys the model files lack erased"
                                      : std::string()));
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

const GraphRows& Server::graph_table(const ServedTable& table, const std::string& tier) const {
  const GraphRows* found = tier == "cache"      ? table.cache.get()
                            : tier == "volatile" ? table.volatile_rows.get()
                                                 : nullptr;
  if (found != nullptr) return *found;
  std::vector<std::string> has;
  if (table.cache != nullptr) has.push_back("cache");
  if (table.volatile_rows != nullptr) has.push_back("volatile");
  throw std::invalid_argument("table " + table.tag + " has no " + py_repr(tier) +
                              " table that a lookup graph reads; it has: " + py_repr(has));
}

bool Server::guarded(Tier& db, const char* what, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const TierUnavailable& e) {
    bool first;
    {
      std::lock_guard<std::mutex> lock(unavailable_mu_);
      first = unavailable_.insert(db.name()).second;
    }
    if (first) {
      log(LogLevel::kWarning, std::string("HPS ") + what + ": " + db.name() + " is unavailable (" + e.what() +
                                  "); going on without it until it answers");
    }
    return false;
  }
  bool was_down;
  {
    std::lock_guard<std::mutex> lock(unavailable_mu_);
    was_down = unavailable_.erase(db.name()) > 0;
  }
  if (was_down) log(LogLevel::kWarning, "HPS: " + db.name() + " answers again");
  return true;
}

void Server::fetch_from_databases(const ServedTable& table, const int64_t* keys, int64_t n, float* rows,
                                  std::vector<uint8_t>* known) {
  const int64_t dim = table.dim;
  const int64_t generation = table.generation.load();  // before the rows are read: a later update voids a copy-back
  for (int64_t i = 0; i < n; ++i) std::copy(table.default_row.begin(), table.default_row.end(), rows + i * dim);
  std::vector<uint8_t> missing(static_cast<size_t>(n), 1);
  bool answered = true;
  if (n > 0 && volatile_ != nullptr) {
    std::vector<float> values(static_cast<size_t>(n * dim));
    std::unique_ptr<bool[]> found(new bool[static_cast<size_t>(n)]);
    answered = guarded(*volatile_, "lookup",
                       [&] { volatile_->fetch(table.tag, keys, n, dim, values.data(), found.get()); });
    if (answered) {
      for (int64_t i = 0; i < n; ++i) {
        if (!found[i]) continue;
        std::copy(values.begin() + i * dim, values.begin() + (i + 1) * dim, rows + i * dim);
        missing[i] = 0;
      }
    }
  }
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; ++i) {
    if (missing[i]) idx.push_back(i);
  }
  if (persistent_ != nullptr && !idx.empty()) {
    const auto m = static_cast<int64_t>(idx.size());
    std::vector<int64_t> asked(idx.size());
    for (int64_t j = 0; j < m; ++j) asked[j] = keys[idx[j]];
    std::vector<float> values(static_cast<size_t>(m * dim));
    std::unique_ptr<bool[]> found(new bool[static_cast<size_t>(m)]);
    const bool got = guarded(*persistent_, "lookup", [&] {
      persistent_->fetch(table.tag, asked.data(), m, dim, values.data(), found.get());
    });
    answered = answered && got;
    if (got) {
      std::vector<int64_t> back_keys;
      std::vector<float> back_rows;
      for (int64_t j = 0; j < m; ++j) {
        if (!found[j]) continue;
        std::copy(values.begin() + j * dim, values.begin() + (j + 1) * dim, rows + idx[j] * dim);
        missing[idx[j]] = 0;
        back_keys.push_back(asked[j]);
        back_rows.insert(back_rows.end(), values.begin() + j * dim, values.begin() + (j + 1) * dim);
      }
      if (volatile_ != nullptr && config_.volatile_db.cache_missed_embeddings && !back_keys.empty()) {
        background_->submit([this, &table, generation, k = std::move(back_keys), r = std::move(back_rows)] {
          std::lock_guard<std::mutex> lock(table.lock);
          if (table.generation.load() != generation) {
            log(LogLevel::kDebug, "HPS copy-back of " + std::to_string(k.size()) + " rows of " + table.tag +
                                      " skipped: an update came after");
            return;
          }
          guarded(*volatile_, "copy back of persistent rows", [&] {
            volatile_->insert(table.tag, k.data(), static_cast<int64_t>(k.size()), r.data(), table.dim);
          });
        });
      }
    }
  }
  if (known != nullptr) {
    known->resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) (*known)[i] = !missing[i] || answered;
  }
}

void Server::fetch(const ServedTable& table, const int64_t* keys, int64_t n, float* rows) {
  fetch_from_databases(table, keys, n, rows, nullptr);
}

void Server::fill(const ServedTable& table, const int64_t* keys, int64_t n, float* rows) {
  std::lock_guard<std::mutex> lock(table.lock);  // no update between the fetch and the cache's insert
  std::vector<uint8_t> known;
  fetch_from_databases(table, keys, n, rows, &known);
  if (table.evicting_cache == nullptr) return;  // a cache of every row takes none: its misses are defaults
  std::vector<int64_t> k;
  std::vector<float> r;
  for (int64_t i = 0; i < n; ++i) {
    if (!known[i]) continue;
    k.push_back(keys[i]);
    r.insert(r.end(), rows + i * table.dim, rows + (i + 1) * table.dim);
  }
  if (!k.empty()) table.evicting_cache->insert(k.data(), static_cast<int64_t>(k.size()), r.data());
}

void Server::schedule_fill(const ServedTable& table, const int64_t* keys, int64_t n) {
  background_->submit([this, &table, k = std::vector<int64_t>(keys, keys + n)] {
    std::vector<float> rows(k.size() * static_cast<size_t>(table.dim));
    fill(table, k.data(), static_cast<int64_t>(k.size()), rows.data());
  });
}

void Server::wait_for_background_work() { background_->wait(); }

void Server::apply_update(const Update& update) {
  auto it = by_tag_.find(update.tag);
  if (it == by_tag_.end()) {
    log(LogLevel::kWarning, "HPS update of " + update.tag + " skipped: no model of the ps_config has that table");
    return;
  }
  ServedTable& table = *it->second;
  const auto n = static_cast<int64_t>(update.count);
  if (static_cast<int64_t>(update.dim) != table.dim) {
    throw UpdateRejected("update of " + update.tag + " has values of shape (" + std::to_string(n) + ", " +
                         std::to_string(update.dim) + ") for " + std::to_string(n) +
                         " keys, but the table's rows have width " + std::to_string(table.dim) +
                         "; write the update with [" + std::to_string(n) + ", " + std::to_string(table.dim) +
                         "] rows");
  }
  if (!table.int64_keys) {
    for (int64_t i = 0; i < n; ++i) {
      if (update.keys[i] < INT32_MIN || update.keys[i] > INT32_MAX) {
        throw UpdateRejected("an update of " + table.tag + " has key " + std::to_string(update.keys[i]) +
                             ", outside int32, but supportlonglong is false (int32 keys); set \"supportlonglong\": "
                             "true in the ps_config and look up int64 ids");
      }
    }
  }
  std::vector<Tier*> targets;
  if (volatile_ != nullptr && volatile_filters_.match(table.model)) targets.push_back(volatile_.get());
  if (persistent_ != nullptr && !config_.persistent_db.read_only && persistent_filters_.match(table.model)) {
    targets.push_back(persistent_.get());
  }
  if (has_database(config_) && targets.empty()) {
    log(LogLevel::kInfo, "HPS update of " + update.tag + " skipped: no database's update_filters take model " +
                             table.model);
    return;
  }
  std::string unreachable;
  {
    std::lock_guard<std::mutex> lock(table.lock);
    table.generation.fetch_add(1);
    for (Tier* db : targets) {
      try {
        db->insert(update.tag, update.keys, n, update.values, table.dim);
      } catch (const TierUnavailable& e) {
        if (unreachable.empty()) unreachable = e.what();
      }
    }
    if (table.full_cache != nullptr) {
      table.full_cache->insert(update.keys, n, update.values);
    } else if (table.evicting_cache != nullptr) {
      const int64_t cached = table.evicting_cache->update_present(update.keys, n, update.values);
      log(LogLevel::kDebug, "update of " + table.tag + ": " + std::to_string(cached) + " of " + std::to_string(n) +
                                " rows were cached and are updated");
    }
  }
  if (!unreachable.empty()) {
    throw TierUnavailable("update of " + update.tag + " not written everywhere: " + unreachable);
  }
  log(LogLevel::kInfo, "HPS applied an update of " + std::to_string(n) + " rows to " + update.tag);
}

void Server::complete(const ServedTable& table, const int64_t* keys, int64_t n, float* rows, const uint8_t* found,
                      bool cache) {
  std::vector<int64_t> where;
  for (int64_t i = 0; i < n; ++i) {
    if (!found[i]) where.push_back(i);
  }
  if (where.empty()) return;
  std::vector<int64_t> asked(where.size());
  for (size_t j = 0; j < where.size(); ++j) asked[j] = keys[where[j]];
  std::vector<int64_t> missing, positions;
  distinct_keys(asked.data(), static_cast<int64_t>(asked.size()), &missing, &positions);
  const int64_t dim = table.dim;
  bool fetched = !cache || table.hit_rate_threshold >= 1.0;
  if (!fetched) {
    std::unordered_set<int64_t> all(keys, keys + n);
    const double misses = static_cast<double>(missing.size()) / static_cast<double>(all.size());
    fetched = 1.0 - misses < table.hit_rate_threshold;
  }
  if (!fetched) {  // the default in this batch, the rows fetched in the background
    schedule_fill(table, missing.data(), static_cast<int64_t>(missing.size()));
    for (int64_t i : where) std::copy(table.default_row.begin(), table.default_row.end(), rows + i * dim);
    return;
  }
  std::vector<float> got(missing.size() * static_cast<size_t>(dim));
  if (cache) {
    fill(table, missing.data(), static_cast<int64_t>(missing.size()), got.data());
  } else {
    fetch_from_databases(table, missing.data(), static_cast<int64_t>(missing.size()), got.data(), nullptr);
  }
  for (size_t j = 0; j < where.size(); ++j) {
    std::copy(got.begin() + positions[j] * dim, got.begin() + (positions[j] + 1) * dim, rows + where[j] * dim);
  }
}

void Server::lookup(const ServedTable& table, const int64_t* keys, int64_t n, float* rows) {
  if (table.cache != nullptr && table.cache_answers_all) {
    table.cache->find(keys, n, rows, table.default_row.data(), nullptr);
    return;
  }
  const GraphRows* first = table.cache != nullptr ? table.cache.get() : table.volatile_rows.get();
  if (first != nullptr) {
    if (table.cache == nullptr && persistent_ == nullptr) {  // the hash map's storage holds every row there is
      first->find(keys, n, rows, table.default_row.data(), nullptr);
      return;
    }
    std::vector<uint8_t> found(static_cast<size_t>(n));
    first->find(keys, n, rows, nullptr, found.data());
    complete(table, keys, n, rows, found.data(), /*cache=*/table.cache != nullptr);
    return;
  }
  std::vector<int64_t> distinct, positions;
  distinct_keys(keys, n, &distinct, &positions);
  std::vector<float> got(distinct.size() * static_cast<size_t>(table.dim));
  fetch_from_databases(table, distinct.data(), static_cast<int64_t>(distinct.size()), got.data(), nullptr);
  for (int64_t i = 0; i < n; ++i) {
    const auto from = got.begin() + positions[i] * table.dim;
    std::copy(from, from + table.dim, rows + i * table.dim);
  }
}

}  // namespace hps
}  // namespace sok
