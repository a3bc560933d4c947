// The shape of a Llama-family decoder: from GGUF metadata (llama.* keys), from a Hugging Face
// config.json, or from a named preset for --random-weights runs.
//
// The architecture: token embedding → n_layers × [RMSNorm → attention with RoPE (rotate-half
// convention, base rope_theta) and grouped-query heads (n_heads query heads share n_kv_heads
// key/value heads) → residual → RMSNorm → SwiGLU MLP (down(silu(gate·x) ⊙ up·x)) → residual] →
// RMSNorm → output projection (the embedding matrix itself when tied_embeddings).
//
// RoPE frequencies: pair i of a head rotates by p · θ^(−2i/head_dim) / f_i at position p, where
// the divisors f_i (rope_freq_factors, empty = all 1) stretch the long wavelengths for contexts
// beyond the trained one: "linear" scaling (f_i = factor), Llama 3.1's "llama3" scaling (f_i = 1
// for wavelengths below original_context / high_freq_factor, = factor above original_context /
// low_freq_factor, interpolated between), or the per-pair divisors of a GGUF `rope_freqs.weight`
// tensor (how llama.cpp's converter stores Llama 3.1 / 3.2 files).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::llm {

class GgufFile;

struct ModelConfig {
  std::string name;  ///< for reports, e.g. "SmolLM2-135M-Instruct"
  /// "llama" (Llama, Mistral, SmolLM, ...), "qwen2" (the same decoder with biases on the q, k
  /// and v projections), "qwen3" (no biases; an RMSNorm over each head of q and k before RoPE) or
  /// "phi3" (Llama's computation with q|k|v and gate|up stored as two fused tensors, which the
  /// weight sources split). Only llama GGUF files hold permuted Q/K rows.
  std::string arch = "llama";
  int64_t vocab_size = 0;
  int64_t dim = 0;  ///< hidden size (embedding_length)
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;     ///< dim / n_heads unless the file says otherwise
  int64_t ffn_dim = 0;      ///< intermediate size of the MLP
  int64_t max_context = 0;  ///< context length the model was trained for
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  bool tied_embeddings = false;  ///< output projection = token embedding
  bool qkv_bias = false;  ///< the q, k, v projections add a bias (Qwen2; Llama's attention_bias)
  bool o_bias = false;    ///< the attention output projection too (Llama's attention_bias)
  bool qk_norm = false;   ///< q and k get an RMSNorm per head (weights head_dim; Qwen3)
  /// RoPE scaling as the model's config states it, for reports and config.json: "" (none or
  /// per-pair divisors from a GGUF file), "linear" or "llama3" with their parameters.
  struct RopeScaling {
    std::string type;
    double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
    int64_t original_context = 8192;
  } rope_scaling;
  /// Per-pair frequency divisors f_i (head_dim / 2 of them, f32 as GGUF stores them); empty: none.
  std::vector<float> rope_freq_factors;

  /// From the llama.* keys of a GGUF file (tied when the file has no output.weight).
  static ModelConfig from_gguf(const GgufFile& g);
  /// From the text of a Hugging Face config.json (LlamaForCausalLM and the like).
  static ModelConfig from_hf_json(std::string_view json_text, const std::string& what);
  /// "llama3-8b" (Meta-Llama-3-8B's sizes) or "smollm2-135m" (SmolLM2-135M's sizes).
  static ModelConfig preset(const std::string& arch);

  /// Throws nibble::Error(invalid_argument) naming the first field that is out of range or
  /// inconsistent (heads that do not divide, an odd head_dim, ...).
  void validate(const std::string& what) const;
  /// The RoPE rotation rate of each pair, θ^(−2i/head_dim) / f_i (head_dim / 2 values, double).
  std::vector<double> rope_inv_freq() const;
  /// Sets rope_scaling and rope_freq_factors for "linear" or "llama3" scaling (the divisors
  /// computed in double and stored as f32); throws for other types.
  void set_rope_scaling(const RopeScaling& s, const std::string& what);
  /// Parameters, counting a tied embedding once.
  int64_t n_params() const;
  std::string describe() const;
  /// A Hugging Face config.json for this configuration (bos/eos ids < 0 are left out).
  std::string to_hf_json(int32_t bos_id, int32_t eos_id) const;
};

/// RoPE tables of `positions` rows × head_dim / 2: cos and sin of p · rope_inv_freq()[i],
/// computed in double and stored as f32 (both backends rotate with these).
void rope_tables(const ModelConfig& c, int64_t positions, std::vector<float>& cos_out,
                 std::vector<float>& sin_out);

}  // namespace nibble::llm
