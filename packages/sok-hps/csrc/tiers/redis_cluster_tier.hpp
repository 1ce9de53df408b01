// sok::hps::RedisClusterTier: the shared volatile DB (volatile_db.type "redis_cluster") in C++, over
// the Redis project's C client hiredis (0.14: no cluster support, no TLS), doing what
// hierarchical_parameter_server.tiers.redis_cluster.RedisClusterTier does with redis-py.
//
// Layout (the Python tier's and the original's, so either reads what the other wrote): the rows of
// partition p of table tag are the hash "hps_et{<tag>/p<p>}v", p = partition_of(key,
// num_partitions) (partition.hpp); a field is the key's 8 little-endian bytes, its value the row's
// raw float32 bytes. The width of a table is the string "hps_et{<tag>}dim" (decimal text). Reads
// are HMGET and writes HSET, max_batch_size fields per command.
//
// Cluster routing is this tier's own: the slot map comes from CLUSTER SLOTS (asked of the
// configured addresses, then of the nodes last known), a key's slot is CRC16-XMODEM of its {hash
// tag} modulo 16384, as Redis computes it. The commands of one call are grouped by node and
// pipelined, every node's pipeline sent before any reply is read, so the nodes work at once. A
// MOVED reply sends the command again to the node it names and has the slot map asked for again;
// an ASK reply sends it again to the node it names, after ASKING; at most kRedirectRounds rounds
// per call. Each node has a pool of at most num_node_connections connections; a call holds one
// connection per node it sends to (taken in the order of the nodes' addresses, so calls never wait
// on each other in a cycle) and waits while a node has none free.
//
// Failures: a connection that fails (refused, reset, closed, no reply within socket_timeout_s), an
// error reply (CLUSTERDOWN, TRYAGAIN, LOADING, NOAUTH, ...) or a slot no node serves throws
// TierUnavailable, "redis_cluster at <address> cannot serve: <node>: <what>" ("cannot be reached"
// when no configured node answers CLUSTER SLOTS). The failing connection, the call's others with
// replies unread, and the idle ones to the failing node are closed, and the slot map is asked for
// again on the next call, so the tier works again once the node is back. A pooled connection that
// the node closed while it sat idle (a node restarted since) is replaced once within the call.
// SIGPIPE is blocked on the calling thread while the tier writes to a socket, so a node that goes
// away cannot kill a process that has not ignored it.
//
// Overflow (overflow_margin rows per partition): after an insert, each partition it wrote holding
// more than overflow_margin rows loses random rows (HRANDFIELD, HDEL) down to
// round(overflow_margin * overflow_resolution_target). Only "evict_random" is offered, as in the
// Python tier (the other policies need per-row access metadata that every fetch would have to
// write back to Redis). No TLS: hiredis 0.14 has none; enable_tls is refused.
//
// An insert does not check the width of rows already stored (the Python tier does not either; a
// server compares stored_dim before it writes); a fetch of another width than the stored rows'
// throws std::invalid_argument. Every call is thread-safe.
#ifndef SOK_HPS_TIERS_REDIS_CLUSTER_TIER_HPP_
#define SOK_HPS_TIERS_REDIS_CLUSTER_TIER_HPP_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "limits.hpp"
#include "tier.hpp"

namespace sok {
namespace hps {

// The most rounds of one call's commands: the first, then those that MOVED and ASK replies (and one
// replaced stale connection) send again.
inline constexpr int kRedirectRounds = 5;

// The settings of a RedisClusterTier, as volatile_db of a ps_config gives them (config.py says what
// each means); the defaults are the Python RedisClusterTier's. The constructor checks them.
struct RedisClusterOptions {
  std::string address = "127.0.0.1:7000";  // host[:port] entries (port 6379 where none), comma-separated
  std::string user_name = "default";       // AUTH user_name password on each connection, when password is set
  std::string password;                    // empty: no AUTH
  int64_t num_partitions = 8;              // hashes per table, 1 .. kMaxPartitions
  int64_t num_node_connections = 5;        // the most connections to one node, >= 1
  int64_t max_batch_size = 65536;          // fields per HSET / HMGET / HDEL, >= 1
  bool enable_tls = false;                 // true is refused: hiredis 0.14 has no TLS
  uint64_t overflow_margin = kNoOverflowLimit;  // the most rows per partition, >= 1
  std::string overflow_policy = "evict_random";  // the only policy offered (checked when a margin is set)
  double overflow_resolution_target = 0.8;       // evict down to this fraction of overflow_margin, (0, 1]
  double socket_timeout_s = 5.0;  // the longest wait to connect or for a node's reply, > 0
};

class RedisClusterTier final : public SharedTier {
 public:
  // Checks options (std::invalid_argument with what is wrong and how to fix it); connects on the
  // first call, not here.
  explicit RedisClusterTier(const RedisClusterOptions& options);
  ~RedisClusterTier() override;

  const std::string& name() const override { return name_; }
  // A table whose rows are of another width than dim throws std::invalid_argument.
  void fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows,
             bool* found) override;
  void insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows, int64_t dim) override;
  int64_t size(const std::string& tag) override;
  // Closes the connections (the rows stay in Redis); later calls throw TierClosed.
  void close() override;

  // options().address.
  const std::string& location() const override { return options_.address; }
  int64_t stored_dim(const std::string& tag) override;
  void set_stored_dim(const std::string& tag, int64_t dim) override;
  // Also erases the rows a deploy with another num_partitions left: rows in another partition than
  // their key's now, fields that are not 8-byte keys, and the hashes of partitions past
  // num_partitions (SCAN of every node).
  int64_t retain_only(const std::string& tag, const int64_t* keys, int64_t n) override;

  const RedisClusterOptions& options() const { return options_; }

  class Client;  // redis_cluster_tier.cpp: the slot map, the node pools, the pipelined rounds

 private:
  void resolve_overflow(const std::string& tag, const std::vector<int64_t>& partitions);

  const RedisClusterOptions options_;
  const std::string name_ = "redis_cluster";
  const uint64_t keep_rows_;  // rows an overflowing partition keeps
  const std::unique_ptr<Client> client_;
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_TIERS_REDIS_CLUSTER_TIER_HPP_
