// sok::hps::Tier: what every storage tier below the embedding cache provides, in C++ (the Python
// protocol is hierarchical_parameter_server.tiers.base.Tier). A tier stores float32 rows per table
// tag ("hps_et.<model>.<table>") by int64 key; every tier is safe for concurrent fetch and insert
// from any number of threads. No Python and no TensorFlow here: the serving op library links it.
//
// Errors are exceptions: std::invalid_argument for arguments a tier refuses (a dim of 0, rows of
// another dim than the table holds, bad options; the Python binding raises ValueError, as the
// Python tiers do), TierClosed (RuntimeError in Python) for calls after close(), TierUnavailable
// (tiers.base.TierUnavailable) when the service behind a tier cannot be reached, and TierReadOnly
// (PermissionError) for a write to a tier opened for reading only.
//
// A tier whose rows outlive the process (Redis, RocksDB) is a SharedTier: it records each table's
// row width and can erase the rows of keys a re-deployed model lacks (tiers.base.SharedTier).
#ifndef SOK_HPS_TIERS_TIER_HPP_
#define SOK_HPS_TIERS_TIER_HPP_

#include <cstdint>
#include <stdexcept>
#include <string>

namespace sok {
namespace hps {

static_assert(sizeof(bool) == 1, "found masks are arrays of one-byte bools (NumPy's bool_)");

// A tier that has been closed (Tier::close): later calls throw it. A std::runtime_error, so the
// Python binding raises RuntimeError, as the Python tiers do.
class TierClosed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The service behind a tier cannot be reached (a Redis node down, a RocksDB path another process
// holds, ...); the message names where. The caller treats the keys as missing in that tier and
// tries again on a later call. tiers.base.TierUnavailable in Python.
class TierUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A write (insert, set_stored_dim, retain_only) to a tier opened for reading only. PermissionError
// in Python.
class TierReadOnly : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// std::invalid_argument unless dim >= 1 (the message of base.py's check_keys).
inline void check_dim(const std::string& tag, int64_t dim) {
  if (dim < 1) throw std::invalid_argument(tag + ": dim must be an integer >= 1, got " + std::to_string(dim));
}

class Tier {
 public:
  virtual ~Tier() = default;

  // What the tier is, for logs and messages ("hash_map", "parallel_hash_map", ...).
  virtual const std::string& name() const = 0;

  // The rows of keys into rows and found: rows[i] = the row of keys[i], zeros where the tier lacks
  // it (found[i] = false). A table the tier does not hold has no keys.
  // Throws std::invalid_argument when dim < 1 or the tier holds tag with another dim; TierClosed.
  virtual void fetch(const std::string& tag,
                     const int64_t* keys,  // (n)
                     int64_t n, int64_t dim,
                     float* rows,  // (n, dim), written
                     bool* found   // (n), written
                     ) = 0;

  // Inserts or overwrites the rows of keys; for a key repeated in keys the last row wins. The
  // first insert of a tag (even of no keys) makes its table, of rows of dim floats.
  // Throws std::invalid_argument when dim < 1 or the tier holds tag with another dim; TierClosed.
  virtual void insert(const std::string& tag,
                      const int64_t* keys,  // (n)
                      int64_t n,
                      const float* rows,  // (n, dim)
                      int64_t dim) = 0;

  // Rows the tier holds for tag (0 for a tag it does not hold). Throws TierClosed.
  virtual int64_t size(const std::string& tag) = 0;

  // Releases what the tier holds (an in-process tier: every row); later calls throw TierClosed.
  // Calls in flight on other threads finish on the rows they started with.
  virtual void close() = 0;
};

// A tier whose rows outlive the server that wrote them (tiers.base.SharedTier).
class SharedTier : public Tier {
 public:
  // Where the rows are, for messages (a RocksDB path, Redis addresses).
  virtual const std::string& location() const = 0;

  // The row width recorded for tag (set_stored_dim), else the width of one stored row of tag, else
  // -1 (no row and no width of tag). Throws TierUnavailable, TierClosed.
  virtual int64_t stored_dim(const std::string& tag) = 0;

  // Records dim as the row width of tag. Throws TierReadOnly, TierUnavailable, TierClosed.
  virtual void set_stored_dim(const std::string& tag, int64_t dim) = 0;

  // Erases every row of tag whose key is not in keys [n]; returns how many were erased. The rows
  // of keys stay readable throughout. Throws TierReadOnly, TierUnavailable, TierClosed.
  virtual int64_t retain_only(const std::string& tag, const int64_t* keys, int64_t n) = 0;
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_TIERS_TIER_HPP_
