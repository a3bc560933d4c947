// Opening a model: its configuration, tokenizer and a source of weights, from
//
//   * a GGUF file (llama.cpp; F32/F16/BF16/Q8_0/Q4_0/Q4_1 tensors, dequantized when loaded);
//   * a Hugging Face checkpoint directory (config.json, tokenizer.json, model.safetensors or
//     model.safetensors.index.json with its shards);
//   * a named architecture with random weights (--random-weights --arch llama3-8b).
//
// Weights are handed out one tensor at a time, as f32, under GGUF's tensor names, so that a
// backend can convert or quantize each one and drop the f32 copy before asking for the next
// (an 8B model never has to exist in f32). Every source hands out the same logical layout:
//
//   token_embd.weight (V, D)             output_norm.weight (D)      output.weight (V, D)
//   blk.L.attn_norm.weight (D)           blk.L.ffn_norm.weight (D)
//   blk.L.attn_q.weight (Hq·hd, D)       blk.L.attn_k.weight, attn_v.weight (Hkv·hd, D)
//   blk.L.attn_output.weight (D, Hq·hd)  blk.L.ffn_gate.weight, ffn_up.weight (F, D)
//   blk.L.ffn_down.weight (D, F)
//
// all row-major (N, K) like nn.Linear, and with the rows of Q and K in the Hugging Face order,
// whose RoPE rotates the pairs (i, i + hd/2) of each head. llama.cpp's converter permutes those
// rows so that its RoPE can rotate adjacent pairs (2i, 2i+1); the GGUF source undoes that
// permutation, so one RoPE serves every source (docs/runner.md, "RoPE and the Q/K order").
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "llm/config.h"
#include "llm/tokenizer.h"
#include "nibble/quantize.h"
#include "nibble/tensor.h"

namespace nibble::llm {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// The tensor `name` as f32, row-major; throws nibble::Error naming the tensor when it is
  /// missing or its shape is not `shape`.
  virtual std::vector<float> load(const std::string& name,
                                  std::initializer_list<int64_t> shape) = 0;
  /// Whether the source has a tensor of this name.
  virtual bool has(const std::string& name) const = 0;
  /// The stored form of the weights, e.g. "GGUF Q4_1 (210 tensors), Q8_0 (1), F32 (61)".
  virtual std::string describe() const = 0;
  /// The nibble linear format in which a pre-quantized checkpoint stores `name`; "" when the
  /// source holds it as floats (every source but a nibble checkpoint).
  virtual std::string quantized_format(const std::string& name) const {
    (void)name;
    return "";
  }
  /// The stored weights of a pre-quantized `name` (n, padded_k(format, k)), checked against
  /// the format's buffer shapes and dtypes.
  virtual QuantizedWeight load_quantized(const std::string& name, int64_t n, int64_t k);
  /// The seed of a random-weights source (random_model), whose weights a backend may generate
  /// on its device instead of loading them; nullopt for every real model.
  virtual std::optional<uint64_t> random_seed() const { return std::nullopt; }
};

/// Weights held in memory under the canonical names: float tensors, and block linears already
/// quantized in a nibble format (what the quantization algorithms of quantize_model.h produce;
/// write_nibble_checkpoint stores them as they are, and a backend loads them like a checkpoint).
class MemorySource final : public WeightSource {
 public:
  void put(const std::string& name, std::vector<int64_t> shape, std::vector<float> data);
  void put_quantized(const std::string& name, const std::string& format, QuantizedWeight qw);
  /// The float values of `name`, for changes in place (e.g. SmoothQuant's folding).
  std::vector<float>& values(const std::string& name);

  std::vector<float> load(const std::string& name, std::initializer_list<int64_t> shape) override;
  bool has(const std::string& name) const override;
  std::string describe() const override;
  std::string quantized_format(const std::string& name) const override;
  QuantizedWeight load_quantized(const std::string& name, int64_t n, int64_t k) override;

 private:
  struct Floats {
    std::vector<int64_t> shape;
    std::vector<float> data;
  };
  std::map<std::string, Floats> floats_;
  // name → (format, weights)
  std::map<std::string, std::pair<std::string, QuantizedWeight>> quantized_;
};

struct ModelFiles {
  ModelConfig config;
  std::optional<Tokenizer> tokenizer;  ///< absent for random weights
  std::unique_ptr<WeightSource> weights;
  std::string path;        ///< what was opened
  int64_t file_bytes = 0;  ///< bytes of the weight files (0 for random weights)
};

/// Opens a .gguf file, or a directory (or its config.json) of a Hugging Face checkpoint.
ModelFiles open_model(const std::string& path);
/// An architecture preset (ModelConfig::preset) with deterministic random weights: uniform,
/// each tensor from its own seed (seed, name), matrices scaled to keep activations O(1).
ModelFiles random_model(const std::string& arch, uint64_t seed);
/// The same for any (validated) configuration, e.g. a tiny one in tests.
ModelFiles random_model(const ModelConfig& config, uint64_t seed);

/// The canonical (GGUF) name of a Hugging Face Llama tensor name, or "" when it is not one.
std::string canonical_tensor_name(const std::string& hf_name);
/// The inverse: the Hugging Face name of a canonical one ("" when it is not one).
std::string hf_tensor_name(const std::string& canonical);

/// Writes a pre-quantized nibble checkpoint of `m` into directory `dir` (created): config.json,
/// tokenizer.json and model.safetensors. The seven linears of every block are stored in the
/// nibble linear format `format`: as the source holds them when it has them pre-quantized in
/// that format (a MemorySource from quantize_model), else quantized exactly as the runner
/// quantizes at load (round to nearest, K padded to the group) and stored as <hf name>.qweight /
/// .scales / .zeros / .group_scales (4-bit values as U8 bytes, two per byte); the embedding and
/// output are stored in `head_mode` (BF16 or F32), the norms in F32. Metadata: nibble.format,
/// nibble.version.
void write_nibble_checkpoint(ModelFiles& m, const std::string& format, const std::string& head_mode,
                             const std::string& dir);

/// How a GPTQ or AWQ checkpoint (config.json's quantization_config) packs its 4-bit layers
/// (nibble::Int4Packing has the layouts). Such a layer holds w = s·(q − z) per group of `group`
/// inputs, exactly nibble's format(), w4a16_g<group>_asym_sf16.
struct ImportedQuantization {
  std::string method;          ///< "gptq" or "awq"; empty: no quantization_config
  int64_t group = 0;           ///< 32, 64, 128 or 256
  bool zero_plus_one = false;  ///< GPTQ's v1 checkpoint format stores each zero minus 1
  std::string format() const;
  Int4Packing packing() const;
};
/// The quantization_config of a config.json text; nibble::Error(unsupported) naming what nibble
/// does not import (other methods and bit widths, GEMV packing, a quantized lm_head, ...).
ImportedQuantization imported_quantization(std::string_view config_json, const std::string& what);

/// Undoes llama.cpp's Q/K row permutation in place: rows (N = heads·hd, K) in GGUF order →
/// Hugging Face order, head by head: hf[h·hd + j·hd/2 + i] = gguf[h·hd + 2i + j].
void unpermute_gguf_qk(std::vector<float>& w, int64_t heads, int64_t head_dim, int64_t k);

}  // namespace nibble::llm
