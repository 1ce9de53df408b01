// The ps_config reader of ps_config.hpp.
#include "ps_config.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "close_match.hpp"
#include "py_regex.hpp"
#include "py_text.hpp"
#include "utf8.hpp"

namespace sok::hps {

bool is_name(std::string_view s) {
  return !s.empty() && s.size() <= kMaxNameLength && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

namespace {

using json::Type;
using json::Value;

const Choices& volatile_types() {
  static const Choices c = {{"disabled", {"disable", "none"}},
                            {"hash_map", {"hashmap", "hash", "map"}},
                            {"parallel_hash_map", {"parallel_hashmap", "parallel_hash", "parallel_map"}},
                            {"redis_cluster", {"redis"}}};
  return c;
}
const Choices& persistent_types() {
  static const Choices c = {{"disabled", {"disable", "none"}}, {"rocks_db", {"rocksdb", "rocks"}}};
  return c;
}
const Choices& update_source_types() {
  static const Choices c = {{"null", {"none"}}, {"directory", {"dir", "directory_watcher"}}};
  return c;
}
const Choices& cache_types() {
  static const Choices c = {{"dynamic", {}}, {"static", {}}, {"uvm", {}}, {"stochastic", {}}};
  return c;
}

// Values the original accepts that this package refuses: the reason and the fix; nullptr for others.
const char* refused(const std::string& lowered) {
  static const char* const kNoMultiProcess =
      "the multi-process hash map is not supported here; use 'parallel_hash_map' (one process) or "
      "'redis_cluster' (shared between processes)";
  static const char* const kNoKafka =
      "Kafka is not supported here; the update source is 'directory' (files written by "
      "hierarchical_parameter_server.updates.write_update or dump_increment)";
  for (const char* name :
       {"multi_process_hash_map", "multi_process_hashmap", "multi_process_hash", "multi_process_map"}) {
    if (lowered == name) return kNoMultiProcess;
  }
  for (const char* name : {"kafka_message_queue", "kafka_mq", "kafka"}) {
    if (lowered == name) return kNoKafka;
  }
  return nullptr;
}

// Keys of the original's documentation or of its Kafka source that are accepted and not used: why;
// nullptr for others.
const char* ignored(const std::string& key) {
  static const std::pair<const char*, const char*> kIgnored[] = {
      {"network_file", "not parsed by HPS"},
      {"label_dim", "not parsed by HPS"},
      {"slot_num", "not parsed by HPS"},
      {"brokers", "Kafka is not supported"},
      {"metadata_refresh_interval_ms", "Kafka is not supported"},
      {"receive_buffer_size", "Kafka is not supported"},
      {"poll_timeout_ms", "Kafka is not supported"},
      {"failure_backoff_ms", "Kafka is not supported"},
      {"max_commit_interval", "Kafka is not supported"},
      // update_source.max_batch_size: the Kafka consumer's buffer (the other sections know the key).
      {"max_batch_size", "Kafka is not supported"},
  };
  for (const auto& [name, why] : kIgnored) {
    if (key == name) return why;
  }
  return nullptr;
}

std::string describe(const Value& value) { return py_repr(value) + " (" + py_type_name(value) + ")"; }

// What is valid for an integer key, of at least `minimum` and no maximum, that is given a value
// above int64's maximum: the integer keys but overflow_margin are int64.
std::string beyond_int64(int64_t minimum) {
  return "expected an integer in [" + py_repr(minimum) + ", " + py_repr(std::numeric_limits<int64_t>::max()) + "]";
}

// Whether an integer is below int64's minimum (the negative ones of big()).
bool below_int64(const Value& value) { return value.big() && value.big_decimal()[0] == '-'; }

// The value as a double when it is a finite JSON number (not a boolean).
std::optional<double> finite(const Value& value) {
  if (!value.is_number()) return std::nullopt;
  const double number = value.as_number();
  return std::isfinite(number) ? std::optional<double>(number) : std::nullopt;
}

// str.lower() as far as matching ASCII names goes: the one non-ASCII character whose lower case is
// ASCII is the Kelvin sign; any other leaves a character no name has (U+FFFF stands for it).
std::string lower_for_match(const std::string& value) {
  std::string out;
  for (const uint32_t cp : code_points(value)) {
    if (cp >= 'A' && cp <= 'Z') {
      out += static_cast<char>(cp - 'A' + 'a');
    } else if (cp == 0x212A) {
      out += 'k';
    } else if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {
      append_utf8(out, 0xFFFF);
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? separator : "") + items[i];
  return out;
}

// Reads the keys of one JSON object at `path`; remembers which keys it was asked for so that
// finish() can warn about the others.
class Reader {
 public:
  Reader(const Value& obj, std::string path, const WarningSink& warn) : obj_(obj), path_(std::move(path)), warn_(warn) {
    if (obj.type() != Type::kObject) {
      throw ConfigError((path_.empty() ? "ps_config" : path_) + ": expected a JSON object, got " + describe(obj));
    }
  }

  std::string where(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  ConfigError error(const std::string& key, const Value& value, const std::string& valid) const {
    return ConfigError(where(key) + ": " + valid + ", got " + describe(value));
  }

  // The member `key`, nullptr where absent (the caller takes the default).
  const Value* raw(const std::string& key) {
    known_.insert(key);
    return obj_.find(key);
  }

  // The member `key`; ConfigError where absent.
  const Value& required(const std::string& key) {
    const Value* value = raw(key);
    if (value == nullptr) throw ConfigError(where(key) + ": required key is missing; add it to the JSON object");
    return *value;
  }

  bool boolean(const std::string& key, std::optional<bool> fallback = std::nullopt) {
    const Value* value = member(key, fallback.has_value());
    if (value == nullptr) return *fallback;
    if (value->type() != Type::kBool) throw error(key, *value, "expected true or false");
    return value->as_bool();
  }

  int64_t integer(const std::string& key, std::optional<int64_t> fallback, int64_t minimum = 0,
                  std::optional<uint64_t> maximum = std::nullopt) {
    const Value* value = member(key, fallback.has_value());
    return value == nullptr ? *fallback : integer_of<int64_t>(key, *value, minimum, maximum);
  }

  template <class Int>
  Int integer_of(const std::string& key, const Value& value, int64_t minimum, std::optional<uint64_t> maximum) const {
    const std::string bounds =
        maximum ? "in [" + py_repr(minimum) + ", " + py_repr(*maximum) + "]" : ">= " + py_repr(minimum);
    const std::string valid = "expected an integer " + bounds;
    if (value.type() != Type::kInt) throw error(key, value, valid);
    if (value.big()) {  // beyond 64 bits: below every minimum, above every maximum
      throw error(key, value, below_int64(value) || maximum ? valid : beyond_int64(minimum));
    }
    if (value.above_int64()) {
      if (maximum && value.as_uint64() > *maximum) throw error(key, value, valid);
      if (value.as_uint64() > static_cast<uint64_t>(std::numeric_limits<Int>::max())) {
        throw error(key, value, beyond_int64(minimum));  // the key is int64 (ps_config.hpp)
      }
      return static_cast<Int>(value.as_uint64());
    }
    const int64_t i = value.as_int();
    if (i < minimum || (maximum && i >= 0 && static_cast<uint64_t>(i) > *maximum)) throw error(key, value, valid);
    return static_cast<Int>(i);
  }

  double number(const std::string& key, std::optional<double> fallback, double low = 0.0, double high = HUGE_VAL,
                bool low_open = false) {
    const Value* value = member(key, fallback.has_value());
    if (value == nullptr) return *fallback;
    const std::string valid =
        std::isinf(high) ? std::string("expected a finite number ") + (low_open ? ">" : ">=") + " " + py_repr(low)
                         : std::string("expected a finite number in ") + (low_open ? "(" : "[") + py_repr(low) + ", " +
                               py_repr(high) + "]";
    const std::optional<double> n = finite(*value);
    if (!n || !(low <= *n && *n <= high) || (low_open && *n == low)) throw error(key, *value, valid);
    return *n;
  }

  std::string string(const std::string& key, std::optional<std::string> fallback, bool nonempty = false) {
    const Value* value = member(key, fallback.has_value());
    if (value == nullptr) return *fallback;
    if (value->type() != Type::kString || (nonempty && value->as_string().empty())) {
      throw error(key, *value, nonempty ? "expected a non-empty string" : "expected a string");
    }
    return value->as_string();
  }

  std::string choice(const std::string& key, const std::string& fallback, const Choices& choices) {
    const Value* value = raw(key);
    if (value == nullptr) return fallback;
    std::vector<std::string> names;
    for (const auto& choice : choices) names.push_back(py_repr(choice.first));
    const std::string valid = join(names, ", ");
    if (value->type() != Type::kString) throw error(key, *value, "expected one of " + valid);
    const std::string lowered = lower_for_match(value->as_string());
    for (const auto& [name, aliases] : choices) {
      if (lowered == name || std::find(aliases.begin(), aliases.end(), lowered) != aliases.end()) return name;
    }
    if (const char* why = refused(lowered)) {
      throw ConfigError(where(key) + ": " + py_repr(value->as_string()) + " is refused: " + why);
    }
    throw error(key, *value, "expected one of " + valid + " (or an alias of them)");
  }

  // The items of the JSON array `value` of `key`, each checked by item(where, value).
  template <class Item>
  auto array_of(const std::string& key, const Value& value, Item item, bool nonempty = true) const {
    std::vector<decltype(item(std::string(), value))> out;
    if (value.type() != Type::kArray || (nonempty && value.as_array().empty())) {
      throw error(key, value, nonempty ? "expected a non-empty JSON array" : "expected a JSON array");
    }
    const json::Array& items = value.as_array();
    for (size_t i = 0; i < items.size(); ++i) out.push_back(item(where(key) + "[" + std::to_string(i) + "]", items[i]));
    return out;
  }

  template <class Item>
  auto array(const std::string& key, Item item, bool nonempty = true) {
    return array_of(key, required(key), item, nonempty);
  }

  void finish() const {
    if (!warn_) return;
    for (const auto& member : obj_.as_object()) {
      const std::string& key = member.first;
      if (known_.count(key)) continue;
      const std::string where_key = where(key);
      if (const char* why = ignored(key)) {
        warn_("ps_config: " + where_key + " is ignored (" + why + ")");
        continue;
      }
      const std::vector<std::string> known(known_.begin(), known_.end());  // sorted, as sorted(self.known)
      const std::optional<std::string> near = close_match(key, known);
      const std::string hint = near ? "; did you mean " + py_repr(*near) + "?" : "; valid keys: " + join(known, ", ");
      warn_("ps_config: unknown key " + where_key + " is ignored" + hint);
    }
  }

 private:
  const Value* member(const std::string& key, bool has_default) { return has_default ? raw(key) : &required(key); }

  const Value& obj_;
  std::string path_;
  const WarningSink& warn_;
  std::set<std::string> known_;
};

auto int_item(int64_t minimum) {
  return [minimum](const std::string& where, const Value& value) {
    if (value.type() != Type::kInt || below_int64(value) ||
        (!value.above_int64() && !value.big() && value.as_int() < minimum)) {
      throw ConfigError(where + ": expected an integer >= " + py_repr(minimum) + ", got " + describe(value));
    }
    if (value.above_int64() || value.big()) {  // the items are int64 (ps_config.hpp)
      throw ConfigError(where + ": " + beyond_int64(minimum) + ", got " + describe(value));
    }
    return value.as_int();
  };
}

// One entry of a model's default_value_for_each_table: the value of every row of a key no tier
// holds, so it must be a finite float32.
auto default_value_item(const std::string& model) {
  return [model](const std::string& where, const Value& value) {
    const std::optional<double> number = finite(value);
    if (!number || std::fabs(*number) > kFloat32Max) {
      throw ConfigError(where + " (model " + py_repr(model) +
                        "): expected a finite number within float32's range (|value| <= 3.4028235e+38), got " +
                        describe(value) + "; it fills the rows of keys no tier holds");
    }
    return *number;
  };
}

std::string str_item(const std::string& where, const Value& value) {
  if (value.type() != Type::kString || value.as_string().empty()) {
    throw ConfigError(where + ": expected a non-empty string, got " + describe(value));
  }
  return value.as_string();
}

std::string name_item(const std::string& where, const Value& value) {
  if (value.type() != Type::kString || !is_name(value.as_string())) {
    throw ConfigError(where +
                      ": expected a name of 1 to 120 letters, digits, '_' or '-' (it becomes part of the table "
                      "tag hps_et.<model>.<table>), got " +
                      describe(value));
  }
  return value.as_string();
}

std::string regex_item(const std::string& where, const Value& value) {
  if (value.type() != Type::kString) {
    throw ConfigError(where + ": expected a regular expression (a string), got " + describe(value));
  }
  if (const std::optional<PyRegexError> e = py_regex_error(value.as_string())) {
    throw ConfigError(where + ": " + py_repr(value.as_string()) + " is not a valid regular expression (" + e->message +
                      ")");
  }
  return value.as_string();
}

// str.strip(): Python's whitespace off both ends.
std::string py_strip(const std::string& s) {
  const std::vector<uint32_t> cps = code_points(s);
  size_t begin = 0, end = cps.size();
  while (begin < end && py_isspace(cps[begin])) ++begin;
  while (end > begin && py_isspace(cps[end - 1])) --end;
  std::string out;
  for (size_t i = begin; i < end; ++i) append_utf8(out, cps[i]);
  return out;
}

// parse_address: one host[:port] entry of volatile_db.address (port 6379 when absent).
void check_address(const std::string& entry) {
  const std::string stripped = py_strip(entry);
  const size_t colon = stripped.rfind(':');
  const std::string host = colon == std::string::npos ? stripped : stripped.substr(0, colon);
  const std::string port = colon == std::string::npos ? "6379" : stripped.substr(colon + 1);
  const size_t first = port.find_first_not_of('0');  // int(port) reads past leading zeros
  const bool in_range = !port.empty() && port.find_first_not_of("0123456789") == std::string::npos &&
                        first != std::string::npos && port.size() - first <= 5 && std::stol(port.substr(first)) < 65536;
  if (host.empty() || !in_range) {
    throw ConfigError("volatile_db.address: " + py_repr(entry) +
                      " is not host[:port] (port 1..65535); write e.g. '127.0.0.1:7000'");
  }
}

ModelConfig read_model(const Value& obj, const std::string& path, const WarningSink& warn) {
  Reader r(obj, path, warn);
  ModelConfig cfg;
  const Value* name = r.raw("model");
  cfg.model = name_item(r.where("model"), name ? *name : Value::string(""));
  cfg.sparse_files = r.array("sparse_files", str_item);
  const size_t n = cfg.sparse_files.size();
  const auto per_table = [&](const std::string& key, size_t count) {
    if (count != n) {
      throw ConfigError(r.where(key) + ": has " + std::to_string(count) +
                        " entries, expected one per table of sparse_files (" + std::to_string(n) + ")");
    }
  };
  cfg.embedding_vecsize_per_table = r.array("embedding_vecsize_per_table", int_item(1));
  per_table("embedding_vecsize_per_table", cfg.embedding_vecsize_per_table.size());
  cfg.maxnum_catfeature_query_per_table_per_sample =
      r.array("maxnum_catfeature_query_per_table_per_sample", int_item(1));
  per_table("maxnum_catfeature_query_per_table_per_sample", cfg.maxnum_catfeature_query_per_table_per_sample.size());
  cfg.default_value_for_each_table = r.array("default_value_for_each_table", default_value_item(cfg.model), false);
  if (cfg.default_value_for_each_table.size() > n) {
    throw ConfigError(r.where("default_value_for_each_table") + ": has " +
                      std::to_string(cfg.default_value_for_each_table.size()) + " entries for " + std::to_string(n) +
                      " table(s); give at most one per table (missing ones are 0.0)");
  }
  if (const Value* names = r.raw("embedding_table_names")) {
    cfg.embedding_table_names = r.array_of("embedding_table_names", *names, name_item);
    per_table("embedding_table_names", cfg.embedding_table_names.size());
  } else {
    for (size_t i = 0; i < n; ++i) cfg.embedding_table_names.push_back("sparse_embedding" + std::to_string(i));
  }
  if (std::set<std::string>(cfg.embedding_table_names.begin(), cfg.embedding_table_names.end()).size() != n) {
    throw ConfigError(r.where("embedding_table_names") + ": names repeat in " + py_repr(cfg.embedding_table_names) +
                      "; make them unique");
  }
  cfg.deployed_device_list = r.array("deployed_device_list", int_item(0));
  const auto& devices = cfg.deployed_device_list;
  if (std::set<int64_t>(devices.begin(), devices.end()).size() != devices.size()) {
    throw ConfigError(r.where("deployed_device_list") + ": devices repeat in " + py_repr(devices));
  }
  // The optional keys, in this order (the first bad key is the one reported).
  const ModelConfig d;
  cfg.embedding_cache_type = r.choice("embedding_cache_type", d.embedding_cache_type, cache_types());
  cfg.use_static_table = r.boolean("use_static_table", d.use_static_table);
  cfg.dense_file = r.string("dense_file", d.dense_file);
  cfg.max_batch_size = r.integer("max_batch_size", d.max_batch_size, 1);
  cfg.gpucache = r.boolean("gpucache", d.gpucache);
  cfg.gpucacheper = r.number("gpucacheper", d.gpucacheper, 0.0, 1.0);
  cfg.hit_rate_threshold = r.number("hit_rate_threshold", d.hit_rate_threshold);
  cfg.cache_refresh_percentage_per_iteration =
      r.number("cache_refresh_percentage_per_iteration", d.cache_refresh_percentage_per_iteration, 0.0, 1.0);
  cfg.num_of_worker_buffer_in_pool = r.integer("num_of_worker_buffer_in_pool", d.num_of_worker_buffer_in_pool, 1);
  cfg.num_of_refresher_buffer_in_pool =
      r.integer("num_of_refresher_buffer_in_pool", d.num_of_refresher_buffer_in_pool, 1);
  cfg.thread_pool_size = r.integer("thread_pool_size", d.thread_pool_size, 1, kMaxThreadPoolSize);
  cfg.use_context_stream = r.boolean("use_context_stream", d.use_context_stream);
  cfg.use_hctr_cache_implementation = r.boolean("use_hctr_cache_implementation", d.use_hctr_cache_implementation);
  cfg.init_ec = r.boolean("init_ec", d.init_ec);
  cfg.enable_pagelock = r.boolean("enable_pagelock", d.enable_pagelock);
  cfg.fp8_quant = r.boolean("fp8_quant", d.fp8_quant);
  cfg.fuse_embedding_table = r.boolean("fuse_embedding_table", d.fuse_embedding_table);
  cfg.maxnum_des_feature_per_sample = r.integer("maxnum_des_feature_per_sample", d.maxnum_des_feature_per_sample);
  cfg.refresh_delay = r.number("refresh_delay", d.refresh_delay);
  cfg.refresh_interval = r.integer("refresh_interval", d.refresh_interval);
  // use_static_table forces the static cache, as in the original.
  if (cfg.use_static_table) cfg.embedding_cache_type = "static";
  cfg.default_value_for_each_table.resize(n, 0.0);
  r.finish();
  return cfg;
}

// The section `path` of the ps_config (`obj`: its JSON value, nullptr or null where absent), read by
// read_fields(reader, defaults); true where present.
template <class Config, class ReadFields>
bool read_section(const Value* obj, const std::string& path, const WarningSink& warn, ReadFields read_fields) {
  if (obj == nullptr || obj->is_null()) return false;
  Reader r(*obj, path, warn);
  read_fields(r, Config());
  r.finish();
  return true;
}

VolatileDbConfig read_volatile_db(const Value* obj, const WarningSink& warn) {
  VolatileDbConfig cfg;
  const bool present =
      read_section<VolatileDbConfig>(obj, "volatile_db", warn, [&cfg](Reader& r, const VolatileDbConfig& d) {
        cfg.type = r.choice("type", d.type, volatile_types());
        cfg.address = r.string("address", d.address, true);
        cfg.user_name = r.string("user_name", d.user_name);
        cfg.password = r.string("password", d.password);
        cfg.num_partitions = r.integer("num_partitions", d.num_partitions, 1, kMaxPartitions);
        cfg.allocation_rate = r.integer("allocation_rate", d.allocation_rate, 1);
        cfg.shared_memory_size = r.integer("shared_memory_size", d.shared_memory_size, 1);
        cfg.shared_memory_name = r.string("shared_memory_name", d.shared_memory_name);
        cfg.shared_memory_auto_remove = r.boolean("shared_memory_auto_remove", d.shared_memory_auto_remove);
        // At most num_partitions for Redis, which an absent num_partitions is raised to.
        cfg.num_node_connections = r.integer("num_node_connections", d.num_node_connections, 1, kMaxPartitions);
        cfg.max_batch_size = r.integer("max_batch_size", d.max_batch_size, 1);
        cfg.enable_tls = r.boolean("enable_tls", d.enable_tls);
        cfg.tls_ca_certificate = r.string("tls_ca_certificate", d.tls_ca_certificate);
        cfg.tls_client_certificate = r.string("tls_client_certificate", d.tls_client_certificate);
        cfg.tls_client_key = r.string("tls_client_key", d.tls_client_key);
        cfg.tls_server_name_identification =
            r.string("tls_server_name_identification", d.tls_server_name_identification);
        const Value* margin = r.raw("overflow_margin");
        cfg.overflow_margin =
            margin ? r.integer_of<uint64_t>("overflow_margin", *margin, 1, kNoOverflowLimit) : d.overflow_margin;
        cfg.overflow_policy = r.choice("overflow_policy", d.overflow_policy, overflow_policies());
        cfg.overflow_resolution_target =
            r.number("overflow_resolution_target", d.overflow_resolution_target, 0.0, 1.0, true);
        cfg.initial_cache_rate = r.number("initial_cache_rate", d.initial_cache_rate, 0.0, 1.0);
        cfg.cache_missed_embeddings = r.boolean("cache_missed_embeddings", d.cache_missed_embeddings);
        const Value* filters = r.raw("update_filters");
        cfg.update_filters = filters ? r.array_of("update_filters", *filters, regex_item, false) : d.update_filters;
        cfg.initialize_after_startup = r.boolean("initialize_after_startup", d.initialize_after_startup);
      });
  // Every host[:port] entry is checked now, not at connect time.
  for (size_t begin = 0;;) {
    const size_t comma = cfg.address.find(',', begin);
    check_address(cfg.address.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  if (cfg.type == "redis_cluster") {
    if (present && obj->find("num_partitions") == nullptr && cfg.num_partitions < cfg.num_node_connections) {
      // The default (cores, at most 16) can be below the default 5 connections on small machines.
      cfg.num_partitions = cfg.num_node_connections;
    }
    if (cfg.num_partitions < cfg.num_node_connections) {
      throw ConfigError("volatile_db.num_partitions: " + py_repr(cfg.num_partitions) +
                        " is below num_node_connections (" + py_repr(cfg.num_node_connections) +
                        "); Redis needs num_partitions >= num_node_connections");
    }
    if (cfg.max_batch_size > kRedisMaxBatch && warn) {
      warn("ps_config: volatile_db.max_batch_size " + py_repr(cfg.max_batch_size) + " is above " +
           py_repr(kRedisMaxBatch) + ", which Redis pipelines handle badly");
    }
  }
  return cfg;
}

PersistentDbConfig read_persistent_db(const Value* obj, const WarningSink& warn) {
  PersistentDbConfig cfg;
  read_section<PersistentDbConfig>(obj, "persistent_db", warn, [&cfg](Reader& r, const PersistentDbConfig& d) {
    cfg.type = r.choice("type", d.type, persistent_types());
    cfg.path = r.string("path", d.path, true);
    cfg.num_threads = r.integer("num_threads", d.num_threads, 1);
    cfg.read_only = r.boolean("read_only", d.read_only);
    cfg.max_batch_size = r.integer("max_batch_size", d.max_batch_size, 1);
    const Value* filters = r.raw("update_filters");
    cfg.update_filters = filters ? r.array_of("update_filters", *filters, regex_item, false) : d.update_filters;
    cfg.initialize_after_startup = r.boolean("initialize_after_startup", d.initialize_after_startup);
  });
  return cfg;
}

UpdateSourceConfig read_update_source(const Value* obj, const WarningSink& warn) {
  UpdateSourceConfig cfg;
  read_section<UpdateSourceConfig>(obj, "update_source", warn, [&cfg](Reader& r, const UpdateSourceConfig& d) {
    cfg.type = r.choice("type", d.type, update_source_types());
    cfg.path = r.string("path", d.path);
    cfg.poll_interval_ms = r.integer("poll_interval_ms", d.poll_interval_ms, 1, kMaxPollIntervalMs);
  });
  if (cfg.type == "directory" && cfg.path.empty()) {
    throw ConfigError("update_source.path: required when type is 'directory'; give the directory to watch");
  }
  return cfg;
}

// os.path.normpath of an absolute POSIX path.
std::string normpath(const std::string& path) {
  const size_t slashes = path.rfind("//", 0) == 0 && path.rfind("///", 0) != 0 ? 2 : 1;
  std::vector<std::string> parts;
  for (size_t begin = 0; begin <= path.size();) {
    size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(begin, end - begin);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    begin = end + 1;
  }
  return std::string(slashes, '/') + join(parts, "/");
}

// tempfile.gettempdir(): the first of $TMPDIR, $TEMP, $TMP, /tmp, /var/tmp, /usr/tmp and the working
// directory in which a file can be made.
std::string python_temp_dir() {
  std::vector<std::string> candidates;
  for (const char* name : {"TMPDIR", "TEMP", "TMP"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && *value != '\0') candidates.emplace_back(value);
  }
  for (const char* dir : {"/tmp", "/var/tmp", "/usr/tmp"}) candidates.emplace_back(dir);
  char cwd[4096];
  const bool have_cwd = ::getcwd(cwd, sizeof(cwd)) != nullptr;
  candidates.emplace_back(have_cwd ? cwd : ".");
  std::vector<std::string> tried;
  for (std::string dir : candidates) {
    if (dir != ".") dir = normpath(dir[0] == '/' || !have_cwd ? dir : std::string(cwd) + "/" + dir);
    tried.push_back(py_repr(dir));
    std::string name = dir + "/XXXXXX";
    const int fd = ::mkstemp(name.data());
    if (fd < 0) continue;
    const bool written = ::write(fd, "blat", 4) == 4;
    ::close(fd);
    ::unlink(name.c_str());
    if (written) return dir;
  }
  throw std::runtime_error("No usable temporary directory found in [" + join(tried, ", ") + "]");
}

[[noreturn]] void unreadable(const std::string& path, int error) {
  throw ConfigError("ps_config file " + py_repr(path) + " cannot be read (" + std::strerror(error) +
                    "); pass the path of a JSON file");
}

// Up to max_bytes + 1 bytes of the file at `path`. It is opened non-blocking, so that a FIFO
// without a writer reads as empty instead of blocking, then read blocking.
std::string read_bytes(const std::string& path, int64_t max_bytes) {
  if (path.find('\0') != std::string::npos) throw ConfigError("embedded null byte");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) unreadable(path, errno);
  struct stat st;
  int error = ::fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0;
  if (error == 0 && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) error = errno;
  std::string data;
  const size_t limit = static_cast<size_t>(max_bytes) + 1;
  while (error == 0 && data.size() < limit) {
    const size_t at = data.size();
    data.resize(std::min(limit, at + (size_t{1} << 16)));
    const ssize_t got = ::read(fd, data.data() + at, data.size() - at);
    if (got < 0 && errno == EINTR) {
      data.resize(at);
      continue;
    }
    if (got < 0) error = errno;
    data.resize(at + std::max<ssize_t>(got, 0));
    if (got <= 0) break;
  }
  ::close(fd);
  if (error != 0) unreadable(path, error);
  return data;
}

// The JSON value of the file at `path`, or ConfigError saying why there is none.
Value read_json(const std::string& path, int64_t max_bytes) {
  const std::string data = read_bytes(path, max_bytes);
  const std::string file = "ps_config file " + py_repr(path);
  if (data.size() > static_cast<size_t>(max_bytes)) {
    throw ConfigError(file + " is larger than " + std::to_string(max_bytes) +
                      " bytes; a ps_config is a small JSON file, pass its path");
  }
  if (const std::optional<Utf8Error> error = first_utf8_error(data)) {
    const size_t at = error->start;
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02x", static_cast<unsigned char>(data[at]));
    throw ConfigError(file + " is not UTF-8 text (byte " + byte + " at offset " + std::to_string(at) +
                      "); is it a binary file? Pass the path of a JSON ps_config");
  }
  const std::vector<uint32_t> cps = code_points(data);
  if (std::all_of(cps.begin(), cps.end(), py_isspace)) {
    throw ConfigError(file + " is empty; write the ps_config's JSON object into it");
  }
  try {
    return json::parse(data, json::BigIntegers::kKeep);
  } catch (const json::ParseError& e) {
    switch (e.reason()) {
      case json::ParseError::Reason::kTooDeep:
        throw ConfigError(file + " nests arrays or objects too deeply to parse; a ps_config nests 4 levels deep");
      case json::ParseError::Reason::kIntegerDigits:
      case json::ParseError::Reason::kIntegerRange:  // not raised under BigIntegers::kKeep
        throw ConfigError(file + " cannot be parsed: " + e.what());
      case json::ParseError::Reason::kSyntax:
        break;
    }
    throw ConfigError(file + " is not valid JSON: " + e.what());
  }
}

}  // namespace

const Choices& overflow_policies() {
  static const Choices c = {
      {"evict_random", {"random"}}, {"evict_least_used", {"least_used"}}, {"evict_oldest", {"oldest"}}};
  return c;
}

int64_t default_num_partitions() {
  const long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  return std::min<int64_t>(16, cores >= 1 ? cores : 1);
}

std::string default_rocksdb_path() {
  static const std::string temp_dir = python_temp_dir();  // computed once, as tempfile.tempdir
  return temp_dir == "/" ? "/rocksdb" : temp_dir + "/rocksdb";
}

PsConfig parse_ps_config(const Value& root, const WarningSink& warn) {
  Reader r(root, "", warn);
  PsConfig cfg;
  cfg.supportlonglong = r.boolean("supportlonglong");
  const Value& models = r.required("models");
  if (models.type() != Type::kArray || models.as_array().empty()) {
    throw r.error("models", models, "expected a non-empty JSON array of model objects");
  }
  for (size_t i = 0; i < models.as_array().size(); ++i) {
    cfg.models.push_back(read_model(models.as_array()[i], "models[" + std::to_string(i) + "]", warn));
  }
  for (size_t i = 0; i < cfg.models.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (cfg.models[j].model == cfg.models[i].model) {
        throw ConfigError("models[" + std::to_string(i) + "].model: " + py_repr(cfg.models[i].model) +
                          " is also the name of models[" + std::to_string(j) + "]; model names must be unique");
      }
    }
  }
  cfg.volatile_db = read_volatile_db(r.raw("volatile_db"), warn);
  cfg.persistent_db = read_persistent_db(r.raw("persistent_db"), warn);
  cfg.update_source = read_update_source(r.raw("update_source"), warn);
  cfg.fuse_embedding_table = r.boolean("fuse_embedding_table", false);
  r.finish();
  return cfg;
}

PsConfig read_ps_config(const std::string& path, const WarningSink& warn, int64_t max_bytes) {
  const Value root = read_json(path, max_bytes);
  if (root.type() != Type::kObject) {
    throw ConfigError("ps_config file " + py_repr(path) + " holds " + root.kind() +
                      "; a ps_config is a JSON object {\"supportlonglong\": ..., \"models\": [...]}");
  }
  return parse_ps_config(root, warn);
}

}  // namespace sok::hps
