// DetTier (det_tier.hpp).
#include "det_tier.hpp"

#include <algorithm>
#include <stdexcept>

namespace sok {
namespace hps {

void DetTier::check_open() const {
  if (closed_) throw TierClosed("this " + name_ + " is closed and holds no rows; make a new HashMapTier");
}

void DetTier::check_table_dim(const std::string& tag, const RowStorage& table, int64_t dim, const char* what) const {
  if (table.dim() != dim) {
    throw std::invalid_argument(tag + ": the " + name_ + " holds rows of dim " + std::to_string(table.dim()) + ", " +
                                what + " dim " + std::to_string(dim));
  }
}

std::shared_ptr<const RowStorage> DetTier::table(const std::string& tag, int64_t dim, const char* what) {
  check_dim(tag, dim);
  std::lock_guard<std::mutex> lock(mu_);
  check_open();
  auto it = tables_.find(tag);
  if (it == tables_.end()) return nullptr;
  check_table_dim(tag, *it->second, dim, what);
  return it->second;
}

void DetTier::fetch(const std::string& tag, const int64_t* keys, int64_t n, int64_t dim, float* rows, bool* found) {
  std::shared_ptr<const RowStorage> t = table(tag, dim, "asked for");
  if (t == nullptr) {
    std::fill(rows, rows + n * dim, 0.0f);
    std::fill(found, found + n, false);
    return;
  }
  static_assert(sizeof(bool) == sizeof(uint8_t), "found masks are one-byte bools");
  t->find(keys, n, rows, nullptr, reinterpret_cast<uint8_t*>(found));
}

void DetTier::insert(const std::string& tag, const int64_t* keys, int64_t n, const float* rows, int64_t dim) {
  storage(tag, dim, n)->insert(keys, n, rows);
}

std::shared_ptr<const RowStorage> DetTier::storage(const std::string& tag, int64_t dim, int64_t capacity) {
  if (std::shared_ptr<const RowStorage> t = table(tag, dim, "got rows of")) return t;
  auto made = std::make_shared<const RowStorage>(det_storage_api(), "the " + name_ + " storage of " + tag, dim,
                                                 SOK_KEY_INT64, -1, det_options(capacity));
  std::lock_guard<std::mutex> lock(mu_);
  check_open();
  auto [it, inserted] = tables_.emplace(tag, made);  // another thread's, where it made one meanwhile
  if (!inserted) check_table_dim(tag, *it->second, dim, "got rows of");
  return it->second;
}

int64_t DetTier::size(const std::string& tag) {
  std::shared_ptr<const RowStorage> t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open();
    auto it = tables_.find(tag);
    if (it == tables_.end()) return 0;
    t = it->second;
  }
  return t->size();
}

void DetTier::close() {
  std::map<std::string, std::shared_ptr<const RowStorage>> dropped;
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  dropped.swap(tables_);
}

}  // namespace hps
}  // namespace sok
