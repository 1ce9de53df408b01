// difflib's SequenceMatcher.ratio and get_close_matches, step for step (close_match.hpp).
#include "close_match.hpp"

#include <iterator>
#include <unordered_map>

#include "py_text.hpp"
#include "utf8.hpp"

namespace sok::hps {
namespace {

using Text = std::vector<uint32_t>;

// SequenceMatcher(None, a, b): b's index (b2j) without its popular elements.
class Matcher {
 public:
  Matcher(const Text& a, const Text& b) : a_(a), b_(b) {
    for (size_t j = 0; j < b.size(); ++j) b2j_[b[j]].push_back(j);
    if (b.size() >= 200) {  // autojunk: elements of more than 1% of a long b are "popular"
      const size_t ntest = b.size() / 100 + 1;
      for (auto it = b2j_.begin(); it != b2j_.end();) {
        it = it->second.size() > ntest ? b2j_.erase(it) : std::next(it);
      }
    }
  }

  double ratio() const {
    size_t matches = 0;
    std::vector<Block> queue = {{0, a_.size(), 0, b_.size()}};
    while (!queue.empty()) {
      const Block q = queue.back();
      queue.pop_back();
      const auto [i, j, k] = find_longest_match(q);
      if (k == 0) continue;
      matches += k;
      if (q.alo < i && q.blo < j) queue.push_back({q.alo, i, q.blo, j});
      if (i + k < q.ahi && j + k < q.bhi) queue.push_back({i + k, q.ahi, j + k, q.bhi});
    }
    const size_t length = a_.size() + b_.size();
    return length ? 2.0 * static_cast<double>(matches) / static_cast<double>(length) : 1.0;
  }

 private:
  struct Block {
    size_t alo, ahi, blo, bhi;
  };
  struct Match {
    size_t i, j, k;
  };

  Match find_longest_match(const Block& q) const {
    size_t besti = q.alo, bestj = q.blo, bestsize = 0;
    std::unordered_map<size_t, size_t> j2len;
    for (size_t i = q.alo; i < q.ahi; ++i) {
      std::unordered_map<size_t, size_t> newj2len;
      const auto found = b2j_.find(a_[i]);
      if (found != b2j_.end()) {
        for (const size_t j : found->second) {
          if (j < q.blo) continue;
          if (j >= q.bhi) break;
          const auto prev = j > 0 ? j2len.find(j - 1) : j2len.end();
          const size_t k = newj2len[j] = (prev == j2len.end() ? 0 : prev->second) + 1;
          if (k > bestsize) {
            besti = i - k + 1;
            bestj = j - k + 1;
            bestsize = k;
          }
        }
      }
      j2len = std::move(newj2len);
    }
    // Extend by equal elements on both sides: there are no junk elements, so popular ones join here.
    while (besti > q.alo && bestj > q.blo && a_[besti - 1] == b_[bestj - 1]) {
      --besti;
      --bestj;
      ++bestsize;
    }
    while (besti + bestsize < q.ahi && bestj + bestsize < q.bhi && a_[besti + bestsize] == b_[bestj + bestsize]) {
      ++bestsize;
    }
    return {besti, bestj, bestsize};
  }

  const Text& a_;
  const Text& b_;
  std::unordered_map<uint32_t, std::vector<size_t>> b2j_;
};

}  // namespace

std::optional<std::string> close_match(const std::string& word, const std::vector<std::string>& possibilities) {
  const Text b = code_points(word);
  std::optional<std::string> best;
  double best_ratio = 0.0;
  for (const std::string& x : possibilities) {
    const Text a = code_points(x);
    const double r = Matcher(a, b).ratio();
    if (r < 0.6) continue;
    if (!best || r > best_ratio || (r == best_ratio && x > *best)) {
      best = x;
      best_ratio = r;
    }
  }
  return best;
}

}  // namespace sok::hps
