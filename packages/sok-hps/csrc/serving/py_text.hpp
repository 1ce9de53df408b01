// What Python writes and sees in text, for the C++ readers that must give Python's messages: repr()
// of the values json.loads makes (str, int, float, bool, None, list, dict), of the C++ values they
// become and of bytes, type(value).__name__, the code points str.isspace() and str.isprintable()
// treat as they do, the order of strs and os.fsencode.
//
// A str is held as utf8.hpp says: UTF-8, a lone surrogate as its 3-byte code (json.hpp's strings), a
// byte that is not UTF-8 as its surrogateescape (a file name as os.fsdecode reads it). The Unicode
// tables (str.isprintable(), str.isspace()) are those of the Python the package is built for, of its
// Unicode version (3.11: 14.0, 3.12: 15.0): that Python writes them at build time
// (gen_unicode_tables.py, into the build directory's unicode_tables.inc), so these functions say
// what it says; a C++ process (libsok_hps_serving.so) has the tables of the Python it was built for.
//
// Example:
//   py_repr(json::parse(R"({"a": [1, 2.5, "it's"]})"))  // {'a': [1, 2.5, "it's"]}
//   py_repr(1e16)                                       // 1e+16
//   py_repr("emb\xff")                                  // 'emb\udcff'
//   py_bytes_repr("JU\0")                               // b'JU\x00'
//   py_type_name(json::parse("null"))                   // NoneType
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "json.hpp"

namespace sok::hps {

bool py_isspace(uint32_t cp);
bool py_isprintable(uint32_t cp);
// The minor version (3.x) of the Python the package was built for (unicode_tables.inc).
int python_minor();

std::string py_repr(std::string_view text);
inline std::string py_repr(const char* text) { return py_repr(std::string_view(text)); }
// repr() of a bytes object holding `bytes`: b'HCTR', b"it's", b'\x00\xff'.
std::string py_bytes_repr(std::string_view bytes);
// f"{value:#0{width}x}": 0x and at least `width` - 2 lower-case hex digits (py_hex(0, 10): 0x00000000).
std::string py_hex(uint64_t value, int width);
std::string py_repr(double x);
std::string py_repr(int64_t i);
std::string py_repr(uint64_t u);
std::string py_repr(const json::Value& v);
// type(v).__name__ of what json.loads makes of v: dict, list, str, int, float, bool, NoneType.
const char* py_type_name(const json::Value& v);

// repr() of a list of strings or integers: ['a', 'b'], [0, 0].
std::string py_repr(const std::vector<std::string>& items);
std::string py_repr(const std::vector<int64_t>& items);

// a < b of two strs: Python's order, by code point.
bool py_less(std::string_view a, std::string_view b);
// os.fsencode: the surrogates U+DC80..U+DCFF, surrogateescape's of the bytes of a file name that are
// not UTF-8, are those bytes again (so that a name from JSON compares with a file's as Python's do).
std::string py_fsencode(std::string_view text);

}  // namespace sok::hps
