#include "llm/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/check.h"
#include "llm/gguf.h"
#include "llm/json.h"

namespace nibble::llm {

namespace {

[[noreturn]] void fail_cfg(const std::string& what, const std::string& msg,
                           ErrorCode code = ErrorCode::invalid_argument) {
  detail::fail(code, "nibble::llm::ModelConfig: " + what + ": " + msg);
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& g) {
  const std::string arch = g.get_string("general.architecture");
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "phi3")
    fail_cfg("GGUF",
             "general.architecture is '" + arch + "'; llama, qwen2, qwen3 and phi3 are supported",
             ErrorCode::unsupported);
  const auto& md = g.metadata();
  const std::string k = arch + ".";  // the keys are prefixed by the architecture
  auto u = [&](const std::string& key) { return static_cast<int64_t>(g.get_uint(k + key)); };
  ModelConfig c;
  c.arch = arch;
  c.qkv_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3";
  if (md.count("general.name")) c.name = g.get_string("general.name");
  c.dim = u("embedding_length");
  c.n_layers = u("block_count");
  c.n_heads = u("attention.head_count");
  c.n_kv_heads =
      md.count(k + "attention.head_count_kv") ? u("attention.head_count_kv") : c.n_heads;
  c.ffn_dim = u("feed_forward_length");
  c.max_context = u("context_length");
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  if (md.count(k + "attention.key_length")) c.head_dim = u("attention.key_length");
  if (md.count(k + "rope.dimension_count") && u("rope.dimension_count") != c.head_dim)
    fail_cfg("GGUF",
             "partial rotary embeddings (rope.dimension_count != head size) are not supported",
             ErrorCode::unsupported);
  if (md.count(k + "rope.freq_base")) c.rope_theta = g.get_float(k + "rope.freq_base");
  c.norm_eps = g.get_float(k + "attention.layer_norm_rms_epsilon");
  if (md.count(k + "rope.scaling.type")) {
    const std::string s = g.get_string(k + "rope.scaling.type");
    if (s == "linear") {
      RopeScaling r;
      r.type = "linear";
      r.factor = g.get_float(k + "rope.scaling.factor");
      c.set_rope_scaling(r, "GGUF");
    } else if (s != "none") {
      fail_cfg("GGUF", "RoPE scaling '" + s + "' is not supported (none, linear; Llama 3.1's "
                       "scaling as a rope_freqs.weight tensor)",
               ErrorCode::unsupported);
    }
  }
  if (md.count(k + "attention.sliding_window"))  // Phi-3: as config.json's sliding_window
    c.max_context = std::min(c.max_context, u("attention.sliding_window"));
  // Llama 3.1 / 3.2 files: per-pair frequency divisors as a tensor (llama.cpp's converter).
  for (const auto& t : g.tensors()) {
    if (t.name == "rope_factors_long.weight" || t.name == "rope_factors_short.weight")
      fail_cfg("GGUF", "LongRoPE (rope_factors_long/short, the 128k Phi-3 models) is not supported",
               ErrorCode::unsupported);
    if (t.name != "rope_freqs.weight") continue;
    if (t.dims.size() != 1 || static_cast<int64_t>(t.dims[0]) != c.head_dim / 2)
      fail_cfg("GGUF", "rope_freqs.weight must hold head_dim / 2 = " +
                           std::to_string(c.head_dim / 2) + " values");
    std::vector<float> f = g.dequantize(t);
    if (!c.rope_freq_factors.empty())  // linear scaling as well: both divide
      for (size_t i = 0; i < f.size(); ++i) f[i] *= c.rope_freq_factors[i];
    c.rope_freq_factors = std::move(f);
  }
  // The vocabulary size: the metadata key when present, else the embedding's rows.
  const GgufTensorInfo& emb = g.tensor("token_embd.weight");
  if (emb.dims.size() != 2) fail_cfg("GGUF", "token_embd.weight is not a matrix");
  c.vocab_size = static_cast<int64_t>(emb.dims[1]);
  if (md.count(k + "vocab_size") && u("vocab_size") != c.vocab_size)
    fail_cfg("GGUF", k + "vocab_size disagrees with token_embd.weight");
  bool has_output = false;
  for (const auto& t : g.tensors()) has_output = has_output || t.name == "output.weight";
  c.tied_embeddings = !has_output;
  c.validate("GGUF");
  return c;
}

ModelConfig ModelConfig::from_hf_json(std::string_view json_text, const std::string& what) {
  const Json j = Json::parse(json_text, what);
  if (!j.is_object()) fail_cfg(what, "not a JSON object");
  auto get = [&](const char* key) -> const Json* { return j.find(key); };
  auto req_int = [&](const char* key) -> int64_t {
    const Json* v = get(key);
    if (v == nullptr) fail_cfg(what, std::string("the key '") + key + "' is missing");
    if (!v->is_int()) fail_cfg(what, std::string("'") + key + "' is not an integer");
    return v->integer();
  };
  auto opt_num = [&](const char* key, double fallback) -> double {
    const Json* v = get(key);
    if (v == nullptr || v->is_null()) return fallback;
    if (!v->is_number()) fail_cfg(what, std::string("'") + key + "' is not a number");
    return v->number();
  };
  std::string arch = "llama";
  if (const Json* mt = get("model_type"); mt != nullptr) {
    if (!mt->is_string()) fail_cfg(what, "'model_type' is not a string");
    const std::string& t = mt->string();
    if (t != "llama" && t != "mistral" && t != "qwen2" && t != "qwen3" && t != "phi3")
      fail_cfg(what,
               "model_type '" + t +
                   "' is not a Llama-family decoder (llama, mistral, qwen2, qwen3, phi3)",
               ErrorCode::unsupported);
    if (t == "qwen2" || t == "qwen3" || t == "phi3") arch = t;
  }
  if (const Json* b = get("mlp_bias"); b != nullptr && b->is_bool() && b->boolean())
    fail_cfg(what, "mlp_bias = true is not supported (biases on the attention projections only)",
             ErrorCode::unsupported);
  const Json* attention_bias = get("attention_bias");
  // Llama's and Qwen3's attention_bias puts biases on q, k, v and o; Qwen2 always has q, k, v's.
  const bool four_biases = arch != "qwen2" && attention_bias != nullptr &&
                           attention_bias->is_bool() && attention_bias->boolean();
  // Qwen2's sliding window changes attention beyond `sliding_window` tokens; refuse it rather
  // than attend differently.
  if (const Json* sw = get("use_sliding_window"); sw != nullptr && sw->is_bool() && sw->boolean())
    fail_cfg(what, "use_sliding_window = true is not supported", ErrorCode::unsupported);
  if (const Json* pr = get("partial_rotary_factor");
      pr != nullptr && (!pr->is_number() || pr->number() != 1.0))
    fail_cfg(what, "partial rotary embeddings (partial_rotary_factor != 1) are not supported",
             ErrorCode::unsupported);
  if (const Json* act = get("hidden_act");
      act != nullptr && (!act->is_string() || act->string() != "silu"))
    fail_cfg(what, "hidden_act must be \"silu\"", ErrorCode::unsupported);
  ModelConfig c;
  c.arch = arch;
  c.qkv_bias = arch == "qwen2" || four_biases;
  c.o_bias = four_biases;
  c.qk_norm = arch == "qwen3";
  if (const Json* n = get("_name_or_path"); n != nullptr && n->is_string()) c.name = n->string();
  c.vocab_size = req_int("vocab_size");
  c.dim = req_int("hidden_size");
  c.n_layers = req_int("num_hidden_layers");
  c.n_heads = req_int("num_attention_heads");
  c.n_kv_heads = get("num_key_value_heads") != nullptr ? req_int("num_key_value_heads") : c.n_heads;
  c.ffn_dim = req_int("intermediate_size");
  c.max_context =
      get("max_position_embeddings") != nullptr ? req_int("max_position_embeddings") : 2048;
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  if (const Json* hd = get("head_dim"); hd != nullptr && !hd->is_null())
    c.head_dim = req_int("head_dim");
  c.rope_theta = opt_num("rope_theta", 10000.0);
  c.norm_eps = opt_num("rms_norm_eps", 1e-6);
  if (const Json* rs = get("rope_scaling"); rs != nullptr && !rs->is_null()) {
    if (!rs->is_object()) fail_cfg(what, "'rope_scaling' is not an object");
    const Json* type = rs->find("rope_type");
    if (type == nullptr) type = rs->find("type");  // the older spelling
    if (type == nullptr || !type->is_string())
      fail_cfg(what, "rope_scaling has no \"rope_type\" string");
    auto num = [&](const char* key) {
      const Json* v = rs->find(key);
      if (v == nullptr || !v->is_number())
        fail_cfg(what, std::string("rope_scaling.") + key + " is missing or not a number");
      return v->number();
    };
    if (type->string() != "default") {
      RopeScaling r;
      r.type = type->string();
      if (r.type == "linear" || r.type == "llama3") r.factor = num("factor");
      if (r.type == "llama3") {
        r.low_freq_factor = num("low_freq_factor");
        r.high_freq_factor = num("high_freq_factor");
        r.original_context = static_cast<int64_t>(num("original_max_position_embeddings"));
      }
      c.set_rope_scaling(r, what);
    }
  }
  // nibble's own key: a GGUF file's per-pair divisors, kept when its checkpoint is written.
  if (const Json* f = get("nibble_rope_freq_factors"); f != nullptr && !f->is_null()) {
    if (!c.rope_freq_factors.empty())
      fail_cfg(what, "both rope_scaling and nibble_rope_freq_factors are given");
    if (!f->is_array()) fail_cfg(what, "'nibble_rope_freq_factors' is not an array");
    for (const Json& v : f->items()) {
      if (!v.is_number()) fail_cfg(what, "'nibble_rope_freq_factors' holds a non-number");
      c.rope_freq_factors.push_back(static_cast<float>(v.number()));
    }
  }
  if (const Json* t = get("tie_word_embeddings"); t != nullptr) {
    if (!t->is_bool()) fail_cfg(what, "'tie_word_embeddings' is not a boolean");
    c.tied_embeddings = t->boolean();
  }
  // A sliding attention window (Mistral 7B v0.1: 4096) changes attention only past the window:
  // the runner attends to the whole context, so the usable context is cut to the window. (Qwen2
  // configs carry a window with use_sliding_window = false: not applied, as in the reference.)
  if (const Json* sw = get("sliding_window"); sw != nullptr && sw->is_int() && sw->integer() > 0 &&
                                               (arch == "llama" || arch == "phi3"))
    c.max_context = std::min(c.max_context, sw->integer());
  c.validate(what);
  return c;
}

ModelConfig ModelConfig::preset(const std::string& arch) {
  ModelConfig c;
  auto set = [&c](const char* name, int64_t vocab, int64_t dim, int64_t layers, int64_t heads,
                  int64_t kv_heads, int64_t ffn, double theta, bool tied) {
    c.name = name;
    c.vocab_size = vocab;
    c.dim = dim;
    c.n_layers = layers;
    c.n_heads = heads;
    c.n_kv_heads = kv_heads;
    c.head_dim = dim / heads;
    c.ffn_dim = ffn;
    c.max_context = 8192;
    c.rope_theta = theta;
    c.norm_eps = 1e-5;
    c.tied_embeddings = tied;
  };
  if (arch == "llama3-8b") {  // Meta-Llama-3-8B config.json
    set("Llama-3-8B architecture (random weights)", 128256, 4096, 32, 32, 8, 14336, 500000.0,
        false);
  } else if (arch == "smollm2-135m") {  // SmolLM2-135M config.json
    set("SmolLM2-135M architecture (random weights)", 49152, 576, 30, 9, 3, 1536, 100000.0, true);
  } else if (arch == "qwen2.5-7b") {  // Qwen2.5-7B config.json: q/k/v biases
    set("Qwen2.5-7B architecture (random weights)", 152064, 3584, 28, 28, 4, 18944, 1e6, false);
    c.arch = "qwen2";
    c.qkv_bias = true;
    c.norm_eps = 1e-6;
  } else if (arch == "qwen3-8b") {  // Qwen3-8B config.json: per-head q/k RMSNorm
    set("Qwen3-8B architecture (random weights)", 151936, 4096, 36, 32, 8, 12288, 1e6, false);
    c.arch = "qwen3";
    c.qk_norm = true;
    c.norm_eps = 1e-6;
  } else {
    fail_cfg("preset", "unknown architecture '" + arch +
                           "' (llama3-8b, smollm2-135m, qwen2.5-7b, qwen3-8b)");
  }
  c.validate(arch);
  return c;
}

void ModelConfig::validate(const std::string& what) const {
  auto in = [&](const char* field, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      fail_cfg(what, std::string(field) + " = " + std::to_string(v) + " is outside [" +
                         std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  in("vocab_size", vocab_size, 1, int64_t{1} << 22);
  in("dim", dim, 2, 1 << 16);
  in("n_layers", n_layers, 1, 1024);
  in("n_heads", n_heads, 1, 1024);
  in("n_kv_heads", n_kv_heads, 1, n_heads);
  in("head_dim", head_dim, 2, 1024);
  in("ffn_dim", ffn_dim, 1, 1 << 20);
  in("max_context", max_context, 1, 1 << 24);
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "phi3")
    fail_cfg(what, "arch '" + arch + "' is not llama, qwen2, qwen3 or phi3");
  if (qk_norm != (arch == "qwen3"))
    fail_cfg(what, "the per-head q/k RMSNorm belongs to qwen3 decoders (and they have it)");
  if (arch == "qwen2" && (!qkv_bias || o_bias))
    fail_cfg(what, "a qwen2 decoder has biases on q, k, v and none on the output projection");
  if (n_heads % n_kv_heads != 0)
    fail_cfg(what, "n_heads (" + std::to_string(n_heads) + ") is not a multiple of n_kv_heads (" +
                       std::to_string(n_kv_heads) + ")");
  if (head_dim % 2 != 0) fail_cfg(what, "head_dim must be even for RoPE");
  if (!(rope_theta > 1.0) || !std::isfinite(rope_theta)) fail_cfg(what, "rope_theta must be > 1");
  if (!(norm_eps > 0.0) || norm_eps > 1.0) fail_cfg(what, "norm_eps must be in (0, 1]");
  if (!rope_freq_factors.empty()) {
    if (static_cast<int64_t>(rope_freq_factors.size()) != head_dim / 2)
      fail_cfg(what, "the RoPE frequency divisors number " +
                         std::to_string(rope_freq_factors.size()) + ", head_dim / 2 is " +
                         std::to_string(head_dim / 2));
    for (float f : rope_freq_factors)
      if (!(f > 0.0f) || !std::isfinite(f))
        fail_cfg(what, "a RoPE frequency divisor is not a positive finite number");
  }
}

std::vector<double> ModelConfig::rope_inv_freq() const {
  const int64_t half = head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv[static_cast<size_t>(i)] =
        std::pow(rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    if (!rope_freq_factors.empty())
      inv[static_cast<size_t>(i)] /= static_cast<double>(rope_freq_factors[static_cast<size_t>(i)]);
  }
  return inv;
}

void rope_tables(const ModelConfig& c, int64_t positions, std::vector<float>& cos_out,
                 std::vector<float>& sin_out) {
  const std::vector<double> inv = c.rope_inv_freq();
  const size_t half = inv.size();
  cos_out.resize(static_cast<size_t>(positions) * half);
  sin_out.resize(cos_out.size());
  for (int64_t p = 0; p < positions; ++p)
    for (size_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(p) * inv[i];
      cos_out[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(a));
      sin_out[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(a));
    }
}

void ModelConfig::set_rope_scaling(const RopeScaling& s, const std::string& what) {
  if (s.type != "linear" && s.type != "llama3")
    fail_cfg(what, "RoPE scaling '" + s.type + "' is not supported (linear, llama3)",
             ErrorCode::unsupported);
  if (!(s.factor > 0.0) || !std::isfinite(s.factor))
    fail_cfg(what, "the RoPE scaling factor must be a positive number");
  rope_scaling = s;
  rope_freq_factors.clear();
  const std::vector<double> base = rope_inv_freq();  // the unscaled rates
  rope_freq_factors.assign(base.size(), static_cast<float>(s.factor));
  if (s.type == "linear") return;
  if (!(s.low_freq_factor > 0.0) || !(s.high_freq_factor > s.low_freq_factor) ||
      s.original_context <= 0)
    fail_cfg(what, "llama3 RoPE scaling needs 0 < low_freq_factor < high_freq_factor and "
                   "original_max_position_embeddings > 0");
  // Llama 3.1's rule (as Hugging Face's _compute_llama3_parameters and llama.cpp's converter):
  // short wavelengths keep their rate, long ones are divided by `factor`, and the band between
  // interpolates smoothly in 1 / f.
  const double pi = 3.14159265358979323846;
  const double orig = static_cast<double>(s.original_context);
  const double low_wavelen = orig / s.low_freq_factor, high_wavelen = orig / s.high_freq_factor;
  for (size_t i = 0; i < base.size(); ++i) {
    const double wavelen = 2.0 * pi / base[i];
    double f = s.factor;
    if (wavelen < high_wavelen) {
      f = 1.0;
    } else if (wavelen <= low_wavelen) {
      const double smooth =
          (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / s.factor + smooth);
    }
    rope_freq_factors[i] = static_cast<float>(f);
  }
}

int64_t ModelConfig::n_params() const {
  const int64_t attn = dim * n_heads * head_dim * 2 + dim * n_kv_heads * head_dim * 2;
  const int64_t mlp = 3 * dim * ffn_dim;
  const int64_t biases = (qkv_bias ? (n_heads + 2 * n_kv_heads) * head_dim : 0) + (o_bias ? dim : 0);
  const int64_t per_layer = attn + mlp + 2 * dim + biases + (qk_norm ? 2 * head_dim : 0);
  return vocab_size * dim * (tied_embeddings ? 1 : 2) + n_layers * per_layer + dim;
}

std::string ModelConfig::to_hf_json(int32_t bos_id, int32_t eos_id) const {
  char num[64];
  auto g = [&](double v) {
    std::snprintf(num, sizeof num, "%.17g", v);
    return std::string(num);
  };
  auto i = [](int64_t v) { return std::to_string(v); };
  const bool qwen2 = arch == "qwen2";
  const char* cls = qwen2                ? "Qwen2ForCausalLM"
                    : arch == "qwen3"      ? "Qwen3ForCausalLM"
                    : arch == "phi3"       ? "Phi3ForCausalLM"
                                           : "LlamaForCausalLM";
  std::string s = std::string("{\n  \"architectures\": [\"") + cls +
                  "\"],\n  \"model_type\": \"" + arch + "\",\n";
  if (!qwen2 && (qkv_bias || o_bias)) {
    if (!(qkv_bias && o_bias))
      detail::fail(ErrorCode::unsupported, "nibble::llm::ModelConfig: a " + arch +
                                               " config.json has biases on all four attention "
                                               "projections or none");
    s += "  \"attention_bias\": true,\n";
  }
  s += "  \"_name_or_path\": " + json_quote(name) + ",\n";
  s += "  \"vocab_size\": " + i(vocab_size) + ",\n  \"hidden_size\": " + i(dim) + ",\n";
  s += "  \"num_hidden_layers\": " + i(n_layers) + ",\n  \"num_attention_heads\": " + i(n_heads) +
       ",\n";
  s += "  \"num_key_value_heads\": " + i(n_kv_heads) + ",\n  \"head_dim\": " + i(head_dim) + ",\n";
  s += "  \"intermediate_size\": " + i(ffn_dim) +
       ",\n  \"max_position_embeddings\": " + i(max_context) + ",\n";
  s += "  \"rope_theta\": " + g(rope_theta) + ",\n  \"rms_norm_eps\": " + g(norm_eps) + ",\n";
  s += std::string("  \"tie_word_embeddings\": ") + (tied_embeddings ? "true" : "false") + ",\n";
  if (bos_id >= 0) s += "  \"bos_token_id\": " + i(bos_id) + ",\n";
  if (eos_id >= 0) s += "  \"eos_token_id\": " + i(eos_id) + ",\n";
  s += "  \"hidden_act\": \"silu\",\n  \"rope_scaling\": ";
  if (rope_scaling.type == "linear") {
    s += "{\"rope_type\": \"linear\", \"factor\": " + g(rope_scaling.factor) + "}";
  } else if (rope_scaling.type == "llama3") {
    s += "{\"rope_type\": \"llama3\", \"factor\": " + g(rope_scaling.factor) +
         ", \"low_freq_factor\": " + g(rope_scaling.low_freq_factor) +
         ", \"high_freq_factor\": " + g(rope_scaling.high_freq_factor) +
         ", \"original_max_position_embeddings\": " + i(rope_scaling.original_context) + "}";
  } else {
    s += "null";
    if (!rope_freq_factors.empty()) {  // a GGUF file's divisors: nibble's own key keeps them
      s += ",\n  \"nibble_rope_freq_factors\": [";
      for (size_t k = 0; k < rope_freq_factors.size(); ++k)
        s += (k ? ", " : "") + g(static_cast<double>(rope_freq_factors[k]));
      s += "]";
    }
  }
  s += "\n}\n";
  return s;
}

std::string ModelConfig::describe() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%s: %lld layers, dim %lld, %lld heads (%lld kv, head_dim %lld), ffn %lld, "
                "vocab %lld, context %lld, rope_theta %g, rms_eps %g, %s embeddings, %.1fM params",
                name.empty() ? arch.c_str() : name.c_str(), static_cast<long long>(n_layers),
                static_cast<long long>(dim), static_cast<long long>(n_heads),
                static_cast<long long>(n_kv_heads), static_cast<long long>(head_dim),
                static_cast<long long>(ffn_dim), static_cast<long long>(vocab_size),
                static_cast<long long>(max_context), rope_theta, norm_eps,
                tied_embeddings ? "tied" : "separate", static_cast<double>(n_params()) / 1e6);
  std::string out = buf;
  if (qkv_bias) out += o_bias ? ", q/k/v/o biases" : ", q/k/v biases";
  if (qk_norm) out += ", per-head q/k RMSNorm";
  if (!rope_scaling.type.empty()) {
    std::snprintf(buf, sizeof buf, ", rope scaling %s x%g", rope_scaling.type.c_str(),
                  rope_scaling.factor);
    out += buf;
  }
  else if (!rope_freq_factors.empty())
    out += ", rope frequency divisors from the file";
  return out;
}

}  // namespace nibble::llm
