// nibble — quantization algorithms: round to nearest with min-max or MSE-optimal clipping,
// GPTQ, SmoothQuant, and static activation calibration.
//
// Every weight quantizer here writes the logical formats of formats.h into a QuantizedWeightView
// laid out exactly as quantize_weight lays it out, so every kernel, `pack_weight` and the runner
// use the results unchanged: the algorithms only choose other integers and scales. They support
// the symmetric schemes (s4_sym, s8_sym; per channel or per group), the ones of w4a8_*, w8a8*,
// w4a16_g* and w8a16. A restricted integer range (`qmax` = 3 or 1 simulates 3-bit or 2-bit
// weights on the 4-bit kernels) is a parameter of the quantizer, not a format: the values stay
// in the 4-bit storage.
//
// All math is on the host in f32/f64 with fixed summation orders, so results are deterministic;
// GPTQ can run its heavy parts on a CUDA device (cuBLAS / cuSOLVER) when nibble is built with
// CUDA. docs/accuracy.md measures these algorithms on a real model.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "nibble/quantize.h"
#include "nibble/types.h"

namespace nibble {

/// How the scale of a channel or group is chosen.
enum class ClipMethod : uint8_t {
  minmax,  ///< s = amax / qmax, nothing clipped (quantize_weight's rule)
  mse,  ///< s = r·amax / qmax, r from a grid in [clip_min_ratio, 1] minimising Σ (w − s·q)²
};

/// The options every weight quantizer here shares.
struct WeightQuantOptions {
  /// Largest integer magnitude used: q ∈ [−qmax, qmax]. 0 means the format's own (7 for s4,
  /// 127 for s8); 3 and 1 simulate 3-bit and (ternary) 2-bit weights in 4-bit storage.
  int qmax = 0;
  ClipMethod clip = ClipMethod::minmax;
  /// MSE search: ratios r_t = 1 − t·(1 − clip_min_ratio)/clip_steps, t = 0..clip_steps. r = 1
  /// (min-max) is always a candidate and wins ties, so the MSE never exceeds min-max's.
  int clip_steps = 20;
  double clip_min_ratio = 0.5;
};

/// Round to nearest: w (N, K) f32/f16/bf16 on the CPU into `out` (s4_sym or s8_sym), with the
/// scale of each channel or group chosen by opt.clip. With default options the result is
/// bit-identical to quantize_weight. Throws nibble::Error(invalid_argument) naming the argument.
void quantize_weight_rtn(const TensorView& w, const QuantizedWeightView& out,
                         const WeightQuantOptions& opt = {});

/// The Hessian of a linear layer's squared output error for GPTQ: H = 2/n · Σ_t x_t x_tᵀ over the
/// n calibration rows x_t (K) of the layer's input. Accumulated in f64 (each add() sums its rows
/// in f32 chunks of at most 512, in a fixed order, then adds them in f64).
class GptqHessian {
 public:
  explicit GptqHessian(int64_t k);
  /// Adds the rows of x (M, K), f32 row-major: on the CPU, or on a CUDA device (cublasDsyrk).
  void add(const TensorView& x);
  int64_t k() const { return k_; }
  int64_t samples() const { return n_; }
  /// (K, K) row-major f64: 2/n · Σ x xᵀ (zeros before the first add).
  std::vector<double> matrix() const;

 private:
  int64_t k_ = 0, n_ = 0;
  std::vector<double> sum_;  // Σ x xᵀ, (K, K)
};

struct GptqOptions : WeightQuantOptions {
  /// λ = damp · mean(diag H) is added to the diagonal (GPTQ's percdamp).
  double damp = 0.01;
  /// Columns per lazy batch update.
  int block_size = 128;
  /// Quantize columns in order of decreasing diag(H) ("act-order"). Group scales are then
  /// fixed before the first column from the original weights ("static groups"), so that the
  /// groups stay the format's contiguous ones.
  bool act_order = false;
  /// Where the Cholesky factorisation and the block updates run: CPU, or CUDA (cuSOLVER potrf
  /// / potri, cuBLAS GEMM). Needs a CUDA build for cuda (else unsupported).
  Device device = Device::cpu();
};

struct GptqResult {
  /// GPTQ's proxy loss Σ_n Σ_k (w − q)² / [H⁻¹]_kk / 2, with the updated w of each column.
  double loss = 0;
  int64_t dead_columns = 0;  ///< columns with diag(H) = 0 (never active): set to 0
};

/// GPTQ (Frantar et al. 2022): quantizes w (N, K) f32 on the CPU column by column, each column's
/// rounding error spread over the not yet quantized columns through the upper Cholesky factor
/// of H⁻¹, with lazy batch updates of opt.block_size columns. Group scales are chosen (by
/// opt.clip) when the group's first column is reached, from the weights updated so far; per
/// channel (and with act_order), from the original weights. With H = I the result equals
/// quantize_weight_rtn with the same options.
GptqResult quantize_weight_gptq(const TensorView& w, const GptqHessian& h,
                                const QuantizedWeightView& out, const GptqOptions& opt = {});

/// Observes activations (M, K) f32 on the CPU: the per-channel max |x| (SmoothQuant's
/// statistic) and a histogram of |x| for static per-tensor scales. The histogram's bins are the
/// f32 values with their mantissa cut to 6 bits (relative width 2⁻⁶), so a percentile is exact
/// to within 1.6% and independent of the order of observations.
class ActivationObserver {
 public:
  explicit ActivationObserver(int64_t k);
  void observe(const TensorView& x);
  int64_t k() const { return k_; }
  int64_t count() const { return count_; }
  /// max |x| over all observed rows, per channel (K).
  const std::vector<float>& channel_absmax() const { return channel_absmax_; }
  float absmax() const;
  /// The smallest bin edge e with at least p% of the observed |x| ≤ e (0 < p ≤ 100), capped at
  /// absmax(); absmax() for p = 100.
  float percentile_absmax(double p) const;

 private:
  int64_t k_ = 0, count_ = 0;
  std::vector<float> channel_absmax_;
  std::vector<int64_t> histogram_;  // indexed by the top 14 bits below the sign of |x|
};

enum class ActCalibration : uint8_t {
  minmax,      ///< the clip is max |x|
  percentile,  ///< the clip is the p-th percentile of |x| (outliers beyond it saturate)
};

/// A static per-tensor int8 scale (for s8_per_tensor / quantize_activation_static): clip / 127.
/// Throws invalid_argument when nothing was observed or every value was 0.
float static_activation_scale(const ActivationObserver& obs, ActCalibration method,
                              double percentile = 99.99);

/// SmoothQuant (Xiao et al. 2022) smoothing factors of one linear input: s_j =
/// max|X_j|^α / max|W_j|^(1−α), clamped below at 1e-5, with act_absmax from calibration and
/// weight_absmax the max |w| of input channel j over every linear that reads this input. The
/// layer then computes (x / s)·(W·diag(s))ᵀ = x·Wᵀ: divide the activations (fold 1/s into the
/// op that produces them) and multiply the weight columns (scale_weight_columns). s_j = 1
/// where either max is 0. 0 ≤ α ≤ 1.
std::vector<float> smoothquant_scales(std::span<const float> act_absmax,
                                      std::span<const float> weight_absmax, double alpha);

/// max over rows of |w[n, j]| for w (N, K) f32 on the CPU, folded into absmax (K) with max.
void column_absmax(const TensorView& w, std::span<float> absmax);

/// w[n, j] *= s[j] in place, w (N, K) f32 on the CPU.
void scale_weight_columns(const TensorView& w, std::span<const float> s);

// ---- W4A4 granularity, chosen per layer from ρ (mixed mode) ----------------------------------

/// Modelled run time of a w4a4_g128 layer relative to w4a4_pc on a GPU of ratio ρ
/// (tensor_core_ratio): 1 + ρ/64. Per 128 k a g128 rescale adds an int→float conversion and an
/// FMA per accumulator on the CUDA cores to 256 MMA operations on the tensor cores. Measured on
/// the H100 (ρ = 32, modelled 1.5): 1.46–1.59 at M ≥ 1024, 1.10–1.50 at M = 16
/// (docs/kernels.md); APEX4 reports g128 losing to 16-bit at ρ = 64 and winning at ρ ≤ 16.
double w4a4_group_time_factor(int rho);

/// One linear layer as the planner sees it: its size and the output error of each
/// granularity (weight_quantization_error, or any error measure on a common scale).
struct GranularityLayer {
  std::string name;
  int64_t n = 0, k = 0;
  double error_per_channel = 0, error_group = 0;
};

/// The planner's decision for one layer.
struct GranularityChoice {
  std::string name;
  bool group = false;       ///< w4a4_g128 (true) or w4a4_pc (false)
  double error_gain = 0;    ///< error_per_channel − error_group
  double added_time = 0;    ///< modelled extra time of g128, in MACs (n·k·(factor − 1))
};

struct GranularityPlan {
  int rho = 0;
  double budget = 0;          ///< allowed extra time over all-per-channel, a fraction
  double group_factor = 0;    ///< w4a4_group_time_factor(rho)
  double time_vs_per_channel = 1;  ///< modelled time of the plan / all-per-channel
  double error = 0, error_per_channel = 0, error_group = 0;  ///< Σ over layers of each choice
  std::vector<GranularityChoice> layers;  ///< in the input order
  /// A paragraph: ρ, the factor, the budget, and per layer the choice and why.
  std::string describe() const;
};

/// Mixed-granularity W4A4 (APEX4's ρ-aware granularity adaptation, per layer): every layer
/// starts per channel; layers then switch to g128 in decreasing order of error gain per unit
/// of added time (n·k·(w4a4_group_time_factor(rho) − 1) MACs; ties by input order), each one
/// only if the modelled total time stays within (1 + budget) × the all-per-channel time, and
/// only if g128 lowers its error. A high ρ (a costly rescale) leaves fewer layers group-wise:
/// at ρ = 8 the rescale costs 12.5% of a layer, at ρ = 64 100%. rho must be > 0 (from
/// tensor_core_ratio), budget ≥ 0; throws nibble::Error(invalid_argument) otherwise.
GranularityPlan plan_w4a4_granularity(const std::vector<GranularityLayer>& layers, int rho,
                                      double budget);

/// The relative output error of quantizing w (N, K) f32/f16/bf16 on the CPU into `format`
/// (round to nearest, quantize_weight): ‖(W − Ŵ)·D^½‖²_F / ‖W·D^½‖²_F with D = diag(mean
/// square of each input column) — the expected squared output error of the layer for inputs
/// with those second moments and uncorrelated columns. `input_mean_square` (K values ≥ 0) may
/// be empty: D = I, plain weight error.
double weight_quantization_error(const TensorView& w, const WeightFormat& format,
                                 std::span<const float> input_mean_square = {});

}  // namespace nibble
