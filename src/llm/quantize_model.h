// Quantizing a whole model with the algorithms of nibble/quant_algorithms.h: round to nearest
// (min-max or MSE clipping), GPTQ run block by block, and SmoothQuant folded into the model,
// calibrated on token windows of a text. The result is a model in memory (MemorySource) whose
// block linears are pre-quantized in a nibble format: write_nibble_checkpoint stores it, and
// the runner loads that checkpoint like any other (`nibble quantize`, docs/accuracy.md).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llm/model_files.h"
#include "nibble/quant_algorithms.h"

namespace nibble::llm {

struct ModelQuantOptions {
  /// The nibble linear format of the block linears, e.g. "w4a8_g128" (symmetric weight formats
  /// for every method but plain rtn, which takes any).
  std::string format = "w4a8_g128";
  /// rtn | rtn-mse | gptq | smoothquant-rtn | smoothquant-gptq.
  std::string method = "rtn";
  /// SmoothQuant's migration strength α.
  double alpha = 0.5;
  /// qmax (3-/2-bit simulation), damp, block_size, act_order; the clip rule is the method's.
  GptqOptions weights;
  /// CPU threads of the calibration forward passes (0: all).
  int threads = 0;
};

/// The methods ModelQuantOptions::method accepts, for messages and the CLI.
inline constexpr const char* kQuantMethods =
    "rtn, rtn-mse, gptq, smoothquant-rtn, smoothquant-gptq";

/// Whether `method` needs calibration data (gptq and the smoothquant methods).
bool needs_calibration(const std::string& method);

/// `samples` windows of `len` tokens of `text` (no BOS). Window s starts at the beginning of the
/// line that holds byte offset b_s, the b_s drawn uniformly (with replacement) by
/// mt19937_64(seed); only the text from there is tokenized (in growing pieces), not the whole
/// file. Throws when no line start has `len` tokens after it.
std::vector<std::vector<int32_t>> calibration_windows(const Tokenizer& tokenizer,
                                                      std::string_view text, int64_t samples,
                                                      int64_t len, uint64_t seed);

struct QuantizeProgress {
  std::string stage;  ///< "smoothquant statistics", "gptq", "rtn"
  int64_t done = 0, total = 0;
};

/// Quantizes the block linears of `model`. Every window of `calib` runs from position 0.
///
///   smoothquant-*: one f32 pass over the calibration windows records max |x| per input channel
///     of every linear; s = smoothquant_scales(act, max over the linears reading that input of
///     max|w|, α) is folded exactly: 1/s into the RMSNorm weight before q/k/v and before
///     gate/up, into the rows of v before o (s shared by the query heads of one KV head) and
///     into the rows of up before down; s into the weight columns.
///   gptq: block by block, as in the GPTQ paper: block l's Hessians come from the calibration
///     hidden states after blocks 0..l−1 already quantized (weights dequantized, activations
///     f32), with block l itself still in f32; then its seven linears are quantized and the
///     block is run again, quantized, to give block l+1 its inputs.
///
/// Returns the model with a MemorySource: the (smoothed) floats and the linears pre-quantized.
ModelFiles quantize_model(ModelFiles& model, const std::vector<std::vector<int32_t>>& calib,
                          const ModelQuantOptions& opt,
                          const std::function<void(const QuantizeProgress&)>& progress = {});

}  // namespace nibble::llm
