// The shape of a Llama-family decoder: from GGUF metadata (llama.* keys), from a Hugging Face
// config.json, or from a named preset for --random-weights runs.
//
// The architecture: token embedding → n_layers × [RMSNorm → attention with RoPE (rotate-half
// convention, base rope_theta) and grouped-query heads (n_heads query heads share n_kv_heads
// key/value heads) → residual → RMSNorm → SwiGLU MLP (down(silu(gate·x) ⊙ up·x)) → residual] →
// RMSNorm → output projection (the embedding matrix itself when tied_embeddings).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace nibble::llm {

class GgufFile;

struct ModelConfig {
  std::string name;  ///< for reports, e.g. "SmolLM2-135M-Instruct"
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

  /// From the llama.* keys of a GGUF file (tied when the file has no output.weight).
  static ModelConfig from_gguf(const GgufFile& g);
  /// From the text of a Hugging Face config.json (LlamaForCausalLM and the like).
  static ModelConfig from_hf_json(std::string_view json_text, const std::string& what);
  /// "llama3-8b" (Meta-Llama-3-8B's sizes) or "smollm2-135m" (SmolLM2-135M's sizes).
  static ModelConfig preset(const std::string& arch);

  /// Throws nibble::Error(invalid_argument) naming the first field that is out of range or
  /// inconsistent (heads that do not divide, an odd head_dim, ...).
  void validate(const std::string& what) const;
  /// Parameters, counting a tied embedding once.
  int64_t n_params() const;
  std::string describe() const;
  /// A Hugging Face config.json for this configuration (bos/eos ids < 0 are left out).
  std::string to_hf_json(int32_t bos_id, int32_t eos_id) const;
};

}  // namespace nibble::llm
