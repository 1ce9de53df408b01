// difflib.get_close_matches(word, possibilities, n=1, cutoff=0.6)[0] of Python: the possibility most
// like `word` by SequenceMatcher's ratio (autojunk on, no junk function), for "did you mean ...?"
// hints that name the key Python's reader names.
//
// Example:
//   close_match("gpucacheperc", {"gpucache", "gpucacheper"})  // "gpucacheper"
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace sok::hps {

// The possibility of highest ratio >= 0.6 (of two equal ratios, the greater string, as
// heapq.nlargest over (ratio, possibility) pairs), std::nullopt where none reaches 0.6. Strings are
// UTF-8 (their byte order is their code points').
std::optional<std::string> close_match(const std::string& word, const std::vector<std::string>& possibilities);

}  // namespace sok::hps
