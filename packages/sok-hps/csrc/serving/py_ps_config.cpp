// The ps_config reader (ps_config.hpp) in hierarchical_parameter_server._serving, which config.py's
// load_config calls: read_ps_config and parse_ps_config return the dict that config.py makes its
// dataclasses of (dicts, tuples for the dataclasses' tuples, in field order; what
// dataclasses.asdict(load_config(...)) gives), and raise _serving.ConfigError, a ValueError, which
// load_config raises again as its ConfigError. The constants config.py exports come from here.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "json.hpp"
#include "ps_config.hpp"
#include "py_str.hpp"

namespace py = pybind11;

namespace {

using sok::hps::py_str;

py::tuple strings(const std::vector<std::string>& items) {
  py::tuple out(items.size());
  for (size_t i = 0; i < items.size(); ++i) out[i] = py_str(items[i]);
  return out;
}

template <class Number>
py::tuple numbers(const std::vector<Number>& items) {
  py::tuple out(items.size());
  for (size_t i = 0; i < items.size(); ++i) out[i] = py::cast(items[i]);
  return out;
}

py::dict as_dict(const sok::hps::ModelConfig& m) {
  py::dict d;
  d["model"] = py_str(m.model);
  d["sparse_files"] = strings(m.sparse_files);
  d["deployed_device_list"] = numbers(m.deployed_device_list);
  d["embedding_vecsize_per_table"] = numbers(m.embedding_vecsize_per_table);
  d["maxnum_catfeature_query_per_table_per_sample"] = numbers(m.maxnum_catfeature_query_per_table_per_sample);
  d["default_value_for_each_table"] = numbers(m.default_value_for_each_table);
  d["embedding_table_names"] = strings(m.embedding_table_names);
  d["dense_file"] = py_str(m.dense_file);
  d["max_batch_size"] = m.max_batch_size;
  d["gpucache"] = m.gpucache;
  d["gpucacheper"] = m.gpucacheper;
  d["hit_rate_threshold"] = m.hit_rate_threshold;
  d["cache_refresh_percentage_per_iteration"] = m.cache_refresh_percentage_per_iteration;
  d["num_of_worker_buffer_in_pool"] = m.num_of_worker_buffer_in_pool;
  d["num_of_refresher_buffer_in_pool"] = m.num_of_refresher_buffer_in_pool;
  d["thread_pool_size"] = m.thread_pool_size;
  d["embedding_cache_type"] = py_str(m.embedding_cache_type);
  d["use_static_table"] = m.use_static_table;
  d["use_context_stream"] = m.use_context_stream;
  d["use_hctr_cache_implementation"] = m.use_hctr_cache_implementation;
  d["init_ec"] = m.init_ec;
  d["enable_pagelock"] = m.enable_pagelock;
  d["fp8_quant"] = m.fp8_quant;
  d["fuse_embedding_table"] = m.fuse_embedding_table;
  d["maxnum_des_feature_per_sample"] = m.maxnum_des_feature_per_sample;
  d["refresh_delay"] = m.refresh_delay;
  d["refresh_interval"] = m.refresh_interval;
  return d;
}

py::dict as_dict(const sok::hps::VolatileDbConfig& v) {
  py::dict d;
  d["type"] = py_str(v.type);
  d["address"] = py_str(v.address);
  d["user_name"] = py_str(v.user_name);
  d["password"] = py_str(v.password);
  d["num_partitions"] = v.num_partitions;
  d["allocation_rate"] = v.allocation_rate;
  d["shared_memory_size"] = v.shared_memory_size;
  d["shared_memory_name"] = py_str(v.shared_memory_name);
  d["shared_memory_auto_remove"] = v.shared_memory_auto_remove;
  d["num_node_connections"] = v.num_node_connections;
  d["max_batch_size"] = v.max_batch_size;
  d["enable_tls"] = v.enable_tls;
  d["tls_ca_certificate"] = py_str(v.tls_ca_certificate);
  d["tls_client_certificate"] = py_str(v.tls_client_certificate);
  d["tls_client_key"] = py_str(v.tls_client_key);
  d["tls_server_name_identification"] = py_str(v.tls_server_name_identification);
  d["overflow_margin"] = v.overflow_margin;
  d["overflow_policy"] = py_str(v.overflow_policy);
  d["overflow_resolution_target"] = v.overflow_resolution_target;
  d["initial_cache_rate"] = v.initial_cache_rate;
  d["cache_missed_embeddings"] = v.cache_missed_embeddings;
  d["update_filters"] = strings(v.update_filters);
  d["initialize_after_startup"] = v.initialize_after_startup;
  return d;
}

py::dict as_dict(const sok::hps::PersistentDbConfig& p) {
  py::dict d;
  d["type"] = py_str(p.type);
  d["path"] = py_str(p.path);
  d["num_threads"] = p.num_threads;
  d["read_only"] = p.read_only;
  d["max_batch_size"] = p.max_batch_size;
  d["update_filters"] = strings(p.update_filters);
  d["initialize_after_startup"] = p.initialize_after_startup;
  return d;
}

py::dict as_dict(const sok::hps::UpdateSourceConfig& u) {
  py::dict d;
  d["type"] = py_str(u.type);
  d["path"] = py_str(u.path);
  d["poll_interval_ms"] = u.poll_interval_ms;
  return d;
}

py::dict as_dict(const sok::hps::PsConfig& c) {
  py::dict d;
  d["supportlonglong"] = c.supportlonglong;
  py::tuple models(c.models.size());
  for (size_t i = 0; i < c.models.size(); ++i) models[i] = as_dict(c.models[i]);
  d["models"] = models;
  d["volatile_db"] = as_dict(c.volatile_db);
  d["persistent_db"] = as_dict(c.persistent_db);
  d["update_source"] = as_dict(c.update_source);
  d["fuse_embedding_table"] = c.fuse_embedding_table;
  return d;
}

// The warnings to the Python callable `warn` (none where it is None), as str; called without the GIL.
sok::hps::WarningSink sink(const py::object& warn) {
  if (warn.is_none()) return nullptr;
  return [warn](const std::string& message) {
    py::gil_scoped_acquire gil;
    warn(py_str(message));
  };
}

}  // namespace

void bind_ps_config(py::module_& m) {
  static PyObject* config_error = nullptr;
  config_error = PyErr_NewExceptionWithDoc(
      "hierarchical_parameter_server._serving.ConfigError",
      "A ps_config the C++ reader refuses; the message is hierarchical_parameter_server.config's.", PyExc_ValueError,
      nullptr);
  if (config_error == nullptr) throw py::error_already_set();
  m.add_object("ConfigError", py::handle(config_error));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const sok::hps::ConfigError& e) {
      PyErr_SetObject(config_error, py_str(e.what()).ptr());  // a message may hold a lone surrogate
    }
  });
  m.def(
      "read_ps_config",
      [](const std::string& path, const py::object& warn, int64_t max_bytes) {
        sok::hps::PsConfig cfg;
        {
          const sok::hps::WarningSink w = sink(warn);
          py::gil_scoped_release release;  // a slow file (a FIFO, a network mount) blocks no other thread
          cfg = sok::hps::read_ps_config(path, w, max_bytes);
        }
        return as_dict(cfg);
      },
      py::arg("path"), py::arg("warn") = py::none(), py::arg("max_bytes") = sok::hps::kMaxConfigBytes,
      "The ps_config file at path (str or bytes) as a dict of dataclasses.asdict's shape; warn(message) for each "
      "warning; ConfigError where it cannot be served. At most max_bytes of the file are read.");
  m.def(
      "parse_ps_config",
      [](const std::string& json_text, const py::object& warn) {
        const sok::hps::json::Value root = sok::hps::json::parse(json_text, sok::hps::json::BigIntegers::kKeep);
        return as_dict(sok::hps::parse_ps_config(root, sink(warn)));
      },
      py::arg("json_text"), py::arg("warn") = py::none(),
      "The ps_config json_text holds, as read_ps_config; JsonParseError where the text is not JSON.");
  m.attr("MAX_CONFIG_BYTES") = sok::hps::kMaxConfigBytes;
  m.attr("MAX_POLL_INTERVAL_MS") = sok::hps::kMaxPollIntervalMs;
  m.attr("MAX_THREAD_POOL_SIZE") = sok::hps::kMaxThreadPoolSize;
  m.attr("MAX_PARTITIONS") = sok::hps::kMaxPartitions;
  m.attr("NO_OVERFLOW_LIMIT") = sok::hps::kNoOverflowLimit;
  py::dict policies;
  for (const auto& [name, aliases] : sok::hps::overflow_policies()) policies[py_str(name)] = strings(aliases);
  m.attr("OVERFLOW_POLICIES") = policies;
}
