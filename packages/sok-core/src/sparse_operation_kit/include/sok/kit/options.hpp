// Backend options (sok_storage_config's name/value pairs) parsed by type; names a backend does not
// know are an error that lists the valid ones.
#ifndef SOK_KIT_OPTIONS_HPP_
#define SOK_KIT_OPTIONS_HPP_

#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "sok/kit/error.hpp"
#include "sok/storage_api.h"

namespace sok {

// Parsed backend options: name -> value, each consumed once; leftovers are an error.
class Options {
 public:
  explicit Options(const sok_storage_config& config) {
    for (int32_t i = 0; i < config.num_options; ++i) {
      if (config.option_names == nullptr || config.option_values == nullptr ||
          config.option_names[i] == nullptr || config.option_values[i] == nullptr) {
        invalid("option " + std::to_string(i) + " has a null name or value");
      }
      values_[config.option_names[i]] = config.option_values[i];
    }
  }
  // The integer option `name`, or `fallback` when absent.
  int64_t integer(const std::string& name, int64_t fallback) {
    return parsed(name, fallback, "an integer", [](const std::string& t, size_t* used) { return std::stoll(t, used); });
  }
  // The real option `name`, or `fallback` when absent.
  double real(const std::string& name, double fallback) {
    return parsed(name, fallback, "a number", [](const std::string& t, size_t* used) { return std::stod(t, used); });
  }
  std::string text(const std::string& name, const std::string& fallback) {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    std::string v = it->second;
    values_.erase(it);
    return v;
  }
  // Call after reading every known option: unknown names are an error that lists the valid ones.
  void reject_unknown(const std::string& backend, const std::vector<std::string>& known) const {
    if (values_.empty()) return;
    std::string valid;
    for (const auto& k : known) valid += (valid.empty() ? "" : ", ") + k;
    invalid("unknown option " + quote(values_.begin()->first) + " for backend " + backend +
            "; valid options: " + (valid.empty() ? "(none)" : valid));
  }
  static std::string quote(const std::string& s) { return "'" + s + "'"; }

 private:
  // Option `name` read whole by `parse` (std::stoll, std::stod), or `fallback` when absent; consumed.
  template <class T, class Parse>
  T parsed(const std::string& name, T fallback, const char* what, Parse parse) {
    auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    std::string text = it->second;
    values_.erase(it);
    size_t used = 0;
    T v{};
    try {
      v = parse(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size()) invalid(name + "=" + quote(text) + " is not " + what);
    return v;
  }
  std::map<std::string, std::string> values_;
};

}  // namespace sok

#endif  // SOK_KIT_OPTIONS_HPP_
