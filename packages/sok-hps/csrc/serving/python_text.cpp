// Python's text for values in messages (python_text.hpp says what and where it differs).
#include "python_text.hpp"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace sok::hps::python_text {
namespace {

// The code point at s[*at] (moving *at past it): UTF-8, a 3-byte surrogate included; a byte that does
// not start a sequence is 0xDC00 + byte (surrogateescape).
uint32_t next_code_point(std::string_view s, size_t* at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = byte(*at);
  const auto continued = [&](size_t count) {
    for (size_t i = 1; i <= count; ++i) {
      if (*at + i >= s.size() || (byte(*at + i) & 0xC0) != 0x80) return false;
    }
    return true;
  };
  uint32_t cp = 0;
  size_t length = 1;
  if (c < 0x80) {
    cp = c;
  } else if (c >= 0xC2 && c < 0xE0 && continued(1)) {
    cp = ((c & 0x1Fu) << 6) | (byte(*at + 1) & 0x3Fu);
    length = 2;
  } else if (c >= 0xE0 && c < 0xF0 && continued(2)) {
    cp = ((c & 0x0Fu) << 12) | ((byte(*at + 1) & 0x3Fu) << 6) | (byte(*at + 2) & 0x3Fu);
    length = cp < 0x800 ? 0 : 3;
  } else if (c >= 0xF0 && c < 0xF5 && continued(3)) {
    cp = ((c & 0x07u) << 18) | ((byte(*at + 1) & 0x3Fu) << 12) | ((byte(*at + 2) & 0x3Fu) << 6) |
         (byte(*at + 3) & 0x3Fu);
    length = cp < 0x10000 || cp > 0x10FFFF ? 0 : 4;
  } else {
    length = 0;
  }
  if (length == 0) {  // not UTF-8: surrogateescape of the one byte
    cp = 0xDC00 + c;
    length = 1;
  }
  *at += length;
  return cp;
}

// Whether str.isprintable() refuses the code point (a character repr escapes), for every category
// but the unassigned code points: controls (Cc), separators but the space (Zs, Zl, Zp), format
// characters (Cf), surrogates (Cs) and private use (Co).
bool escaped(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return true;
  if (cp < 0x600) return false;
  static constexpr std::pair<uint32_t, uint32_t> kRanges[] = {
      {0x600, 0x605},     {0x61C, 0x61C},     {0x6DD, 0x6DD},     {0x70F, 0x70F},     {0x890, 0x891},
      {0x8E2, 0x8E2},     {0x1680, 0x1680},   {0x180E, 0x180E},   {0x2000, 0x200F},   {0x2028, 0x202F},
      {0x205F, 0x2064},   {0x2066, 0x206F},   {0x3000, 0x3000},   {0xD800, 0xF8FF},   {0xFEFF, 0xFEFF},
      {0xFFF9, 0xFFFB},   {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3},
      {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xF0000, 0x10FFFF},
  };
  for (const auto& [first, last] : kRanges) {
    if (cp >= first && cp <= last) return true;
  }
  return false;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string hex(uint32_t value, int digits) {
  char buffer[16];
  std::snprintf(buffer, sizeof(buffer), "%0*x", digits, static_cast<unsigned>(value));
  return buffer;
}

void append_repr(std::string& out, const json::Value& v) {
  switch (v.type()) {
    case json::Type::kNull:
      out += "None";
      return;
    case json::Type::kBool:
      out += v.as_bool() ? "True" : "False";
      return;
    case json::Type::kInt:
      out += std::to_string(v.as_int());
      return;
    case json::Type::kFloat:
      out += repr(v.as_number());
      return;
    case json::Type::kString:
      out += repr(v.as_string());
      return;
    case json::Type::kArray: {
      out += '[';
      const char* separator = "";
      for (const auto& item : v.as_array()) {
        out += separator;
        append_repr(out, item);
        separator = ", ";
      }
      out += ']';
      return;
    }
    case json::Type::kObject: {
      out += '{';
      const char* separator = "";
      for (const auto& [key, value] : v.as_object()) {
        out += separator;
        out += repr(key);
        out += ": ";
        append_repr(out, value);
        separator = ", ";
      }
      out += '}';
      return;
    }
  }
}

}  // namespace

OsError::OsError(int code, const std::string& filename)
    : std::runtime_error("[Errno " + std::to_string(code) + "] " + std::strerror(code) +
                         (filename.empty() ? "" : ": " + repr(filename))),
      code_(code),
      filename_(filename) {}

std::string repr(std::string_view s) {
  const bool single = s.find('\'') == std::string_view::npos || s.find('"') != std::string_view::npos;
  const char quote = single ? '\'' : '"';
  std::string out(1, quote);
  for (size_t at = 0; at < s.size();) {
    const uint32_t cp = next_code_point(s, &at);
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (!escaped(cp)) {
      append_utf8(out, cp);
    } else if (cp < 0x100) {
      out += "\\x" + hex(cp, 2);
    } else if (cp < 0x10000) {
      out += "\\u" + hex(cp, 4);
    } else {
      out += "\\U" + hex(cp, 8);
    }
  }
  out += quote;
  return out;
}

std::string fsencode(std::string_view s) {
  std::string out;
  for (size_t at = 0; at < s.size();) {
    const size_t first = at;
    const uint32_t cp = next_code_point(s, &at);
    if (cp >= 0xDC80 && cp <= 0xDCFF) {
      out += static_cast<char>(cp - 0xDC00);
    } else {
      out.append(s, first, at - first);
    }
  }
  return out;
}

bool less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t x = next_code_point(a, &i), y = next_code_point(b, &j);
    if (x != y) return x < y;
  }
  return i >= a.size() && j < b.size();
}

std::string repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof(buffer), x, std::chars_format::scientific).ptr;
  const std::string_view text(buffer, static_cast<size_t>(end - buffer));  // [-]d[.ddd]e[+-]dd
  const bool negative = text[0] == '-';
  const size_t e = text.find('e');
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i) {
    if (text[i] != '.') digits += text[i];
  }
  int exponent = 0;
  std::from_chars(text.data() + e + (text[e + 1] == '+' ? 2 : 1), text.data() + text.size(), exponent);
  // Python's float_repr_style "short": the digits, fixed where -4 < decpt <= 16, else d.ddde+XX.
  const int decpt = exponent + 1;
  const int count = static_cast<int>(digits.size());
  std::string out = negative ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (decpt >= count) {
      out += digits + std::string(static_cast<size_t>(decpt - count), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (count > 1) out += "." + digits.substr(1);
  char tail[16];
  std::snprintf(tail, sizeof(tail), "e%c%02d", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
  return out + tail;
}

std::string repr(const json::Value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

const char* type_name(const json::Value& v) {
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
  return "object";
}

std::string utf8_error(std::string_view bytes) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const auto continuation = [&](size_t i) { return (byte(i) & 0xC0) == 0x80; };
  // CPython's UTF-8 decoder: the first bad sequence [start, end) and why.
  const auto error = [&](size_t start, size_t end, const char* reason) {
    if (end - start == 1) {
      return "'utf-8' codec can't decode byte 0x" + hex(byte(start), 2) + " in position " + std::to_string(start) +
             ": " + reason;
    }
    return "'utf-8' codec can't decode bytes in position " + std::to_string(start) + "-" + std::to_string(end - 1) +
           ": " + reason;
  };
  const size_t n = bytes.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = byte(i);
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the bounds of the second byte
    if (c < 0x80) {
      length = 1;
    } else if (c >= 0xC2 && c < 0xE0) {
      length = 2;
    } else if (c >= 0xE0 && c < 0xF0) {
      length = 3;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c < 0xF5) {
      length = 4;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    } else {
      return error(i, i + 1, "invalid start byte");
    }
    for (size_t k = 1; k < length; ++k) {
      if (i + k >= n) return error(i, n, "unexpected end of data");
      const bool valid = k == 1 ? byte(i + k) >= low && byte(i + k) <= high : continuation(i + k);
      if (!valid) return error(i, i + k, "invalid continuation byte");
    }
    i += length;
  }
  return "";
}

std::string join(std::string_view a, std::string_view b) {
  if (!b.empty() && b[0] == '/') return std::string(b);
  if (a.empty() || a.back() == '/') return std::string(a) + std::string(b);
  return std::string(a) + "/" + std::string(b);
}

std::pair<std::string, std::string> split(std::string_view path) {
  const size_t cut = path.rfind('/') + 1;  // npos + 1 == 0
  std::string head(path.substr(0, cut));
  if (head.find_first_not_of('/') != std::string::npos) head.erase(head.find_last_not_of('/') + 1);
  return {head, std::string(path.substr(cut))};
}

std::string basename(std::string_view path) { return std::string(path.substr(path.rfind('/') + 1)); }

std::string normpath(std::string_view path) {
  if (path.empty()) return ".";
  size_t slashes = 0;
  while (slashes < path.size() && path[slashes] == '/') ++slashes;
  const std::string root = slashes == 2 ? "//" : slashes > 0 ? "/" : "";
  std::vector<std::string_view> parts;
  for (size_t at = 0; at <= path.size();) {
    size_t end = path.find('/', at);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(at, end - at);
    at = end + 1;
    if (part.empty() || part == ".") continue;
    if (part != ".." || (root.empty() && (parts.empty() || parts.back() == ".."))) {
      parts.push_back(part);
    } else if (!parts.empty()) {
      parts.pop_back();
    }
  }
  std::string out = root;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += '/';
    out += parts[i];
  }
  return out.empty() ? "." : out;
}

std::string abspath(std::string_view path) {
  if (!path.empty() && path[0] == '/') return normpath(path);
  std::vector<char> cwd(4096);
  while (::getcwd(cwd.data(), cwd.size()) == nullptr) {
    if (errno != ERANGE) throw OsError(errno);
    cwd.resize(cwd.size() * 2);
  }
  return normpath(join(cwd.data(), path));
}

}  // namespace sok::hps::python_text
