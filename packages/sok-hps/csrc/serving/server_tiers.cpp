// make_volatile_tier and make_persistent_tier (server_tiers.hpp).
#include "server_tiers.hpp"

#include "det_tier.hpp"
#include "hash_map_tier.hpp"
#include "py_text.hpp"

namespace sok {
namespace hps {

std::string unbuilt_tier(const PsConfig& config) {
  if (config.volatile_db.type == "redis_cluster") {
    return "volatile_db.type 'redis_cluster' (this build of sok-hps has no C++ Redis tier: build it where "
           "libhiredis-dev is installed)";
  }
  if (config.persistent_db.type == "rocks_db") {
    return "persistent_db.type 'rocks_db' (this build of sok-hps has no C++ RocksDB tier: build it where "
           "librocksdb-dev is installed)";
  }
  return "";
}

std::unique_ptr<Tier> make_volatile_tier(const VolatileDbConfig& config) {
  if (config.type == "disabled") return nullptr;
  if (config.type != "hash_map" && config.type != "parallel_hash_map") {
    throw std::invalid_argument("volatile_db.type " + py_repr(config.type) + " has no C++ tier");
  }
  if (config.overflow_margin == kNoOverflowLimit) return std::make_unique<DetTier>(config.type);
  HashMapOptions options;
  options.num_partitions = config.num_partitions;
  options.parallel = config.type == "parallel_hash_map";
  options.allocation_rate = config.allocation_rate;
  options.max_batch_size = config.max_batch_size;
  options.overflow_margin = config.overflow_margin;
  options.overflow_policy = parse_overflow_policy(config.overflow_policy);
  options.overflow_resolution_target = config.overflow_resolution_target;
  return std::make_unique<HashMapTier>(options);
}

std::unique_ptr<Tier> make_persistent_tier(const PersistentDbConfig& config) {
  if (config.type == "disabled") return nullptr;
  throw std::invalid_argument("persistent_db.type " + py_repr(config.type) + " has no C++ tier");
}

}  // namespace hps
}  // namespace sok
