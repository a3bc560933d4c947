// Tokenizers: SentencePiece-style and byte-level BPE on hand-built vocabularies with
// hand-computed ids, tokenizer.json variants and their errors, and — when the real model is
// present (NIBBLE_LLM_MODEL) — SmolLM2's tokenizer against ids produced by Hugging Face
// `tokenizers` (tests/llm/data/smollm2_tokens.json; how: tests/llm/reference.py tokens).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "llm/file_util.h"
#include "llm/gguf.h"
#include "llm/json.h"
#include "llm/model_files.h"
#include "llm/tokenizer.h"
#include "nibble/status.h"
#include "test_llm_util.h"

namespace nibble::llm {
namespace {

using test::GgufWriter;
using Ids = std::vector<int32_t>;

// A GGUF file holding only tokenizer metadata.
GgufFile spm_gguf(bool add_space_prefix) {
  const std::vector<std::string> tokens = {"<unk>",
                                           "<s>",
                                           "</s>",
                                           "\xE2\x96\x81",
                                           "h",
                                           "e",
                                           "l",
                                           "o",
                                           "\xE2\x96\x81h",
                                           "ll",
                                           "\xE2\x96\x81he",
                                           "llo",
                                           "\xE2\x96\x81hello",
                                           "<0xC3>",
                                           "<0xA9>",
                                           "w"};
  //                                        0      1      2       3(▁)   4    5    6    7
  std::vector<float> scores(tokens.size(), -100.0f);
  scores[8] = -1, scores[9] = -2, scores[10] = -3, scores[11] = -4, scores[12] = -5;
  std::vector<int32_t> types(tokens.size(), 1);
  types[0] = 2, types[1] = 3, types[2] = 3, types[13] = 6, types[14] = 6;
  GgufWriter w;
  w.header(0, 8);
  w.kv_string("tokenizer.ggml.model", "llama");
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_f32s("tokenizer.ggml.scores", scores);
  w.kv_i32s("tokenizer.ggml.token_type", types);
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", 2);
  w.kv_u32("tokenizer.ggml.unknown_token_id", 0);
  w.kv_bool("tokenizer.ggml.add_space_prefix", add_space_prefix);
  return GgufFile::parse(w.bytes, "spm");
}

TEST(LlmTokenizer, SentencePieceMergesByScoreAndFallsBackToBytes) {
  const Tokenizer t = Tokenizer::from_gguf(spm_gguf(true));
  EXPECT_EQ(t.model(), Tokenizer::Model::sentencepiece);
  EXPECT_TRUE(t.add_bos());
  // "▁hello": ▁h (−1), ll (−2), ▁he (−3), llo (−4), ▁hello (−5) merge in that order.
  EXPECT_EQ(t.encode("hello"), (Ids{1, 12}));
  EXPECT_EQ(t.encode("hello", false), (Ids{12}));
  // é is not a token: its two UTF-8 bytes become <0xC3> <0xA9>.
  EXPECT_EQ(t.encode("hello \xC3\xA9", false), (Ids{12, 3, 13, 14}));
  EXPECT_EQ(t.encode("wow", false), (Ids{3, 15, 7, 15}));
  EXPECT_EQ(t.decode(Ids{1, 12, 3, 13, 14}, true), "hello \xC3\xA9");
  // Control tokens in the text are matched as tokens; the text after one gets a space prefix.
  EXPECT_EQ(t.encode("hello</s>hello", false), (Ids{12, 2, 12}));
  EXPECT_TRUE(t.is_end_of_generation(2));
  EXPECT_EQ(t.encode("", true), (Ids{1}));
  const Tokenizer no_prefix = Tokenizer::from_gguf(spm_gguf(false));
  EXPECT_EQ(no_prefix.encode("hello", false), (Ids{4, 5, 11}));  // ll, then llo; "he" is no token
}

// A tiny byte-level vocabulary: the 256 byte characters, then merges of "Ġt", "he", "Ġthe".
std::string byte_level_json(bool merges_as_pairs, const std::string& pre) {
  std::string vocab;
  int id = 0;
  // The printable characters GPT-2 maps bytes to, in byte order; 'Ġ' (U+0120) is the space.
  uint32_t extra = 0;  // non-printable bytes map to U+0100, U+0101, ... in byte order
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const uint32_t cp = printable ? static_cast<uint32_t>(b) : 256u + extra++;
    if (id > 0) vocab += ',';
    vocab += '"';
    if (cp == '"' || cp == '\\') vocab += '\\';
    if (cp < 0x80) {
      vocab += static_cast<char>(cp);
    } else {
      vocab += static_cast<char>(0xC0 | (cp >> 6));
      vocab += static_cast<char>(0x80 | (cp & 0x3F));
    }
    vocab += "\":";
    vocab += std::to_string(id);
    ++id;
  }
  vocab += ",\"\xC4\xA0t\":256,\"he\":257,\"\xC4\xA0the\":258,\"12\":259";
  const std::string merges =
      merges_as_pairs ? "[[\"\xC4\xA0\",\"t\"],[\"h\",\"e\"],[\"\xC4\xA0t\",\"he\"],[\"1\",\"2\"]]"
                      : "[\"\xC4\xA0 t\",\"h e\",\"\xC4\xA0t he\",\"1 2\"]";
  return "{\"added_tokens\":[{\"id\":260,\"content\":\"<|end|>\",\"special\":true}],"
         "\"pre_tokenizer\":" +
         pre + ",\"model\":{\"type\":\"BPE\",\"vocab\":{" + vocab + "},\"merges\":" + merges + "}}";
}

TEST(LlmTokenizer, ByteLevelBpeFromTokenizerJson) {
  const std::string byte_level =
      "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}";
  const std::string with_digits =
      "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\","
      "\"individual_digits\":true}," +
      byte_level + "]}";
  for (bool pairs : {false, true}) {
    const Tokenizer t = Tokenizer::from_hf_json(byte_level_json(pairs, byte_level), "tiny");
    EXPECT_EQ(t.vocab_size(), 261);
    // " the" → Ġ t h e → Ġt, he → Ġthe; "the" alone: t, he.
    EXPECT_EQ(t.encode(" the"), (Ids{258}));
    EXPECT_EQ(t.encode("the"), (Ids{'t', 257}));
    EXPECT_EQ(t.encode("the<|end|> the"), (Ids{'t', 257, 260, 258}));
    EXPECT_EQ(t.decode(t.encode("x the<|end|>\n\xC3\xA9")), "x the<|end|>\n\xC3\xA9");
    EXPECT_EQ(t.decode(t.encode("a<|end|>"), true), "a");
    // The GPT-2 pattern keeps "12" together (and the merge "1 2" applies); " " is Ġ, id 32.
    EXPECT_EQ(t.encode("12"), (Ids{259}));
    EXPECT_EQ(t.encode(" the  12"), (Ids{258, 32, 32, 259}));
  }
  // Digits(individual_digits) isolates each digit first, so "12" cannot merge.
  const Tokenizer d = Tokenizer::from_hf_json(byte_level_json(true, with_digits), "digits");
  EXPECT_EQ(d.pre_split(), Tokenizer::PreSplit::gpt2_digits);
  EXPECT_EQ(d.encode("12"), (Ids{'1', '2'}));
}

// Llama 3's pre-tokenizer as its tokenizer.json spells it: Split(regex) then ByteLevel without
// its own regex. (The regex itself is checked against tokenizers' by tests/llm/reference.py
// check-pre-split on thousands of strings; these are the parsing, a few cuts and the export.)
std::string llama3_split_pre(const std::string& regex, const std::string& behavior = "Isolated",
                             bool byte_level_regex = false) {
  return "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"" +
         regex + "\"},\"behavior\":\"" + behavior +
         "\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
         "\"trim_offsets\":true,\"use_regex\":" +
         (byte_level_regex ? "true" : "false") + "}]}";
}
const char* const kLlama3RegexJson =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";

TEST(LlmTokenizer, Llama3SplitPreTokenizerFromTokenizerJson) {
  const Tokenizer t =
      Tokenizer::from_hf_json(byte_level_json(true, llama3_split_pre(kLlama3RegexJson)), "llama3");
  EXPECT_EQ(t.pre_split(), Tokenizer::PreSplit::llama3);
  using Pieces = std::vector<std::string_view>;
  // Three digits a piece; a punctuation mark leads a word; contractions in any case; spaces
  // before a newline end with it; the last space of a run goes with the next word.
  EXPECT_EQ(t.pre_split("12345 (hello) I'LL  go\n\n  x"),
            (Pieces{"123", "45", " (", "hello", ")", " I", "'LL", " ", " go", "\n\n", " ", " x"}));
  EXPECT_EQ(t.pre_split("(hi"), (Pieces{"(hi"}));
  EXPECT_EQ(t.pre_split("a'\xC5\xBFx"), (Pieces{"a", "'\xC5\xBF", "x"}));  // 'ſ folds to 's
  EXPECT_EQ(t.pre_split("x!?\n\ny"), (Pieces{"x", "!?\n\n", "y"}));
  EXPECT_EQ(t.encode("12"), (Ids{259}));  // "12" is one piece and merges
  // The export keeps the rule: tokenizer.json → to_hf_json → the same pieces and ids.
  const Tokenizer back = Tokenizer::from_hf_json(t.to_hf_json(), "round trip");
  EXPECT_EQ(back.pre_split(), Tokenizer::PreSplit::llama3);
  EXPECT_EQ(back.encode(" the 12345!\n"), t.encode(" the 12345!\n"));
  // Other Split shapes are refused by name, not run with another rule.
  for (const auto& [pre, expect] : std::vector<std::pair<std::string, const char*>>{
           {llama3_split_pre("\\\\s+"), "not Llama 3's or Qwen2's regex"},
           {llama3_split_pre(kLlama3RegexJson, "Removed"), "behavior Isolated"},
           {llama3_split_pre(kLlama3RegexJson, "Isolated", true), "ByteLevel(use_regex = false)"},
       }) {
    try {
      Tokenizer::from_hf_json(byte_level_json(true, pre), "case");
      ADD_FAILURE() << "accepted: " << pre;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  }
}

TEST(LlmTokenizer, IgnoreMergesTakesWholeVocabularyWords) {
  // "Ġthe" is in the vocabulary; with merges removed it is reachable only as a whole word.
  std::string json = byte_level_json(true, llama3_split_pre(kLlama3RegexJson));
  const std::string merges = "\"merges\":[[\"\xC4\xA0\",\"t\"],[\"h\",\"e\"],[\"\xC4\xA0t\",\"he\"],[\"1\",\"2\"]]";
  const size_t at = json.find(merges);
  ASSERT_NE(at, std::string::npos);
  json.replace(at, merges.size(), "\"merges\":[],\"ignore_merges\":true");
  const Tokenizer t = Tokenizer::from_hf_json(json, "ignore_merges");
  EXPECT_EQ(t.encode(" the"), (Ids{258}));
  EXPECT_EQ(t.encode(" then"), (Ids{32, 't', 'h', 'e', 'n'}));  // no whole word: bytes
}

TEST(LlmTokenizer, ChatFormatFromTheTemplateOrTheSpecialTokens) {
  const std::string byte_level = "{\"type\":\"ByteLevel\"}";
  Tokenizer t = Tokenizer::from_hf_json(byte_level_json(true, byte_level), "tiny");
  EXPECT_EQ(t.chat_format(), Tokenizer::ChatFormat::none);
  EXPECT_THROW(t.chat_prompt("hi"), Error);
  t.set_chat_template("{% for m in messages %}<|start_header_id|>{{ m['role'] }}...");
  EXPECT_EQ(t.chat_format(), Tokenizer::ChatFormat::llama3);
  EXPECT_EQ(t.chat_prompt("Hi?"),
            "<|start_header_id|>user<|end_header_id|>\n\nHi?<|eot_id|><|start_header_id|>"
            "assistant<|end_header_id|>\n\n");
  t.set_chat_template("{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]");
  EXPECT_EQ(t.chat_prompt("Hi?"), "[INST] Hi? [/INST]");
  EXPECT_EQ(t.chat_prompt("Hi?", "Be brief."), "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi? [/INST]");
  t.set_chat_template("{% if m['role'] == 'user' %}<|user|>\n{{ m }}<|end|>\n<|assistant|>\n");
  EXPECT_EQ(t.chat_prompt("Hi?"), "<|user|>\nHi?<|end|>\n<|assistant|>\n");
  t.set_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n");
  EXPECT_EQ(t.chat_prompt("Hi?"), "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.chat_prompt("Hi?", "Be brief."),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
            "<|im_start|>assistant\n");
  // Without a template, ChatML's special tokens in the vocabulary are enough.
  std::string json = byte_level_json(true, byte_level);
  const std::string added = "{\"id\":260,\"content\":\"<|end|>\",\"special\":true}";
  json.replace(json.find(added), added.size(),
               added + ",{\"id\":261,\"content\":\"<|im_start|>\",\"special\":true},"
                       "{\"id\":262,\"content\":\"<|im_end|>\",\"special\":true}");
  EXPECT_EQ(Tokenizer::from_hf_json(json, "chatml").chat_format(), Tokenizer::ChatFormat::chatml);
}

// A Hugging Face directory whose config.json lists several EOS ids, with a generation_config.json
// and a tokenizer_config.json chat template: every listed id ends generation.
TEST(LlmTokenizer, HuggingFaceDirectoryEndIdsAndChatTemplate) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("nibble-eos-" + std::to_string(::getpid()));
  ModelConfig c;
  c.vocab_size = 261, c.dim = 64, c.n_layers = 1, c.n_heads = 2, c.n_kv_heads = 2;
  c.head_dim = 32, c.ffn_dim = 64, c.max_context = 32, c.tied_embeddings = true;
  ModelFiles m = random_model(c, 7);
  m.tokenizer = Tokenizer::from_hf_json(byte_level_json(true, "{\"type\":\"ByteLevel\"}"), "tiny");
  write_nibble_checkpoint(m, "w8a8", "bf16", dir.string());
  auto write = [&](const char* name, const std::string& text) {
    std::ofstream(dir / name) << text;
  };
  std::string config = read_text_file((dir / "config.json").string(), "test");
  config.replace(config.rfind('}'), 1, ", \"eos_token_id\": [258, 259]}");
  write("config.json", config);
  write("generation_config.json", "{\"eos_token_id\": [257, 258]}");
  write("tokenizer_config.json", "{\"chat_template\": \"<|start_header_id|>...\"}");
  const ModelFiles back = open_model(dir.string());
  ASSERT_TRUE(back.tokenizer);
  for (int32_t id : {257, 258, 259}) EXPECT_TRUE(back.tokenizer->is_end_of_generation(id)) << id;
  EXPECT_FALSE(back.tokenizer->is_end_of_generation(256));
  EXPECT_EQ(back.tokenizer->chat_format(), Tokenizer::ChatFormat::llama3);
  write("generation_config.json", "{\"eos_token_id\": [9999]}");
  EXPECT_THROW(open_model(dir.string()), Error);
  fs::remove_all(dir);
}

TEST(LlmTokenizer, UnsupportedOrMalformedTokenizerJsonIsRejected) {
  const std::string byte_level = "{\"type\":\"ByteLevel\"}";
  const std::string good = byte_level_json(false, byte_level);
  EXPECT_NO_THROW(Tokenizer::from_hf_json(good, "good"));
  struct Case {
    std::string json;
    const char* expect;
  };
  const Case cases[] = {
      {"[]", "not a JSON object"},
      {"{}", "no \"model\""},
      {"{\"model\":{\"type\":\"Unigram\"}}", "not BPE"},
      {"{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", "vocab is not an object"},
      {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", "not an integer id"},
      {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", "out of range"},
      {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", "not \"a b\""},
      {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[1]}}", "neither"},
      {"{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":"
       "0},\"merges\":[]}}",
       "not supported"},
      {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", "byte_fallback"},
      {good.substr(0, good.size() - 1), "unexpected end"},
  };
  for (const Case& c : cases) {
    try {
      Tokenizer::from_hf_json(c.json, "case");
      ADD_FAILURE() << "accepted: " << c.json.substr(0, 200);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
  }
}

TEST(LlmTokenizer, CharacterBpeWithByteFallbackLikeLlama2) {
  // "▁" "a" "b" "▁a" "ab" "▁ab" and byte tokens for 'c': Llama-2's tokenizer.json shape.
  const std::string json =
      "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
      "\"\xE2\x96\x81\"},"
      "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}]},"
      "\"pre_tokenizer\":null,\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},"
      "{\"id\":1,\"content\":\"<s>\",\"special\":true}],"
      "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":"
      "\"<s>\",\"type_id\":0}},"
      "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}]},"
      "\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"unk_token\":\"<unk>\",\"vocab\":{\"<"
      "unk>\":0,\"<s>\":1,"
      "\"\xE2\x96\x81\":2,\"a\":3,\"b\":4,\"\xE2\x96\x81\x61\":5,\"ab\":6,\"\xE2\x96\x81\x61\x62\":"
      "7,\"<0x63>\":8},"
      "\"merges\":[\"\xE2\x96\x81 a\",\"a b\",\"\xE2\x96\x81\x61 b\"]}}";
  const Tokenizer t = Tokenizer::from_hf_json(json, "llama2-like");
  EXPECT_EQ(t.model(), Tokenizer::Model::char_bpe);
  EXPECT_TRUE(t.add_bos());
  EXPECT_EQ(t.encode("ab c"), (Ids{1, 7, 2, 8}));
  EXPECT_EQ(t.decode(Ids{1, 7, 2, 8}, true), "ab c");
}

TEST(LlmTokenizer, GgufWithoutTokenizerOrWithUnknownModelIsRejected) {
  GgufWriter w;
  w.header(0, 1);
  w.kv_string("tokenizer.ggml.model", "bert");
  try {
    Tokenizer::from_gguf(GgufFile::parse(w.bytes, "bert"));
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
  }
  GgufWriter w2;
  w2.header(0, 1);
  w2.kv_string("tokenizer.ggml.model", "gpt2");
  EXPECT_THROW(Tokenizer::from_gguf(GgufFile::parse(w2.bytes, "no tokens")), Error);
}

// ---- the real model ----------------------------------------------------------------------------

void check_against_reference(const Tokenizer& t, const char* which) {
  const Json data =
      Json::parse(read_text_file(test::test_data_path("smollm2_tokens.json"), "test"), "data");
  int n = 0;
  for (const Json& c : data.find("cases")->items()) {
    const std::string& text = c.find("text")->string();
    Ids want;
    for (const Json& id : c.find("ids")->items())
      want.push_back(static_cast<int32_t>(id.integer()));
    EXPECT_EQ(t.encode(text), want) << which << ": " << text;
    EXPECT_EQ(t.decode(want), text) << which << ": " << text;
    ++n;
  }
  EXPECT_GE(n, 15);
}

TEST(LlmTokenizerRealModel, SmolLM2MatchesHuggingFaceTokenizers) {
  if (test::real_model_path().empty())
    GTEST_SKIP() << "NIBBLE_LLM_MODEL is not set (ctest -R llm_ sets it)";
  const ModelFiles m = open_model(test::real_model_path());
  ASSERT_TRUE(m.tokenizer.has_value());
  EXPECT_EQ(m.tokenizer->pre_split(), Tokenizer::PreSplit::gpt2_digits);
  EXPECT_FALSE(m.tokenizer->add_bos());
  EXPECT_EQ(m.tokenizer->eos_id(), 2);
  check_against_reference(*m.tokenizer, "GGUF");
}

TEST(LlmTokenizerRealModel, SmolLM2TokenizerJsonMatchesToo) {
  if (test::real_hf_dir().empty())
    GTEST_SKIP() << "NIBBLE_LLM_HF_DIR is not set (ctest -R llm_ sets it)";
  const ModelFiles m = open_model(test::real_hf_dir());
  ASSERT_TRUE(m.tokenizer.has_value());
  EXPECT_EQ(m.tokenizer->eos_id(), 2);
  check_against_reference(*m.tokenizer, "tokenizer.json");
}

}  // namespace
}  // namespace nibble::llm
