#include "llm/json.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

#include "common/check.h"

namespace nibble::llm {

namespace {
[[noreturn]] void fail_kind(const char* want, Json::Kind got) {
  detail::fail(ErrorCode::invalid_argument, std::string("nibble::llm::Json: expected ") + want +
                                                ", got " + Json::to_string(got));
}
}  // namespace

// Recursive descent; depth is bounded by Json::kMaxDepth, so recursion is bounded too.
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

class JsonParser {
 public:
  JsonParser(std::string_view text, const std::string& what) : s_(text), what_(what) {}

  Json document() {
    Json v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected bytes after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) const {
    detail::fail(ErrorCode::invalid_argument,
                 "nibble::llm::Json: " + what_ + ": " + msg + " at byte " + std::to_string(pos_));
  }

  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  char peek() {
    if (pos_ >= s_.size()) fail("unexpected end of input");
    return s_[pos_];
  }

  void expect_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) fail("invalid literal");
    pos_ += lit.size();
  }

  Json value(int depth) {
    if (depth >= Json::kMaxDepth)
      fail("nesting deeper than " + std::to_string(Json::kMaxDepth) + " levels");
    skip_ws();
    Json v;
    switch (peek()) {
      case '{':
        object(v, depth);
        break;
      case '[':
        array(v, depth);
        break;
      case '"':
        v.kind_ = Json::Kind::string;
        v.string_ = string();
        break;
      case 't':
        expect_literal("true");
        v.kind_ = Json::Kind::boolean;
        v.bool_ = true;
        break;
      case 'f':
        expect_literal("false");
        v.kind_ = Json::Kind::boolean;
        break;
      case 'n':
        expect_literal("null");
        break;
      default:
        number(v);
        break;
    }
    return v;
  }

  void object(Json& v, int depth) {
    v.kind_ = Json::Kind::object;
    ++pos_;  // '{'
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    std::unordered_set<std::string> seen;
    while (true) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      std::string key = string();
      if (!seen.insert(key).second) fail("duplicate key \"" + key + "\"");
      skip_ws();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      Json member = value(depth + 1);
      v.members_.emplace_back(std::move(key), std::move(member));
      skip_ws();
      const char c = peek();
      ++pos_;
      if (c == '}') return;
      if (c != ',') {
        --pos_;
        fail("expected ',' or '}'");
      }
    }
  }

  void array(Json& v, int depth) {
    v.kind_ = Json::Kind::array;
    ++pos_;  // '['
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return;
    }
    while (true) {
      v.items_.push_back(value(depth + 1));
      skip_ws();
      const char c = peek();
      ++pos_;
      if (c == ']') return;
      if (c != ',') {
        --pos_;
        fail("expected ',' or ']'");
      }
    }
  }

  unsigned hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      u <<= 4;
      if (c >= '0' && c <= '9')
        u |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f')
        u |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        u |= static_cast<unsigned>(c - 'A' + 10);
      else
        fail("invalid hex digit in a \\u escape");
    }
    return u;
  }



  std::string string() {
    ++pos_;  // '"'
    std::string out;
    while (true) {
      const char c = peek();
      ++pos_;
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        fail("unescaped control character in a string");
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") fail("high surrogate without its low half");
            pos_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate without its low half");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          fail("invalid escape in a string");
      }
    }
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  void number(Json& v) {
    const size_t start = pos_;
    bool integral = true;
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || !digit(s_[pos_])) fail("invalid value");
    if (s_[pos_] == '0') {
      ++pos_;
      if (pos_ < s_.size() && digit(s_[pos_])) fail("a number with a leading zero");
    } else {
      while (pos_ < s_.size() && digit(s_[pos_])) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      integral = false;
      ++pos_;
      if (pos_ >= s_.size() || !digit(s_[pos_])) fail("a number with no digit after '.'");
      while (pos_ < s_.size() && digit(s_[pos_])) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      integral = false;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ >= s_.size() || !digit(s_[pos_])) fail("a number with an empty exponent");
      while (pos_ < s_.size() && digit(s_[pos_])) ++pos_;
    }
    // strtod/strtoll need a terminated string; numbers are short, so copy.
    const std::string lit(s_.substr(start, pos_ - start));
    v.kind_ = Json::Kind::number;
    v.number_ = std::strtod(lit.c_str(), nullptr);
    if (integral) {
      errno = 0;
      const long long i = std::strtoll(lit.c_str(), nullptr, 10);
      if (errno == 0) {
        v.is_int_ = true;
        v.int_ = i;
      }
    }
  }

  std::string_view s_;
  const std::string& what_;
  size_t pos_ = 0;
};

Json Json::parse(std::string_view text, const std::string& what) {
  return JsonParser(text, what).document();
}

const char* Json::to_string(Kind k) {
  switch (k) {
    case Kind::null:
      return "null";
    case Kind::boolean:
      return "a boolean";
    case Kind::number:
      return "a number";
    case Kind::string:
      return "a string";
    case Kind::array:
      return "an array";
    case Kind::object:
      return "an object";
  }
  return "?";
}

bool Json::boolean() const {
  if (kind_ != Kind::boolean) fail_kind("a boolean", kind_);
  return bool_;
}

double Json::number() const {
  if (kind_ != Kind::number) fail_kind("a number", kind_);
  return number_;
}

int64_t Json::integer() const {
  if (!is_int()) fail_kind("an integer", kind_);
  return int_;
}

const std::string& Json::string() const {
  if (kind_ != Kind::string) fail_kind("a string", kind_);
  return string_;
}

const std::vector<Json>& Json::items() const {
  if (kind_ != Kind::array) fail_kind("an array", kind_);
  return items_;
}

const std::vector<std::pair<std::string, Json>>& Json::members() const {
  if (kind_ != Kind::object) fail_kind("an object", kind_);
  return members_;
}

std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

const Json* Json::find(std::string_view key) const {
  for (const auto& [k, v] : members())
    if (k == key) return &v;
  return nullptr;
}

}  // namespace nibble::llm
