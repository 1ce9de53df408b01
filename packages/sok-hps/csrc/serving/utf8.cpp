// UTF-8 encoding and decoding (utf8.hpp says how text is held).
#include "utf8.hpp"

namespace sok::hps {

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
  if (length == 0) {  // not UTF-8 (an overlong code among them): surrogateescape of the one byte
    cp = 0xDC00 + c;
    length = 1;
  }
  *at += length;
  return cp;
}

std::vector<uint32_t> code_points(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t at = 0; at < s.size();) out.push_back(next_code_point(s, &at));
  return out;
}

// CPython's UTF-8 decoder (Objects/stringlib/codecs.h): the second byte's bounds refuse overlong
// codes, surrogates and code points above U+10FFFF.
std::optional<Utf8Error> first_utf8_error(std::string_view bytes) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
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
      return Utf8Error{i, i + 1, "invalid start byte"};
    }
    for (size_t k = 1; k < length; ++k) {
      if (i + k >= n) return Utf8Error{i, n, "unexpected end of data"};
      const unsigned char next = byte(i + k);
      if (next < (k == 1 ? low : 0x80) || next > (k == 1 ? high : 0xBF)) {
        return Utf8Error{i, i + k, "invalid continuation byte"};
      }
    }
    i += length;
  }
  return std::nullopt;
}

}  // namespace sok::hps
