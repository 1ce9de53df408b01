// DetTier, the volatile hash map that never evicts (hash_map / parallel_hash_map without
// overflow_margin) as a Tier of one sok-backend-det CPU storage per table (row_storage.hpp), what the
// Python HashMapTier keeps such rows in too (tiers/hash_map.py), so that a lookup graph's SokFind
// reads them (storage()).
//
// Example:
//   DetTier tier("hash_map");
//   tier.insert("hps_et.m.t", keys, n, rows, 16);
//   tier.fetch("hps_et.m.t", keys, n, 16, out, found);
#ifndef SOK_HPS_SERVING_DET_TIER_HPP_
#define SOK_HPS_SERVING_DET_TIER_HPP_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "row_storage.hpp"
#include "tier.hpp"

namespace sok {
namespace hps {

// The volatile hash map that never evicts: one det RowStorage in host memory (int64 keys) per table
// tag, made at its first insert (or storage()). Thread-safe; close() drops the tables, calls in
// flight finish on the rows they started with.
class DetTier final : public Tier {
 public:
  explicit DetTier(std::string name) : name_(std::move(name)) {}

  const std::string& name() const override { return name_; }
  void fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows, bool* found) override;
  void insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows, int64_t dim) override;
  int64_t size(const std::string& tag) override;
  void close() override;

  // The storage of tag's rows, made empty (with slots for capacity rows) where the tier has none:
  // what a lookup graph's SokFind reads (tiers/hash_map.py's graph_table). Throws
  // std::invalid_argument (the tier holds tag with another dim), TierClosed.
  std::shared_ptr<const RowStorage> storage(const std::string& tag, int64_t dim, int64_t capacity = 1);

 private:
  // tag's table, nullptr where the tier has none; throws TierClosed, and std::invalid_argument when its
  // dim is not dim (`what`: "asked for" or "got rows of").
  std::shared_ptr<const RowStorage> table(const std::string& tag, int64_t dim, const char* what);
  void check_open() const;  // TierClosed after close(); under mu_
  // std::invalid_argument unless `table` (tag's) holds rows of dim (`what`: as table()'s).
  void check_table_dim(const std::string& tag, const RowStorage& table, int64_t dim, const char* what) const;

  const std::string name_;
  std::mutex mu_;
  bool closed_ = false;
  std::map<std::string, std::shared_ptr<const RowStorage>> tables_;
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_SERVING_DET_TIER_HPP_
