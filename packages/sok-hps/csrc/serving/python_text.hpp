// Python's text for values in messages, so that the C++ readers (model_files.hpp) write the messages of
// the Python readers they mirror: repr() of a str and of what json.loads makes, type(x).__name__, the
// UnicodeDecodeError of bytes.decode("utf-8"), os.fsencode, and the os.path (posixpath) functions.
//
// repr(str) escapes as Python does the ASCII controls, the quote, the backslash and, of the rest of
// Unicode, the controls, separators, format characters, surrogates and private use characters that
// str.isprintable() refuses; an unassigned code point is written as it is (Python escapes it). A
// byte that is not UTF-8 is Python's surrogateescape of it (the way os.fsdecode reads a file name),
// but the 3-byte code of a surrogate is that surrogate (as json.hpp keeps a lone one; os.fsdecode
// escapes each of its bytes). Also OsError, Python's text of an OSError.
//
// Example:
//   python_text::repr("emb'0")                           // "\"emb'0\""
//   python_text::repr(json::parse("[1, 2.5e20, null]"))  // "[1, 2.5e+20, None]"
//   python_text::join("ckpt", "emb_0-key")               // "ckpt/emb_0-key"
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "json.hpp"

namespace sok::hps::python_text {

// Python's OSError: an error of the system (errno `code`) about the file `filename` ("" where Python
// names none); what() is str() of Python's ("[Errno 13] Permission denied: 'emb_0-key'").
class OsError : public std::runtime_error {
 public:
  explicit OsError(int code, const std::string& filename = "");
  int code() const { return code_; }
  const std::string& filename() const { return filename_; }

 private:
  int code_;
  std::string filename_;
};

// repr() of the str whose UTF-8 (lone surrogates as their 3-byte code, as json.hpp keeps them) is `s`.
std::string repr(std::string_view s);
// repr() of the Python value json.loads makes of `v` (dicts and lists as Python writes them).
std::string repr(const json::Value& v);
// repr() of a float (shortest round trip: "1.0", "1e+16", "inf").
std::string repr(double x);
// os.fsencode of the str whose UTF-8 is `s` (lone surrogates as their 3-byte code): the surrogates
// U+DC80..U+DCFF, surrogateescape's of the bytes of a file name that are not UTF-8, are those bytes
// again (so a name from JSON compares with a file's name as Python compares them).
std::string fsencode(std::string_view s);
// Python's order of two strs (of their code points), each as repr() reads it.
bool less(std::string_view a, std::string_view b);
// type(x).__name__ of what json.loads makes of `v`: "dict", "list", "str", "int", "float", "bool", "NoneType".
const char* type_name(const json::Value& v);
// str() of the UnicodeDecodeError that bytes.decode("utf-8") raises for `bytes`; "" when they are UTF-8.
std::string utf8_error(std::string_view bytes);

// os.path.join(a, b), os.path.split, os.path.basename, os.path.normpath and os.path.abspath (posixpath).
std::string join(std::string_view a, std::string_view b);
std::pair<std::string, std::string> split(std::string_view path);
std::string basename(std::string_view path);
std::string normpath(std::string_view path);
std::string abspath(std::string_view path);

}  // namespace sok::hps::python_text
