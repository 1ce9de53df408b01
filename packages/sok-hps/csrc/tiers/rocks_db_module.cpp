// The binding of sok::hps::RocksDbTier (rocks_db_tier.hpp) into hierarchical_parameter_server._tiers,
// where RocksDB was found (CMakeLists.txt; module.cpp calls bind_rocks_db). Besides the class: the
// options' defaults, the table format and the block cache's capacity, which the tests hold against
// the Python tier's, the fewest keys a fetch reads per thread, and the version of the RocksDB the
// tier is built with.
#include <pybind11/pybind11.h>

#include <rocksdb/version.h>

#include <cstdint>
#include <memory>
#include <string>

#include "py_tier.hpp"
#include "rocks_db_tier.hpp"

namespace py = pybind11;

void bind_rocks_db(py::module_& m) {
  using sok::hps::RocksDbOptions;
  using sok::hps::RocksDbTier;
  m.attr("ROCKSDB_VERSION") = std::to_string(ROCKSDB_MAJOR) + "." + std::to_string(ROCKSDB_MINOR) + "." +
                              std::to_string(ROCKSDB_PATCH);
  m.attr("ROCKS_DB_TABLE_FORMAT_VERSION") = sok::hps::kRocksDbTableFormatVersion;
  m.attr("ROCKS_DB_BLOCK_CACHE_BYTES") = sok::hps::kRocksDbBlockCacheBytes;
  m.attr("ROCKS_DB_KEYS_PER_THREAD") = sok::hps::kRocksDbKeysPerThread;
  {
    const RocksDbOptions o;
    py::dict defaults;
    defaults["num_threads"] = o.num_threads;
    defaults["read_only"] = o.read_only;
    defaults["max_batch_size"] = o.max_batch_size;
    m.attr("ROCKS_DB_DEFAULT_OPTIONS") = defaults;
  }

  py::class_<RocksDbTier> rocks_db(m, "RocksDbTier", "sok::hps::RocksDbTier (csrc/tiers/rocks_db_tier.hpp).");
  sok::hps::py_tier::def_shared_tier(rocks_db);
  rocks_db
      .def(py::init([](const std::string& path, int num_threads, bool read_only, int64_t max_batch_size) {
             RocksDbOptions o;
             o.path = path;
             o.num_threads = num_threads;
             o.read_only = read_only;
             o.max_batch_size = max_batch_size;
             py::gil_scoped_release released;  // opening replays the write-ahead log
             return std::make_unique<RocksDbTier>(o);
           }),
           py::arg("path"), py::arg("num_threads"), py::arg("read_only"), py::arg("max_batch_size"))
      .def_property_readonly("read_only", [](const RocksDbTier& t) { return t.options().read_only; })
      .def_property_readonly("max_batch_size", [](const RocksDbTier& t) { return t.options().max_batch_size; });
}
