// What Python writes and sees in text, for the C++ readers that must give Python's messages: repr()
// of the values json.loads makes (str, int, float, bool, None, list, dict) and of the C++ values
// they become, type(value).__name__, and the code points str.isspace() and str.isprintable() treat
// as they do.
//
// Text is UTF-8 as json.hpp keeps it (a lone surrogate as its 3-byte code). The Unicode tables are
// Python 3.11's (Unicode 14.0.0): unicode_nonprintable.inc.
//
// Example:
//   py_repr(json::parse(R"({"a": [1, 2.5, "it's"]})"))  // {'a': [1, 2.5, "it's"]}
//   py_repr(1e16)                                       // 1e+16
//   py_type_name(json::parse("null"))                   // NoneType
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "json.hpp"

namespace sok::hps {

// The code points of UTF-8 text (json.hpp's: well-formed but for lone surrogates).
std::vector<uint32_t> code_points(std::string_view utf8);
// `cp` as UTF-8 (a surrogate as its 3-byte code).
void append_utf8(std::string& out, uint32_t cp);

bool py_isspace(uint32_t cp);
bool py_isprintable(uint32_t cp);

std::string py_repr(std::string_view text);
inline std::string py_repr(const std::string& text) { return py_repr(std::string_view(text)); }
std::string py_repr(double x);
std::string py_repr(int64_t i);
std::string py_repr(uint64_t u);
std::string py_repr(const json::Value& v);
// type(v).__name__ of what json.loads makes of v: dict, list, str, int, float, bool, NoneType.
const char* py_type_name(const json::Value& v);

// repr() of a list of strings or integers: ['a', 'b'], [0, 0].
std::string py_repr(const std::vector<std::string>& items);
std::string py_repr(const std::vector<int64_t>& items);

}  // namespace sok::hps
