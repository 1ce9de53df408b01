// UTF-8 as the C++ readers hold text: the one encoder and decoder of it, and the check of Python's
// strict decoder (bytes.decode("utf-8")).
//
// A str is held as UTF-8 in which a lone surrogate is its 3-byte code (as json.hpp keeps a "\ud800")
// and a byte that is not UTF-8 stands for U+DC00 + the byte (Python's surrogateescape: what
// os.fsdecode makes of a file name). The two meet in one case: bytes that are the 3-byte code of a
// surrogate read as that surrogate here, where os.fsdecode escapes each of the three.
//
// Example:
//   code_points("a\xc3\xa9\xff")                // {0x61, 0xE9, 0xDCFF}
//   first_utf8_error("ab\xff")->reason          // "invalid start byte" (start 2, end 3)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sok::hps {

// `cp` as UTF-8 (a surrogate as its 3-byte code).
void append_utf8(std::string& out, uint32_t cp);
// The code point at s[*at], moving *at past it (a byte that starts no sequence: U+DC00 + the byte).
uint32_t next_code_point(std::string_view s, size_t* at);
// The code points of `s`, each as next_code_point reads it.
std::vector<uint32_t> code_points(std::string_view s);

// The first sequence Python's UTF-8 decoder refuses (a surrogate's code included): bytes [start, end)
// and why, in the words of UnicodeDecodeError ("invalid start byte", "invalid continuation byte",
// "unexpected end of data").
struct Utf8Error {
  size_t start;
  size_t end;
  const char* reason;
};
std::optional<Utf8Error> first_utf8_error(std::string_view bytes);

}  // namespace sok::hps
