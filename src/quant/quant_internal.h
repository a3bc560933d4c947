// Shared pieces of the quantization algorithms (src/quant/): argument checks, the scale rule of
// one channel or group, and the f64 linear algebra of GPTQ. Internal: the public API is
// include/nibble/quant_algorithms.h.
#pragma once

#include <cstdint>
#include <vector>

#include "common/check.h"
#include "nibble/quant_algorithms.h"

namespace nibble::quant {

/// Checks the options and `out` (a symmetric format: s4_sym or s8_sym on the CPU) and w (N, K)
/// float on the CPU with out's shape; returns the qmax to use.
int check_weight_quantizer(const detail::ArgCheck& check, const TensorView& w,
                           const QuantizedWeightView& out, const WeightQuantOptions& opt);

/// The stored scale of one channel or group of `count` weights under opt.clip (min-max, or the
/// MSE search of quant_algorithms.h), for integers in [−qmax, qmax] and scales of dtype t.
/// `row` names the row in an overflow error.
float choose_scale(const float* w, int64_t count, int qmax, DType t, const WeightQuantOptions& opt,
                   int64_t row);

/// Σ (w − s·q(w))² of `count` weights with q(w) = quantize_int(w, s, −qmax, qmax), in f64.
double quantization_sse(const float* w, int64_t count, float s, int qmax);

/// The upper-triangular U with Uᵀ·U = H⁻¹ (GPTQ's "upper Cholesky of the inverse"), H (K, K)
/// row-major symmetric positive definite, f64. Computed without forming H⁻¹: H = V·Vᵀ with V
/// upper triangular (a Cholesky factorisation run from the last row up), then U = V⁻¹. Returns
/// false when H is not positive definite (a pivot ≤ 0).
bool upper_cholesky_of_inverse(const std::vector<double>& h, int64_t k, std::vector<double>& u);

/// Dot product of two f64 vectors with four interleaved partial sums (a fixed order).
double dot_f64(const double* a, const double* b, int64_t n);

#if NIBBLE_WITH_CUDA
/// The device half of GPTQ on CUDA (src/cuda/quant/gptq.cu): W (N, K) f64 lives on the device;
/// the column loop stays on the host (shared with the CPU path), which fetches the columns of
/// each block and hands back the block's scaled errors E (N, B) for the lazy batch update
/// W[:, b1:] −= E · U[b0:b1, b1:] (cublasDgemm). Throws nibble::Error(cuda_error) on failures.
class GptqDevice {
 public:
  GptqDevice(const std::vector<double>& w, int64_t n, int64_t k, Device device);
  ~GptqDevice();
  GptqDevice(const GptqDevice&) = delete;
  GptqDevice& operator=(const GptqDevice&) = delete;
  /// U with Uᵀ·U = H⁻¹ (upper, row-major) by cuSOLVER: potrf, potri, potrf. False when H is not
  /// positive definite.
  bool upper_cholesky_of_inverse(const std::vector<double>& h, std::vector<double>& u);
  /// Copies columns [c0, c1) of the device W into the same columns of w_host (N, K).
  void fetch_columns(int64_t c0, int64_t c1, std::vector<double>& w_host);
  /// W[:, b1:] −= E · U[b0:b1, b1:] on the device, e (N, b1 − b0) row-major on the host.
  void lazy_update(const std::vector<double>& e, int64_t b0, int64_t b1);

 private:
  struct State;
  static void release(State*& s);
  State* state_;
};
/// Σ_t x_t x_tᵀ of x (M, K) f32 on a CUDA device (cublasDsyrk in f64), added into sum (K, K).
void hessian_add_cuda(const TensorView& x, std::vector<double>& sum);
#endif

}  // namespace nibble::quant
