// Regular expressions matched against a model's name in full (Python's re.fullmatch): the model
// filters of the update source and the update_filters of the C++ server's databases. Checked as
// re.compile checks them (py_regex.hpp), then run by std::regex (ECMAScript), which lacks some of
// Python's extensions: a filter only Python's re can run is refused, naming it.
//
// Example:
//   ModelFilters filters({"foo", "ba.*"}, "model filter");
//   filters.match("bar");   // true
#ifndef SOK_HPS_SERVING_MODEL_FILTERS_HPP_
#define SOK_HPS_SERVING_MODEL_FILTERS_HPP_

#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

namespace sok::hps {

// A filter that is no regular expression: type() is the Python exception re.compile raises
// ("error": re.error, "OverflowError", "ValueError", "RecursionError"; py_regex.hpp), or
// "ValueError" where std::regex cannot run it.
class ModelFilterError : public std::invalid_argument {
 public:
  ModelFilterError(std::string type, const std::string& message)
      : std::invalid_argument(message), type_(std::move(type)) {}
  const std::string& type() const { return type_; }

 private:
  std::string type_;
};

class ModelFilters {
 public:
  // `what` names a filter in messages ("model filter"). Throws ModelFilterError.
  ModelFilters(const std::vector<std::string>& patterns, const std::string& what);

  // Whether one filter matches `model` in full (none: no filter takes it).
  bool match(const std::string& model) const;

 private:
  std::vector<std::regex> filters_;
};

}  // namespace sok::hps

#endif  // SOK_HPS_SERVING_MODEL_FILTERS_HPP_
