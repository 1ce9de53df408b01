// sok::hps::KeyIndex: the key -> row map of one hash-map partition. Open addressing with linear
// probing over one array of (key, row) pairs, at most 70% full, hashed with splitmix64's finaliser
// (sok::mix64, independent of the partition function, which names the partition by another mix):
// a lookup is one hash and, mostly, one cache line, where std::unordered_map follows a pointer to
// a node per key. No erase: eviction (HashMapTier) rebuilds the index from its survivors, which
// costs what choosing the victims already costs (a pass over the partition).
#ifndef SOK_HPS_TIERS_KEY_INDEX_HPP_
#define SOK_HPS_TIERS_KEY_INDEX_HPP_

#include <cstdint>
#include <utility>
#include <vector>

#include "sok/kit/keys.hpp"

namespace sok {
namespace hps {

class KeyIndex {
 public:
  // The row of key, -1 where the index lacks it.
  int64_t find(int64_t key) const {
    if (size_ == 0) return -1;
    for (uint64_t i = home(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.row < 0) return -1;
      if (e.key == key) return e.row;
    }
  }

  // Starts loading the line where find(key) begins, for a bulk loop that finds key a few keys later.
  void prefetch(int64_t key) const {
    if (size_ != 0) __builtin_prefetch(&entries_[home(key)]);
  }

  // Maps key (absent from the index) to row (>= 0).
  void insert(int64_t key, int64_t row) {
    if ((size_ + 1) * 10 > static_cast<int64_t>(entries_.size()) * 7) {
      rehash(entries_.empty() ? 16 : 2 * entries_.size());
    }
    place(key, row);
    ++size_;
  }

  // Drops every key; the capacity stays.
  void clear() {
    for (Entry& e : entries_) e.row = -1;
    size_ = 0;
  }

  int64_t size() const { return size_; }

  // Calls fn(key, row) for every key, in no particular order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (const Entry& e : entries_)
      if (e.row >= 0) fn(e.key, e.row);
  }

 private:
  struct Entry {
    int64_t key;
    int64_t row;  // -1: empty
  };

  uint64_t home(int64_t key) const { return mix64(static_cast<uint64_t>(key)) & mask_; }

  void place(int64_t key, int64_t row) {
    uint64_t i = home(key);
    while (entries_[i].row >= 0) i = (i + 1) & mask_;
    entries_[i] = Entry{key, row};
  }

  void rehash(size_t capacity) {  // a power of two
    std::vector<Entry> old(capacity, Entry{0, -1});
    old.swap(entries_);
    mask_ = capacity - 1;
    for (const Entry& e : old)
      if (e.row >= 0) place(e.key, e.row);
  }

  std::vector<Entry> entries_;
  uint64_t mask_ = 0;
  int64_t size_ = 0;
};

}  // namespace hps
}  // namespace sok

#endif  // SOK_HPS_TIERS_KEY_INDEX_HPP_
