// ModelFilters (model_filters.hpp).
#include "model_filters.hpp"

#include <algorithm>
#include <optional>

#include "py_regex.hpp"
#include "py_text.hpp"

namespace sok::hps {

ModelFilters::ModelFilters(const std::vector<std::string>& patterns, const std::string& what) {
  for (const std::string& pattern : patterns) {
    if (const std::optional<PyRegexError> error = py_regex_error(pattern)) {
      throw ModelFilterError(error->type, error->message);
    }
    try {
      filters_.emplace_back(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& error) {
      throw ModelFilterError("ValueError", what + " " + py_repr(pattern) +
                                               " is a regular expression of Python's re that C++'s std::regex "
                                               "(ECMAScript) cannot run (" +
                                               error.what() +
                                               "); write it without Python's extensions ((?P<name>...), inline "
                                               "flags, look-behind, \\A, \\Z)");
    }
  }
}

bool ModelFilters::match(const std::string& model) const {
  return std::any_of(filters_.begin(), filters_.end(), [&](const std::regex& f) { return std::regex_match(model, f); });
}

}  // namespace sok::hps
