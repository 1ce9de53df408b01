// make_volatile_tier and make_persistent_tier (server_tiers.hpp).
#include "server_tiers.hpp"

#include "det_tier.hpp"
#include "hash_map_tier.hpp"
#include "py_text.hpp"
#ifdef SOK_HPS_WITH_REDIS
#include "redis_cluster_tier.hpp"
#endif
#ifdef SOK_HPS_WITH_ROCKSDB
#include "rocks_db_tier.hpp"
#endif

namespace sok {
namespace hps {

std::string unbuilt_tier(const PsConfig& config) {
#ifndef SOK_HPS_WITH_REDIS
  if (config.volatile_db.type == "redis_cluster") {
    return "volatile_db.type 'redis_cluster' (this build of sok-hps has no C++ Redis tier: build it where "
           "libhiredis-dev is installed)";
  }
#endif
#ifndef SOK_HPS_WITH_ROCKSDB
  if (config.persistent_db.type == "rocks_db") {
    return "persistent_db.type 'rocks_db' (this build of sok-hps has no C++ RocksDB tier: build it where "
           "librocksdb-dev is installed)";
  }
#endif
  (void)config;
  return "";
}

std::unique_ptr<Tier> make_volatile_tier(const VolatileDbConfig& config) {
  if (config.type == "disabled") return nullptr;
#ifdef SOK_HPS_WITH_REDIS
  if (config.type == "redis_cluster") {
    RedisClusterOptions o;
    o.address = config.address;
    o.user_name = config.user_name;
    o.password = config.password;
    o.num_partitions = config.num_partitions;
    o.num_node_connections = config.num_node_connections;
    o.max_batch_size = config.max_batch_size;
    o.enable_tls = config.enable_tls;
    o.overflow_margin = config.overflow_margin;
    o.overflow_policy = config.overflow_policy;
    o.overflow_resolution_target = config.overflow_resolution_target;
    return std::make_unique<RedisClusterTier>(o);
  }
#endif
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
#ifdef SOK_HPS_WITH_ROCKSDB
  if (config.type == "rocks_db") {
    RocksDbOptions o;
    o.path = config.path;
    o.num_threads = static_cast<int>(config.num_threads);
    o.read_only = config.read_only;
    o.max_batch_size = config.max_batch_size;
    return std::make_unique<RocksDbTier>(o);
  }
#endif
  throw std::invalid_argument("persistent_db.type " + py_repr(config.type) + " has no C++ tier");
}

}  // namespace hps
}  // namespace sok
