// What Python 3.11's re.compile(pattern) raises for a str pattern, without compiling it: its parser
// (re/_parser.py) and the checks of its compiler (look-behind widths), ported step for step, with
// their messages ("missing ), unterminated subpattern at position 0"). config.py refuses an
// update_filters entry that re.compile refuses, and the C++ reader must say the same.
//
// Differences, on patterns no ps_config holds:
// * a \N{...} name is not looked up: any name of a Unicode name's shape is taken, and a range with
//   its character is not checked;
// * str.isidentifier() (group names), str.isalpha() (after "(?" flags) and int() (a "(?(1)...)"
//   group number) are ASCII's here: a non-ASCII character counts as a letter, never as a digit;
// * nesting beyond 490 levels is RecursionError here; Python's limit depends on its stack (about
//   496 levels).
//
// Example:
//   py_regex_error("(")->message   // "missing ), unterminated subpattern at position 0"
//   py_regex_error(".+")           // std::nullopt
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace sok::hps {

struct PyRegexError {
  // The Python exception's class: "error" (re.error), "OverflowError" (a repeat count of 2**32 - 1
  // or more), "ValueError" (flags 'a' and 'u' together, a count of more than 4300 digits) or
  // "RecursionError".
  std::string type;
  std::string message;  // str() of the exception
};

// The exception re.compile(pattern) raises, std::nullopt where it compiles. `pattern` is UTF-8.
std::optional<PyRegexError> py_regex_error(std::string_view pattern);

}  // namespace sok::hps
