// Python's repr(), character classes, order of strs and os.fsencode (py_text.hpp says which).
#include "py_text.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "utf8.hpp"

namespace sok::hps {
namespace {

struct Range {
  uint32_t first, last;
};

// kNonPrintable (what str.isprintable() refuses) and kSpaces (what str.isspace() takes), written at
// build time into the build directory by gen_unicode_tables.py, run by the Python the package is built for.
#include "unicode_tables.inc"

// Whether cp is in one of the ranges (closed, ascending).
template <size_t N>
bool in_ranges(const Range (&ranges)[N], uint32_t cp) {
  const Range* it = std::upper_bound(ranges, ranges + N, cp, [](uint32_t c, const Range& r) { return c < r.first; });
  return it != ranges && cp <= std::prev(it)->last;
}

template <class Item>
std::string list_repr(const std::vector<Item>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ", ";
    out += py_repr(items[i]);
  }
  return out + "]";
}

}  // namespace

bool py_isspace(uint32_t cp) { return in_ranges(kSpaces, cp); }

bool py_isprintable(uint32_t cp) { return !in_ranges(kNonPrintable, cp); }

int python_minor() { return kPythonMinor; }

// unicode_repr of CPython's Objects/unicodeobject.c.
std::string py_repr(std::string_view text) {
  const std::vector<uint32_t> cps = code_points(text);
  const bool has_single = std::find(cps.begin(), cps.end(), '\'') != cps.end();
  const bool has_double = std::find(cps.begin(), cps.end(), '"') != cps.end();
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  char escape[16];
  for (const uint32_t cp : cps) {
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp < ' ' || cp == 0x7F) {
      std::snprintf(escape, sizeof(escape), "\\x%02x", cp);
      out += escape;
    } else if (cp < 0x7F || py_isprintable(cp)) {
      append_utf8(out, cp);
    } else {
      std::snprintf(escape, sizeof(escape), cp <= 0xFF ? "\\x%02x" : cp <= 0xFFFF ? "\\u%04x" : "\\U%08x", cp);
      out += escape;
    }
  }
  return out + quote;
}

// bytes_repr of CPython's Objects/bytesobject.c.
std::string py_bytes_repr(std::string_view bytes) {
  const bool has_single = bytes.find('\'') != std::string_view::npos;
  const bool has_double = bytes.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out = "b";
  out += quote;
  char escape[8];
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (byte < ' ' || byte >= 0x7F) {
      std::snprintf(escape, sizeof(escape), "\\x%02x", byte);
      out += escape;
    } else {
      out += c;
    }
  }
  return out + quote;
}

// C's %#x writes 0 without its 0x.
std::string py_hex(uint64_t value, int width) {
  char text[32];
  std::snprintf(text, sizeof(text), "0x%0*llx", std::max(width - 2, 1), static_cast<unsigned long long>(value));
  return text;
}

// float_repr_style 'short' of CPython's Python/pystrtod.c: the shortest digits that round-trip, in
// positional notation for exponents -4 <= e < 16, else d.ddde+XX.
std::string py_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof(buffer), x, std::chars_format::scientific).ptr;
  const std::string_view sci(buffer, end - buffer);
  const size_t e = sci.find('e');
  std::string out = std::signbit(x) ? "-" : "";
  std::string digits;
  for (const char c : sci.substr(0, e)) {
    if (c >= '0' && c <= '9') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int exponent = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exponent);
  const int decpt = exponent + 1;  // digits d1 d2 ... are 0.d1d2... * 10**decpt
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    char exp_text[16];
    std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp_text;
  }
  if (decpt <= 0) return out + "0." + std::string(-decpt, '0') + digits;
  if (decpt >= n) return out + digits + std::string(decpt - n, '0') + ".0";
  return out + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

std::string py_repr(int64_t i) { return std::to_string(i); }
std::string py_repr(uint64_t u) { return std::to_string(u); }
std::string py_repr(const std::vector<std::string>& items) { return list_repr(items); }
std::string py_repr(const std::vector<int64_t>& items) { return list_repr(items); }

bool py_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t x = next_code_point(a, &i), y = next_code_point(b, &j);
    if (x != y) return x < y;
  }
  return i >= a.size() && j < b.size();
}

std::string py_fsencode(std::string_view text) {
  std::string out;
  for (size_t at = 0; at < text.size();) {
    const size_t first = at;
    const uint32_t cp = next_code_point(text, &at);
    if (cp >= 0xDC80 && cp <= 0xDCFF) {
      out += static_cast<char>(cp - 0xDC00);
    } else {
      out.append(text, first, at - first);
    }
  }
  return out;
}

std::string py_repr(const json::Value& v) {
  switch (v.type()) {
    case json::Type::kNull:
      return "None";
    case json::Type::kBool:
      return v.as_bool() ? "True" : "False";
    case json::Type::kInt:
      if (v.big()) return v.big_decimal();
      return v.above_int64() ? py_repr(v.as_uint64()) : py_repr(v.as_int());
    case json::Type::kFloat:
      return py_repr(v.as_number());
    case json::Type::kString:
      return py_repr(v.as_string());
    case json::Type::kArray:
      return list_repr(v.as_array());
    case json::Type::kObject: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : v.as_object()) {
        if (!first) out += ", ";
        first = false;
        out += py_repr(key) + ": " + py_repr(value);
      }
      return out + "}";
    }
  }
  return "";
}

const char* py_type_name(const json::Value& v) {
  switch (v.type()) {
    case json::Type::kNull:
      return "NoneType";
    case json::Type::kBool:
      return "bool";
    case json::Type::kInt:
      return "int";
    case json::Type::kFloat:
      return "float";
    case json::Type::kString:
      return "str";
    case json::Type::kArray:
      return "list";
    case json::Type::kObject:
      return "dict";
  }
  return "";
}

}  // namespace sok::hps
