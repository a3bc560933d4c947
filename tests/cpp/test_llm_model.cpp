// The model side of the runner: configurations (config.json, GGUF, presets) and their errors,
// tensor names and the GGUF Q/K permutation, the CPU backend against a float64 forward pass
// written here from the formulas, prefill = step-by-step decode, the sampler, generate() and
// perplexity(); and, with the real model present, end-to-end generation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "llm/backend.h"
#include "llm/config.h"
#include "llm/gguf.h"
#include "llm/model_files.h"
#include "llm/runner.h"
#include "llm/safetensors.h"
#include "llm/tokenizer.h"
#include "nibble/status.h"
#include "test_llm_util.h"
#include "test_util.h"

namespace nibble::llm {
namespace {

const char* kSmolConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": 49152, "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
  "num_key_value_heads": 3, "intermediate_size": 1536, "max_position_embeddings": 8192,
  "rope_theta": 100000, "rms_norm_eps": 1e-05, "tie_word_embeddings": true, "hidden_act": "silu",
  "rope_scaling": null, "bos_token_id": 1, "eos_token_id": 2})";

TEST(LlmConfig, FromHuggingFaceConfigJson) {
  const ModelConfig c = ModelConfig::from_hf_json(kSmolConfig, "config.json");
  EXPECT_EQ(c.dim, 576);
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.ffn_dim, 1536);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_TRUE(c.tied_embeddings);
  // Same sizes as the preset, whose parameter count is SmolLM2-135M's.
  const ModelConfig p = ModelConfig::preset("smollm2-135m");
  EXPECT_EQ(p.n_params(), c.n_params());
  EXPECT_NEAR(static_cast<double>(p.n_params()), 134.5e6, 0.1e6);
  EXPECT_NEAR(static_cast<double>(ModelConfig::preset("llama3-8b").n_params()), 8.03e9, 0.01e9);
  // The model cards' counts: Qwen2.5-7B 7.61B, Qwen3-8B 8.19B.
  const ModelConfig q2 = ModelConfig::preset("qwen2.5-7b"), q3 = ModelConfig::preset("qwen3-8b");
  EXPECT_NEAR(static_cast<double>(q2.n_params()), 7.62e9, 0.01e9);
  EXPECT_TRUE(q2.qkv_bias && !q2.o_bias && q2.arch == "qwen2");
  EXPECT_NEAR(static_cast<double>(q3.n_params()), 8.19e9, 0.01e9);
  EXPECT_TRUE(q3.qk_norm && q3.head_dim == 128 && q3.arch == "qwen3");
}

// config.json's quantization_config: GPTQ and AWQ checkpoints of 4-bit weights in groups of
// 32..256 import as w4a16_g<G>_asym_sf16; anything else is refused naming what is unsupported.
// (The packings themselves are checked end to end by tests/llm: llm_*_import_equals_nibble_checkpoint.)
TEST(LlmModel, QuantizationConfigsAreImportedOrRefusedByName) {
  const std::string dir = test::unique_temp_path("nibble_quant_config_test");
  std::filesystem::create_directories(dir);
  const float one = 1.0f;
  std::vector<uint8_t> bytes(4);
  std::memcpy(bytes.data(), &one, 4);
  write_safetensors(dir + "/model.safetensors",
                    {{"model.norm.weight", "F32", {1}, bytes}}, {});
  auto open_with = [&](const std::string& qc) {
    std::string cfg = kSmolConfig;
    cfg.insert(cfg.rfind('}'), ", \"quantization_config\": " + qc);
    std::FILE* f = std::fopen((dir + "/config.json").c_str(), "wb");
    std::fputs(cfg.c_str(), f);
    std::fclose(f);
    return open_model(dir);
  };
  auto refused = [&](const std::string& qc, const std::string& words) {
    try {
      open_with(qc);
      ADD_FAILURE() << qc << ": no error; expected one mentioning '" << words << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  EXPECT_NE(open_with(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false})")
                .weights->describe()
                .find("gptq 4-bit (g128) imported as w4a16_g128_asym_sf16"),
            std::string::npos);
  EXPECT_NE(open_with(R"({"quant_method": "AWQ", "bits": 4, "group_size": 64, "version": "GEMM",
                         "zero_point": true})")
                .weights->describe()
                .find("awq 4-bit (g64) imported as w4a16_g64_asym_sf16"),
            std::string::npos);
  EXPECT_NE(open_with("null").weights->describe().find("safetensors"), std::string::npos);
  refused(R"({"quant_method": "gptq", "bits": 8, "group_size": 128})", "'bits' must be 4");
  refused(R"({"quant_method": "gptq", "bits": 4, "group_size": -1})",
          "'group_size' must be 32, 64, 128 or 256");
  refused(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"})",
          "got 'marlin'");
  refused(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": true})", "lm_head");
  refused(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"})", "'gemv'");
  refused(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": false})",
          "zero_point");
  refused(R"({"quant_method": "bitsandbytes", "load_in_4bit": true})", "'bitsandbytes'");
  std::filesystem::remove_all(dir);
}

TEST(LlmConfig, BadConfigsNameTheProblem) {
  const std::string base = kSmolConfig;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = base;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  struct Case {
    std::string json;
    const char* expect;
  };
  const Case cases[] = {
      {with("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 2"), "not a multiple"},
      {with("\"hidden_size\": 576,", ""), "'hidden_size' is missing"},
      {with("\"num_hidden_layers\": 30", "\"num_hidden_layers\": \"30\""), "not an integer"},
      {with("\"num_hidden_layers\": 30", "\"num_hidden_layers\": 0"), "n_layers = 0"},
      {with("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\"}"), "rope_scaling"},
      {with("\"model_type\": \"llama\"", "\"model_type\": \"gpt2\""), "not a Llama-family"},
      {with("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), "silu"},
      {with("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1"), "norm_eps"},
      {with("\"rope_theta\": 100000", "\"rope_theta\": 0.5"), "rope_theta"},
      {"[1]", "not a JSON object"},
      {"{", "unexpected end"},
  };
  for (const Case& c : cases) {
    try {
      ModelConfig::from_hf_json(c.json, "config.json");
      ADD_FAILURE() << "accepted: " << c.json;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(ModelConfig::preset("gpt-5"), Error);
}

// The metadata of a tiny llama GGUF file (8 wide, 2 heads, 10 tokens), after its header.
void tiny_llama_metadata(test::GgufWriter& w, uint32_t layers, uint32_t kv_heads, float theta) {
  w.kv_string("general.architecture", "llama");
  w.kv_u32("llama.embedding_length", 8);
  w.kv_u32("llama.block_count", layers);
  w.kv_u32("llama.attention.head_count", 2);
  w.kv_u32("llama.attention.head_count_kv", kv_heads);
  w.kv_u32("llama.feed_forward_length", 16);
  w.kv_u32("llama.context_length", 64);
  w.kv_f32("llama.rope.freq_base", theta);
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
}

TEST(LlmConfig, FromGgufMetadataWithTiedEmbeddings) {
  test::GgufWriter w;
  w.header(1, 9);
  tiny_llama_metadata(w, 2, 1, 5000.0f);
  w.tensor("token_embd.weight", {8, 10}, 0, 0);
  w.align();
  w.bytes.resize(w.bytes.size() + 8 * 10 * 4, 0);
  const ModelConfig c = ModelConfig::from_gguf(GgufFile::parse(w.bytes, "tiny"));
  EXPECT_EQ(c.vocab_size, 10);
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.rope_theta, 5000.0);
  EXPECT_TRUE(c.tied_embeddings);
}

// Llama 3.1's config.json RoPE scaling, against Hugging Face's _compute_llama3_parameters written
// out independently (its where() form over wavelengths), then the export and a GGUF
// rope_freqs.weight tensor.
TEST(LlmConfig, Llama3RopeScaling) {
  std::string json = kSmolConfig;
  const std::string from = "\"rope_scaling\": null";
  json.replace(json.find(from), from.size(),
               "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": "
               "1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 1024}");
  const ModelConfig c = ModelConfig::from_hf_json(json, "config.json");
  ASSERT_EQ(c.rope_freq_factors.size(), 32u);
  const std::vector<double> inv = c.rope_inv_freq();
  int scaled = 0, smooth = 0;
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(100000.0, -2.0 * i / 64.0);
    const double wavelen = 2 * 3.14159265358979323846 / base;
    double want = wavelen > 1024.0 ? base / 8.0 : base;  // low_freq_wavelen = 1024 / 1
    const double s = (1024.0 / wavelen - 1.0) / (4.0 - 1.0);
    if (!(wavelen < 256.0) && !(wavelen > 1024.0)) {    // high_freq_wavelen = 1024 / 4
      want = (1 - s) * want / 8.0 + s * want;
      ++smooth;
    }
    scaled += wavelen > 1024.0;
    EXPECT_NEAR(inv[static_cast<size_t>(i)], want, want * 1e-7) << i;  // f32 divisors
  }
  EXPECT_GT(scaled, 0);
  EXPECT_GT(smooth, 0);
  EXPECT_EQ(c.rope_freq_factors.front(), 1.0f);
  EXPECT_EQ(c.rope_freq_factors.back(), 8.0f);
  // config.json out and back: the same parameters, the same divisors.
  const ModelConfig back = ModelConfig::from_hf_json(c.to_hf_json(1, 2), "exported");
  EXPECT_EQ(back.rope_scaling.type, "llama3");
  EXPECT_EQ(back.rope_freq_factors, c.rope_freq_factors);
  EXPECT_NE(c.describe().find("rope scaling llama3 x8"), std::string::npos) << c.describe();
  // Linear scaling divides every rate; YaRN and dynamic NTK are refused by name.
  std::string lin = kSmolConfig;
  lin.replace(lin.find(from), from.size(), "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 4}");
  EXPECT_EQ(ModelConfig::from_hf_json(lin, "linear").rope_inv_freq()[0], 0.25);
  for (const char* type : {"yarn", "dynamic", "longrope"}) {
    std::string other = kSmolConfig;
    other.replace(other.find(from), from.size(),
                  std::string("\"rope_scaling\": {\"rope_type\": \"") + type + "\", \"factor\": 4}");
    try {
      ModelConfig::from_hf_json(other, "config.json");
      ADD_FAILURE() << type << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + type + "' is not supported"),
                std::string::npos) << e.what();
    }
  }
}

TEST(LlmConfig, GgufRopeFreqsTensorDividesTheRates) {
  auto file = [](uint64_t n_factors) {
    test::GgufWriter w;
    w.header(2, 9);
    tiny_llama_metadata(w, 1, 2, 10000.0f);
    w.tensor("token_embd.weight", {8, 10}, 0, 0);
    w.tensor("rope_freqs.weight", {n_factors}, 0, 320);
    w.align();
    w.bytes.resize(w.bytes.size() + 320, 0);
    for (uint64_t i = 0; i < n_factors; ++i) w.put<float>(1.0f + static_cast<float>(i));
    return GgufFile::parse(w.bytes, "tiny");
  };
  const ModelConfig c = ModelConfig::from_gguf(file(2));  // head_dim 4: two pairs
  EXPECT_EQ(c.rope_freq_factors, (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(c.rope_inv_freq()[1], std::pow(10000.0, -0.5) / 2.0);
  // Written as a checkpoint's config.json, the divisors travel in nibble's own key.
  const ModelConfig back = ModelConfig::from_hf_json(c.to_hf_json(-1, -1), "exported");
  EXPECT_EQ(back.rope_freq_factors, c.rope_freq_factors);
  try {
    ModelConfig::from_gguf(file(3));
    ADD_FAILURE() << "three divisors for two pairs accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim / 2 = 2"), std::string::npos) << e.what();
  }
}

TEST(LlmConfig, Qwen2AndLlamaAttentionBiases) {
  std::string qwen = kSmolConfig;
  const std::string from = "\"model_type\": \"llama\"";
  qwen.replace(qwen.find(from), from.size(), "\"model_type\": \"qwen2\"");
  const ModelConfig q = ModelConfig::from_hf_json(qwen, "qwen2");
  EXPECT_EQ(q.arch, "qwen2");
  EXPECT_TRUE(q.qkv_bias);
  EXPECT_FALSE(q.o_bias);
  const ModelConfig q_back = ModelConfig::from_hf_json(q.to_hf_json(1, 2), "exported");
  EXPECT_EQ(q_back.arch, "qwen2");
  EXPECT_TRUE(q_back.qkv_bias);
  std::string llama = kSmolConfig;
  llama.replace(llama.find(from), from.size(), "\"model_type\": \"llama\", \"attention_bias\": true");
  const ModelConfig l = ModelConfig::from_hf_json(llama, "llama");
  EXPECT_TRUE(l.qkv_bias && l.o_bias);
  EXPECT_TRUE(ModelConfig::from_hf_json(l.to_hf_json(1, 2), "exported").o_bias);
  EXPECT_NE(l.describe().find("q/k/v/o biases"), std::string::npos);
  // What would change the computation without being run is refused by name.
  for (const auto& [json, expect] : std::vector<std::pair<std::string, const char*>>{
           {qwen.substr(0, qwen.size() - 1) + ", \"use_sliding_window\": true}", "use_sliding_window"},
           {qwen.substr(0, qwen.size() - 1) + ", \"mlp_bias\": true}", "mlp_bias"},
       }) {
    try {
      ModelConfig::from_hf_json(json, "config.json");
      ADD_FAILURE() << "accepted: " << json;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(canonical_tensor_name("model.layers.3.self_attn.v_proj.bias"), "blk.3.attn_v.bias");
  // Qwen3: no biases unless attention_bias (then on all four), per-head q/k RMSNorm.
  std::string qwen3 = kSmolConfig;
  qwen3.replace(qwen3.find(from), from.size(), "\"model_type\": \"qwen3\", \"head_dim\": 128");
  const ModelConfig q3 = ModelConfig::from_hf_json(qwen3, "qwen3");
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_FALSE(q3.qkv_bias || q3.o_bias);
  EXPECT_EQ(q3.head_dim, 128);  // q is 9 × 128 wide, not the hidden size 576
  const ModelConfig q3_back = ModelConfig::from_hf_json(q3.to_hf_json(1, 2), "exported");
  EXPECT_TRUE(q3_back.qk_norm);
  EXPECT_EQ(q3_back.head_dim, 128);
  EXPECT_EQ(canonical_tensor_name("model.layers.0.self_attn.k_norm.weight"),
            "blk.0.attn_k_norm.weight");
}

TEST(LlmConfig, MistralSlidingWindowLimitsTheContext) {
  std::string json = kSmolConfig;
  const std::string from = "\"model_type\": \"llama\"";
  json.replace(json.find(from), from.size(), "\"model_type\": \"mistral\", \"sliding_window\": 4096");
  EXPECT_EQ(ModelConfig::from_hf_json(json, "mistral").max_context, 4096);
  json.replace(json.find("4096"), 4, "null");
  EXPECT_EQ(ModelConfig::from_hf_json(json, "mistral v0.2").max_context, 8192);
  // Phi-3-mini-4k's window of 2047 likewise; a partial rotary embedding is refused.
  std::string phi3 = kSmolConfig;
  phi3.replace(phi3.find(from), from.size(), "\"model_type\": \"phi3\", \"sliding_window\": 2047");
  const ModelConfig p = ModelConfig::from_hf_json(phi3, "phi3");
  EXPECT_EQ(p.arch, "phi3");
  EXPECT_EQ(p.max_context, 2047);
  EXPECT_EQ(ModelConfig::from_hf_json(p.to_hf_json(1, 2), "exported").arch, "phi3");
  phi3.replace(phi3.find("2047"), 4, "2047, \"partial_rotary_factor\": 0.5");
  EXPECT_THROW(ModelConfig::from_hf_json(phi3, "phi3"), Error);
}

TEST(LlmModelFiles, TensorNamesAndTheGgufQkPermutation) {
  EXPECT_EQ(canonical_tensor_name("model.layers.12.self_attn.k_proj.weight"),
            "blk.12.attn_k.weight");
  EXPECT_EQ(canonical_tensor_name("model.layers.0.mlp.down_proj.weight"), "blk.0.ffn_down.weight");
  EXPECT_EQ(canonical_tensor_name("lm_head.weight"), "output.weight");
  EXPECT_EQ(canonical_tensor_name("model.layers.x.mlp.down_proj.weight"), "");
  EXPECT_EQ(canonical_tensor_name("model.layers.0.self_attn.rotary_emb.inv_freq"), "");
  // One head of 4 rows (k = 1): GGUF rows (r0, r1, r2, r3) hold HF rows (0, 2, 1, 3).
  std::vector<float> w = {10, 12, 11, 13, 20, 22, 21, 23};  // two heads
  unpermute_gguf_qk(w, 2, 4, 1);
  EXPECT_EQ(w, (std::vector<float>{10, 11, 12, 13, 20, 21, 22, 23}));
  EXPECT_THROW(unpermute_gguf_qk(w, 3, 4, 1), Error);
  EXPECT_THROW(open_model("/nonexistent/model.gguf"), Error);
}

// A tiny model: GQA (4 query heads over 2 kv heads), K = 32 so g128 formats pad.
ModelConfig tiny_config() {
  ModelConfig c;
  c.name = "tiny";
  c.vocab_size = 97, c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 8;
  c.ffn_dim = 48, c.max_context = 64, c.rope_theta = 10000.0, c.norm_eps = 1e-5,
  c.tied_embeddings = true;
  return c;
}

std::unique_ptr<Backend> tiny_backend(const std::string& mode, int threads = 1,
                                      const ModelConfig& c = tiny_config()) {
  ModelFiles m = random_model(c, 7);
  BackendOptions o;
  o.strategy = {mode, mode};
  o.head_mode = mode == "f32" ? "f32" : "bf16";
  o.threads = threads;
  return make_backend("cpu", m, o);
}

// The forward pass in float64 from the formulas (HF layout: RoPE on pairs (i, i + hd/2)).
std::vector<double> reference_logits(const std::vector<int32_t>& tokens,
                                     const ModelConfig& c = tiny_config()) {
  ModelFiles m = random_model(c, 7);
  auto load = [&](const std::string& n, std::initializer_list<int64_t> s) {
    auto f = m.weights->load(n, s);
    return std::vector<double>(f.begin(), f.end());
  };
  const int64_t d = c.dim, hd = c.head_dim, H = c.n_heads, KV = c.n_kv_heads, F = c.ffn_dim;
  auto matvec = [](const std::vector<double>& w, const std::vector<double>& x, int64_t n) {
    std::vector<double> y(static_cast<size_t>(n), 0.0);
    const size_t k = x.size();
    for (size_t r = 0; r < static_cast<size_t>(n); ++r)
      for (size_t i = 0; i < k; ++i) y[r] += w[r * k + i] * x[i];
    return y;
  };
  auto norm = [&](const std::vector<double>& x, const std::vector<double>& g) {
    double ss = 0;
    for (double v : x) ss += v * v;
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      y[i] = x[i] / std::sqrt(ss / static_cast<double>(x.size()) + c.norm_eps) * g[i];
    return y;
  };
  auto rope = [&](std::vector<double>& v, int64_t heads, int64_t pos) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double a =
            static_cast<double>(pos) *
            std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
        double& x0 = v[static_cast<size_t>(h * hd + i)];
        double& x1 = v[static_cast<size_t>(h * hd + i + hd / 2)];
        const double y0 = x0 * std::cos(a) - x1 * std::sin(a),
                     y1 = x1 * std::cos(a) + x0 * std::sin(a);
        x0 = y0, x1 = y1;
      }
  };
  const auto emb = load("token_embd.weight", {c.vocab_size, d});
  std::vector<std::vector<std::vector<double>>> kc(static_cast<size_t>(c.n_layers)), vc(kc.size());
  std::vector<double> x;
  for (size_t t = 0; t < tokens.size(); ++t) {
    x.assign(emb.begin() + tokens[t] * d, emb.begin() + (tokens[t] + 1) * d);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      auto h = norm(x, load(p + "attn_norm.weight", {d}));
      auto q = matvec(load(p + "attn_q.weight", {H * hd, d}), h, H * hd);
      auto k = matvec(load(p + "attn_k.weight", {KV * hd, d}), h, KV * hd);
      auto v = matvec(load(p + "attn_v.weight", {KV * hd, d}), h, KV * hd);
      rope(q, H, static_cast<int64_t>(t));
      rope(k, KV, static_cast<int64_t>(t));
      kc[static_cast<size_t>(l)].push_back(k);
      vc[static_cast<size_t>(l)].push_back(v);
      std::vector<double> att(static_cast<size_t>(H * hd), 0.0);
      for (int64_t hh = 0; hh < H; ++hh) {
        const int64_t g = hh / (H / KV);
        std::vector<double> s;
        double mx = -1e300, sum = 0;
        for (const auto& kk : kc[static_cast<size_t>(l)]) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i)
            dot += q[static_cast<size_t>(hh * hd + i)] * kk[static_cast<size_t>(g * hd + i)];
          s.push_back(dot / std::sqrt(static_cast<double>(hd)));
          mx = std::max(mx, s.back());
        }
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j < s.size(); ++j)
          for (int64_t i = 0; i < hd; ++i)
            att[static_cast<size_t>(hh * hd + i)] +=
                s[j] / sum * vc[static_cast<size_t>(l)][j][static_cast<size_t>(g * hd + i)];
      }
      auto o = matvec(load(p + "attn_output.weight", {d, H * hd}), att, d);
      for (int64_t i = 0; i < d; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
      h = norm(x, load(p + "ffn_norm.weight", {d}));
      auto gt = matvec(load(p + "ffn_gate.weight", {F, d}), h, F);
      auto up = matvec(load(p + "ffn_up.weight", {F, d}), h, F);
      for (int64_t i = 0; i < F; ++i)
        gt[static_cast<size_t>(i)] = gt[static_cast<size_t>(i)] /
                                     (1 + std::exp(-gt[static_cast<size_t>(i)])) *
                                     up[static_cast<size_t>(i)];
      o = matvec(load(p + "ffn_down.weight", {d, F}), gt, d);
      for (int64_t i = 0; i < d; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
    }
  }
  return matvec(emb, norm(x, load("output_norm.weight", {d})), c.vocab_size);
}

const std::vector<int32_t> kPrompt = {3, 50, 7, 96, 0, 12, 12, 41, 5};

TEST(LlmCpuBackend, F32MatchesTheFloat64Formulas) {
  ModelConfig wide = tiny_config();
  wide.head_dim = 16;  // 4 heads × 16 = 64 against dim 32, as Qwen3-0.6B and Mistral-NeMo
  for (const ModelConfig& c : {tiny_config(), wide}) {
    SCOPED_TRACE("head_dim " + std::to_string(c.head_dim));
    auto be = tiny_backend("f32", 1, c);
    std::vector<float> logits;
    be->forward(kPrompt, 0, false, logits);
    const auto want = reference_logits(kPrompt, c);
    ASSERT_EQ(logits.size(), want.size());
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      max_err = std::max(max_err, std::abs(logits[i] - want[i]));
      max_ref = std::max(max_ref, std::abs(want[i]));
    }
    EXPECT_LT(max_err, 1e-5 * std::max(1.0, max_ref)) << "max |logit| " << max_ref;
  }
}

TEST(LlmCpuBackend, PrefillEqualsTokenByTokenDecodeInEveryMode) {
  for (const char* mode : {"f32", "bf16", "w4a8_pc", "w4a8_g128", "w8a8", "w4a16_g128"}) {
    auto be = tiny_backend(mode, 2);
    std::vector<float> all, step;
    be->forward(kPrompt, 0, true, all);
    const auto v = static_cast<size_t>(be->config().vocab_size);
    for (size_t t = 0; t < kPrompt.size(); ++t) {
      be->forward(std::span<const int32_t>(&kPrompt[t], 1), static_cast<int64_t>(t), false, step);
      for (size_t i = 0; i < v; ++i)
        ASSERT_EQ(step[i], all[t * v + i]) << mode << " token " << t << " logit " << i;
    }
  }
}

TEST(LlmCpuBackend, QuantizedModesStayCloseToF32) {
  std::vector<float> ref;
  tiny_backend("f32")->forward(kPrompt, 0, false, ref);
  double ref_norm = 0;
  for (float r : ref) ref_norm += static_cast<double>(r) * r;
  // Relative L2 error of the logits: bf16 rounding, then 8-bit, then 4-bit quantization noise
  // on random (uniform) weights. Measured 0.003 (bf16), 0.01 (w8a8), 0.07-0.09 (4-bit).
  const std::pair<const char*, double> modes[] = {
      {"bf16", 0.02}, {"w8a8", 0.05}, {"w4a8_pc", 0.25}, {"w4a8_g128", 0.25}, {"w4a16_g128", 0.25}};
  for (const auto& [mode, tol] : modes) {
    std::vector<float> got;
    tiny_backend(mode)->forward(kPrompt, 0, false, got);
    double err = 0;
    for (size_t i = 0; i < ref.size(); ++i)
      err += (got[i] - ref[i]) * static_cast<double>(got[i] - ref[i]);
    EXPECT_LT(std::sqrt(err / ref_norm), tol) << mode;
  }
}

// The pool runs only linears of kParallelLinearMacs multiply-adds and attention of
// kParallelAttentionWork (llm/linear.h), which the tiny model's never reach: a wider model and a
// longer prompt, above both, so that two threads really split the work.
TEST(LlmCpuBackend, ThreadCountDoesNotChangeResults) {
  ModelConfig c = tiny_config();
  c.dim = 256, c.n_heads = 8, c.n_kv_heads = 4, c.head_dim = 32, c.ffn_dim = 512;
  c.max_context = 128;
  nibble::test::Rng rng;
  std::vector<int32_t> prompt(80);
  for (auto& t : prompt) t = static_cast<int32_t>(rng.uniform_int(0, c.vocab_size - 1));
  const auto tokens = static_cast<int64_t>(prompt.size());
  ASSERT_GE(tokens * c.ffn_dim * c.dim, kParallelLinearMacs);
  ASSERT_GE(tokens * c.n_heads * tokens * c.head_dim, kParallelAttentionWork);
  for (const char* mode : {"bf16", "w4a8_g128", "w4a16_g128"}) {
    std::vector<float> one, two;
    tiny_backend(mode, 1, c)->forward(prompt, 0, true, one);
    tiny_backend(mode, 2, c)->forward(prompt, 0, true, two);
    ASSERT_EQ(one.size(), prompt.size() * static_cast<size_t>(c.vocab_size)) << mode;
    EXPECT_EQ(one, two) << mode;
  }
}

TEST(LlmCpuBackend, BadRequestsAreRejected) {
  auto be = tiny_backend("f32");
  std::vector<float> logits;
  const int32_t bad_id[1] = {97};
  EXPECT_THROW(be->forward(bad_id, 0, false, logits), Error);
  EXPECT_THROW(be->forward(kPrompt, 60, false, logits), Error);  // past the context
  EXPECT_THROW(be->forward({}, 0, false, logits), Error);
  ModelFiles m = random_model(tiny_config(), 1);
  BackendOptions o;
  // Heads wider than the CUDA attention kernels' 128: rejected with or without a GPU (a CPU-only
  // build rejects "cuda" itself). The tiny model's head_dim 8 runs on the GPU, zero-padded.
  ModelConfig wide_heads = tiny_config();
  wide_heads.head_dim = 160;
  ModelFiles wide_model = random_model(wide_heads, 1);
  EXPECT_THROW(make_backend("cuda", wide_model, o), Error);
  EXPECT_THROW(make_backend("tpu", m, o), Error);
  o.strategy = {"w4a8_g100", "w4a8_g100"};
  EXPECT_THROW(make_backend("cpu", m, o), Error);
  o.strategy = {"w8a8_static", "w8a8_static"};
  EXPECT_THROW(make_backend("cpu", m, o), Error);
  o.strategy = {"bf16", "bf16"};
  o.max_context = 65;  // beyond the model's 64
  EXPECT_THROW(make_backend("cpu", m, o), Error);
}

TEST(LlmCpuBackend, PrefillAndDecodeStrategyUsesTheDecodeWeightsForOneToken) {
  ModelFiles m = random_model(tiny_config(), 7);
  BackendOptions o;
  o.strategy = {"bf16", "w4a16_g128"};
  auto mixed = make_backend("cpu", m, o);
  std::vector<float> a, b, c;
  mixed->forward(kPrompt, 0, false, a);
  tiny_backend("bf16")->forward(kPrompt, 0, false, b);
  EXPECT_EQ(a, b);  // the prompt ran on the prefill weights
  const int32_t one[1] = {4};
  mixed->forward(one, static_cast<int64_t>(kPrompt.size()), false, a);
  auto w4 = tiny_backend("w4a16_g128");
  w4->forward(kPrompt, 0, false, c);
  w4->forward(one, static_cast<int64_t>(kPrompt.size()), false, c);
  EXPECT_NE(a, c);  // different caches (bf16 prompt) ...
  const auto mem = mixed->memory();
  EXPECT_LT(mem.decode_weight_bytes, mem.resident_weight_bytes);  // ... and both weight sets held
}

TEST(LlmSampler, GreedyTopKTopPAndSeeds) {
  const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 2.0f};
  EXPECT_EQ(argmax(logits), 1);  // the lowest id among ties
  EXPECT_EQ(Sampler({}).sample(logits), 1);
  EXPECT_EQ(Sampler({1.0, 1, 1.0, 5}).sample(logits), 1);   // top-k 1 is greedy
  EXPECT_EQ(Sampler({1.0, 0, 1e-9, 5}).sample(logits), 1);  // a tiny top-p is greedy
  std::vector<int32_t> a, b;
  Sampler sa({0.8, 3, 0.95, 42}), sb({0.8, 3, 0.95, 42});
  std::vector<int> counts(5, 0);
  for (int i = 0; i < 2000; ++i) {
    a.push_back(sa.sample(logits));
    b.push_back(sb.sample(logits));
    ++counts[static_cast<size_t>(a.back())];
  }
  EXPECT_EQ(a, b);                      // the seed reproduces the draw
  EXPECT_EQ(counts[0] + counts[3], 0);  // outside the top 3
  EXPECT_GT(counts[2], 200);            // 1.9 is nearly as likely as 2.0
  EXPECT_THROW(Sampler({-1.0, 0, 1.0, 0}), Error);
  EXPECT_THROW(Sampler({1.0, 0, 0.0, 0}), Error);
}

TEST(LlmRunner, GenerateIsGreedyStopsAndChecksTheContext) {
  auto be = tiny_backend("f32");
  const GenerateResult r = generate(*be, kPrompt, 8, {});
  ASSERT_EQ(r.tokens.size(), 8u);
  // Each greedy token is the argmax of the logits of the sequence so far.
  std::vector<int32_t> seq = kPrompt;
  std::vector<float> logits;
  for (int32_t t : r.tokens) {
    be->forward(seq, 0, false, logits);
    EXPECT_EQ(argmax(logits), t);
    seq.push_back(t);
  }
  const GenerateResult s =
      generate(*be, kPrompt, 8, {}, [&](int32_t id) { return id == r.tokens[2]; });
  EXPECT_TRUE(s.stopped);
  EXPECT_LE(s.tokens.size(), 3u);
  EXPECT_THROW(generate(*be, kPrompt, 60, {}), Error);
  EXPECT_THROW(generate(*be, {}, 4, {}), Error);
}

TEST(LlmRunner, PerplexityIsTheMeanNegativeLogLikelihood) {
  auto be = tiny_backend("f32");
  std::vector<int32_t> text;
  for (int i = 0; i < 40; ++i) text.push_back((i * 37 + 11) % 97);
  const PerplexityResult r = perplexity(*be, text, 16, -1);
  // Windows of 16: tokens [0,16), [16,32), [32,40): 15 + 15 + 7 scored.
  EXPECT_EQ(r.windows, 3);
  EXPECT_EQ(r.scored, 37);
  double nll = 0;
  std::vector<float> logits;
  for (size_t start = 0; start < text.size(); start += 16) {
    const size_t len = std::min<size_t>(16, text.size() - start);
    std::vector<int32_t> w(text.begin() + static_cast<std::ptrdiff_t>(start),
                           text.begin() + static_cast<std::ptrdiff_t>(start + len));
    be->forward(w, 0, true, logits);
    for (size_t i = 0; i + 1 < len; ++i) {
      double z = 0;
      for (size_t v = 0; v < 97; ++v) z += std::exp(static_cast<double>(logits[i * 97 + v]));
      nll -= std::log(
          std::exp(static_cast<double>(logits[i * 97 + static_cast<size_t>(w[i + 1])])) / z);
    }
  }
  EXPECT_NEAR(r.nll_sum, nll, 1e-6 * nll);
  EXPECT_NEAR(r.perplexity(), std::exp(nll / 37), 1e-6 * r.perplexity());
  // With BOS each window holds 15 text tokens.
  EXPECT_EQ(perplexity(*be, text, 16, 1).scored, 14 + 14 + 9);
  EXPECT_THROW(perplexity(*be, text, 1, -1), Error);
  EXPECT_THROW(perplexity(*be, text, 65, -1), Error);
}

TEST(LlmCheckpoint, PreQuantizedCheckpointRunsLikeQuantizingAtLoad) {
  const std::string dir = test::unique_temp_path("nibble_ckpt_test");
  for (const char* fmt : {"w4a8_g128", "w8a8", "w4a16_g128_asym", "w4a8_g128_2level"}) {
    ModelFiles m = random_model(tiny_config(), 7);
    m.tokenizer = Tokenizer::from_hf_json(
        R"({"pre_tokenizer": {"type": "ByteLevel"}, "added_tokens": [{"id": 2, "content": "<s>"}],
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "<s>": 2}, "merges": []}})",
        "tiny");
    write_nibble_checkpoint(m, fmt, "bf16", dir);
    ModelFiles q = open_model(dir);
    EXPECT_EQ(q.weights->quantized_format("blk.1.ffn_down.weight"), fmt);
    EXPECT_EQ(q.weights->quantized_format("token_embd.weight"), "");
    EXPECT_EQ(q.config.n_params(), tiny_config().n_params());
    ASSERT_TRUE(q.tokenizer.has_value());
    EXPECT_EQ(q.tokenizer->encode("ab<s>"), (std::vector<int32_t>{0, 1, 2}));
    BackendOptions o;
    o.strategy = {fmt, fmt};
    auto from_ckpt = make_backend("cpu", q, o);
    std::vector<float> a, b;
    from_ckpt->forward(kPrompt, 0, true, a);
    tiny_backend(fmt)->forward(kPrompt, 0, true, b);
    EXPECT_EQ(a, b) << fmt;  // the same weights, bit for bit
    // Another format than the stored one is refused with the reason.
    ModelFiles q2 = open_model(dir);
    o.strategy = {"bf16", "bf16"};
    try {
      make_backend("cpu", q2, o);
      ADD_FAILURE() << "ran a " << fmt << " checkpoint as bf16";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pre-quantized"), std::string::npos) << e.what();
    }
  }
  ModelFiles m = random_model(tiny_config(), 7);
  EXPECT_THROW(write_nibble_checkpoint(m, "w4a8_g128", "bf16", dir), Error);  // no tokenizer
  std::filesystem::remove_all(dir);
}

TEST(LlmCheckpoint, TokenizerJsonRoundTrip) {
  const std::string json =
      R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true},
          {"type": "ByteLevel"}]}, "added_tokens": [{"id": 3, "content": "<|x|>", "special": true}],
          "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<|x|>": 3}, "merges": ["a b"]}})";
  const Tokenizer t = Tokenizer::from_hf_json(json, "t");
  const Tokenizer u = Tokenizer::from_hf_json(t.to_hf_json(), "round trip");
  EXPECT_EQ(u.encode("abab<|x|>a"), t.encode("abab<|x|>a"));
  EXPECT_EQ(u.encode("abab<|x|>a"), (std::vector<int32_t>{2, 2, 3, 0}));
  EXPECT_EQ(u.pre_split(), Tokenizer::PreSplit::gpt2_digits);
  const ModelConfig c = ModelConfig::from_hf_json(tiny_config().to_hf_json(1, 2), "config");
  EXPECT_EQ(c.describe(), tiny_config().describe());
}

// ---- the real model ----------------------------------------------------------------------------

TEST(LlmRealModel, SmolLM2GreedyGenerationIsSensible) {
  if (test::real_model_path().empty())
    GTEST_SKIP() << "NIBBLE_LLM_MODEL is not set (ctest -R llm_ sets it)";
  ModelFiles m = open_model(test::real_model_path());
  BackendOptions o;
  o.max_context = 256;
  auto be = make_backend("cpu", m, o);
  const auto prompt = m.tokenizer->encode("The capital of France is");
  const GenerateResult r = generate(*be, prompt, 8, {});
  const std::string text = m.tokenizer->decode(r.tokens);
  EXPECT_EQ(text.rfind(" Paris", 0), 0u) << text;
}

}  // namespace
}  // namespace nibble::llm
