// Python's text of the errors the C++ readers (model_files.hpp) report as Python's readers do: an
// OSError, and the UnicodeDecodeError of bytes.decode("utf-8").
//
// Example:
//   OsError(EACCES, "emb_0-key").what()  // "[Errno 13] Permission denied: 'emb_0-key'"
//   OsError(ENOENT, "a", "b").what()     // "[Errno 2] No such file or directory: 'a' -> 'b'"
//   utf8_decode_error("ab\xff")          // "'utf-8' codec can't decode byte 0xff in position 2: invalid start byte"
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace sok::hps {

// Python's OSError: an error of the system (errno `code`) about the file `filename` ("" where Python
// names none), and `filename2` where a call names two (os.replace's source and target); what() is
// str() of Python's.
class OsError : public std::runtime_error {
 public:
  explicit OsError(int code, const std::string& filename = "", const std::string& filename2 = "");
  int code() const { return code_; }
  const std::string& filename() const { return filename_; }
  const std::string& filename2() const { return filename2_; }

 private:
  int code_;
  std::string filename_;
  std::string filename2_;
};

// str() of the UnicodeDecodeError that bytes.decode("utf-8") raises for `bytes`; "" when they are UTF-8.
std::string utf8_decode_error(std::string_view bytes);

}  // namespace sok::hps
