// Python 3.11's re parser (re/_parser.py) as a checker: py_regex.hpp says what it gives. The
// functions keep _parser.py's names and order; a pattern is kept only as far as the checks need it:
// each item's kind and width (SubPattern.getwidth), for repeats, back references and look-behinds.
#include "py_regex.hpp"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "py_text.hpp"
#include "utf8.hpp"

namespace sok::hps {
namespace {

using Text = std::u32string;
using Width = unsigned __int128;

constexpr uint64_t kMaxRepeat = 4294967295;  // _sre.MAXREPEAT
constexpr uint64_t kMaxGroups = 1073741823;  // _sre.MAXGROUPS
constexpr uint64_t kMaxCode = 4294967295;    // _compiler.MAXCODE
constexpr Width kMaxWidth = Width(1) << 64;  // _parser.MAXWIDTH
constexpr int kMaxNesting = 490;
constexpr size_t kMaxIntDigits = 4300;  // sys.get_int_max_str_digits()

// The flags of _constants.py.
constexpr int kTemplate = 1, kIgnoreCase = 2, kLocale = 4, kMultiline = 8, kDotAll = 16, kUnicode = 32, kVerbose = 64,
              kDebug = 128, kAscii = 256;
constexpr int kTypeFlags = kAscii | kLocale | kUnicode;
constexpr int kGlobalFlags = kDebug | kTemplate;

int flag_of(const Text& c) {
  if (c.size() != 1) return 0;
  switch (c[0]) {
    case 'i':
      return kIgnoreCase;
    case 'L':
      return kLocale;
    case 'm':
      return kMultiline;
    case 's':
      return kDotAll;
    case 'x':
      return kVerbose;
    case 'a':
      return kAscii;
    case 't':
      return kTemplate;
    case 'u':
      return kUnicode;
    default:
      return 0;
  }
}

std::string utf8(const Text& t) {
  std::string out;
  for (const char32_t c : t) append_utf8(out, c);
  return out;
}

Text text(char32_t c) { return Text(1, c); }
bool is(const Text& t, char32_t c) { return t.size() == 1 && t[0] == c; }
bool one_of(const Text& t, std::u32string_view chars) { return t.size() == 1 && chars.find(t[0]) != chars.npos; }
bool digit(char32_t c) { return c >= '0' && c <= '9'; }
bool octdigit(char32_t c) { return c >= '0' && c <= '7'; }
bool hexdigit(char32_t c) { return digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool ascii_letter(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
// str.isalpha() of a token (a two-character escape is not alphabetic).
bool isalpha(const Text& t) { return t.size() == 1 && (ascii_letter(t[0]) || t[0] >= 0x80); }

bool isidentifier(const Text& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char32_t c = name[i];
    if (!(ascii_letter(c) || c == '_' || c >= 0x80 || (i > 0 && digit(c)))) return false;
  }
  return true;
}

// An exception of re.compile: its class, message and position.
struct Fail {
  std::string type;
  std::string message;
  std::optional<size_t> pos;
};

Fail error(std::string message, std::optional<size_t> pos = std::nullopt) { return {"error", std::move(message), pos}; }

// The decimal digits of a count as int() reads them; ValueError beyond its digit limit.
std::string count_digits(const Text& digits) {
  if (digits.size() > kMaxIntDigits) {
    throw Fail{"ValueError",
               "Exceeds the limit (4300 digits) for integer string conversion: value has " +
                   std::to_string(digits.size()) + " digits; use sys.set_int_max_str_digits() to increase the limit",
               std::nullopt};
  }
  std::string out = utf8(digits);
  out.erase(0, std::min(out.find_first_not_of('0'), out.size() - 1));
  return out;
}

// a >= b for decimal strings without leading zeros.
bool at_least(const std::string& a, uint64_t b) {
  const std::string bs = std::to_string(b);
  return a.size() != bs.size() ? a.size() > bs.size() : a >= bs;
}

class Tokenizer {
 public:
  explicit Tokenizer(const Text& s) : s_(s) { advance(); }

  const Text& next() const { return next_; }
  bool match(char32_t c) {
    if (!is(next_, c)) return false;
    advance();
    return true;
  }
  Text get() {
    Text t = next_;
    advance();
    return t;
  }
  template <class Pred>
  Text getwhile(int n, Pred in_set) {
    Text result;
    for (int i = 0; i < n && next_.size() == 1 && in_set(next_[0]); ++i) result += get();
    return result;
  }
  Text getuntil(char32_t terminator, const std::string& name) {
    Text result;
    while (true) {
      const Text c = get();
      if (c.empty()) {
        if (result.empty()) throw fail("missing " + name);
        throw fail("missing " + utf8(text(terminator)) + ", unterminated name", result.size());
      }
      if (is(c, terminator)) {
        if (result.empty()) throw fail("missing " + name, 1);
        break;
      }
      result += c;
    }
    return result;
  }
  size_t tell() const { return index_ - next_.size(); }
  void seek(size_t index) {
    index_ = index;
    advance();
  }
  Fail fail(const std::string& message, size_t offset = 0) const { return error(message, tell() - offset); }
  void checkgroupname(const Text& name, size_t offset) const {
    if (!isidentifier(name)) throw fail("bad character in group name " + py_repr(utf8(name)), name.size() + offset);
  }

 private:
  void advance() {
    size_t index = index_;
    if (index >= s_.size()) {
      next_.clear();
      return;
    }
    Text c = text(s_[index]);
    if (c[0] == '\\') {
      ++index;
      if (index >= s_.size()) throw error("bad escape (end of pattern)", s_.size() - 1);
      c += s_[index];
    }
    index_ = index + 1;
    next_ = c;
  }

  const Text& s_;
  size_t index_ = 0;
  Text next_;
};

struct Range {
  Width lo = 0, hi = 0;
};

Range cap(Width lo, Width hi) { return {std::min(lo, kMaxWidth), std::min(hi, kMaxWidth)}; }

// The kinds of item a repeat tells apart: an anchor (AT: nothing to repeat), a repeat (multiple
// repeat), any other of _parser.py's opcodes.
enum class Kind { kAt, kRepeat, kOther };

struct Item {
  Kind kind;
  Range width;
};

// A SubPattern: its items.
using Sub = std::vector<Item>;

Range width_of(const Sub& sub) {
  Width lo = 0, hi = 0;
  for (const Item& item : sub) {
    lo += item.width.lo;
    hi += item.width.hi;
  }
  return cap(lo, hi);
}

// A look-behind assertion: where it starts (the compiler checks them in this order) and its width.
struct LookBehind {
  size_t start;
  Range width;
};

class State {
 public:
  int flags = 0;
  std::optional<size_t> lookbehindgroups;
  std::vector<std::pair<std::string, size_t>> grouprefpos;  // group number (decimal) -> position
  std::vector<LookBehind> lookbehinds;

  size_t groups() const { return groupwidths_.size(); }
  size_t opengroup(const std::optional<Text>& name, const Tokenizer& source) {
    const size_t gid = groups();
    groupwidths_.emplace_back();
    if (groups() > kMaxGroups) throw source.fail("too many groups", name ? name->size() + 1 : 0);
    if (name) {
      const auto found = groupdict_.find(*name);
      if (found != groupdict_.end()) {
        throw source.fail("redefinition of group name " + py_repr(utf8(*name)) + " as group " + std::to_string(gid) +
                              "; was group " + std::to_string(found->second),
                          name->size() + 1);
      }
      groupdict_[*name] = gid;
    }
    return gid;
  }
  void closegroup(size_t gid, const Sub& p) { groupwidths_[gid] = width_of(p); }
  bool checkgroup(size_t gid) const { return gid < groups() && groupwidths_[gid].has_value(); }
  Range groupwidth(size_t gid) const { return *groupwidths_[gid]; }
  std::optional<size_t> group_named(const Text& name) const {
    const auto found = groupdict_.find(name);
    return found == groupdict_.end() ? std::nullopt : std::optional<size_t>(found->second);
  }
  void checklookbehindgroup(size_t gid, const Tokenizer& source) const {
    if (!lookbehindgroups) return;
    if (!checkgroup(gid)) throw source.fail("cannot refer to an open group");
    if (gid >= *lookbehindgroups) throw source.fail("cannot refer to group defined in the same lookbehind subpattern");
  }

 private:
  std::vector<std::optional<Range>> groupwidths_ = {std::nullopt};  // group 0
  std::map<Text, size_t> groupdict_;
};

// A code of a character class: a literal (with its code point, unknown for a \N{...} name) or a
// category (IN).
struct ClassCode {
  bool literal;
  char32_t value;
  bool known = true;
};

// \x, \u, \U, \N and octal escapes, common to _class_escape and _escape; std::nullopt for others.
std::optional<ClassCode> numeric_escape(Tokenizer& source, Text& escape) {
  const char32_t c = escape[1];
  const auto hex = [&](int n) {
    escape += source.getwhile(n, hexdigit);
    if (escape.size() != static_cast<size_t>(n + 2)) {
      throw source.fail("incomplete escape " + utf8(escape), escape.size());
    }
    uint64_t value = 0;
    for (size_t i = 2; i < escape.size(); ++i) {
      const char32_t d = escape[i];
      value = value * 16 + (digit(d) ? d - '0' : (d | 0x20) - 'a' + 10);
    }
    return value;
  };
  if (c == 'x') return ClassCode{true, static_cast<char32_t>(hex(2))};
  if (c == 'u') return ClassCode{true, static_cast<char32_t>(hex(4))};
  if (c == 'U') {
    const uint64_t value = hex(8);
    if (value > 0x10FFFF) throw source.fail("bad escape " + utf8(escape), escape.size());  // chr()'s ValueError
    return ClassCode{true, static_cast<char32_t>(value)};
  }
  if (c == 'N') {
    if (!source.match('{')) throw source.fail("missing {");
    const Text name = source.getuntil('}', "character name");
    // Names are not looked up (py_regex.hpp); a Unicode name has 2 or more letters, digits, spaces and
    // hyphens, and starts and ends with a letter or a digit.
    const auto alnum = [](char32_t n) { return ascii_letter(n) || digit(n); };
    const bool name_like =
        name.size() >= 2 && alnum(name.front()) && alnum(name.back()) &&
        std::all_of(name.begin(), name.end(), [&](char32_t n) { return alnum(n) || n == ' ' || n == '-'; });
    if (!name_like) throw source.fail("undefined character name " + py_repr(utf8(name)), name.size() + 4);
    return ClassCode{true, 0, false};
  }
  return std::nullopt;
}

uint32_t octal(const Text& digits) {
  uint32_t value = 0;
  for (const char32_t d : digits) value = value * 8 + (d - '0');
  return value;
}

void check_octal(const Tokenizer& source, const Text& escape) {
  if (octal(escape.substr(1)) > 0377) {
    throw source.fail("octal escape value " + utf8(escape) + " outside of range 0-0o377", escape.size());
  }
}

// _class_escape: an escape inside a character class.
ClassCode class_escape(Tokenizer& source, Text escape) {
  const char32_t c = escape[1];
  static const std::u32string_view kEscapes = U"abfnrtv\\";
  static const char32_t kEscaped[] = {'\a', '\b', '\f', '\n', '\r', '\t', '\v', '\\'};
  if (kEscapes.find(c) != kEscapes.npos) return {true, kEscaped[kEscapes.find(c)]};
  if (std::u32string_view(U"dDsSwW").find(c) != std::u32string_view::npos) return {false, 0};
  if (const std::optional<ClassCode> code = numeric_escape(source, escape)) return *code;
  if (octdigit(c)) {
    escape += source.getwhile(2, octdigit);
    check_octal(source, escape);
    return {true, octal(escape.substr(1))};
  }
  if (!digit(c) && escape.size() == 2 && !ascii_letter(c)) return {true, c};
  throw source.fail("bad escape " + utf8(escape), escape.size());
}

// _escape: an escape outside a character class.
Item escape_item(Tokenizer& source, Text escape, State& state) {
  const char32_t c = escape[1];
  if (std::u32string_view(U"AbBZ").find(c) != std::u32string_view::npos) return {Kind::kAt, {}};
  if (std::u32string_view(U"dDsSwWafnrtv\\").find(c) != std::u32string_view::npos) return {Kind::kOther, {1, 1}};
  if (numeric_escape(source, escape)) return {Kind::kOther, {1, 1}};
  if (c == '0') {
    escape += source.getwhile(2, octdigit);
    return {Kind::kOther, {1, 1}};
  }
  if (digit(c)) {
    if (source.next().size() == 1 && digit(source.next()[0])) {
      escape += source.get();
      if (octdigit(escape[1]) && octdigit(escape[2]) && source.next().size() == 1 && octdigit(source.next()[0])) {
        escape += source.get();
        check_octal(source, escape);
        return {Kind::kOther, {1, 1}};
      }
    }
    const size_t group = std::stoul(utf8(escape.substr(1)));
    if (group < state.groups()) {
      if (!state.checkgroup(group)) throw source.fail("cannot refer to an open group", escape.size());
      state.checklookbehindgroup(group, source);
      return {Kind::kOther, state.groupwidth(group)};
    }
    throw source.fail("invalid group reference " + std::to_string(group), escape.size() - 1);
  }
  if (escape.size() == 2 && !ascii_letter(c)) return {Kind::kOther, {1, 1}};
  throw source.fail("bad escape " + utf8(escape), escape.size());
}

// int(text) of a conditional group's number, as a decimal without leading zeros; std::nullopt where
// int() refuses it or it is negative.
std::optional<std::string> group_number(const Text& name) {
  size_t begin = 0, end = name.size();
  while (begin < end && py_isspace(name[begin])) ++begin;
  while (end > begin && py_isspace(name[end - 1])) --end;
  if (begin < end && (name[begin] == '+' || name[begin] == '-')) {
    if (name[begin] == '-') {
      // "-0" is 0; any other negative number is refused like a non-number
      const Text rest = name.substr(begin + 1, end - begin - 1);
      const bool zero = !rest.empty() && rest.find_first_not_of(U"0_") == Text::npos && rest.front() != '_' &&
                        rest.back() != '_' && rest.find(U"__") == Text::npos;
      return zero ? std::optional<std::string>("0") : std::nullopt;
    }
    ++begin;
  }
  Text digits;
  for (size_t i = begin; i < end; ++i) {
    const char32_t c = name[i];
    if (digit(c)) {
      digits += c;
    } else if (!(c == '_' && i > begin && i + 1 < end && digit(name[i - 1]) && digit(name[i + 1]))) {
      return std::nullopt;
    }
  }
  if (digits.empty() || digits.size() > kMaxIntDigits) return std::nullopt;
  return count_digits(digits);
}

class Parser {
 public:
  explicit Parser(const Text& pattern) : source_(pattern) {}

  void parse() {
    parse_sub(false, 0);
    if ((state_.flags & kAscii) && (state_.flags & kUnicode)) {
      throw Fail{"ValueError", "ASCII and UNICODE flags are incompatible", std::nullopt};
    }
    if (!source_.next().empty()) throw source_.fail("unbalanced parenthesis");
    for (const auto& [group, pos] : state_.grouprefpos) {
      if (at_least(group, state_.groups())) throw error("invalid group reference " + group, pos);
    }
    // _compiler._compile: the look-behinds, outer before inner.
    std::vector<LookBehind> lookbehinds = state_.lookbehinds;
    std::stable_sort(lookbehinds.begin(), lookbehinds.end(),
                     [](const LookBehind& a, const LookBehind& b) { return a.start < b.start; });
    for (const LookBehind& l : lookbehinds) {
      if (l.width.lo > kMaxCode) throw error("looks too much behind");
      if (l.width.lo != l.width.hi) throw error("look-behind requires fixed-width pattern");
    }
  }

 private:
  // _parse_sub: an alternation a|b|c, as the width of the branch it becomes.
  Sub parse_sub(bool verbose, int nested) {
    if (nested > kMaxNesting) throw Fail{"RecursionError", "maximum recursion depth exceeded", std::nullopt};
    std::vector<Sub> items;
    while (true) {
      items.push_back(parse(verbose, nested + 1, nested == 0 && items.empty()));
      if (!source_.match('|')) break;
      if (nested == 0) verbose = state_.flags & kVerbose;
    }
    if (items.size() == 1) return items[0];
    Width lo = kMaxWidth, hi = 0;
    for (const Sub& item : items) {
      const Range w = width_of(item);
      lo = std::min(lo, w.lo);
      hi = std::max(hi, w.hi);
    }
    return {{Kind::kOther, cap(lo, hi)}};
  }

  // _parse: a sequence of items.
  Sub parse(bool verbose, int nested, bool first) {
    Sub subpattern;
    while (true) {
      Text self = source_.next();
      if (self.empty() || is(self, '|') || is(self, ')')) break;
      source_.get();
      if (verbose) {
        if (one_of(self, U" \t\n\r\v\f")) continue;
        if (is(self, '#')) {
          while (true) {
            self = source_.get();
            if (self.empty() || is(self, '\n')) break;
          }
          continue;
        }
      }
      if (self[0] == '\\') {
        subpattern.push_back(escape_item(source_, self, state_));
      } else if (!one_of(self, U".[{()*+?^$|")) {
        subpattern.push_back({Kind::kOther, {1, 1}});
      } else if (is(self, '[')) {
        character_set();
        subpattern.push_back({Kind::kOther, {1, 1}});
      } else if (one_of(self, U"*+?{")) {
        repeat(self, subpattern);
      } else if (is(self, '.')) {
        subpattern.push_back({Kind::kOther, {1, 1}});
      } else if (is(self, '(')) {
        group(verbose, nested, first, subpattern);  // global flags may turn verbose on
      } else {                                      // ^ and $
        subpattern.push_back({Kind::kAt, {}});
      }
    }
    return subpattern;
  }

  void character_set() {
    const size_t here = source_.tell() - 1;
    size_t items = 0;
    source_.match('^');
    while (true) {
      Text self = source_.get();
      if (self.empty()) throw source_.fail("unterminated character set", source_.tell() - here);
      if (is(self, ']') && items > 0) break;
      const ClassCode code1 = self[0] == '\\' ? class_escape(source_, self) : ClassCode{true, self[0]};
      if (source_.match('-')) {
        const Text that = source_.get();
        if (that.empty()) throw source_.fail("unterminated character set", source_.tell() - here);
        if (is(that, ']')) {
          items += 2;
          break;
        }
        const ClassCode code2 = that[0] == '\\' ? class_escape(source_, that) : ClassCode{true, that[0]};
        const bool reversed = code1.known && code2.known && code2.value < code1.value;
        if (!code1.literal || !code2.literal || reversed) {
          throw source_.fail("bad character range " + utf8(self) + "-" + utf8(that), self.size() + 1 + that.size());
        }
      }
      ++items;
    }
  }

  void repeat(const Text& self, Sub& subpattern) {
    const size_t here = source_.tell();
    uint64_t min = 0, max = kMaxRepeat;
    if (is(self, '?')) {
      max = 1;
    } else if (is(self, '+')) {
      min = 1;
    } else if (is(self, '{')) {
      if (is(source_.next(), '}')) {
        subpattern.push_back({Kind::kOther, {1, 1}});
        return;
      }
      Text lo, hi;
      while (source_.next().size() == 1 && digit(source_.next()[0])) lo += source_.get();
      if (source_.match(',')) {
        while (source_.next().size() == 1 && digit(source_.next()[0])) hi += source_.get();
      } else {
        hi = lo;
      }
      if (!source_.match('}')) {
        subpattern.push_back({Kind::kOther, {1, 1}});
        source_.seek(here);
        return;
      }
      const auto count = [](const Text& digits) {
        const std::string n = count_digits(digits);
        if (at_least(n, kMaxRepeat)) throw Fail{"OverflowError", "the repetition number is too large", std::nullopt};
        return std::stoull(n);
      };
      if (!lo.empty()) min = count(lo);
      if (!hi.empty()) {
        max = count(hi);
        if (max < min) throw source_.fail("min repeat greater than max repeat", source_.tell() - here);
      }
    }
    if (subpattern.empty() || subpattern.back().kind == Kind::kAt) {
      throw source_.fail("nothing to repeat", source_.tell() - here + self.size());
    }
    if (subpattern.back().kind == Kind::kRepeat) {
      throw source_.fail("multiple repeat", source_.tell() - here + self.size());
    }
    if (!source_.match('?')) source_.match('+');
    const Range item = subpattern.back().width;
    const Width hi = max == kMaxRepeat && item.hi ? kMaxWidth : item.hi * max;
    subpattern.back() = {Kind::kRepeat, cap(item.lo * min, hi)};
  }

  void group(bool& verbose, int nested, bool first, Sub& subpattern) {
    const size_t start = source_.tell() - 1;
    bool capture = true;
    std::optional<Text> name;
    int add_flags = 0, del_flags = 0;
    if (source_.match('?')) {
      Text c = source_.get();
      if (c.empty()) throw source_.fail("unexpected end of pattern");
      if (is(c, 'P')) {
        if (source_.match('<')) {
          name = source_.getuntil('>', "group name");
          source_.checkgroupname(*name, 1);
        } else if (source_.match('=')) {
          const Text ref = source_.getuntil(')', "group name");
          source_.checkgroupname(ref, 1);
          const std::optional<size_t> gid = state_.group_named(ref);
          if (!gid) throw source_.fail("unknown group name " + py_repr(utf8(ref)), ref.size() + 1);
          if (!state_.checkgroup(*gid)) throw source_.fail("cannot refer to an open group", ref.size() + 1);
          state_.checklookbehindgroup(*gid, source_);
          subpattern.push_back({Kind::kOther, state_.groupwidth(*gid)});
          return;
        } else {
          c = source_.get();
          if (c.empty()) throw source_.fail("unexpected end of pattern");
          throw source_.fail("unknown extension ?P" + utf8(c), c.size() + 2);
        }
      } else if (is(c, ':')) {
        capture = false;
      } else if (is(c, '#')) {
        while (true) {
          if (source_.next().empty()) throw source_.fail("missing ), unterminated comment", source_.tell() - start);
          if (is(source_.get(), ')')) return;
        }
      } else if (one_of(c, U"=!<")) {
        lookaround(c, verbose, nested, start, subpattern);
        return;
      } else if (is(c, '(')) {
        conditional(verbose, nested, start, subpattern);
        return;
      } else if (is(c, '>')) {
        capture = false;
      } else if (flag_of(c) != 0 || is(c, '-')) {
        const std::optional<std::pair<int, int>> flags = parse_flags(c);
        if (!flags) {  // global flags
          if (!first || !subpattern.empty()) {
            throw source_.fail("global flags not at the start of the expression", source_.tell() - start);
          }
          verbose = state_.flags & kVerbose;
          return;
        }
        std::tie(add_flags, del_flags) = *flags;
        capture = false;
      } else {
        throw source_.fail("unknown extension ?" + utf8(c), c.size() + 1);
      }
    }
    const std::optional<size_t> gid = capture ? std::optional<size_t>(state_.opengroup(name, source_)) : std::nullopt;
    const bool sub_verbose = (verbose || (add_flags & kVerbose)) && !(del_flags & kVerbose);
    const Sub p = parse_sub(sub_verbose, nested + 1);
    if (!source_.match(')')) throw source_.fail("missing ), unterminated subpattern", source_.tell() - start);
    if (gid) state_.closegroup(*gid, p);
    subpattern.push_back({Kind::kOther, width_of(p)});
  }

  void lookaround(Text c, bool verbose, int nested, size_t start, Sub& subpattern) {
    const bool behind = is(c, '<');
    std::optional<size_t> outer;
    if (behind) {
      c = source_.get();
      if (c.empty()) throw source_.fail("unexpected end of pattern");
      if (!one_of(c, U"=!")) throw source_.fail("unknown extension ?<" + utf8(c), c.size() + 2);
      outer = state_.lookbehindgroups;
      if (!outer) state_.lookbehindgroups = state_.groups();
    }
    const Sub p = parse_sub(verbose, nested + 1);
    if (behind && !outer) state_.lookbehindgroups.reset();
    if (!source_.match(')')) throw source_.fail("missing ), unterminated subpattern", source_.tell() - start);
    if (behind) state_.lookbehinds.push_back({start, width_of(p)});
    subpattern.push_back({Kind::kOther, {}});
  }

  void conditional(bool verbose, int nested, size_t start, Sub& subpattern) {
    const Text condname = source_.getuntil(')', "group name");
    size_t condgroup = 0;
    if (isidentifier(condname)) {
      source_.checkgroupname(condname, 1);
      const std::optional<size_t> gid = state_.group_named(condname);
      if (!gid) throw source_.fail("unknown group name " + py_repr(utf8(condname)), condname.size() + 1);
      condgroup = *gid;
    } else {
      // Python 3.12 refuses what 3.11 took with a DeprecationWarning: a number of other than ASCII digits
      const bool ascii_digits = !condname.empty() && std::all_of(condname.begin(), condname.end(),
                                                                 [](char32_t c) { return c >= '0' && c <= '9'; });
      if (python_minor() >= 12 && !ascii_digits) {
        throw source_.fail("bad character in group name " + py_repr(utf8(condname)), condname.size() + 1);
      }
      const std::optional<std::string> number = group_number(condname);
      if (!number) throw source_.fail("bad character in group name " + py_repr(utf8(condname)), condname.size() + 1);
      if (*number == "0") throw source_.fail("bad group number", condname.size() + 1);
      if (at_least(*number, kMaxGroups)) {
        throw source_.fail("invalid group reference " + *number, condname.size() + 1);
      }
      condgroup = std::stoul(*number);
      const bool seen = std::any_of(state_.grouprefpos.begin(), state_.grouprefpos.end(),
                                    [&](const auto& g) { return g.first == *number; });
      if (!seen) state_.grouprefpos.emplace_back(*number, source_.tell() - condname.size() - 1);
    }
    state_.checklookbehindgroup(condgroup, source_);
    const Range yes = width_of(parse(verbose, nested + 1, false));
    Range width = {0, yes.hi};
    if (source_.match('|')) {
      const Range no = width_of(parse(verbose, nested + 1, false));
      if (is(source_.next(), '|')) throw source_.fail("conditional backref with more than two branches");
      width = {std::min(yes.lo, no.lo), std::max(yes.hi, no.hi)};
    }
    if (!source_.match(')')) throw source_.fail("missing ), unterminated subpattern", source_.tell() - start);
    subpattern.push_back({Kind::kOther, width});
  }

  // _parse_flags: the flags of "(?aiLmsux-imsx:...)" or "(?aiLmsux)" (global: std::nullopt).
  std::optional<std::pair<int, int>> parse_flags(Text c) {
    int add_flags = 0, del_flags = 0;
    if (!is(c, '-')) {
      while (true) {
        const int flag = flag_of(c);
        if (is(c, 'L')) throw source_.fail("bad inline flags: cannot use 'L' flag with a str pattern");
        add_flags |= flag;
        if ((flag & kTypeFlags) && (add_flags & kTypeFlags) != flag) {
          throw source_.fail("bad inline flags: flags 'a', 'u' and 'L' are incompatible");
        }
        c = source_.get();
        if (c.empty()) throw source_.fail("missing -, : or )");
        if (one_of(c, U")-:")) break;
        if (flag_of(c) == 0) throw source_.fail(isalpha(c) ? "unknown flag" : "missing -, : or )", c.size());
      }
    }
    if (is(c, ')')) {
      state_.flags |= add_flags;
      return std::nullopt;
    }
    if (add_flags & kGlobalFlags) throw source_.fail("bad inline flags: cannot turn on global flag", 1);
    if (is(c, '-')) {
      c = source_.get();
      if (c.empty()) throw source_.fail("missing flag");
      if (flag_of(c) == 0) throw source_.fail(isalpha(c) ? "unknown flag" : "missing flag", c.size());
      while (true) {
        const int flag = flag_of(c);
        if (flag & kTypeFlags) throw source_.fail("bad inline flags: cannot turn off flags 'a', 'u' and 'L'");
        del_flags |= flag;
        c = source_.get();
        if (c.empty()) throw source_.fail("missing :");
        if (is(c, ':')) break;
        if (flag_of(c) == 0) throw source_.fail(isalpha(c) ? "unknown flag" : "missing :", c.size());
      }
    }
    if (del_flags & kGlobalFlags) throw source_.fail("bad inline flags: cannot turn off global flag", 1);
    if (add_flags & del_flags) throw source_.fail("bad inline flags: flag turned on and off", 1);
    return std::make_pair(add_flags, del_flags);
  }

  Tokenizer source_;
  State state_;
};

// str(re.error(message, pattern, pos)): the position, and its line and column in a pattern of lines.
std::string error_text(const Fail& f, const Text& pattern) {
  if (!f.pos) return f.message;
  const size_t pos = *f.pos;
  std::string out = f.message + " at position " + std::to_string(pos);
  if (pattern.find('\n') == Text::npos) return out;
  const size_t line = std::count(pattern.begin(), pattern.begin() + std::min(pos, pattern.size()), U'\n') + 1;
  const size_t last = pattern.rfind('\n', pos == 0 ? 0 : pos - 1);
  const size_t column = last == Text::npos || pos == 0 ? pos + 1 : pos - last;
  return out + " (line " + std::to_string(line) + ", column " + std::to_string(column) + ")";
}

}  // namespace

std::optional<PyRegexError> py_regex_error(std::string_view pattern) {
  const std::vector<uint32_t> cps = code_points(pattern);
  const Text text(cps.begin(), cps.end());
  try {
    Parser(text).parse();
  } catch (const Fail& f) {
    return PyRegexError{f.type, error_text(f, text)};
  }
  return std::nullopt;
}

}  // namespace sok::hps
