// Tokenizers of Llama-family models, built from GGUF metadata or from a Hugging Face
// tokenizer.json:
//
//   * byte-level BPE (GGUF tokenizer.ggml.model = "gpt2"; tokenizer.json model BPE with a
//     ByteLevel pre-tokenizer): text → special tokens split out → pre-tokenizer pieces (the
//     GPT-2 regex, with digits split one by one first for "smollm"-style vocabularies) → bytes
//     mapped to printable characters (GPT-2's bytes_to_unicode) → merges applied lowest rank
//     first. Decoding maps the characters back to bytes.
//   * SentencePiece-style (GGUF "llama", with per-token scores): spaces become U+2581 "▁"
//     (and one is prepended when add_space_prefix), then the adjacent pair whose merged text
//     has the highest score is merged until none is in the vocabulary; characters that are
//     not in the vocabulary become byte tokens <0xXX>. This is llama.cpp's algorithm.
//   * character-level BPE with byte fallback (tokenizer.json model BPE with byte_fallback and
//     the Llama-2 normalizer "prepend ▁, replace ' ' by ▁").
//
// Special tokens (GGUF token types control and user-defined; tokenizer.json added_tokens) are
// matched in the input text before anything else, so "<|im_start|>" is one token.
// BOS is prepended by encode() when the model asks for it (tokenizer.ggml.add_bos_token, or a
// tokenizer.json post-processor that starts with a special token).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace nibble::llm {

class GgufFile;
class Json;

class Tokenizer {
 public:
  enum class Model : uint8_t { byte_bpe, char_bpe, sentencepiece };
  /// How raw text is cut into pieces before BPE (byte-level models): GPT-2's regex (optionally
  /// after cutting out every digit), Llama 3's regex, Qwen2's (Llama 3's with single digits).
  enum class PreSplit : uint8_t { gpt2, gpt2_digits, llama3, qwen2, none };

  static Tokenizer from_gguf(const GgufFile& g);
  /// From the text of a Hugging Face tokenizer.json (`what` names it in errors).
  static Tokenizer from_hf_json(std::string_view json_text, const std::string& what);

  /// Token ids of `text`; a BOS token first when add_bos() and `allow_bos`.
  std::vector<int32_t> encode(std::string_view text, bool allow_bos = true) const;
  /// The pieces the pre-tokenizer cuts `text` into (substrings of it; special tokens are not
  /// looked for): what BPE then runs on, one piece at a time. The whole text for models without
  /// a pre-split.
  std::vector<std::string_view> pre_split(std::string_view text) const;
  /// The bytes the ids stand for (special tokens as their text unless `skip_special`).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::string& token(int32_t id) const;  ///< the vocabulary entry (not decoded)
  bool is_special(int32_t id) const;
  int32_t bos_id() const { return bos_id_; }  ///< -1 when the model has none
  int32_t eos_id() const { return eos_id_; }  ///< -1 when the model has none
  bool add_bos() const { return add_bos_ && bos_id_ >= 0; }
  /// Whether generation stops at this id (EOS, or an end-of-turn token such as <|im_end|>).
  bool is_end_of_generation(int32_t id) const;
  Model model() const { return model_; }
  PreSplit pre_split() const { return pre_split_; }
  std::string describe() const;  ///< one line for `nibble info`

  /// The tokenizer as a Hugging Face tokenizer.json (BPE models; a SentencePiece-score model
  /// has no BPE form and throws unsupported). from_hf_json() of it gives the same ids.
  std::string to_hf_json() const;

  /// For loaders: ids from a config file (tokenizer.json carries no BOS/EOS of its own).
  void set_bos_eos(int32_t bos, int32_t eos, bool add_bos);
  /// For loaders: one more id that ends generation (config.json or generation_config.json list
  /// several, e.g. Llama 3.1's <|end_of_text|>, <|eom_id|>, <|eot_id|>).
  void add_end_of_generation(int32_t id);

  /// The chat format of the model: how one user turn is wrapped so that the model answers.
  enum class ChatFormat : uint8_t { none, chatml, llama3, inst, phi3 };
  /// Found from the model's chat template (GGUF tokenizer.chat_template, tokenizer_config.json
  /// chat_template) when it names one of the formats' markers, else from the special tokens of
  /// the vocabulary (<|im_start|>, <|start_header_id|>).
  ChatFormat chat_format() const;
  /// `user` as one user turn followed by the start of the assistant's: ChatML
  /// "<|im_start|>user\n...<|im_end|>\n<|im_start|>assistant\n", Llama 3
  /// "<|start_header_id|>user<|end_header_id|>\n\n...<|eot_id|><|start_header_id|>assistant
  /// <|end_header_id|>\n\n", Llama 2 / Mistral "[INST] ... [/INST]", or Phi-3
  /// "<|user|>\n...<|end|>\n<|assistant|>\n" (BOS, when the model adds one, comes from
  /// encode()). Throws unsupported when chat_format() is none.
  /// With a non-empty `system`, a system turn comes first (ChatML and Llama 3 as a "system" turn,
  /// Phi-3 as <|system|>, [INST] as Llama 2's <<SYS>> block inside the first instruction).
  std::string chat_prompt(std::string_view user, std::string_view system = {}) const;
  /// For loaders: the chat template text (Jinja), used only to recognise the format.
  void set_chat_template(std::string t) { chat_template_ = std::move(t); }

 private:
  void finish();  // builds the lookup tables from tokens_, merges, specials
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;  // no specials
  void bpe_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void spm_fragment(std::string_view text, std::vector<int32_t>& out) const;
  void byte_fallback(unsigned char byte, std::vector<int32_t>& out) const;
  int32_t find(std::string_view s) const;  // -1 when absent

  Model model_ = Model::byte_bpe;
  PreSplit pre_split_ = PreSplit::gpt2;
  // A piece that is a whole vocabulary entry becomes that token without merging (tokenizers'
  // BPE `ignore_merges`, set by Llama 3's tokenizer: its vocabulary holds words that its merges
  // do not build).
  bool ignore_merges_ = false;
  std::vector<std::string> tokens_;
  std::vector<float> scores_;     // sentencepiece
  std::vector<uint8_t> special_;  // per id: matched in text and skippable in decode
  std::vector<std::pair<std::string, std::string>> merge_pairs_;  // rank order
  std::unordered_map<std::string, int32_t> index_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a,b) → (rank, merged)
  std::vector<int32_t> byte_token_;  // byte-level: byte → id of its mapped char; else <0xXX>
  std::vector<int32_t> specials_by_length_;  // special ids, longest text first
  std::vector<int32_t> end_ids_;
  std::string chat_template_;
  int32_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1;
  bool add_bos_ = false;
  bool add_space_prefix_ = false;  // sentencepiece / char_bpe: prepend "▁"
};

}  // namespace nibble::llm
