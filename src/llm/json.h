// A small, strict JSON reader (RFC 8259) for the model files that carry JSON: the safetensors
// header, config.json and tokenizer.json. It is written for hostile input, because all three
// come from downloaded files and the safetensors header is fuzzed: nesting is limited to
// kMaxDepth (so no input can exhaust the stack), every byte is consumed or rejected, control
// characters, lone surrogates, bad escapes, leading zeros, trailing garbage and duplicate
// object keys are errors, and every error names the file and the byte offset.
//
// Numbers keep both readings: `number()` as a double and, when the literal is an integer that
// fits, an exact int64 (`is_int()`), so 64-bit file offsets are never rounded through a double.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nibble::llm {

class Json {
 public:
  enum class Kind : uint8_t { null, boolean, number, string, array, object };
  static constexpr int kMaxDepth = 128;

  /// Parses a whole document; throws nibble::Error(invalid_argument) naming `what` and the byte
  /// offset of the first problem.
  static Json parse(std::string_view text, const std::string& what);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_number() const { return kind_ == Kind::number; }
  bool is_int() const { return kind_ == Kind::number && is_int_; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }

  // Accessors of the wrong kind throw nibble::Error(invalid_argument); callers that know the
  // key check the kind first so that their message can name it.
  bool boolean() const;
  double number() const;
  int64_t integer() const;  ///< only when is_int()
  const std::string& string() const;
  const std::vector<Json>& items() const;                            ///< array elements
  const std::vector<std::pair<std::string, Json>>& members() const;  ///< object, file order
  /// The member named `key`, or nullptr (objects only).
  const Json* find(std::string_view key) const;

  static const char* to_string(Kind k);

 private:
  friend class JsonParser;
  Kind kind_ = Kind::null;
  bool bool_ = false;
  bool is_int_ = false;
  int64_t int_ = 0;
  double number_ = 0.0;
  std::string string_;
  std::vector<Json> items_;
  std::vector<std::pair<std::string, Json>> members_;
};

/// `s` as a JSON string literal, quotes included (for the writers of config and tokenizer files).
std::string json_quote(std::string_view s);

/// Appends the UTF-8 encoding of code point `cp` (≤ 0x10FFFF) to `out`.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace nibble::llm
