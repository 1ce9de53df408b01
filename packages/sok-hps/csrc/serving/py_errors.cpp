// Python's text of OSError and UnicodeDecodeError (py_errors.hpp).
#include "py_errors.hpp"

#include <cstdio>
#include <cstring>

#include "py_text.hpp"
#include "utf8.hpp"

namespace sok::hps {

OsError::OsError(int code, const std::string& filename, const std::string& filename2)
    : std::runtime_error("[Errno " + std::to_string(code) + "] " + std::strerror(code) +
                         (filename.empty() ? "" : ": " + py_repr(filename)) +
                         (filename.empty() || filename2.empty() ? "" : " -> " + py_repr(filename2))),
      code_(code),
      filename_(filename),
      filename2_(filename2) {}

std::string utf8_decode_error(std::string_view bytes) {
  const std::optional<Utf8Error> error = first_utf8_error(bytes);
  if (!error) return "";
  std::string where;
  if (error->end - error->start == 1) {
    char byte[8];
    std::snprintf(byte, sizeof(byte), "0x%02x", static_cast<unsigned char>(bytes[error->start]));
    where = std::string("byte ") + byte + " in position " + std::to_string(error->start);
  } else {
    where = "bytes in position " + std::to_string(error->start) + "-" + std::to_string(error->end - 1);
  }
  return "'utf-8' codec can't decode " + where + ": " + error->reason;
}

}  // namespace sok::hps
