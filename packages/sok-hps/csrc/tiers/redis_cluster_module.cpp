// The binding of sok::hps::RedisClusterTier (redis_cluster_tier.hpp) into
// hierarchical_parameter_server._tiers, built where hiredis is (CMakeLists.txt); module.cpp calls
// bind_redis_cluster. tiers/redis_cluster_cpp.py wraps the class.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>

#include "py_tier.hpp"
#include "redis_cluster_tier.hpp"

namespace py = pybind11;

void bind_redis_cluster(py::module_& m) {
  using sok::hps::RedisClusterOptions;
  using sok::hps::RedisClusterTier;
  const RedisClusterOptions d;
  {  // RedisClusterOptions' defaults, which tiers/redis_cluster_defaults.py must hold too (the tests compare them)
    py::dict defaults;
    defaults["address"] = d.address;
    defaults["user_name"] = d.user_name;
    defaults["password"] = d.password;
    defaults["num_partitions"] = d.num_partitions;
    defaults["num_node_connections"] = d.num_node_connections;
    defaults["max_batch_size"] = d.max_batch_size;
    defaults["enable_tls"] = d.enable_tls;
    defaults["overflow_margin"] = d.overflow_margin;
    defaults["overflow_policy"] = d.overflow_policy;
    defaults["overflow_resolution_target"] = d.overflow_resolution_target;
    defaults["socket_timeout_s"] = d.socket_timeout_s;
    m.attr("REDIS_CLUSTER_DEFAULT_OPTIONS") = defaults;
  }
  py::class_<RedisClusterTier> cls(m, "RedisClusterTier",
                                   "sok::hps::RedisClusterTier (csrc/tiers/redis_cluster_tier.hpp).");
  sok::hps::py_tier::def_shared_tier(cls);
  cls.def(py::init([](const std::string& address, const std::string& user_name, const std::string& password,
                      int64_t num_partitions, int64_t num_node_connections, int64_t max_batch_size, bool enable_tls,
                      const py::int_& overflow_margin, const std::string& overflow_policy,
                      double overflow_resolution_target, double socket_timeout_s) {
            if (!(overflow_margin >= py::int_(1) && overflow_margin <= py::int_(UINT64_MAX))) {
              throw py::value_error("overflow_margin must be in [1, 2**64 - 1] (2**64 - 1: no limit), got " +
                                    py::repr(overflow_margin).cast<std::string>());
            }
            RedisClusterOptions o;
            o.address = address;
            o.user_name = user_name;
            o.password = password;
            o.num_partitions = num_partitions;
            o.num_node_connections = num_node_connections;
            o.max_batch_size = max_batch_size;
            o.enable_tls = enable_tls;
            o.overflow_margin = overflow_margin.cast<uint64_t>();
            o.overflow_policy = overflow_policy;
            o.overflow_resolution_target = overflow_resolution_target;
            o.socket_timeout_s = socket_timeout_s;
            return std::make_unique<RedisClusterTier>(o);
          }),
          py::arg("address"), py::arg("user_name"), py::arg("password"), py::arg("num_partitions"),
          py::arg("num_node_connections"), py::arg("max_batch_size"), py::arg("enable_tls"), py::arg("overflow_margin"),
          py::arg("overflow_policy"), py::arg("overflow_resolution_target"), py::arg("socket_timeout_s"));
}
