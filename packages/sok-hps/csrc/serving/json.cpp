// The JSON reader of json.hpp: a recursive descent over the text, as Python's json.scanner.
#include "json.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "utf8.hpp"

namespace sok::hps::json {
namespace {

// sys.get_int_max_str_digits(): the most digits int() reads.
constexpr size_t kMaxIntDigits = 4300;

}  // namespace

Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.type_ = Type::kInt;
  v.int_ = i;
  return v;
}

Value Value::unsigned_integer(uint64_t u) {
  Value v;
  v.type_ = Type::kInt;
  v.uint_ = u;
  v.above_int64_ = u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  v.int_ = v.above_int64_ ? 0 : static_cast<int64_t>(u);
  return v;
}

Value Value::big_integer(std::string decimal) {
  Value v;
  v.type_ = Type::kInt;
  v.big_ = true;
  v.string_ = std::move(decimal);
  return v;
}

Value Value::floating(double d) {
  Value v;
  v.type_ = Type::kFloat;
  v.float_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}

Value Value::array(Array items) {
  Value v;
  v.type_ = Type::kArray;
  v.array_ = std::make_shared<const Array>(std::move(items));
  return v;
}

Value Value::object(Object members) {
  Value v;
  v.type_ = Type::kObject;
  v.object_ = std::make_shared<const Object>(std::move(members));
  return v;
}

namespace {

[[noreturn]] void wrong_type(const Value& v, const char* wanted) {
  throw std::logic_error(std::string("JSON value is ") + v.kind() + ", not " + wanted);
}

}  // namespace

bool Value::as_bool() const {
  if (type_ != Type::kBool) wrong_type(*this, "a boolean");
  return bool_;
}

int64_t Value::as_int() const {
  if (type_ != Type::kInt) wrong_type(*this, "an integer");
  if (above_int64_) throw std::logic_error("JSON integer " + std::to_string(uint_) + " does not fit int64");
  if (big_) throw std::logic_error("JSON integer " + string_ + " does not fit int64");
  return int_;
}

uint64_t Value::as_uint64() const {
  if (type_ != Type::kInt) wrong_type(*this, "an integer");
  if (big_) throw std::logic_error("JSON integer " + string_ + " does not fit uint64");
  if (!above_int64_ && int_ < 0) throw std::logic_error("JSON integer " + std::to_string(int_) + " is negative");
  return above_int64_ ? uint_ : static_cast<uint64_t>(int_);
}

const std::string& Value::big_decimal() const {
  if (!big()) throw std::logic_error("JSON value is not an integer outside int64 and uint64");
  return string_;
}

double Value::as_number() const {
  if (big_) return std::strtod(string_.c_str(), nullptr);  // +-inf beyond double's range
  if (type_ == Type::kInt) return above_int64_ ? static_cast<double>(uint_) : static_cast<double>(int_);
  if (type_ != Type::kFloat) wrong_type(*this, "a number");
  return float_;
}

const std::string& Value::as_string() const {
  if (type_ != Type::kString) wrong_type(*this, "a string");
  return string_;
}

const Array& Value::as_array() const {
  if (type_ != Type::kArray) wrong_type(*this, "an array");
  return *array_;
}

const Object& Value::as_object() const {
  if (type_ != Type::kObject) wrong_type(*this, "an object");
  return *object_;
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [name, value] : as_object()) {
    if (name == key) return &value;
  }
  return nullptr;
}

const char* Value::kind() const {
  switch (type_) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "a boolean";
    case Type::kInt:
    case Type::kFloat:
      return "a number";
    case Type::kString:
      return "a string";
    case Type::kArray:
      return "an array";
    case Type::kObject:
      return "an object";
  }
  return "a value";
}

namespace {

class Parser {
 public:
  Parser(std::string_view text, BigIntegers big_integers) : s_(text), big_integers_(big_integers) {}

  Value document() {
    if (s_.size() >= 3 && s_.substr(0, 3) == "\xEF\xBB\xBF") fail("Unexpected UTF-8 BOM (decode using utf-8-sig)", 0);
    skip_space();
    Value v = value(0);
    skip_space();
    if (at_ < s_.size()) fail("Extra data", at_);
    return v;
  }

 private:
  // json.JSONDecodeError's message for an error at byte `at`: line, column and offset in code points.
  [[noreturn]] void fail(const std::string& what, size_t at,
                         ParseError::Reason reason = ParseError::Reason::kSyntax) const {
    size_t line = 1, column = 1, chars = 0;
    for (size_t i = 0; i < at && i < s_.size(); ++i) {
      const auto c = static_cast<unsigned char>(s_[i]);
      if ((c & 0xC0) == 0x80) continue;  // a UTF-8 continuation byte: not a code point of its own
      ++chars;
      if (c == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw ParseError(reason, what + ": line " + std::to_string(line) + " column " + std::to_string(column) + " (char " +
                                 std::to_string(chars) + ")");
  }

  void skip_space() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) ++at_;
  }

  bool literal(std::string_view word) {
    if (s_.substr(at_, word.size()) != word) return false;
    at_ += word.size();
    return true;
  }

  Value value(int depth) {
    if (at_ >= s_.size()) fail("Expecting value", at_);
    const char c = s_[at_];
    if (c == '"') return Value::string(string());
    if (c == '{' || c == '[') {
      if (depth >= kMaxDepth) {
        fail("arrays and objects nest deeper than " + std::to_string(kMaxDepth) + " levels", at_,
             ParseError::Reason::kTooDeep);
      }
      return c == '{' ? object(depth + 1) : array(depth + 1);
    }
    if (literal("null")) return Value();
    if (literal("true")) return Value::boolean(true);
    if (literal("false")) return Value::boolean(false);
    if (literal("NaN")) return Value::floating(std::numeric_limits<double>::quiet_NaN());
    if (literal("Infinity")) return Value::floating(std::numeric_limits<double>::infinity());
    if (literal("-Infinity")) return Value::floating(-std::numeric_limits<double>::infinity());
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail("Expecting value", at_);
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  // -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?, as json.scanner's NUMBER_RE: a fraction or an exponent
  // without digits is not part of the number (the text after it is then "Extra data").
  Value number() {
    const size_t begin = at_;
    size_t i = at_;
    if (s_[i] == '-') ++i;
    if (i >= s_.size() || !digit(s_[i])) fail("Expecting value", begin);
    if (s_[i] == '0') {
      ++i;
    } else {
      while (i < s_.size() && digit(s_[i])) ++i;
    }
    bool integral = true;
    if (i + 1 < s_.size() && s_[i] == '.' && digit(s_[i + 1])) {
      integral = false;
      i += 2;
      while (i < s_.size() && digit(s_[i])) ++i;
    }
    if (i + 1 < s_.size() && (s_[i] == 'e' || s_[i] == 'E')) {
      size_t j = i + 1;
      if (j < s_.size() && (s_[j] == '+' || s_[j] == '-')) ++j;
      if (j < s_.size() && digit(s_[j])) {
        integral = false;
        i = j;
        while (i < s_.size() && digit(s_[i])) ++i;
      }
    }
    const std::string text(s_.substr(begin, i - begin));
    at_ = i;
    errno = 0;
    if (integral) {
      const size_t digits = text.size() - (text[0] == '-');
      if (digits > kMaxIntDigits) {
        throw ParseError(ParseError::Reason::kIntegerDigits,
                         "Exceeds the limit (" + std::to_string(kMaxIntDigits) +
                             " digits) for integer string conversion: value has " + std::to_string(digits) +
                             " digits; use sys.set_int_max_str_digits() to increase the limit");
      }
      const long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno != ERANGE) return Value::integer(v);
      if (text[0] != '-') {
        errno = 0;
        const unsigned long long u = std::strtoull(text.c_str(), nullptr, 10);
        if (errno != ERANGE) return Value::unsigned_integer(u);
      }
      if (big_integers_ == BigIntegers::kKeep) return Value::big_integer(text);
      fail("integer " + text + " does not fit 64 bits", begin, ParseError::Reason::kIntegerRange);
    }
    return Value::floating(std::strtod(text.c_str(), nullptr));  // an overflow is +-inf, as Python's float()
  }

  // The 4 hex digits after the "\u" at at_ - 1 (at_ on the 'u'), or -1.
  int64_t hex4(size_t u) const {
    if (u + 5 > s_.size()) return -1;
    int64_t v = 0;
    for (size_t i = u + 1; i < u + 5; ++i) {
      const char c = s_[i];
      int d = digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) return -1;
      v = v * 16 + d;
    }
    return v;
  }

  std::string string() {
    const size_t quote = at_++;
    std::string out;
    while (true) {
      if (at_ >= s_.size()) fail("Unterminated string starting at", quote);
      const char c = s_[at_];
      if (c == '"') {
        ++at_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("Invalid control character at", at_);
      if (c != '\\') {
        out += c;
        ++at_;
        continue;
      }
      if (at_ + 1 >= s_.size()) fail("Unterminated string starting at", quote);
      const char e = s_[at_ + 1];
      const char* simple = nullptr;
      switch (e) {
        case '"':
          simple = "\"";
          break;
        case '\\':
          simple = "\\";
          break;
        case '/':
          simple = "/";
          break;
        case 'b':
          simple = "\b";
          break;
        case 'f':
          simple = "\f";
          break;
        case 'n':
          simple = "\n";
          break;
        case 'r':
          simple = "\r";
          break;
        case 't':
          simple = "\t";
          break;
        default:
          break;
      }
      if (simple != nullptr) {
        out += simple;
        at_ += 2;
        continue;
      }
      if (e != 'u') fail("Invalid \\escape", at_);
      // the rules of json's C scanner: the 4 digits must not end the text, and a pair needs 6
      // characters and one more after the first escape
      const size_t u = at_ + 1;
      int64_t cp = u + 5 < s_.size() ? hex4(u) : -1;
      if (cp < 0) fail("Invalid \\uXXXX escape", u);
      at_ = u + 5;
      // a high surrogate followed by "\u" and a low one: one code point
      if (cp >= 0xD800 && cp <= 0xDBFF && at_ + 6 < s_.size() && s_[at_] == '\\' && s_[at_ + 1] == 'u') {
        const int64_t low = hex4(at_ + 1);
        if (low < 0) fail("Invalid \\uXXXX escape", at_ + 1);
        if (low >= 0xDC00 && low <= 0xDFFF) {
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          at_ += 6;
        }
      }
      append_utf8(out, static_cast<uint32_t>(cp));
    }
  }

  Value array(int depth) {
    ++at_;  // '['
    Array items;
    skip_space();
    if (at_ < s_.size() && s_[at_] == ']') {
      ++at_;
      return Value::array(std::move(items));
    }
    while (true) {
      skip_space();
      items.push_back(value(depth));
      skip_space();
      if (at_ < s_.size() && s_[at_] == ']') {
        ++at_;
        return Value::array(std::move(items));
      }
      if (at_ >= s_.size() || s_[at_] != ',') fail("Expecting ',' delimiter", at_);
      ++at_;
    }
  }

  Value object(int depth) {
    ++at_;  // '{'
    Object members;
    skip_space();
    if (at_ < s_.size() && s_[at_] == '}') {
      ++at_;
      return Value::object(std::move(members));
    }
    while (true) {
      skip_space();
      if (at_ >= s_.size() || s_[at_] != '"') fail("Expecting property name enclosed in double quotes", at_);
      std::string key = string();
      skip_space();
      if (at_ >= s_.size() || s_[at_] != ':') fail("Expecting ':' delimiter", at_);
      ++at_;
      skip_space();
      Value v = value(depth);
      bool repeated = false;
      for (auto& member : members) {
        if (member.first == key) {
          member.second = std::move(v);
          repeated = true;
          break;
        }
      }
      if (!repeated) members.emplace_back(std::move(key), std::move(v));
      skip_space();
      if (at_ < s_.size() && s_[at_] == '}') {
        ++at_;
        return Value::object(std::move(members));
      }
      if (at_ >= s_.size() || s_[at_] != ',') fail("Expecting ',' delimiter", at_);
      ++at_;
    }
  }

  std::string_view s_;
  BigIntegers big_integers_;
  size_t at_ = 0;
};

}  // namespace

Value parse(std::string_view text, BigIntegers big_integers) { return Parser(text, big_integers).document(); }

}  // namespace sok::hps::json
