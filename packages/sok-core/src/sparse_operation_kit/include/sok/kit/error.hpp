// sok::Error, the exception the ABI adapter (sok/kit/abi_adapter.hpp) turns into a sok_status and
// a last_error message, and sok::fmt for numbers in messages.
#ifndef SOK_KIT_ERROR_HPP_
#define SOK_KIT_ERROR_HPP_

#include <cstdio>
#include <stdexcept>
#include <string>

#include "sok/storage_api.h"

namespace sok {

// An error that crosses the ABI as (status, message).
class Error : public std::runtime_error {
 public:
  Error(sok_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  sok_status status() const { return status_; }

 private:
  sok_status status_;
};

[[noreturn]] inline void fail(sok_status status, const std::string& message) {
  throw Error(status, message);
}
[[noreturn]] inline void invalid(const std::string& message) {
  fail(SOK_ERROR_INVALID_ARGUMENT, message);
}

// What is wrong with hint bits outside SOK_HINTS_ALL: the one wording of the ABI adapter and of
// sok-core's binding (which checks them itself where a backend has no insert_or_assign_hinted).
inline std::string unknown_hints(uint32_t hints) {
  return "hints=" + std::to_string(hints) + " has bits the storage ABI does not define; valid: a combination of " +
         "SOK_HINT_UNIQUE_KEYS = 1 (SOK_HINTS_ALL = " + std::to_string(SOK_HINTS_ALL) + ")";
}

// A number for messages ("%g"). Backends build text with std::string, never with iostreams: some
// toolchains link libstdc++ statically into the module, and their iostreams then crash for want of
// locale initialisation (seen with the GPU host's GCC).
inline std::string fmt(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", v);
  return buffer;
}

}  // namespace sok

#endif  // SOK_KIT_ERROR_HPP_
