// hierarchical_parameter_server._tiers: the Python binding of the C++ tiers (tier.hpp), for
// hierarchical_parameter_server.tiers.*_cpp and the tests that run the tier conformance suite on
// both implementations (the parts every tier's binding shares: py_tier.hpp). WITH_ROCKSDB and
// WITH_REDIS say whether the tiers over those services were built (where their client libraries
// were found).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "hash_map_tier.hpp"
#include "partition.hpp"
#include "py_tier.hpp"

namespace py = pybind11;
using sok::hps::HashMapOptions;
using sok::hps::HashMapTier;
using Keys = sok::hps::py_tier::Keys;

// The tiers over services, built where their client libraries are (CMakeLists.txt): each binding
// adds its class to the module.
#ifdef SOK_HPS_WITH_ROCKSDB
void bind_rocks_db(py::module_& m);  // rocks_db_module.cpp
#endif
#ifdef SOK_HPS_WITH_REDIS
void bind_redis_cluster(py::module_& m);  // redis_cluster_module.cpp
#endif

namespace {

// overflow_margin, a Python int of any size: one in [0, 2**64 - 1] as it is (HashMapTier refuses 0 with
// its message), another with that message and the value as given.
uint64_t margin_of(const py::int_& margin, int64_t max_batch_size, int64_t allocation_rate) {
  if (margin >= py::int_(0) && margin <= py::int_(UINT64_MAX)) return margin.cast<uint64_t>();
  throw py::value_error("max_batch_size, overflow_margin and allocation_rate must be >= 1, got " +
                        std::to_string(max_batch_size) + ", " + py::repr(margin).cast<std::string>() + ", " +
                        std::to_string(allocation_rate));
}

}  // namespace

PYBIND11_MODULE(_tiers, m) {
  m.doc() = "The C++ storage tiers of HPS (csrc/tiers): HashMapTier, and the partition function they share.";
  m.attr("NO_OVERFLOW_LIMIT") = py::int_(sok::hps::kNoOverflowLimit);
  m.attr("MAX_PARTITIONS") = sok::hps::kMaxPartitions;
  m.attr("PARALLEL_MIN_KEYS") = sok::hps::kParallelMinKeys;
  {  // HashMapOptions' defaults, which tiers/hash_map_defaults.py must hold too (the tests compare them)
    const HashMapOptions o;
    const char* policy = o.overflow_policy == sok::hps::OverflowPolicy::kEvictLeastUsed ? "evict_least_used"
                         : o.overflow_policy == sok::hps::OverflowPolicy::kEvictOldest  ? "evict_oldest"
                                                                                        : "evict_random";
    py::dict defaults;
    defaults["num_partitions"] = o.num_partitions;
    defaults["parallel"] = o.parallel;
    defaults["allocation_rate"] = o.allocation_rate;
    defaults["max_batch_size"] = o.max_batch_size;
    defaults["overflow_policy"] = policy;
    defaults["overflow_resolution_target"] = o.overflow_resolution_target;
    m.attr("DEFAULT_OPTIONS") = defaults;
  }
  sok::hps::py_tier::register_errors(m);

  m.def(
      "partition_of",
      [](const Keys& keys, int64_t num_partitions) {
        if (num_partitions < 1) {
          throw py::value_error("num_partitions must be >= 1, got " + std::to_string(num_partitions));
        }
        py::array_t<uint64_t> out(keys.size());
        const int64_t* k = keys.data();
        uint64_t* o = out.mutable_data();
        for (py::ssize_t i = 0; i < keys.size(); ++i) o[i] = sok::hps::partition_of(k[i], num_partitions);
        return out;
      },
      py::arg("keys"), py::arg("num_partitions"), "The partition of each int64 key (uint64 [n]), as partition.py's.");

  py::class_<HashMapTier> hash_map(m, "HashMapTier", "sok::hps::HashMapTier (csrc/tiers/hash_map_tier.hpp).");
  sok::hps::py_tier::def_tier(hash_map);
  hash_map
      .def(py::init([](int64_t num_partitions, bool parallel, int64_t allocation_rate, int64_t max_batch_size,
                       const py::int_& overflow_margin, const std::string& overflow_policy,
                       double overflow_resolution_target, std::optional<uint64_t> seed) {
             HashMapOptions o;
             o.num_partitions = num_partitions;
             o.parallel = parallel;
             o.allocation_rate = allocation_rate;
             o.max_batch_size = max_batch_size;
             o.overflow_margin = margin_of(overflow_margin, max_batch_size, allocation_rate);
             o.overflow_policy = sok::hps::parse_overflow_policy(overflow_policy);
             o.overflow_resolution_target = overflow_resolution_target;
             o.seed = seed;
             return std::make_unique<HashMapTier>(o);
           }),
           py::arg("num_partitions"), py::arg("parallel"), py::arg("allocation_rate"), py::arg("max_batch_size"),
           py::arg("overflow_margin"), py::arg("overflow_policy"), py::arg("overflow_resolution_target"),
           py::arg("seed"))
      .def_property_readonly("evicts", &HashMapTier::evicts)
      .def(
          "partition_contents",
          [](HashMapTier& tier, const std::string& tag) {
            py::dict out;
            for (auto& [p, c] : tier.partition_contents(tag)) {
              out[py::int_(p)] = py::make_tuple(py::array_t<int64_t>(c.keys.size(), c.keys.data()),
                                                py::array_t<int64_t>(c.access_counts.size(), c.access_counts.data()),
                                                c.rows_allocated);
            }
            return out;
          },
          py::arg("tag"));
  m.attr("WITH_ROCKSDB") = false;
  m.attr("WITH_REDIS") = false;
#ifdef SOK_HPS_WITH_ROCKSDB
  m.attr("WITH_ROCKSDB") = true;
  bind_rocks_db(m);
#endif
#ifdef SOK_HPS_WITH_REDIS
  m.attr("WITH_REDIS") = true;
  bind_redis_cluster(m);
#endif
}
