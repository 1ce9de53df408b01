// A JSON reader for the C++ server's files (the ps_config, a checkpoint's manifest.json): what
// Python's json.loads makes of a text, as C++ values, so that the C++ and the Python readers of one
// file see the same values and give the same messages.
//
// As json.loads: NaN, Infinity and -Infinity are numbers; an object's repeated key keeps its last
// value (at the place of its first); a number with a fraction or an exponent is a float, one without
// an integer; strings are UTF-8, \u escapes of lone surrogates kept as their 3-byte code; a parse
// error's message is json.JSONDecodeError's ("Expecting ',' delimiter: line 3 column 5 (char 20)",
// columns and offsets in code points); an integer of more than 4300 digits is an error with int()'s
// ValueError message. Differences: an integer outside int64 and uint64 (below -2**63 or above
// 2**64 - 1) is an error unless parse is told to keep it (BigIntegers::kKeep: then it is a Value
// holding its decimal digits, as Python keeps any integer of at most 4300 digits), and nesting deeper
// than kMaxDepth is an error (Python's RecursionError, at about 1000 levels). ParseError::reason()
// tells these apart.
//
// Example:
//   sok::hps::json::Value v = sok::hps::json::parse(R"({"models": [{"model": "foo"}]})");
//   const Value* models = v.find("models");          // nullptr where absent
//   models->as_array()[0].find("model")->as_string();  // "foo"
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sok::hps::json {

// How deep arrays and objects may nest.
constexpr int kMaxDepth = 512;

// A text that is not JSON, or not what json.loads can or this reader will read.
class ParseError : public std::runtime_error {
 public:
  enum class Reason {
    kSyntax,         // not JSON: what() is json.JSONDecodeError's message
    kTooDeep,        // nested deeper than kMaxDepth (Python: RecursionError)
    kIntegerDigits,  // an integer of more than 4300 digits: what() is int()'s ValueError message
    kIntegerRange,   // an integer outside int64 and uint64, under BigIntegers::kRefuse (Python keeps it)
  };
  ParseError(Reason reason, const std::string& what) : std::runtime_error(what), reason_(reason) {}
  Reason reason() const { return reason_; }

 private:
  Reason reason_;
};

enum class Type { kNull, kBool, kInt, kFloat, kString, kArray, kObject };

// What parse does with an integer outside int64 and uint64 (of at most 4300 digits): refuse it
// (ParseError::Reason::kIntegerRange) or keep it as its decimal digits (Value::big()).
enum class BigIntegers { kRefuse, kKeep };

class Value;
using Array = std::vector<Value>;
using Object = std::vector<std::pair<std::string, Value>>;  // keys in the order of their first appearance

class Value {
 public:
  Value() = default;  // null
  static Value boolean(bool b);
  static Value integer(int64_t i);
  // An integer above int64's maximum (up to uint64's).
  static Value unsigned_integer(uint64_t u);
  // An integer outside int64 and uint64, as its decimal digits ("-" first where negative).
  static Value big_integer(std::string decimal);
  static Value floating(double d);
  static Value string(std::string s);
  static Value array(Array items);
  static Value object(Object members);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_number() const { return type_ == Type::kInt || type_ == Type::kFloat; }
  // The value as its type; std::logic_error for another type (the reader checks type() first).
  bool as_bool() const;
  int64_t as_int() const;  // std::logic_error above int64's maximum or big() too
  // Whether an integer is above int64's maximum and within uint64; as_uint64() gives any
  // non-negative integer that is not big().
  bool above_int64() const { return type_ == Type::kInt && above_int64_; }
  uint64_t as_uint64() const;
  // Whether an integer is outside int64 and uint64 (only parse(text, BigIntegers::kKeep) makes one);
  // big_decimal() gives its digits.
  bool big() const { return type_ == Type::kInt && big_; }
  const std::string& big_decimal() const;
  double as_number() const;  // an integer (+-inf beyond double's range) or a float
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;
  // The member `key` of an object, nullptr where absent (std::logic_error if not an object).
  const Value* find(std::string_view key) const;
  // What json.loads makes of the value, as config.py's messages name it: "an object", "an array",
  // "a string", "a number", "a boolean", "null".
  const char* kind() const;

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  int64_t int_ = 0;
  uint64_t uint_ = 0;  // an integer above int64's maximum
  bool above_int64_ = false;
  bool big_ = false;  // an integer outside int64 and uint64: its digits in string_
  double float_ = 0.0;
  std::string string_;
  std::shared_ptr<const Array> array_;  // shared: copies of a parsed tree are cheap
  std::shared_ptr<const Object> object_;
};

// The value of `text` (the whole text: whitespace may follow it, nothing else). Throws ParseError.
Value parse(std::string_view text, BigIntegers big_integers = BigIntegers::kRefuse);

}  // namespace sok::hps::json
