// sok::hps::RedisClusterTier (redis_cluster_tier.hpp says what it does and how).
#include "redis_cluster_tier.hpp"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "overflow.hpp"
#include "partition.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "a field is the key's 8 little-endian bytes, sent as the key lies in memory");

namespace sok {
namespace hps {
namespace {

constexpr int kSlots = 16384;
// How many names one SCAN of retain_only asks a node for at a time.
constexpr const char* kScanCount = "1000";

// CRC16-XMODEM (polynomial 0x1021, initial value 0), the hash of Redis cluster's key slots.
constexpr std::array<uint16_t, 256> crc16_table() {
  std::array<uint16_t, 256> table{};
  for (int byte = 0; byte < 256; ++byte) {
    uint16_t crc = static_cast<uint16_t>(byte << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = static_cast<uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    }
    table[byte] = crc;
  }
  return table;
}
constexpr std::array<uint16_t, 256> kCrc16 = crc16_table();

uint16_t crc16(std::string_view text) {
  uint16_t crc = 0;
  for (const unsigned char c : text) crc = static_cast<uint16_t>((crc << 8) ^ kCrc16[((crc >> 8) ^ c) & 0xff]);
  return crc;
}

// The hash slot of key as Redis computes it: of the text between the first '{' and the first '}'
// after it where that text is not empty, else of the whole key.
int key_slot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return crc16(key) & (kSlots - 1);
}

// The hash of partition p of table tag: "hps_et{<tag>/p<p>}v".
std::string value_hash(const std::string& tag, int64_t p) { return "hps_et{" + tag + "/p" + std::to_string(p) + "}v"; }

// The string recording the row width of table tag: "hps_et{<tag>}dim".
std::string dim_key(const std::string& tag) { return "hps_et{" + tag + "}dim"; }

// text with the characters of Redis's glob patterns escaped, so that a pattern matches them as they are.
std::string glob_escaped(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// The 8 bytes of key, as the field of its row.
std::string_view key_field(const int64_t& key) { return {reinterpret_cast<const char*>(&key), sizeof(key)}; }

bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// A node's address: host, port and "host:port", the name its pool and messages go by.
struct Endpoint {
  std::string host;
  int port;
  std::string name;
};

// One "host[:port]" entry of the address setting, as config.parse_address reads it (port 6379 where
// none is given); std::invalid_argument with parse_address's message otherwise.
Endpoint parse_endpoint(const std::string& entry) {
  size_t begin = 0, end = entry.size();
  while (begin < end && is_ascii_space(entry[begin])) ++begin;
  while (end > begin && is_ascii_space(entry[end - 1])) --end;
  const std::string stripped = entry.substr(begin, end - begin);
  const size_t colon = stripped.rfind(':');
  const std::string host = colon == std::string::npos ? stripped : stripped.substr(0, colon);
  const std::string port = colon == std::string::npos ? "6379" : stripped.substr(colon + 1);
  int value = 0;
  bool valid = !host.empty() && !port.empty();
  for (const char c : port) {
    valid = valid && c >= '0' && c <= '9' && (value = value * 10 + (c - '0')) < 65536;
  }
  if (!valid || value < 1) {
    throw std::invalid_argument("volatile_db.address: '" + entry +
                                "' is not host[:port] (port 1..65535); write e.g. '127.0.0.1:7000'");
  }
  return {host, value, host + ":" + std::to_string(value)};
}

// The endpoints of an address setting: its comma-separated entries, each once.
std::vector<Endpoint> parse_endpoints(const std::string& address) {
  std::vector<Endpoint> out;
  for (size_t begin = 0;;) {
    const size_t comma = address.find(',', begin);
    Endpoint endpoint = parse_endpoint(address.substr(begin, comma == std::string::npos ? comma : comma - begin));
    const bool seen = std::any_of(out.begin(), out.end(), [&](const Endpoint& e) { return e.name == endpoint.name; });
    if (!seen) out.push_back(std::move(endpoint));
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

// The endpoint of a node as Redis names it ("ip:port" in CLUSTER SLOTS, MOVED and ASK).
Endpoint endpoint_of(const std::string& name) {
  const size_t colon = name.rfind(':');
  int port = 0;
  if (colon != std::string::npos) std::from_chars(name.data() + colon + 1, name.data() + name.size(), port);
  return {name.substr(0, colon == std::string::npos ? 0 : colon), port, name};
}

const RedisClusterOptions& checked(const RedisClusterOptions& o) {
  if (o.enable_tls) {
    throw std::invalid_argument(
        "enable_tls is true, but the C++ redis_cluster tier has no TLS: it is built on the Redis C client hiredis "
        "0.14 (Debian's libhiredis-dev), which has none. Serve this volatile_db from the Python tier "
        "(hierarchical_parameter_server.tiers.redis_cluster.RedisClusterTier, redis-py with TLS), or reach the "
        "cluster through a TLS-terminating proxy (e.g. stunnel) on this host and set enable_tls to false");
  }
  if (o.overflow_margin != kNoOverflowLimit && o.overflow_policy != "evict_random") {
    throw std::invalid_argument("redis_cluster supports overflow_policy 'evict_random' only, got '" +
                                o.overflow_policy +
                                "'; set volatile_db.overflow_policy to 'evict_random' or leave overflow_margin unset");
  }
  if (o.num_partitions < 1 || o.num_partitions > kMaxPartitions) {
    throw std::invalid_argument("num_partitions must be in [1, " + std::to_string(kMaxPartitions) + "], got " +
                                std::to_string(o.num_partitions));
  }
  if (o.num_node_connections < 1 || o.max_batch_size < 1 || o.overflow_margin < 1) {
    throw std::invalid_argument("num_node_connections, max_batch_size and overflow_margin must be >= 1, got " +
                                std::to_string(o.num_node_connections) + ", " + std::to_string(o.max_batch_size) +
                                ", " + std::to_string(o.overflow_margin));
  }
  check_overflow_resolution_target(o.overflow_resolution_target);
  if (!(o.socket_timeout_s > 0 && std::isfinite(o.socket_timeout_s))) {
    throw std::invalid_argument("socket_timeout_s must be a number of seconds > 0, got " +
                                py_float_repr(o.socket_timeout_s));
  }
  return o;
}

struct FreeReply {
  void operator()(redisReply* reply) const { freeReplyObject(reply); }
};
using Reply = std::unique_ptr<redisReply, FreeReply>;

struct FreeContext {
  void operator()(redisContext* context) const { redisFree(context); }
};
using Context = std::unique_ptr<redisContext, FreeContext>;

// One command of a call: the words it owns (the command, then the key that routes it), then
// arguments in memory that outlives the call (fields, rows). A command with `node` set is sent to
// that node instead of routed by its key (SCAN). `reply` is its reply once the call has run.
struct Command {
  std::vector<std::string> words;
  std::vector<std::string_view> args;
  std::string node;
  Reply reply;
};

Command command(std::vector<std::string> words) {
  Command out;
  out.words = std::move(words);
  return out;
}

// A node that failed a call: the node ("host:port"; empty where no node is to blame) and what
// happened. stale: a pooled connection that the node had closed (it restarted since), worth one
// more try on a new connection.
class NodeFailure : public std::runtime_error {
 public:
  NodeFailure(std::string node, const std::string& what, bool stale = false)
      : std::runtime_error(what), node(std::move(node)), stale(stale) {}
  std::string node;
  bool stale;
};

// SIGPIPE blocked on this thread while it lives, so that a write to a socket its node closed fails
// with EPIPE instead of killing the process; the SIGPIPE such a write raised is taken before the
// thread's mask is restored. errno is kept.
class SigpipeBlocked {
 public:
  SigpipeBlocked() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &previous_);
  }
  ~SigpipeBlocked() {
    const int saved = errno;
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) == -1 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
    errno = saved;
  }
  SigpipeBlocked(const SigpipeBlocked&) = delete;
  SigpipeBlocked& operator=(const SigpipeBlocked&) = delete;

 private:
  sigset_t pipe_, previous_;
  bool was_pending_;
};

// Appends command to the output buffer of context, ASKING first where asking.
void append(redisContext* context, const Command& c, bool asking) {
  if (asking) {
    const char* word = "ASKING";
    const size_t size = 6;
    redisAppendCommandArgv(context, 1, &word, &size);
  }
  std::vector<const char*> argv;
  std::vector<size_t> sizes;
  argv.reserve(c.words.size() + c.args.size());
  sizes.reserve(argv.capacity());
  for (const std::string& word : c.words) {
    argv.push_back(word.data());
    sizes.push_back(word.size());
  }
  for (const std::string_view arg : c.args) {
    argv.push_back(arg.data());
    sizes.push_back(arg.size());
  }
  redisAppendCommandArgv(context, static_cast<int>(argv.size()), argv.data(), sizes.data());
}

// Sends the output buffer of context; false (context->err set, errno as the failed call left it)
// when the connection failed.
bool flush(redisContext* context) {
  SigpipeBlocked blocked;
  int done = 0;
  while (!done) {
    if (redisBufferWrite(context, &done) != REDIS_OK) return false;
  }
  return true;
}

// The next reply on context; null (context->err set, errno as the failed call left it) when the
// connection failed.
Reply read_reply(redisContext* context) {
  void* reply = nullptr;
  if (redisGetReply(context, &reply) != REDIS_OK) return nullptr;
  return Reply(static_cast<redisReply*>(reply));
}

// What failed on context, for messages; error: errno right after the failure.
std::string failure_of(const redisContext& context, int error, double timeout_s) {
  if (context.err == REDIS_ERR_IO && (error == EAGAIN || error == EWOULDBLOCK)) {
    return "no reply within socket_timeout_s = " + py_float_repr(timeout_s) + " s";
  }
  if (context.err == REDIS_ERR_EOF) return "the node closed the connection";
  return context.errstr;
}

// Whether the node closed the connection (as a node does that restarted while it sat in a pool).
bool closed_by_node(const redisContext& context, int error) {
  return context.err == REDIS_ERR_EOF || (context.err == REDIS_ERR_IO && (error == ECONNRESET || error == EPIPE));
}

bool is_error(const redisReply& reply) { return reply.type == REDIS_REPLY_ERROR; }

std::string text_of(const redisReply& reply) { return std::string(reply.str, reply.len); }

}  // namespace

// The connections to the nodes and the slot map, shared by every call of a tier.
class RedisClusterTier::Client {
 public:
  explicit Client(const RedisClusterOptions& options)
      : options_(options), startup_(parse_endpoints(options.address)), timeout_(timeval_of(options.socket_timeout_s)) {}

  // Sends every command and reads its reply into it: routed by key slot to the nodes of the slot
  // map, pipelined per node, MOVED and ASK followed. Throws TierUnavailable (after it has closed
  // the failing connection, the call's others with replies unread and the failing node's idle
  // ones, and marked the slot map stale), TierClosed.
  void run(std::vector<Command>& commands) {
    check_open();
    if (commands.empty()) return;
    try {
      run_rounds(commands);
    } catch (const NodeFailure& failure) {
      drop(failure.node);
      mark_stale();
      throw TierUnavailable("redis_cluster at " + options_.address + " cannot serve: " +
                            (failure.node.empty() ? "" : failure.node + ": ") + failure.what());
    }
  }

  // The masters of the slot map ("host:port"). Throws TierUnavailable, TierClosed.
  std::vector<std::string> masters() {
    check_open();
    return slot_map()->masters;
  }

  void check_open() const {
    if (closed_.load(std::memory_order_acquire)) {
      throw TierClosed("this redis_cluster at " + options_.address + " is closed; make a new RedisClusterTier");
    }
  }

  // Closes the idle connections, and lent ones as they come back; later calls throw TierClosed.
  void close() {
    std::vector<Context> idle;
    {
      std::lock_guard<std::mutex> lock(pools_mutex_);
      closed_.store(true, std::memory_order_release);
      for (auto& [name, node] : nodes_) take_idle(node, idle);
    }
    pools_cv_.notify_all();
  }

 private:
  // The connections to one node: idle ones, how many are open (idle or lent), and a generation
  // that a failure of the node bumps (lent connections of an older one are closed when returned).
  struct Node {
    Endpoint endpoint;
    std::vector<Context> idle;
    int64_t open = 0;
    uint64_t generation = 0;
  };

  // A connection lent to a call; back to its node's pool unless replies of commands sent on it are
  // still unread (the call failed half way).
  struct Lease {
    Node* node = nullptr;
    Context context;
    uint64_t generation = 0;
    bool reused = false;  // from the pool, not made for this call
    bool replies_unread = false;
  };

  // The connections one round of a call holds, given back when it ends.
  class Held {
   public:
    explicit Held(Client& client) : client_(client) {}
    ~Held() {
      for (Lease& lease : leases) client_.give_back(lease);
    }
    std::vector<Lease> leases;

   private:
    Client& client_;
  };

  // Which master serves each hash slot.
  struct SlotMap {
    std::vector<std::string> masters;              // "host:port"
    std::vector<int32_t> owner = std::vector<int32_t>(kSlots, -1);  // index into masters, -1: none
  };

  static timeval timeval_of(double seconds) {
    seconds = std::min(seconds, 1e9);
    timeval out;
    out.tv_sec = static_cast<time_t>(seconds);
    out.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(out.tv_sec)) * 1e6);
    return out;
  }

  // The rounds of a call: every pending command sent to its node, replies read; those MOVED or
  // ASKed (or on a pooled connection the node had closed) go again in the next round.
  void run_rounds(std::vector<Command>& commands) {
    std::vector<size_t> pending(commands.size());
    std::iota(pending.begin(), pending.end(), size_t{0});
    std::vector<std::string> redirected(commands.size());  // the node a MOVED or ASK reply named
    std::vector<char> asking(commands.size(), 0);          // ASK: send ASKING first
    std::vector<std::string> target(commands.size());  // the node of the command's last round
    std::set<std::string> replaced;                    // nodes whose stale pooled connection was replaced
    for (int round = 1;; ++round) {
      const std::shared_ptr<const SlotMap> map = slot_map();
      std::map<std::string, std::vector<size_t>> by_node;  // ordered: connections are taken in this order
      for (const size_t i : pending) {
        const Command& c = commands[i];
        if (!c.node.empty()) {
          target[i] = c.node;
        } else if (!redirected[i].empty()) {
          target[i] = redirected[i];
        } else {
          const int slot = key_slot(c.words.at(1));
          if (map->owner[slot] < 0) {
            throw NodeFailure("", "no master serves hash slot " + std::to_string(slot) + " (of " + c.words[1] +
                                      "); the cluster is not ok, check CLUSTER INFO");
          }
          target[i] = map->masters[map->owner[slot]];
        }
        by_node[target[i]].push_back(i);
      }
      std::vector<size_t> again;
      {
        Held held(*this);
        for (const auto& node : by_node) held.leases.push_back(acquire(node.first));
        // A connection that failed: its node's commands without a reply go again in the next round
        // once, where the node had closed a pooled connection; else the call fails.
        auto failed = [&](Lease& lease, const std::vector<size_t>& sent, size_t from) {
          const int error = errno;
          const std::string& name = lease.node->endpoint.name;
          if (lease.reused && closed_by_node(*lease.context, error) && replaced.insert(name).second) {
            drop(name);
            again.insert(again.end(), sent.begin() + from, sent.end());
            return;
          }
          throw NodeFailure(name, failure_of(*lease.context, error, options_.socket_timeout_s));
        };
        std::vector<bool> sent_ok(by_node.size(), true);
        size_t k = 0;
        for (const auto& [name, sent] : by_node) {
          Lease& lease = held.leases[k];
          lease.replies_unread = true;
          for (const size_t i : sent) append(lease.context.get(), commands[i], asking[i]);
          if (!flush(lease.context.get())) {
            sent_ok[k] = false;
            failed(lease, sent, 0);
          }
          ++k;
        }
        k = 0;
        for (const auto& [name, sent] : by_node) {
          Lease& lease = held.leases[k];
          if (sent_ok[k++]) {
            bool read_all = true;
            for (size_t j = 0; j < sent.size() && read_all; ++j) {
              const size_t i = sent[j];
              Reply asked = asking[i] ? read_reply(lease.context.get()) : nullptr;
              Reply reply = !asking[i] || asked ? read_reply(lease.context.get()) : nullptr;
              if (!reply) {
                read_all = false;
                failed(lease, sent, j);
              }
              commands[i].reply = std::move(reply);
            }
            lease.replies_unread = !read_all;
          }
        }
      }
      for (const size_t i : pending) {
        Command& c = commands[i];
        if (!c.reply || !is_error(*c.reply)) continue;
        const std::string error = text_of(*c.reply);
        const size_t address = error.find(' ', error.find(' ') + 1);
        const bool moved = error.rfind("MOVED ", 0) == 0;
        if ((moved || error.rfind("ASK ", 0) == 0) && address != std::string::npos) {
          if (moved) mark_stale();  // and the next call's map has the slot's new node
          redirected[i] = error.substr(address + 1);
          asking[i] = !moved;
        } else {
          throw NodeFailure(target[i], c.words[0] + " " + (c.words.size() > 1 ? c.words[1] : "") + ": " + error);
        }
        c.reply.reset();
        again.push_back(i);
      }
      if (again.empty()) return;
      if (round == kRedirectRounds) {
        throw NodeFailure(target[again.front()], "still redirected (MOVED, ASK) after " +
                                                     std::to_string(kRedirectRounds) +
                                                     " rounds; the cluster may be resharding, try again");
      }
      std::sort(again.begin(), again.end());  // the order of the call: a later write of a key lands later
      pending = std::move(again);
    }
  }

  // A connection to node `name`: an idle one, else a new one while the node has fewer than
  // num_node_connections open, else the first one given back. Throws NodeFailure, TierClosed.
  Lease acquire(const std::string& name) {
    std::unique_lock<std::mutex> lock(pools_mutex_);
    auto it = nodes_.find(name);
    if (it == nodes_.end()) it = nodes_.emplace(name, Node{endpoint_of(name), {}, 0, 0}).first;
    Node& node = it->second;
    pools_cv_.wait(lock, [&] {
      return closed_.load(std::memory_order_relaxed) || !node.idle.empty() ||
             node.open < options_.num_node_connections;
    });
    check_open();
    Lease lease;
    lease.node = &node;
    lease.generation = node.generation;
    if (!node.idle.empty()) {
      lease.context = std::move(node.idle.back());
      node.idle.pop_back();
      lease.reused = true;
      return lease;
    }
    ++node.open;
    lock.unlock();
    try {
      lease.context = connect(node.endpoint);
    } catch (...) {
      lock.lock();
      --node.open;
      lock.unlock();
      pools_cv_.notify_all();
      throw;
    }
    return lease;
  }

  void give_back(Lease& lease) {
    if (lease.node == nullptr) return;
    Context closing;
    {
      std::lock_guard<std::mutex> lock(pools_mutex_);
      const bool reusable = !lease.replies_unread && lease.generation == lease.node->generation;
      if (reusable && !closed_.load(std::memory_order_relaxed)) {
        lease.node->idle.push_back(std::move(lease.context));
      } else {
        closing = std::move(lease.context);
        --lease.node->open;
      }
      lease.node = nullptr;
    }
    pools_cv_.notify_all();
  }

  // Moves node's idle connections into out (closed when out goes); under pools_mutex_.
  static void take_idle(Node& node, std::vector<Context>& out) {
    node.open -= static_cast<int64_t>(node.idle.size());
    for (Context& c : node.idle) out.push_back(std::move(c));
    node.idle.clear();
  }

  // Closes the idle connections to node `name`, and its lent ones as they come back.
  void drop(const std::string& name) {
    std::vector<Context> idle;
    {
      std::lock_guard<std::mutex> lock(pools_mutex_);
      const auto it = nodes_.find(name);
      if (it == nodes_.end()) return;
      ++it->second.generation;
      take_idle(it->second, idle);
    }
    pools_cv_.notify_all();
  }

  // One command on a connection of its own (AUTH, CLUSTER SLOTS); throws NodeFailure where the
  // connection fails.
  Reply exchange(redisContext* context, const Command& c, const std::string& name, bool reused) {
    append(context, c, false);
    Reply reply = flush(context) ? read_reply(context) : nullptr;
    if (!reply) {
      const int error = errno;
      throw NodeFailure(name, failure_of(*context, error, options_.socket_timeout_s),
                        reused && closed_by_node(*context, error));
    }
    return reply;
  }

  // A new connection to endpoint, authenticated where a password is set. Throws NodeFailure.
  Context connect(const Endpoint& endpoint) {
    Context context(redisConnectWithTimeout(endpoint.host.c_str(), endpoint.port, timeout_));
    if (!context) throw NodeFailure(endpoint.name, "hiredis could not allocate a connection");
    if (context->err) throw NodeFailure(endpoint.name, std::string("cannot connect: ") + context->errstr);
    if (redisSetTimeout(context.get(), timeout_) != REDIS_OK) {
      throw NodeFailure(endpoint.name, std::string("cannot set the socket timeout: ") + context->errstr);
    }
    redisEnableKeepAlive(context.get());
    if (!options_.password.empty()) {
      const Reply reply = exchange(context.get(), command({"AUTH", options_.user_name, options_.password}),
                                   endpoint.name, false);
      if (is_error(*reply)) {
        throw NodeFailure(endpoint.name, "AUTH as user '" + options_.user_name + "' was refused: " +
                                             text_of(*reply) + "; check volatile_db.user_name and password");
      }
    }
    return context;
  }

  void mark_stale() {
    std::lock_guard<std::mutex> lock(map_mutex_);
    ++stale_epoch_;
  }

  // The slot map, asked for again where a failure or a MOVED reply marked it stale since it was
  // made (by one thread at a time; the others wait for its map). Throws TierUnavailable.
  std::shared_ptr<const SlotMap> slot_map() {
    {
      std::lock_guard<std::mutex> lock(map_mutex_);
      if (map_ && map_epoch_ == stale_epoch_) return map_;
    }
    std::lock_guard<std::mutex> refreshing(refresh_mutex_);
    uint64_t epoch;
    std::shared_ptr<const SlotMap> previous;
    {
      std::lock_guard<std::mutex> lock(map_mutex_);
      if (map_ && map_epoch_ == stale_epoch_) return map_;
      epoch = stale_epoch_;
      previous = map_;
    }
    std::shared_ptr<const SlotMap> fresh = load_slot_map(previous.get());
    std::lock_guard<std::mutex> lock(map_mutex_);
    map_ = fresh;
    map_epoch_ = epoch;
    return fresh;
  }

  // CLUSTER SLOTS of the first node that answers: the configured ones, then the masters of the
  // previous map. Throws TierUnavailable naming every node's failure when none answers.
  std::shared_ptr<const SlotMap> load_slot_map(const SlotMap* previous) {
    std::vector<std::string> candidates;
    for (const Endpoint& e : startup_) candidates.push_back(e.name);
    if (previous != nullptr) {
      for (const std::string& m : previous->masters) {
        if (std::find(candidates.begin(), candidates.end(), m) == candidates.end()) candidates.push_back(m);
      }
    }
    std::string failures;
    for (const std::string& name : candidates) {
      for (int attempt = 0; attempt < 2; ++attempt) {  // a second where the pooled connection was stale
        try {
          Held held(*this);
          held.leases.push_back(acquire(name));
          Lease& lease = held.leases.back();
          lease.replies_unread = true;
          const Reply reply = exchange(lease.context.get(), command({"CLUSTER", "SLOTS"}), name, lease.reused);
          lease.replies_unread = false;
          return parse_slot_map(*reply, name);
        } catch (const NodeFailure& failure) {
          drop(name);
          if (failure.stale && attempt == 0) continue;
          failures += (failures.empty() ? "" : "; ") + name + ": " + failure.what();
          break;
        }
      }
    }
    throw TierUnavailable("redis_cluster at " + options_.address +
                          " cannot be reached: no node answered CLUSTER SLOTS (" + failures + ")");
  }

  // The map of a CLUSTER SLOTS reply of node `name`; NodeFailure for an error or a reply of
  // another form. A master without an IP is the node asked.
  static std::shared_ptr<const SlotMap> parse_slot_map(const redisReply& reply, const std::string& name) {
    if (is_error(reply)) throw NodeFailure(name, "CLUSTER SLOTS: " + text_of(reply));
    auto map = std::make_shared<SlotMap>();
    std::map<std::string, int32_t> index;
    const auto malformed = [&] { return NodeFailure(name, "CLUSTER SLOTS answered in a form this tier cannot read"); };
    if (reply.type != REDIS_REPLY_ARRAY) throw malformed();
    for (size_t e = 0; e < reply.elements; ++e) {
      const redisReply& range = *reply.element[e];
      if (range.type != REDIS_REPLY_ARRAY || range.elements < 3) throw malformed();
      const redisReply& first = *range.element[0];
      const redisReply& last = *range.element[1];
      const redisReply& master = *range.element[2];
      if (first.type != REDIS_REPLY_INTEGER || last.type != REDIS_REPLY_INTEGER || first.integer < 0 ||
          last.integer >= kSlots || first.integer > last.integer || master.type != REDIS_REPLY_ARRAY ||
          master.elements < 2 || master.element[0]->type != REDIS_REPLY_STRING ||
          master.element[1]->type != REDIS_REPLY_INTEGER) {
        throw malformed();
      }
      std::string host = text_of(*master.element[0]);
      if (host.empty()) host = endpoint_of(name).host;
      const std::string node = host + ":" + std::to_string(master.element[1]->integer);
      const auto [it, added] = index.emplace(node, static_cast<int32_t>(map->masters.size()));
      if (added) map->masters.push_back(node);
      std::fill(map->owner.begin() + first.integer, map->owner.begin() + last.integer + 1, it->second);
    }
    return map;
  }

  const RedisClusterOptions& options_;
  const std::vector<Endpoint> startup_;
  const timeval timeout_;
  std::atomic<bool> closed_{false};

  std::mutex pools_mutex_;  // guards nodes_ (the map and every Node in it)
  std::condition_variable pools_cv_;
  std::map<std::string, Node> nodes_;  // by "host:port"; never erased, so a Node& stays valid

  std::mutex refresh_mutex_;  // held by the thread that asks for the slot map
  std::mutex map_mutex_;      // guards map_, map_epoch_, stale_epoch_
  std::shared_ptr<const SlotMap> map_;
  uint64_t map_epoch_ = 0;    // stale_epoch_ when map_ was asked for
  uint64_t stale_epoch_ = 0;  // bumped by every failure and MOVED reply
};

RedisClusterTier::RedisClusterTier(const RedisClusterOptions& options)
    : options_(checked(options)),
      keep_rows_(keep_rows_of(options.overflow_margin, options.overflow_resolution_target)),
      client_(std::make_unique<Client>(options_)) {}

RedisClusterTier::~RedisClusterTier() = default;

namespace {

// The reply of c, which must be of type `type`; TierUnavailable naming the command otherwise.
const redisReply& reply_of(const Command& c, int type, const std::string& location) {
  if (c.reply->type != type) {
    throw TierUnavailable("redis_cluster at " + location + " cannot serve: " + c.words[0] + " " + c.words[1] +
                          " answered a reply of type " + std::to_string(c.reply->type) + ", expected " +
                          std::to_string(type) + " (hiredis's REDIS_REPLY_*)");
  }
  return *c.reply;
}

// The commands `verb` name field... of the keys of a call by partition (groups), at most
// max_batch_size fields each, and per command the range of groups.order it covers. with_rows: each
// field followed by its row of dim floats (HSET).
std::vector<Command> partition_commands(const char* verb, const std::string& tag, const Groups& groups,
                                        const int64_t* keys, int64_t max_batch_size, const float* rows,
                                        int64_t dim, std::vector<std::pair<int64_t, int64_t>>* spans) {
  std::vector<Command> out;
  for (const Groups::Group& g : groups.groups) {
    for (int64_t first = g.begin; first < g.end; first += max_batch_size) {
      const int64_t end = std::min(g.end, first + max_batch_size);
      Command c = command({verb, value_hash(tag, g.partition)});
      c.args.reserve((end - first) * (rows ? 2 : 1));
      for (int64_t i = first; i < end; ++i) {
        const int64_t at = groups.order[i];
        c.args.push_back(key_field(keys[at]));
        if (rows) c.args.emplace_back(reinterpret_cast<const char*>(rows + at * dim), dim * sizeof(float));
      }
      out.push_back(std::move(c));
      if (spans) spans->emplace_back(first, end);
    }
  }
  return out;
}

// HDEL commands of name for fields, max_batch_size each.
void append_deletes(const std::string& name, const std::vector<std::string_view>& fields, int64_t max_batch_size,
                    std::vector<Command>& out) {
  for (size_t first = 0; first < fields.size(); first += max_batch_size) {
    Command c = command({"HDEL", name});
    const size_t end = std::min(fields.size(), first + static_cast<size_t>(max_batch_size));
    c.args.assign(fields.begin() + first, fields.begin() + end);
    out.push_back(std::move(c));
  }
}

}  // namespace

void RedisClusterTier::fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows,
                             bool* found) {
  client_->check_open();
  check_dim(tag, dim);
  std::fill(rows, rows + n * dim, 0.0f);
  std::fill(found, found + n, false);
  if (n == 0) return;
  const Groups groups = group_by_partition(keys, n, options_.num_partitions);
  std::vector<std::pair<int64_t, int64_t>> spans;
  std::vector<Command> commands =
      partition_commands("HMGET", tag, groups, keys, options_.max_batch_size, nullptr, 0, &spans);
  client_->run(commands);
  std::set<size_t> other_sizes;  // bytes of stored rows of another width than dim
  for (size_t c = 0; c < commands.size(); ++c) {
    const redisReply& reply = reply_of(commands[c], REDIS_REPLY_ARRAY, options_.address);
    const auto [first, end] = spans[c];
    if (static_cast<int64_t>(reply.elements) != end - first) {
      throw TierUnavailable("redis_cluster at " + options_.address + " cannot serve: HMGET " + commands[c].words[1] +
                            " answered " + std::to_string(reply.elements) + " values for " +
                            std::to_string(end - first) + " fields");
    }
    for (int64_t i = first; i < end; ++i) {
      const redisReply& value = *reply.element[i - first];
      if (value.type == REDIS_REPLY_NIL) continue;
      if (value.type != REDIS_REPLY_STRING || value.len != static_cast<size_t>(dim) * sizeof(float)) {
        other_sizes.insert(value.len);
        continue;
      }
      const int64_t at = groups.order[i];
      std::memcpy(rows + at * dim, value.str, value.len);
      found[at] = true;
    }
  }
  if (!other_sizes.empty()) {
    std::string floats;
    for (const size_t bytes : other_sizes) floats += (floats.empty() ? "" : ", ") + std::to_string(bytes / 4);
    throw std::invalid_argument(tag + ": redis_cluster holds rows of [" + floats + "] floats, asked for dim " +
                                std::to_string(dim));
  }
}

void RedisClusterTier::insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows,
                              int64_t dim) {
  client_->check_open();
  check_dim(tag, dim);
  if (n == 0) return;
  // Positions ascend within a partition and the commands keep their order, so a repeated key's last
  // row is set last.
  const Groups groups = group_by_partition(keys, n, options_.num_partitions);
  std::vector<Command> commands =
      partition_commands("HSET", tag, groups, keys, options_.max_batch_size, rows, dim, nullptr);
  client_->run(commands);
  for (const Command& c : commands) reply_of(c, REDIS_REPLY_INTEGER, options_.address);
  if (options_.overflow_margin == kNoOverflowLimit) return;
  std::vector<int64_t> partitions;
  for (const Groups::Group& g : groups.groups) partitions.push_back(g.partition);
  resolve_overflow(tag, partitions);
}

void RedisClusterTier::resolve_overflow(const std::string& tag, const std::vector<int64_t>& partitions) {
  std::vector<Command> lengths;
  for (const int64_t p : partitions) lengths.push_back(command({"HLEN", value_hash(tag, p)}));
  client_->run(lengths);
  std::vector<Command> draws;
  for (const Command& c : lengths) {
    const uint64_t length = static_cast<uint64_t>(reply_of(c, REDIS_REPLY_INTEGER, options_.address).integer);
    if (length > options_.overflow_margin) {
      draws.push_back(command({"HRANDFIELD", c.words[1], std::to_string(length - keep_rows_)}));
    }
  }
  if (draws.empty()) return;
  client_->run(draws);
  std::vector<Command> deletes;  // their fields lie in the replies of draws
  for (const Command& c : draws) {
    const redisReply& victims = reply_of(c, REDIS_REPLY_ARRAY, options_.address);
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < victims.elements; ++i) fields.emplace_back(victims.element[i]->str, victims.element[i]->len);
    append_deletes(c.words[1], fields, options_.max_batch_size, deletes);
  }
  client_->run(deletes);
}

int64_t RedisClusterTier::size(const std::string& tag) {
  client_->check_open();
  std::vector<Command> lengths;
  for (int64_t p = 0; p < options_.num_partitions; ++p) lengths.push_back(command({"HLEN", value_hash(tag, p)}));
  client_->run(lengths);
  int64_t total = 0;
  for (const Command& c : lengths) total += reply_of(c, REDIS_REPLY_INTEGER, options_.address).integer;
  return total;
}

int64_t RedisClusterTier::stored_dim(const std::string& tag) {
  client_->check_open();
  std::vector<Command> recorded;
  recorded.push_back(command({"GET", dim_key(tag)}));
  client_->run(recorded);
  if (recorded[0].reply->type != REDIS_REPLY_NIL) {
    const std::string text = text_of(reply_of(recorded[0], REDIS_REPLY_STRING, options_.address));
    size_t begin = 0, end = text.size();
    while (begin < end && is_ascii_space(text[begin])) ++begin;
    while (end > begin && is_ascii_space(text[end - 1])) --end;
    int64_t dim = 0;
    const auto [stop, error] = std::from_chars(text.data() + begin, text.data() + end, dim);
    if (error != std::errc() || stop != text.data() + end || begin == end || dim < 1) {
      throw std::invalid_argument(tag + ": redis_cluster at " + options_.address + " holds '" + text + "' in " +
                                  dim_key(tag) + ", not a row width >= 1; set_stored_dim writes one");
    }
    return dim;
  }
  std::vector<Command> samples;
  for (int64_t p = 0; p < options_.num_partitions; ++p) {
    samples.push_back(command({"HRANDFIELD", value_hash(tag, p), "1", "WITHVALUES"}));
  }
  client_->run(samples);
  for (const Command& c : samples) {
    const redisReply& pair = reply_of(c, REDIS_REPLY_ARRAY, options_.address);
    if (pair.elements >= 2) return static_cast<int64_t>(pair.element[1]->len / sizeof(float));
  }
  return -1;
}

void RedisClusterTier::set_stored_dim(const std::string& tag, int64_t dim) {
  client_->check_open();
  check_dim(tag, dim);
  std::vector<Command> set;
  set.push_back(command({"SET", dim_key(tag), std::to_string(dim)}));
  client_->run(set);
  reply_of(set[0], REDIS_REPLY_STATUS, options_.address);
}

int64_t RedisClusterTier::retain_only(const std::string& tag, const int64_t* keys, int64_t n) {
  client_->check_open();
  std::vector<int64_t> keep(keys, keys + n);
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  int64_t erased = 0;
  for (int64_t p = 0; p < options_.num_partitions; ++p) {
    std::vector<Command> listed;
    listed.push_back(command({"HKEYS", value_hash(tag, p)}));
    client_->run(listed);
    const redisReply& fields = reply_of(listed[0], REDIS_REPLY_ARRAY, options_.address);
    std::vector<std::string_view> stale;  // in the reply of listed
    for (size_t i = 0; i < fields.elements; ++i) {
      const redisReply& field = *fields.element[i];
      int64_t key = 0;
      if (field.len == sizeof(key)) std::memcpy(&key, field.str, sizeof(key));
      if (field.len != sizeof(key) || !std::binary_search(keep.begin(), keep.end(), key) ||
          static_cast<int64_t>(partition_of(key, options_.num_partitions)) != p) {
        stale.emplace_back(field.str, field.len);
      }
    }
    std::vector<Command> deletes;
    append_deletes(listed[0].words[1], stale, options_.max_batch_size, deletes);
    client_->run(deletes);
    for (const Command& c : deletes) erased += reply_of(c, REDIS_REPLY_INTEGER, options_.address).integer;
  }
  // The hashes of tag that are not this tier's partitions (a deploy with more partitions left them).
  std::set<std::string> ours;
  for (int64_t p = 0; p < options_.num_partitions; ++p) ours.insert(value_hash(tag, p));
  const std::string pattern = "hps_et{" + glob_escaped(tag) + "/p*}v";
  std::set<std::string> strays;
  std::vector<std::string> nodes = client_->masters();
  std::vector<std::string> cursors(nodes.size(), "0");
  while (!nodes.empty()) {
    std::vector<Command> scans;
    for (size_t k = 0; k < nodes.size(); ++k) {
      scans.push_back(command({"SCAN", cursors[k], "MATCH", pattern, "COUNT", kScanCount}));
      scans.back().node = nodes[k];
    }
    client_->run(scans);
    std::vector<std::string> next_nodes, next_cursors;
    for (size_t k = 0; k < nodes.size(); ++k) {
      const redisReply& page = reply_of(scans[k], REDIS_REPLY_ARRAY, options_.address);
      if (page.elements != 2 || page.element[0]->type != REDIS_REPLY_STRING ||
          page.element[1]->type != REDIS_REPLY_ARRAY) {
        throw TierUnavailable("redis_cluster at " + options_.address + " cannot serve: SCAN of " + nodes[k] +
                              " answered in a form this tier cannot read");
      }
      for (size_t i = 0; i < page.element[1]->elements; ++i) {
        std::string name = text_of(*page.element[1]->element[i]);
        if (ours.count(name) == 0) strays.insert(std::move(name));
      }
      const std::string cursor = text_of(*page.element[0]);
      if (cursor != "0") {
        next_nodes.push_back(nodes[k]);
        next_cursors.push_back(cursor);
      }
    }
    nodes = std::move(next_nodes);
    cursors = std::move(next_cursors);
  }
  std::vector<Command> removals;  // HLEN then DEL of each stray hash
  for (const std::string& name : strays) {
    removals.push_back(command({"HLEN", name}));
    removals.push_back(command({"DEL", name}));
  }
  client_->run(removals);
  for (size_t i = 0; i < removals.size(); i += 2) {
    erased += reply_of(removals[i], REDIS_REPLY_INTEGER, options_.address).integer;
  }
  return erased;
}

void RedisClusterTier::close() { client_->close(); }

}  // namespace hps
}  // namespace sok
