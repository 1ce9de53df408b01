// HPS's ps_config (a JSON file) for the C++ server: read, checked and filled with NVIDIA's defaults,
// as hierarchical_parameter_server/config.py reads it. The structs mirror config.py's dataclasses
// field for field (PSConfig, ModelConfig, VolatileDBConfig, PersistentDBConfig, UpdateSourceConfig:
// same field names, same defaults, same order), every check is config.py's, in its order, and every
// ConfigError message is config.py's word for word, Python reprs included (py_text.hpp);
// tests/test_ps_config_cpp.py holds the two readers equal on every case of test_config.py and on
// mutated configs.
//
// What config.py logs as warnings (an unknown key and the nearest valid one, an ignored key, a Redis
// batch above REDIS_MAX_BATCH) goes to `warn`, in the same words and order; its debug lines (a key
// left at its default) are not written.
//
// Differences from config.py, all on input no ps_config holds:
// * an integer below -2**63 or above 2**64 - 1 (of at most 4300 digits) is a parse error
//   ("integer ... does not fit 64 bits", json.hpp), where config.py reads it, then refuses it as out
//   of range or, where it sets no upper bound, takes it;
// * an integer above 2**63 - 1 where config.py sets no upper bound (most integer keys, the items of
//   the integer arrays) is refused here ("expected an integer in [1, 9223372036854775807], got
//   ..."), where config.py takes it; overflow_margin takes up to 2**64 - 1 in both;
// * arrays and objects nested deeper than json::kMaxDepth (512) levels are "nested too deeply",
//   where config.py's limit is Python's recursion limit (about 1000 levels);
// * the port of a volatile_db.address entry is ASCII digits; config.py's str.isdigit() also takes
//   other Unicode digits (it reads '７０００' as 7000 and fails with int()'s ValueError on '²');
// * an update_filters entry is checked as py_regex.hpp says (its differences: \N{...} names, non-ASCII
//   group names and flags, nesting); the exceptions of re.compile other than re.error, which
//   config.py lets through (OverflowError for a repeat count of 2**32 - 1 or more, ...), are
//   ConfigError here, of the same message;
// * a path with a NUL byte raises ConfigError("embedded null byte"), config.py a plain ValueError of
//   that message; a path that is not UTF-8 is named in messages as if decoded (Python names its
//   bytes as '\udcXX').
//
// Example:
//   sok::hps::PsConfig cfg = sok::hps::read_ps_config("hps.json", [](const std::string& w) {
//     std::cerr << w << "\n";
//   });
//   cfg.models[0].embedding_vecsize_per_table[0];  // 16
//   cfg.volatile_db.type;                          // "parallel_hash_map"
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.hpp"
#include "limits.hpp"

namespace sok::hps {

// config.py's constants of the same names (kNoOverflowLimit and kMaxPartitions: limits.hpp).
// The largest float32, the bound of default_value_for_each_table.
constexpr double kFloat32Max = 3.4028234663852886e+38;
// The most bytes of a ps_config file read (a ps_config is a few KiB; this stops e.g. /dev/zero).
constexpr int64_t kMaxConfigBytes = int64_t{64} << 20;
// The longest update_source.poll_interval_ms: a day (longer waits overflow the poller's timer).
constexpr int64_t kMaxPollIntervalMs = int64_t{24} * 3600 * 1000;
// The most threads of a model's background pool (thread_pool_size).
constexpr int64_t kMaxThreadPoolSize = 1024;
// Redis pipelines longer than this many commands are not advised.
constexpr int64_t kRedisMaxBatch = 262143;

// A ps_config that cannot be served: config.py's ConfigError message (the key's path, the value,
// what is valid).
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// volatile_db.num_partitions' default: min(16, os.cpu_count() or 1).
int64_t default_num_partitions();
// persistent_db.path's default: os.path.join(tempfile.gettempdir(), "rocksdb").
std::string default_rocksdb_path();

struct ModelConfig {
  std::string model;
  std::vector<std::string> sparse_files;
  std::vector<int64_t> deployed_device_list;
  std::vector<int64_t> embedding_vecsize_per_table;
  std::vector<int64_t> maxnum_catfeature_query_per_table_per_sample;
  std::vector<double> default_value_for_each_table;  // one per table, padded with 0.0
  std::vector<std::string> embedding_table_names;    // default sparse_embedding0, sparse_embedding1, ...
  std::string dense_file;
  int64_t max_batch_size = 64;
  bool gpucache = true;
  double gpucacheper = 0.2;
  double hit_rate_threshold = 0.9;
  double cache_refresh_percentage_per_iteration = 0.0;
  int64_t num_of_worker_buffer_in_pool = 1;
  int64_t num_of_refresher_buffer_in_pool = 1;
  int64_t thread_pool_size = 16;
  std::string embedding_cache_type = "dynamic";
  bool use_static_table = false;
  bool use_context_stream = true;
  bool use_hctr_cache_implementation = true;
  bool init_ec = true;
  bool enable_pagelock = false;
  bool fp8_quant = false;
  bool fuse_embedding_table = true;
  int64_t maxnum_des_feature_per_sample = 26;
  double refresh_delay = 0.0;
  int64_t refresh_interval = 0;
};

struct VolatileDbConfig {
  std::string type = "parallel_hash_map";
  std::string address = "127.0.0.1:7000";
  std::string user_name = "default";
  std::string password;
  int64_t num_partitions = default_num_partitions();
  int64_t allocation_rate = 268435456;
  int64_t shared_memory_size = 17179869184;
  std::string shared_memory_name = "hctr_mp_hash_map_database";
  bool shared_memory_auto_remove = true;
  int64_t num_node_connections = 5;
  int64_t max_batch_size = 65536;
  bool enable_tls = false;
  std::string tls_ca_certificate = "cacertbundle.crt";
  std::string tls_client_certificate = "client_cert.pem";
  std::string tls_client_key = "client_key.pem";
  std::string tls_server_name_identification = "redis.localhost";
  uint64_t overflow_margin = kNoOverflowLimit;
  std::string overflow_policy = "evict_random";
  double overflow_resolution_target = 0.8;
  double initial_cache_rate = 1.0;
  bool cache_missed_embeddings = false;
  std::vector<std::string> update_filters = {".+"};
  bool initialize_after_startup = true;
};

struct PersistentDbConfig {
  std::string type = "disabled";
  std::string path = default_rocksdb_path();
  int64_t num_threads = 16;
  bool read_only = false;
  int64_t max_batch_size = 65536;
  std::vector<std::string> update_filters = {".+"};
  bool initialize_after_startup = true;
};

struct UpdateSourceConfig {
  std::string type = "null";
  std::string path;
  int64_t poll_interval_ms = 1000;
};

struct PsConfig {
  bool supportlonglong = false;
  std::vector<ModelConfig> models;
  VolatileDbConfig volatile_db;
  PersistentDbConfig persistent_db;
  UpdateSourceConfig update_source;
  bool fuse_embedding_table = false;
};

// Receives each warning config.py logs, e.g. "ps_config: unknown key models[0].gpucacheperc is
// ignored; did you mean 'gpucacheper'?"; none where empty.
using WarningSink = std::function<void(const std::string&)>;

// load_config(path): the ps_config file at `path`. Throws ConfigError.
PsConfig read_ps_config(const std::string& path, const WarningSink& warn = nullptr);
// load_config(mapping): the ps_config of a parsed JSON value. Throws ConfigError.
PsConfig parse_ps_config(const json::Value& root, const WarningSink& warn = nullptr);

}  // namespace sok::hps
