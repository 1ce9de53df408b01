// HPS's ps_config (a JSON file): read, checked and filled with NVIDIA's defaults. This is the one
// reader of a ps_config: the C++ server calls it, and hierarchical_parameter_server/config.py's
// load_config calls it through _serving (py_ps_config.cpp) and builds its dataclasses from what it
// returns, so Python and C++ cannot disagree. The structs have the fields of config.py's dataclasses
// (PSConfig, ModelConfig, VolatileDBConfig, PersistentDBConfig, UpdateSourceConfig: same names, same
// defaults, same order; tests/test_ps_config_cpp.py compares the defaults). A ConfigError's message
// names the key's path, the value as Python's repr writes it (py_text.hpp) and what is valid; where
// this reader differs from NVIDIA's on purpose, config.py's docstring says.
//
// The warnings (an unknown key and the nearest valid one, an ignored key, a Redis batch above
// kRedisMaxBatch) go to `warn`, which config.py logs.
//
// Where Python (json.loads, str.isdigit, re.compile) takes a value that this reader refuses or reads
// otherwise:
// * an integer above 2**63 - 1 is refused in the integer keys of no upper bound (most of them, and
//   the items of the integer arrays: "expected an integer in [1, 9223372036854775807], got ...");
//   overflow_margin takes up to 2**64 - 1;
// * arrays and objects nested deeper than json::kMaxDepth (512) levels are "nested too deeply";
// * the port of a volatile_db.address entry is ASCII digits (as config.parse_address reads it);
// * an update_filters entry is checked as py_regex.hpp says (its differences: \N{...} names,
//   non-ASCII group names and flags, nesting);
// * a path with a NUL byte raises ConfigError("embedded null byte"); a path that is not UTF-8 is
//   named in messages as os.fsdecode decodes it (its bytes as '\udcXX').
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
#include <string_view>
#include <utility>
#include <vector>

#include "json.hpp"
#include "limits.hpp"

namespace sok::hps {

// config.py's MAX_CONFIG_BYTES, MAX_POLL_INTERVAL_MS, MAX_THREAD_POOL_SIZE, MAX_PARTITIONS and
// NO_OVERFLOW_LIMIT are kMaxConfigBytes, kMaxPollIntervalMs, kMaxThreadPoolSize and limits.hpp's
// kMaxPartitions and kNoOverflowLimit, which _serving exports.
// The longest model or table name: config.py's NAME_PATTERN is [a-zA-Z0-9_\-]{1,120}.
constexpr size_t kMaxNameLength = 120;
// Whether `s` is a model or table name (NAME_PATTERN's full match): it becomes part of the table tag
// hps_et.<model>.<table>, which the online updates (update_files.hpp) check too.
bool is_name(std::string_view s);
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

// A ps_config that cannot be served; the message names the key's path, the value and what is valid
// (config.py raises it as its ConfigError).
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A key's canonical values, each with its aliases, in the order messages list them.
using Choices = std::vector<std::pair<std::string, std::vector<std::string>>>;
// volatile_db.overflow_policy's (config.py's OVERFLOW_POLICIES).
const Choices& overflow_policies();

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

// Receives each warning, e.g. "ps_config: unknown key models[0].gpucacheperc is
// ignored; did you mean 'gpucacheper'?"; none where empty.
using WarningSink = std::function<void(const std::string&)>;

// The ps_config file at `path`, of at most `max_bytes` (tests lower the limit). Throws ConfigError.
PsConfig read_ps_config(const std::string& path, const WarningSink& warn = nullptr,
                        int64_t max_bytes = kMaxConfigBytes);
// The ps_config of a parsed JSON value (json::parse with BigIntegers::kKeep, as read_ps_config
// parses a file). Throws ConfigError.
PsConfig parse_ps_config(const json::Value& root, const WarningSink& warn = nullptr);

}  // namespace sok::hps
