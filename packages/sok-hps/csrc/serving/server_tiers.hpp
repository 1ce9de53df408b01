// The databases of a ps_config as the C++ server makes them (tiers/__init__.py's make_volatile_db and
// make_persistent_db): the volatile DB (hash_map / parallel_hash_map: a DetTier that never evicts,
// or, with overflow_margin, the evicting HashMapTier; redis_cluster: RedisClusterTier) and the
// persistent DB (rocks_db: RocksDbTier), or none where the type is "disabled". A tier over a
// service is built into sok-hps only where its client library was found (CMakeLists.txt); without
// it the config is refused, naming the setting.
#ifndef SOK_HPS_SERVING_SERVER_TIERS_HPP_
#define SOK_HPS_SERVING_SERVER_TIERS_HPP_

#include <memory>
#include <string>

#include "ps_config.hpp"
#include "tier.hpp"

namespace sok {
namespace hps {

// "" where this build makes the volatile DB and the persistent DB of config, else why not (the
// setting and what to do), for the server's ConfigError.
std::string unbuilt_tier(const PsConfig& config);

// The volatile DB of config, nullptr when disabled. Throws std::invalid_argument (a setting the tier
// refuses) and TierUnavailable.
std::unique_ptr<Tier> make_volatile_tier(const VolatileDbConfig& config);

// The persistent DB of config, nullptr when disabled. Throws TierUnavailable (it cannot be opened).
std::unique_ptr<Tier> make_persistent_tier(const PersistentDbConfig& config);

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_SERVER_TIERS_HPP_
