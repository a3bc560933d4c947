// One linear layer of the CUDA runner, y (M, N) f32 = x (M, K) · Wᵀ, and the one place that
// decides how it runs (GpuLinear::path):
//
//   mode                                     path              what forward() calls
//   bf16                                     cublas_bf16       cublasGemmEx bf16 × bf16, f32 compute, f32 out
//   formats with a packed layout             packed_a8         [quantize_activation +] nibble::linear(
//   (has_packed_layout) and int8 or e4m3                         QuantizedActivationView, PackedWeightView)
//   per-token activations: w4a8_pc,                            — the W4A8 / W4A-FP8 kernels
//   w4a8_gNN, w4a8_g128_2level, w4afp8_*
//   (K_pad % 32 == 0)
//   weight-only formats with a packed        packed_a16        nibble::linear(TensorView bf16, PackedWeightView)
//   layout: w4a16_*, w8a16 (K_pad % 8 == 0)                    — the W4A16/W8A16 tensor-core kernel
//   other formats with quantized             quantized_act     [quantize_activation +] nibble::linear(
//   activations (w8a8, w4a4_*)                                   QuantizedActivationView, QuantizedWeightView)
//   other weight-only formats                weight_only       nibble::linear(TensorView bf16, QuantizedWeightView)
//
// Only nibble's public API runs the quantized layers, and the packed/logical choice follows
// nibble's own has_packed_layout()/packed_layout(): a format that gains a packed layout moves
// to it here, and a new kernel for an existing layout needs no change at all. Nothing else in
// the runner looks at formats.
//
// K is padded as the CPU backend pads it (llm::padded_k: to the group size, or to an even count
// for per-channel int4), with zero weight columns; the caller's input rows must be zero in the
// padded columns too, so products equal the unpadded layer's. Quantization is round-to-nearest
// (nibble::quantize_weight on the host), exactly the CPU backend's, so both backends hold
// identical weights.
#pragma once

#include <cublas_v2.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "llm/cuda/kernels.h"
#include "nibble/gemm.h"
#include "nibble/layout.h"
#include "nibble/tensor.h"

namespace nibble::llm::cuda {

/// A (rows, cols) view with row pitch `ld` elements (K contiguous) over device memory.
TensorView strided(void* data, DType dtype, int64_t rows, int64_t cols, int64_t ld,
                   Device device);

/// A layer's input as its producer wrote it: f32/bf16 rows, or int8 rows with per-row scales.
struct LinearInput {
  TensorView x;                 ///< (M, ≥ k_padded()) bf16 or f32; unused when `quantized`
  QuantizedActivationView qa;   ///< s8 per token (M, k_padded()), when `quantized`
  bool quantized = false;
  /// Float x for an int8-activation layer: nibble::linear(x, packed) quantizes it per token
  /// (inside its GEMM where it can) instead of quantize_activation into the scratch first.
  bool quantize_in_linear = false;
  /// With quantize_in_linear: the RMSNorm in front of the quantization (from the residual's
  /// granule sums) and the residual add after the GEMM, run by nibble::linear(x, packed, ...,
  /// fusion) (norm_in_linear).
  LinearFusion fusion;
};

/// Where a layer quantizes its own input when the producer wrote floats: (M, ld) bytes and M
/// f32 scales, 16-byte aligned rows.
struct LinearScratch {
  void* q = nullptr;
  int64_t ld = 0;  ///< bytes per row, a multiple of 16
  float* scales = nullptr;
};

class GpuLinear {
 public:
  enum class Path : uint8_t { cublas_bf16, packed_a8, packed_a16, quantized_act, weight_only };

  /// From f32 weights (n, k) on the host: rounded to bf16, or padded, quantized and packed.
  static std::unique_ptr<GpuLinear> from_floats(const std::string& mode,
                                                const std::vector<float>& w, int64_t n,
                                                int64_t k, Device device);
  /// From weights already quantized in `mode` (a pre-quantized checkpoint), (n, padded_k(k)).
  static std::unique_ptr<GpuLinear> from_quantized(const std::string& mode,
                                                   const QuantizedWeight& qw, int64_t k,
                                                   Device device);
  /// Random weights made on the device (kernels.h fills): uniform bf16 with variance 1/k, or
  /// random int4/int8 values with scales that give the dequantized weights variance ≈ 1/k.
  static std::unique_ptr<GpuLinear> random(const std::string& mode, int64_t n, int64_t k,
                                           uint64_t seed, Device device, Stream stream);
  /// A bf16 layer over a (n, k) bf16 weight already on the device (a tied output projection
  /// sharing the embedding table).
  static std::unique_ptr<GpuLinear> bf16_shared(Tensor w);

  /// "bf16" or a nibble linear format that the CUDA runner can run (throws otherwise).
  static void check_mode(const std::string& mode);

  Path path() const { return path_; }
  /// The input form this layer reads for m tokens. `fuse_int8` lets the int8 per-token
  /// quantization be fused: into the W4A8 GEMM at decode size (quantizes_in_linear: the
  /// producer writes f32), else into the producer (it writes int8 and the scales). Without it
  /// producers write f32 and forward() calls quantize_activation.
  ActKind input_kind(bool fuse_int8, int64_t m) const;
  /// Whether forward() hands f32 rows to nibble::linear(x, packed), which quantizes them inside
  /// its GEMM (packed W4A8 with per-token int8, fuse_int8, m ≤ kQuantizeInLinearMaxTokens).
  bool quantizes_in_linear(bool fuse_int8, int64_t m) const;
  /// Tokens up to which the packed W4A8 layers quantize their own f32 input (the decode step):
  /// there one GEMM that quantizes each CTA's slice of the row beats a producer that quantizes
  /// the whole row after a grid-wide maximum (docs/runner.md, "deferred int8").
  static constexpr int64_t kQuantizeInLinearMaxTokens = 1;
  /// Whether this layer, quantizing in its linear, can also take the RMSNorm before it (as the
  /// consumer of the residual stream) and the residual add after it (as its producer) through
  /// LinearFusion: no padded K columns (the residual rows have none). The decode step then runs
  /// no norm or add kernel after its first block's (docs/runner.md). NIBBLE_DECODE_NORM=kernel
  /// keeps those kernels (A/B measurements).
  bool norm_in_linear(bool fuse_int8, int64_t m) const;
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  int64_t k_padded() const { return kp_; }
  /// y (m, n) f32 (row stride ≥ n) from `in`; runs on `stream` (`blas` is bound to it).
  void forward(const LinearInput& in, const LinearScratch& scratch, int64_t m,
               const TensorView& y, Stream stream, cublasHandle_t blas) const;
  /// Bytes of weights, scales and zeros on the device (what one forward call reads).
  int64_t weight_bytes() const;
  const std::string& mode() const { return mode_; }
  /// The path in words, with the kernel nibble::explain picks at M = m.
  std::string describe(int64_t m) const;
  bool packed() const { return path_ == Path::packed_a8 || path_ == Path::packed_a16; }
  /// The bf16 weight of a cublas_bf16 layer (empty otherwise).
  const Tensor& bf16_weight() const { return bf16_; }

 private:
  GpuLinear(const std::string& mode, int64_t n, int64_t k);
  static Path choose_path(const std::string& mode, int64_t k_padded);
  void set_quantized(const QuantizedWeight& host_qw, Device device);

  std::string mode_;
  LinearFormat format_{};  // unset for bf16
  Path path_ = Path::cublas_bf16;
  int64_t n_ = 0, k_ = 0, kp_ = 0;
  Tensor bf16_;           // cublas_bf16: (n, k)
  PackedWeight packed_;   // packed_a8, packed_a16
  QuantizedWeight qw_;    // quantized_act, weight_only: (n, kp) on the device
};

}  // namespace nibble::llm::cuda
