#include "llm/tokenizer.h"

#include <algorithm>
#include <array>
#include <optional>
#include <queue>

#include "common/check.h"
#include "llm/gguf.h"
#include "llm/json.h"

namespace nibble::llm {

namespace {

[[noreturn]] void fail_tok(const std::string& msg, ErrorCode code = ErrorCode::invalid_argument) {
  detail::fail(code, "nibble::llm::Tokenizer: " + msg);
}

// ---- Unicode ------------------------------------------------------------------------------------

struct CodepointRange {
  uint32_t lo, hi;
};
#include "llm/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CodepointRange (&r)[N], uint32_t cp) {
  size_t lo = 0, hi = N;
  while (lo < hi) {  // first range whose hi >= cp
    const size_t mid = (lo + hi) / 2;
    if (r[mid].hi < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < N && r[lo].lo <= cp;
}

enum class Cls : uint8_t { none, letter, number, space, other };

// The Unicode White_Space property, the meaning of \s in the tokenizers' regexes.
bool is_white_space(uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

Cls classify(uint32_t cp) {
  if (cp < 0x80) {  // the common case without a table search
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return Cls::letter;
    if (cp >= '0' && cp <= '9') return Cls::number;
    return is_white_space(cp) ? Cls::space : Cls::other;
  }
  if (is_white_space(cp)) return Cls::space;
  if (in_ranges(kLetterRanges, cp)) return Cls::letter;
  if (in_ranges(kNumberRanges, cp)) return Cls::number;
  return Cls::other;
}

// One code point of a text: its value and its byte span. Invalid UTF-8 bytes become single-byte
// code points of class "other" (value 0xFFFD), so every byte of the input is kept.
struct Cp {
  uint32_t cp;
  uint32_t off, len;
};

std::vector<Cp> decode_utf8(std::string_view s) {
  static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};  // shortest-form minimums
  std::vector<Cp> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int extra = c < 0x80         ? 0
                      : (c >> 5) == 6  ? 1
                      : (c >> 4) == 14 ? 2
                      : (c >> 3) == 30 ? 3
                                       : -1;
    uint32_t cp = extra == 0 ? c : 0xFFFD, len = 1;
    if (extra > 0 && i + static_cast<size_t>(extra) < s.size()) {
      uint32_t v = c & (0x3Fu >> extra);
      bool ok = true;
      for (int k = 1; k <= extra; ++k) {
        const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
        ok = ok && (cc & 0xC0) == 0x80;
        v = (v << 6) | (cc & 0x3Fu);
      }
      if (ok && v >= kMin[extra] && v <= 0x10FFFF && !(v >= 0xD800 && v <= 0xDFFF)) {
        cp = v;
        len = static_cast<uint32_t>(extra) + 1;
      }
    }
    out.push_back({cp, static_cast<uint32_t>(i), len});
    i += len;
  }
  return out;
}

// GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to U+0100.. in
// order, so every byte is a visible character in the vocabulary.
const std::array<uint32_t, 256>& byte_to_cp() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? b : 256 + n++;
    }
    return t;
  }();
  return table;
}

// The inverse, for code points below 512 (-1: not a byte's character).
const std::array<int, 512>& cp_to_byte() {
  static const std::array<int, 512> table = [] {
    std::array<int, 512> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_cp()[static_cast<size_t>(b)]] = b;
    return t;
  }();
  return table;
}

// ---- pre-tokenizers -----------------------------------------------------------------------------

// The code points of a text fragment that ends at `end`, as the hand-written regex matchers see
// them: a class and a value for every index (past the end: none), and pieces emitted as byte
// spans of the text.
struct CodepointRun {
  std::string_view text;
  const std::vector<Cp>& cps;
  size_t end;
  std::vector<std::string_view>& out;
  Cls cls(size_t i) const { return i < end ? classify(cps[i].cp) : Cls::none; }
  uint32_t cp(size_t i) const { return i < end ? cps[i].cp : 0xFFFFFFFFu; }
  void emit(size_t a, size_t b) const {
    out.push_back(text.substr(cps[a].off, cps[b - 1].off + cps[b - 1].len - cps[a].off));
  }
};

// GPT-2's pattern, matched by hand on code points (as llama.cpp does):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(std::string_view text, const std::vector<Cp>& cps, size_t begin, size_t end,
                std::vector<std::string_view>& out) {
  const CodepointRun run{text, cps, end, out};
  auto cls = [&](size_t i) { return run.cls(i); };
  auto cpt = [&](size_t i) { return run.cp(i); };
  auto emit = [&](size_t a, size_t b) { run.emit(a, b); };
  size_t pos = begin;
  while (pos < end) {
    const size_t start = pos;
    const uint32_t c = cpt(pos);
    if (c == '\'' && pos + 1 < end) {
      const uint32_t n1 = cpt(pos + 1);
      if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
        emit(start, pos + 2);
        pos += 2;
        continue;
      }
      if (pos + 2 < end) {
        const uint32_t n2 = cpt(pos + 2);
        if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
          emit(start, pos + 3);
          pos += 3;
          continue;
        }
      }
    }
    const Cls c2 = c == ' ' ? cls(pos + 1) : cls(pos);
    if (c2 == Cls::letter || c2 == Cls::number) {
      pos += c == ' ' ? 1 : 0;
      while (cls(pos) == c2) ++pos;
      emit(start, pos);
      continue;
    }
    if (c2 == Cls::other) {
      pos += c == ' ' ? 1 : 0;
      while (cls(pos) == Cls::other) ++pos;
      emit(start, pos);
      continue;
    }
    size_t spaces = 0;
    while (cls(pos + spaces) == Cls::space) ++spaces;
    if (spaces > 1 && pos + spaces < end) {  // \s+(?!\S): leave the last space to the next word
      pos += spaces - 1;
      emit(start, pos);
      continue;
    }
    if (spaces > 0) {
      pos += spaces;
      emit(start, pos);
      continue;
    }
    ++pos;  // not reached for valid classes; keeps the loop total
    emit(start, pos);
  }
}

// The two patterns as tokenizer.json spells them (Split pre-tokenizer, "Regex").
const char* const kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// Llama 3's pattern (Qwen2's with max_digits = 1: \p{N} instead of \p{N}{1,3}), matched by hand:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// The alternatives are tried in order at each position, as the regex engine does; the comments
// say which one a branch is. Differences from GPT-2's: one non-letter (a space, but also
// punctuation or a tab) may lead a word; numbers go in runs of at most three digits; punctuation
// keeps the newlines after it; a run of spaces ending in newlines is one piece up to its last
// newline.
void split_llama3(std::string_view text, const std::vector<Cp>& cps, size_t begin, size_t end,
                  size_t max_digits, std::vector<std::string_view>& out) {
  const CodepointRun run{text, cps, end, out};
  auto cls = [&](size_t i) { return run.cls(i); };
  auto cpt = [&](size_t i) { return run.cp(i); };
  auto emit = [&](size_t a, size_t b) { run.emit(a, b); };
  // Case-insensitive as the regex engine's (?i): ASCII case, and U+017F (long s), which Unicode
  // case-folds to 's' — the only code point outside ASCII that folds to a contraction letter.
  auto lower = [&](size_t i) {
    const uint32_t c = cpt(i);
    return c >= 'A' && c <= 'Z' ? c + 32 : c == 0x17F ? uint32_t{'s'} : c;
  };
  auto is_crlf = [&](size_t i) { return cpt(i) == '\r' || cpt(i) == '\n'; };
  size_t pos = begin;
  while (pos < end) {
    const size_t start = pos;
    const Cls c = cls(pos);
    if (cpt(pos) == '\'') {  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
      const uint32_t a = lower(pos + 1), b = lower(pos + 2);
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        len = 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        len = 3;
      if (len > 0) {
        pos += len;
        emit(start, pos);
        continue;
      }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    const bool leads = c != Cls::letter && c != Cls::number && !is_crlf(pos);
    if (c == Cls::letter || (leads && cls(pos + 1) == Cls::letter)) {
      pos += c == Cls::letter ? 0 : 1;
      while (cls(pos) == Cls::letter) ++pos;
      emit(start, pos);
      continue;
    }
    if (c == Cls::number) {  // \p{N}{1,3}
      while (cls(pos) == Cls::number && pos - start < max_digits) ++pos;
      emit(start, pos);
      continue;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    if (c == Cls::other || (cpt(pos) == ' ' && cls(pos + 1) == Cls::other)) {
      pos += c == Cls::other ? 0 : 1;
      while (cls(pos) == Cls::other) ++pos;
      while (is_crlf(pos)) ++pos;
      emit(start, pos);
      continue;
    }
    // c is white space: the run's extent and its last newline.
    size_t run_end = pos, last_crlf = end;
    while (cls(run_end) == Cls::space) {
      if (is_crlf(run_end)) last_crlf = run_end;
      ++run_end;
    }
    if (last_crlf != end) {  // \s*[\r\n]+
      pos = last_crlf + 1;
    } else if (run_end < end && run_end - pos > 1) {  // \s+(?!\S): the last space goes on
      pos = run_end - 1;
    } else {  // \s+
      pos = run_end;
    }
    emit(start, pos);
  }
}

// Pieces of one text fragment under a pre-split rule.
std::vector<std::string_view> split_pieces(std::string_view text, Tokenizer::PreSplit rule) {
  std::vector<std::string_view> out;
  if (rule == Tokenizer::PreSplit::none) {
    if (!text.empty()) out.push_back(text);
    return out;
  }
  const std::vector<Cp> cps = decode_utf8(text);
  if (rule == Tokenizer::PreSplit::gpt2) {
    split_gpt2(text, cps, 0, cps.size(), out);
    return out;
  }
  if (rule == Tokenizer::PreSplit::llama3 || rule == Tokenizer::PreSplit::qwen2) {
    split_llama3(text, cps, 0, cps.size(), rule == Tokenizer::PreSplit::llama3 ? 3 : 1, out);
    return out;
  }
  // gpt2_digits: every number character is its own piece, the GPT-2 pattern runs between them
  // (tokenizers' Digits(individual_digits) then ByteLevel; llama.cpp's "smollm" pre-type).
  size_t run = 0;
  for (size_t i = 0; i <= cps.size(); ++i) {
    if (i < cps.size() && classify(cps[i].cp) != Cls::number) continue;
    split_gpt2(text, cps, run, i, out);
    if (i < cps.size()) out.push_back(text.substr(cps[i].off, cps[i].len));
    run = i + 1;
  }
  return out;
}

const std::string kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (!from.empty() && s.substr(i, from.size()) == from) {
      out += to;
      i += from.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

// A symbol of the merge loops: a span of the piece, its token id, and list links.
struct Symbol {
  int32_t id;
  uint32_t off, len;
  int prev, next;
};

// A candidate merge of two adjacent symbols; `key` orders the queue (smaller merges first).
struct Bigram {
  double key;
  int left, right;
  uint32_t left_len, right_len;
  int32_t merged;
  bool operator<(const Bigram& o) const {  // std::priority_queue pops the largest
    return key != o.key ? key > o.key : left > o.left;
  }
};

/// A pair's merge: the id of the merged token and its queue key (smaller merges first).
struct Merge {
  double key;
  int32_t merged;
};

// Links `sym` into a list and merges adjacent symbols, the smallest key first (leftmost on
// ties), with a priority queue and lazy invalidation, until no pair merges. `merge_of(a, b)`
// gives a pair's merge or nullopt. Merged-away symbols get length 0; the list from index 0 (via
// `next`) is the result.
template <class MergeOf>
void merge_symbols(std::vector<Symbol>& sym, MergeOf merge_of) {
  const int n = static_cast<int>(sym.size());
  for (int i = 0; i < n; ++i) {
    sym[static_cast<size_t>(i)].prev = i - 1;
    sym[static_cast<size_t>(i)].next = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<Bigram> queue;
  auto try_add = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = sym[static_cast<size_t>(l)];
    const Symbol& b = sym[static_cast<size_t>(r)];
    const std::optional<Merge> m = merge_of(a, b);
    if (m) queue.push({m->key, l, r, a.len, b.len, m->merged});
  };
  for (int i = 0; i + 1 < n; ++i) try_add(i, i + 1);
  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Symbol& a = sym[static_cast<size_t>(bg.left)];
    Symbol& b = sym[static_cast<size_t>(bg.right)];
    // Stale entries: a side was merged away or grew since the bigram was queued.
    if (a.len == 0 || b.len == 0 || a.next != bg.right || a.len != bg.left_len ||
        b.len != bg.right_len)
      continue;
    a.id = bg.merged;
    a.len += b.len;
    b.len = 0;
    a.next = b.next;
    if (b.next >= 0) sym[static_cast<size_t>(b.next)].prev = bg.left;
    try_add(a.prev, bg.left);
    try_add(bg.left, a.next);
  }
}

std::string byte_token_name(unsigned b) {
  static const char* hex = "0123456789ABCDEF";
  return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

}  // namespace

// ---- construction -------------------------------------------------------------------------------

void Tokenizer::finish() {
  const auto n = static_cast<int32_t>(tokens_.size());
  if (n == 0) fail_tok("the vocabulary is empty");
  special_.resize(tokens_.size(), 0);
  index_.clear();
  index_.reserve(tokens_.size());
  for (int32_t i = 0; i < n; ++i) index_.emplace(tokens_[static_cast<size_t>(i)], i);
  for (int32_t id : {bos_id_, eos_id_, unk_id_})
    if (id >= n)
      fail_tok("special token id " + std::to_string(id) + " is outside the vocabulary of " +
               std::to_string(n));
  merges_.clear();
  for (size_t r = 0; r < merge_pairs_.size(); ++r) {
    const auto& [a, b] = merge_pairs_[r];
    const int32_t ia = find(a), ib = find(b), im = find(a + b);
    if (ia < 0 || ib < 0 || im < 0) continue;  // as llama.cpp: a merge outside the vocab is inert
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(ia)) << 32) | static_cast<uint32_t>(ib);
    merges_.emplace(key, std::make_pair(static_cast<int32_t>(r), im));
  }
  byte_token_.assign(256, -1);
  for (unsigned b = 0; b < 256; ++b) {
    if (model_ == Model::byte_bpe) {
      std::string ch;
      append_utf8(ch, byte_to_cp()[b]);
      // Vocabularies may lack bytes that never occur in UTF-8 text (SmolLM2 has 235 of 256);
      // such a byte is dropped when encoding, as tokenizers and llama.cpp do.
      byte_token_[b] = find(ch);
    } else {
      byte_token_[b] = find(byte_token_name(b));
    }
  }
  specials_by_length_.clear();
  for (int32_t i = 0; i < n; ++i)
    if (special_[static_cast<size_t>(i)] && !tokens_[static_cast<size_t>(i)].empty())
      specials_by_length_.push_back(i);
  std::stable_sort(
      specials_by_length_.begin(), specials_by_length_.end(), [&](int32_t a, int32_t b) {
        return tokens_[static_cast<size_t>(a)].size() > tokens_[static_cast<size_t>(b)].size();
      });
  if (eos_id_ >= 0 && std::find(end_ids_.begin(), end_ids_.end(), eos_id_) == end_ids_.end())
    end_ids_.push_back(eos_id_);
}

void Tokenizer::add_end_of_generation(int32_t id) {
  if (id < 0 || id >= vocab_size())
    fail_tok("end-of-generation id " + std::to_string(id) + " is outside the vocabulary of " +
             std::to_string(vocab_size()));
  if (std::find(end_ids_.begin(), end_ids_.end(), id) == end_ids_.end()) end_ids_.push_back(id);
}

Tokenizer::ChatFormat Tokenizer::chat_format() const {
  auto in_template = [&](const char* marker) {
    return chat_template_.find(marker) != std::string::npos;
  };
  auto special = [&](const char* text) {
    const int32_t id = find(text);
    return id >= 0 && is_special(id);
  };
  if (in_template("<|start_header_id|>")) return ChatFormat::llama3;
  if (in_template("<|im_start|>")) return ChatFormat::chatml;
  if (in_template("[INST]")) return ChatFormat::inst;
  if (in_template("<|user|>") && in_template("<|assistant|>")) return ChatFormat::phi3;
  if (special("<|start_header_id|>") && special("<|end_header_id|>") && special("<|eot_id|>"))
    return ChatFormat::llama3;
  if (special("<|im_start|>") && special("<|im_end|>")) return ChatFormat::chatml;
  if (special("<|user|>") && special("<|assistant|>") && special("<|end|>"))
    return ChatFormat::phi3;
  return ChatFormat::none;
}

std::string Tokenizer::chat_prompt(std::string_view user, std::string_view system) const {
  const std::string u(user), sys(system);
  const bool has_sys = !sys.empty();
  switch (chat_format()) {
    case ChatFormat::chatml:
      return (has_sys ? "<|im_start|>system\n" + sys + "<|im_end|>\n" : std::string()) +
             "<|im_start|>user\n" + u + "<|im_end|>\n<|im_start|>assistant\n";
    case ChatFormat::llama3:
      return (has_sys ? "<|start_header_id|>system<|end_header_id|>\n\n" + sys + "<|eot_id|>"
                      : std::string()) +
             "<|start_header_id|>user<|end_header_id|>\n\n" + u +
             "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    case ChatFormat::inst:
      return "[INST] " + (has_sys ? "<<SYS>>\n" + sys + "\n<</SYS>>\n\n" : std::string()) + u +
             " [/INST]";
    case ChatFormat::phi3:
      return (has_sys ? "<|system|>\n" + sys + "<|end|>\n" : std::string()) + "<|user|>\n" + u +
             "<|end|>\n<|assistant|>\n";
    case ChatFormat::none:
      break;
  }
  fail_tok("the model has no chat format nibble knows (ChatML <|im_start|>, Llama 3 "
           "<|start_header_id|>, Phi-3 <|user|>, or [INST] in its chat template)",
           ErrorCode::unsupported);
}

void Tokenizer::set_bos_eos(int32_t bos, int32_t eos, bool add_bos) {
  bos_id_ = bos;
  eos_id_ = eos;
  add_bos_ = add_bos;
  finish();
}

Tokenizer Tokenizer::from_gguf(const GgufFile& g) {
  Tokenizer t;
  const auto& md = g.metadata();
  const std::string kind = g.get_string("tokenizer.ggml.model");
  auto array = [&](const char* key, bool required) -> const std::vector<GgufValue::Scalar>* {
    auto it = md.find(key);
    if (it == md.end() || !it->second.is_array) {
      if (required) fail_tok(std::string("GGUF metadata lacks the array ") + key);
      return nullptr;
    }
    return &it->second.array;
  };
  auto opt_uint = [&](const char* key, int64_t fallback) -> int64_t {
    auto it = md.find(key);
    if (it == md.end()) return fallback;
    if (const auto* u = std::get_if<uint64_t>(&it->second.scalar)) return static_cast<int64_t>(*u);
    if (const auto* i = std::get_if<int64_t>(&it->second.scalar)) return *i;
    fail_tok(std::string("GGUF metadata ") + key + " is not an integer");
  };
  auto opt_bool = [&](const char* key, bool fallback) -> bool {
    auto it = md.find(key);
    if (it == md.end()) return fallback;
    if (const auto* b = std::get_if<bool>(&it->second.scalar)) return *b;
    fail_tok(std::string("GGUF metadata ") + key + " is not a bool");
  };
  if (kind != "gpt2" && kind != "llama")
    fail_tok("GGUF tokenizer.ggml.model '" + kind + "' is not supported (gpt2, llama)",
             ErrorCode::unsupported);
  for (const auto& v : *array("tokenizer.ggml.tokens", true)) {
    const auto* s = std::get_if<std::string>(&v);
    if (s == nullptr) fail_tok("tokenizer.ggml.tokens holds a non-string");
    t.tokens_.push_back(*s);
  }
  const size_t n = t.tokens_.size();
  t.special_.assign(n, 0);
  if (const auto* types = array("tokenizer.ggml.token_type", false)) {
    if (types->size() != n) fail_tok("tokenizer.ggml.token_type and tokens differ in length");
    for (size_t i = 0; i < n; ++i) {
      int64_t ty = 1;
      if (const auto* u = std::get_if<uint64_t>(&(*types)[i]))
        ty = static_cast<int64_t>(*u);
      else if (const auto* s = std::get_if<int64_t>(&(*types)[i]))
        ty = *s;
      // llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
      t.special_[i] = ty == 3 || ty == 4 ? 1 : 0;
    }
  }
  t.bos_id_ = static_cast<int32_t>(opt_uint("tokenizer.ggml.bos_token_id", -1));
  t.eos_id_ = static_cast<int32_t>(opt_uint("tokenizer.ggml.eos_token_id", -1));
  t.unk_id_ = static_cast<int32_t>(opt_uint("tokenizer.ggml.unknown_token_id", -1));
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    const int64_t id = opt_uint(key, -1);
    if (id >= 0 && id < static_cast<int64_t>(n)) t.end_ids_.push_back(static_cast<int32_t>(id));
  }
  if (md.count("tokenizer.chat_template")) t.chat_template_ = g.get_string("tokenizer.chat_template");
  if (kind == "gpt2") {
    t.model_ = Model::byte_bpe;
    t.add_bos_ = opt_bool("tokenizer.ggml.add_bos_token", false);
    const std::string pre =
        md.count("tokenizer.ggml.pre") ? g.get_string("tokenizer.ggml.pre") : "default";
    if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell" ||
        pre == "command-r" || pre == "exaone" || pre == "minerva")
      t.pre_split_ = PreSplit::gpt2_digits;
    else if (pre == "default" || pre == "gpt2" || pre == "mpt" || pre == "olmo" || pre == "jais")
      t.pre_split_ = PreSplit::gpt2;
    else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe" ||
             pre == "dbrx")
      t.pre_split_ = PreSplit::llama3;
    else if (pre == "qwen2" || pre == "deepseek-r1-qwen")  // DeepSeek-R1's Qwen distills
      t.pre_split_ = PreSplit::qwen2;
    else
      fail_tok("GGUF tokenizer.ggml.pre '" + pre +
                   "' is not supported (gpt2, default, smollm, starcoder, mpt, olmo, "
                   "llama-bpe, qwen2, ...)",
               ErrorCode::unsupported);
    // llama.cpp sets ignore_merges for the Llama 3 pre-tokenizer, as Llama 3's tokenizer.json.
    t.ignore_merges_ = t.pre_split_ == PreSplit::llama3;
    for (const auto& v : *array("tokenizer.ggml.merges", true)) {
      const auto* s = std::get_if<std::string>(&v);
      const size_t sp = s == nullptr ? std::string::npos : s->find(' ', 1);
      if (sp == std::string::npos)
        fail_tok("tokenizer.ggml.merges holds an entry that is not \"a b\"");
      t.merge_pairs_.emplace_back(s->substr(0, sp), s->substr(sp + 1));
    }
  } else if (kind == "llama") {
    t.model_ = Model::sentencepiece;
    t.pre_split_ = PreSplit::none;
    t.add_bos_ = opt_bool("tokenizer.ggml.add_bos_token", true);
    t.add_space_prefix_ = opt_bool("tokenizer.ggml.add_space_prefix", true);
    const auto* scores = array("tokenizer.ggml.scores", true);
    if (scores->size() != n) fail_tok("tokenizer.ggml.scores and tokens differ in length");
    for (const auto& v : *scores) {
      const auto* d = std::get_if<double>(&v);
      if (d == nullptr) fail_tok("tokenizer.ggml.scores holds a non-float");
      t.scores_.push_back(static_cast<float>(*d));
    }
  } else {
    fail_tok("GGUF tokenizer.ggml.model '" + kind + "' is not supported (gpt2, llama)",
             ErrorCode::unsupported);
  }
  t.finish();
  return t;
}

Tokenizer Tokenizer::from_hf_json(std::string_view json_text, const std::string& what) {
  const Json root = Json::parse(json_text, what);
  auto bad = [&](const std::string& msg, ErrorCode code = ErrorCode::invalid_argument) {
    fail_tok(what + ": " + msg, code);
  };
  if (!root.is_object()) bad("not a JSON object");
  const Json* model = root.find("model");
  if (model == nullptr || !model->is_object()) bad("has no \"model\" object");
  const Json* type = model->find("type");
  if (type == nullptr || !type->is_string() || type->string() != "BPE")
    bad("model type is not BPE (only BPE tokenizers are supported)", ErrorCode::unsupported);
  const Json* vocab = model->find("vocab");
  const Json* merges = model->find("merges");
  if (vocab == nullptr || !vocab->is_object()) bad("model.vocab is not an object");
  if (merges == nullptr || !merges->is_array()) bad("model.merges is not an array");
  Tokenizer t;
  // Ids may come in any order and added tokens may extend the vocabulary: size by the largest.
  constexpr int64_t kMaxVocab = int64_t{1} << 22;  // ModelConfig's bound on vocab_size
  auto place = [&](int64_t id, const std::string& text) {
    if (id < 0 || id >= kMaxVocab) bad("token id " + std::to_string(id) + " is out of range");
    if (static_cast<size_t>(id) >= t.tokens_.size()) t.tokens_.resize(static_cast<size_t>(id) + 1);
    t.tokens_[static_cast<size_t>(id)] = text;
  };
  for (const auto& [text, id] : vocab->members()) {
    if (!id.is_int()) bad("model.vocab['" + text + "'] is not an integer id");
    place(id.integer(), text);
  }
  std::vector<int32_t> added;
  if (const Json* at = root.find("added_tokens"); at != nullptr && !at->is_null()) {
    if (!at->is_array()) bad("added_tokens is not an array");
    for (const Json& a : at->items()) {
      const Json* id = a.is_object() ? a.find("id") : nullptr;
      const Json* content = a.is_object() ? a.find("content") : nullptr;
      if (id == nullptr || !id->is_int() || content == nullptr || !content->is_string())
        bad("an added_tokens entry lacks an integer id or a string content");
      place(id->integer(), content->string());
      added.push_back(static_cast<int32_t>(id->integer()));
    }
  }
  t.special_.assign(t.tokens_.size(), 0);
  for (int32_t id : added) t.special_[static_cast<size_t>(id)] = 1;
  for (const Json& m : merges->items()) {
    if (m.is_string()) {  // "a b" (tokenizers < 0.20)
      const std::string& s = m.string();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) bad("a merge is not \"a b\": '" + s + "'");
      t.merge_pairs_.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.items().size() == 2 && m.items()[0].is_string() &&
               m.items()[1].is_string()) {  // ["a", "b"]
      t.merge_pairs_.emplace_back(m.items()[0].string(), m.items()[1].string());
    } else {
      bad("a merge is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  const Json* fallback = model->find("byte_fallback");
  const bool byte_fallback = fallback != nullptr && fallback->is_bool() && fallback->boolean();
  if (const Json* unk = model->find("unk_token"); unk != nullptr && unk->is_string())
    t.unk_id_ = -2;  // resolved below, once the index exists
  if (const Json* im = model->find("ignore_merges"); im != nullptr && !im->is_null()) {
    if (!im->is_bool()) bad("model.ignore_merges is not a boolean");
    t.ignore_merges_ = im->boolean();
  }
  // The pre-tokenizer: ByteLevel (GPT-2 regex), optionally after Digits(individual_digits); or
  // Split(Llama 3's or Qwen2's regex, Isolated) then ByteLevel without its regex.
  const Json* pre = root.find("pre_tokenizer");
  bool byte_level = false, digits = false, byte_level_regex = true;
  std::optional<PreSplit> split;
  std::vector<const Json*> stages;
  if (pre != nullptr && !pre->is_null()) {
    const Json* pt = pre->is_object() ? pre->find("type") : nullptr;
    if (pt != nullptr && pt->is_string() && pt->string() == "Sequence") {
      const Json* list = pre->find("pretokenizers");
      if (list == nullptr || !list->is_array()) bad("pre_tokenizer Sequence has no list");
      for (const Json& s : list->items()) stages.push_back(&s);
    } else {
      stages.push_back(pre);
    }
  }
  auto stage_name = [](const Json* s) -> std::string {
    const Json* st = s->is_object() ? s->find("type") : nullptr;
    return st != nullptr && st->is_string() ? st->string() : "?";
  };
  for (const Json* s : stages) {
    const std::string name = stage_name(s);
    if (name == "ByteLevel") {
      const Json* prefix = s->find("add_prefix_space");
      const Json* regex = s->find("use_regex");
      if (prefix != nullptr && prefix->is_bool() && prefix->boolean())
        bad("ByteLevel add_prefix_space = true is not supported", ErrorCode::unsupported);
      byte_level_regex = regex == nullptr || !regex->is_bool() || regex->boolean();
      byte_level = true;
    } else if (name == "Digits") {
      const Json* ind = s->find("individual_digits");
      if (ind == nullptr || !ind->is_bool() || !ind->boolean())
        bad("Digits without individual_digits is not supported", ErrorCode::unsupported);
      digits = true;
    } else if (name == "Split") {
      const Json* pattern = s->find("pattern");
      const Json* regex = pattern != nullptr && pattern->is_object() ? pattern->find("Regex") : nullptr;
      const Json* behavior = s->find("behavior");
      const Json* invert = s->find("invert");
      const std::string re = regex != nullptr && regex->is_string() ? regex->string() : "";
      if (re == kLlama3Regex)
        split = PreSplit::llama3;
      else if (re == kQwen2Regex)
        split = PreSplit::qwen2;
      else
        bad("the Split pre-tokenizer's pattern is not Llama 3's or Qwen2's regex",
            ErrorCode::unsupported);
      if (behavior == nullptr || !behavior->is_string() || behavior->string() != "Isolated" ||
          (invert != nullptr && (!invert->is_bool() || invert->boolean())))
        bad("a Split pre-tokenizer must be behavior Isolated, invert false", ErrorCode::unsupported);
    } else {
      bad("pre-tokenizer '" + name + "' is not supported (ByteLevel, Digits, Split, Sequence)",
          ErrorCode::unsupported);
    }
  }
  if (split && (byte_level_regex || stages.size() != 2 || stage_name(stages[0]) != "Split" ||
                stage_name(stages[1]) != "ByteLevel"))
    bad("a Split pre-tokenizer is supported as Sequence[Split, ByteLevel(use_regex = false)]",
        ErrorCode::unsupported);
  if (byte_level && !byte_level_regex && !split)
    bad("ByteLevel use_regex = false is supported only after a Split", ErrorCode::unsupported);
  if (byte_level) {
    t.model_ = Model::byte_bpe;
    t.pre_split_ = split ? *split : digits ? PreSplit::gpt2_digits : PreSplit::gpt2;
  } else {
    if (digits) bad("Digits without ByteLevel is not supported", ErrorCode::unsupported);
    // Llama-2 style: normalizer Prepend("▁") + Replace(" ", "▁"), byte fallback.
    t.model_ = Model::char_bpe;
    t.pre_split_ = PreSplit::none;
    if (!byte_fallback)
      bad("a BPE model without ByteLevel needs byte_fallback", ErrorCode::unsupported);
    const Json* norm = root.find("normalizer");
    std::vector<const Json*> ns;
    if (norm != nullptr && norm->is_object()) {
      const Json* nt = norm->find("type");
      if (nt != nullptr && nt->is_string() && nt->string() == "Sequence") {
        const Json* list = norm->find("normalizers");
        if (list != nullptr && list->is_array())
          for (const Json& s : list->items()) ns.push_back(&s);
      } else {
        ns.push_back(norm);
      }
    }
    bool replaces_space = false;
    for (const Json* s : ns) {
      const Json* st = s->is_object() ? s->find("type") : nullptr;
      const std::string name = st != nullptr && st->is_string() ? st->string() : "?";
      if (name == "Prepend") {
        t.add_space_prefix_ = true;
      } else if (name == "Replace") {
        replaces_space = true;
      } else {
        bad("normalizer '" + name + "' is not supported (Prepend, Replace)",
            ErrorCode::unsupported);
      }
    }
    if (!replaces_space)
      bad("a byte-fallback BPE without Replace(' ', '▁') is not supported", ErrorCode::unsupported);
  }
  // BOS from a post-processor that puts a special token first (TemplateProcessing).
  std::vector<const Json*> procs;
  if (const Json* pp = root.find("post_processor"); pp != nullptr && pp->is_object()) {
    procs.push_back(pp);
    if (const Json* list = pp->find("processors"); list != nullptr && list->is_array())
      for (const Json& s : list->items()) procs.push_back(&s);
  }
  for (const Json* p : procs) {
    const Json* single = p->is_object() ? p->find("single") : nullptr;
    if (single == nullptr || !single->is_array() || single->items().empty()) continue;
    const Json& first = single->items()[0];
    const Json* sp = first.is_object() ? first.find("SpecialToken") : nullptr;
    const Json* id = sp != nullptr && sp->is_object() ? sp->find("id") : nullptr;
    if (id == nullptr || !id->is_string()) continue;
    t.index_.clear();
    for (size_t i = 0; i < t.tokens_.size(); ++i)
      t.index_.emplace(t.tokens_[i], static_cast<int32_t>(i));
    t.bos_id_ = t.find(id->string());
    t.add_bos_ = t.bos_id_ >= 0;
  }
  if (t.unk_id_ == -2) {
    t.index_.clear();
    for (size_t i = 0; i < t.tokens_.size(); ++i)
      t.index_.emplace(t.tokens_[i], static_cast<int32_t>(i));
    t.unk_id_ = t.find(model->find("unk_token")->string());
  }
  t.finish();
  return t;
}

// ---- encoding -----------------------------------------------------------------------------------

int32_t Tokenizer::find(std::string_view s) const {
  auto it = index_.find(std::string(s));
  return it == index_.end() ? -1 : it->second;
}

const std::string& Tokenizer::token(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail_tok("token id " + std::to_string(id) + " is outside the vocabulary of " +
             std::to_string(vocab_size()));
  return tokens_[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)] != 0;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

void Tokenizer::byte_fallback(unsigned char byte, std::vector<int32_t>& out) const {
  const int32_t id = byte_token_[byte];
  if (id >= 0)
    out.push_back(id);
  else if (unk_id_ >= 0)
    out.push_back(unk_id_);
  // else: a character the vocabulary cannot express is dropped (no unk, no byte tokens)
}

// Byte-level or character-level BPE of one piece: merges applied lowest rank first (leftmost
// on ties), with a priority queue and lazy invalidation like llama.cpp and tokenizers.
void Tokenizer::bpe_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_ && model_ == Model::byte_bpe) {
    std::string mapped;
    for (char c : piece) append_utf8(mapped, byte_to_cp()[static_cast<unsigned char>(c)]);
    if (const int32_t id = find(mapped); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<Symbol> sym;
  if (model_ == Model::byte_bpe) {
    for (size_t i = 0; i < piece.size(); ++i) {
      const int32_t id = byte_token_[static_cast<unsigned char>(piece[i])];
      if (id >= 0) sym.push_back({id, static_cast<uint32_t>(i), 1, 0, 0});
    }
  } else {
    for (const Cp& c : decode_utf8(piece)) {
      const int32_t id = find(piece.substr(c.off, c.len));
      if (id >= 0) {
        sym.push_back({id, c.off, c.len, 0, 0});
        continue;
      }
      for (uint32_t b = 0; b < c.len; ++b) {  // byte fallback: one symbol per byte
        std::vector<int32_t> ids;
        byte_fallback(static_cast<unsigned char>(piece[c.off + b]), ids);
        for (int32_t i : ids) sym.push_back({i, c.off + b, 1, 0, 0});
      }
    }
  }
  merge_symbols(sym, [&](const Symbol& a, const Symbol& b) -> std::optional<Merge> {
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(a.id)) << 32) | static_cast<uint32_t>(b.id);
    auto it = merges_.find(key);
    if (it == merges_.end()) return std::nullopt;
    return Merge{static_cast<double>(it->second.first), it->second.second};
  });
  const int n = static_cast<int>(sym.size());
  for (int i = n > 0 ? 0 : -1; i >= 0; i = sym[static_cast<size_t>(i)].next)
    out.push_back(sym[static_cast<size_t>(i)].id);
}

// SentencePiece-style merging by score (llama.cpp's llm_tokenizer_spm): the adjacent pair whose
// concatenation is the highest-scoring token is merged first (leftmost on ties). A pair is only
// queued when its text is a token, so every merged symbol is a token; the single characters
// left that are not become byte tokens <0xXX> (llama.cpp's resegment reduces to this).
void Tokenizer::spm_fragment(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  for (const Cp& c : decode_utf8(text)) sym.push_back({-1, c.off, c.len, 0, 0});
  merge_symbols(sym, [&](const Symbol& a, const Symbol& b) -> std::optional<Merge> {
    const int32_t id = find(text.substr(a.off, a.len + b.len));
    if (id < 0) return std::nullopt;
    // Higher score first: the queue pops the smallest key.
    return Merge{-static_cast<double>(scores_[static_cast<size_t>(id)]), id};
  });
  const int n = static_cast<int>(sym.size());
  for (int i = n > 0 ? 0 : -1; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& s = sym[static_cast<size_t>(i)];
    const std::string_view piece = text.substr(s.off, s.len);
    const int32_t id = find(piece);
    if (id >= 0)
      out.push_back(id);
    else
      for (const char c : piece) byte_fallback(static_cast<unsigned char>(c), out);
  }
}

std::vector<std::string_view> Tokenizer::pre_split(std::string_view text) const {
  return split_pieces(text, model_ == Model::byte_bpe ? pre_split_ : PreSplit::none);
}

void Tokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  switch (model_) {
    case Model::byte_bpe:
      for (std::string_view piece : split_pieces(text, pre_split_)) bpe_piece(piece, out);
      break;
    case Model::char_bpe:
      bpe_piece(text, out);
      break;
    case Model::sentencepiece:
      spm_fragment(text, out);
      break;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_bos) const {
  std::vector<int32_t> out;
  if (allow_bos && add_bos()) out.push_back(bos_id_);
  // Special tokens first (longest match at each position), then the text between them.
  std::array<bool, 256> first_byte{};
  for (int32_t id : specials_by_length_)
    first_byte[static_cast<unsigned char>(tokens_[static_cast<size_t>(id)][0])] = true;
  bool prev_special = true;  // SentencePiece prefixes a space to text at the start or after one
  auto flush = [&](std::string_view frag) {
    if (frag.empty()) return;
    if (model_ == Model::byte_bpe) {
      encode_text(frag, out);
    } else {
      std::string s = add_space_prefix_ && prev_special ? " " : "";
      s += frag;
      encode_text(replace_all(s, " ", kSpmSpace), out);
    }
    prev_special = false;
  };
  size_t start = 0, i = 0;
  while (i < text.size()) {
    int32_t match = -1;
    if (first_byte[static_cast<unsigned char>(text[i])])
      for (int32_t id : specials_by_length_) {
        const std::string& s = tokens_[static_cast<size_t>(id)];
        if (text.substr(i, s.size()) == s) {
          match = id;
          break;
        }
      }
    if (match < 0) {
      ++i;
      continue;
    }
    flush(text.substr(start, i - start));
    out.push_back(match);
    prev_special = true;
    i += tokens_[static_cast<size_t>(match)].size();
    start = i;
  }
  flush(text.substr(start));
  return out;
}

// ---- decoding -----------------------------------------------------------------------------------

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (const int32_t id : ids) {
    const std::string& t = token(id);
    if (special_[static_cast<size_t>(id)]) {
      if (!skip_special) out += t;
      continue;
    }
    if (model_ == Model::byte_bpe) {
      for (const Cp& c : decode_utf8(t)) {
        const int b = c.cp < 512 ? cp_to_byte()[c.cp] : -1;
        if (b >= 0)
          out += static_cast<char>(b);
        else
          out += t.substr(c.off, c.len);
      }
      continue;
    }
    if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>') {  // a byte token <0xXX>
      auto hex = [](char c) {
        return c >= '0' && c <= '9'   ? c - '0'
               : c >= 'A' && c <= 'F' ? c - 'A' + 10
               : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                      : -1;
      };
      const int hi = hex(t[3]), lo = hex(t[4]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        continue;
      }
    }
    out += replace_all(t, kSpmSpace, " ");
  }
  // The space SentencePiece prepended to the text is not part of it.
  if (add_space_prefix_ && !out.empty() && out[0] == ' ' && !ids.empty() &&
      !special_[static_cast<size_t>(ids[0] == bos_id_ && ids.size() > 1 ? ids[1] : ids[0])])
    out.erase(0, 1);
  return out;
}

std::string Tokenizer::to_hf_json() const {
  if (model_ == Model::sentencepiece)
    fail_tok("a SentencePiece (score) vocabulary cannot be written as a BPE tokenizer.json",
             ErrorCode::unsupported);
  const bool byte_level = model_ == Model::byte_bpe;
  std::string s = "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[";
  bool first = true;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (!special_[i]) continue;
    s += first ? "" : ",";
    first = false;
    s += "{\"id\":" + std::to_string(i) + ",\"content\":" + json_quote(tokens_[i]) +
         ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
         "\"special\":true}";
  }
  s += "],";
  const std::string space = json_quote(kSpmSpace);
  if (byte_level) {
    s += "\"normalizer\":null,\"pre_tokenizer\":";
    const std::string bl =
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":"
        "true}";
    if (pre_split_ == PreSplit::gpt2_digits) {
      s += "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":"
           "true}," + bl + "]}";
    } else if (pre_split_ == PreSplit::llama3 || pre_split_ == PreSplit::qwen2) {
      s += "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":" +
           json_quote(pre_split_ == PreSplit::llama3 ? kLlama3Regex : kQwen2Regex) +
           "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_"
           "space\":false,\"trim_offsets\":true,\"use_regex\":false}]}";
    } else {
      s += bl;
    }
    s += ",\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,"
         "\"use_regex\":true},";
  } else {
    s += "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[";
    if (add_space_prefix_) s += "{\"type\":\"Prepend\",\"prepend\":" + space + "},";
    s += "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":" + space + "}]},";
    s += "\"pre_tokenizer\":null,\"decoder\":null,";
  }
  if (add_bos()) {
    const std::string bos = json_quote(tokens_[static_cast<size_t>(bos_id_)]);
    s += "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{"
         "\"id\":" +
         bos +
         ",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[{"
         "\"SpecialToken\":{\"id\":" +
         bos +
         ",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"Sequence\":{\"id\":\"B\","
         "\"type_id\":1}}],"
         "\"special_tokens\":{" +
         bos + ":{\"id\":" + bos + ",\"ids\":[" + std::to_string(bos_id_) + "],\"tokens\":[" + bos +
         "]}}},";
  } else {
    s += "\"post_processor\":null,";
  }
  s += "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":";
  s += unk_id_ >= 0 && !byte_level ? json_quote(tokens_[static_cast<size_t>(unk_id_)]) : "null";
  s += ",\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_"
       "fallback\":";
  s += byte_level ? "false" : "true";
  s += std::string(",\"ignore_merges\":") + (ignore_merges_ ? "true" : "false");
  s += ",\"vocab\":{";
  first = true;
  std::unordered_map<std::string, int> seen;  // a duplicate text keeps its first id
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].empty() || !seen.emplace(tokens_[i], 1).second) continue;
    s += first ? "" : ",";
    first = false;
    s += json_quote(tokens_[i]) + ":" + std::to_string(i);
  }
  s += "},\"merges\":[";
  for (size_t r = 0; r < merge_pairs_.size(); ++r)
    s += (r ? ",[" : "[") + json_quote(merge_pairs_[r].first) + "," +
         json_quote(merge_pairs_[r].second) + "]";
  s += "]}}\n";
  return s;
}

std::string Tokenizer::describe() const {
  const char* m = model_ == Model::byte_bpe   ? "byte-level BPE"
                  : model_ == Model::char_bpe ? "BPE with byte fallback"
                                              : "SentencePiece (scores)";
  const char* p = pre_split_ == PreSplit::gpt2          ? "gpt2 regex"
                  : pre_split_ == PreSplit::gpt2_digits ? "digits + gpt2 regex"
                  : pre_split_ == PreSplit::llama3      ? "llama3 regex"
                  : pre_split_ == PreSplit::qwen2       ? "qwen2 regex"
                                                        : "none";
  std::string s = std::string(m) + ", " + std::to_string(vocab_size()) + " tokens, " +
                  std::to_string(merges_.size()) + " merges, pre-split: " + p;
  if (ignore_merges_) s += " (whole-word tokens before merges)";
  s += ", bos " + std::to_string(bos_id_) + (add_bos() ? " (added)" : " (not added)");
  s += ", eos " + std::to_string(eos_id_);
  if (end_ids_.size() > 1) {
    s += " (generation ends at";
    for (int32_t id : end_ids_) {
      s += ' ';
      s += std::to_string(id);
    }
    s += ")";
  }
  const ChatFormat cf = chat_format();
  s += cf == ChatFormat::chatml   ? ", chat ChatML"
       : cf == ChatFormat::llama3 ? ", chat Llama 3"
       : cf == ChatFormat::inst   ? ", chat [INST]"
       : cf == ChatFormat::phi3   ? ", chat Phi-3"
                                  : "";
  return s;
}

}  // namespace nibble::llm
