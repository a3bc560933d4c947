// nibble — integer GEMMs and quantized linear layers.
//
//     D[M,N] = A[M,K] · W[N,K]ᵀ (+ bias[N])
//
// Every function validates all arguments (shapes, dtypes, strides, devices, null pointers, K
// limits) before it writes anything, and throws nibble::Error naming the argument. Tensors of
// one call live on one device; the CPU backend is the normative reference, the CUDA backend
// runs on `stream` and never synchronizes.
#pragma once

#include <string>

#include "nibble/formats.h"
#include "nibble/layout.h"
#include "nibble/quantize.h"
#include "nibble/types.h"

namespace nibble {

/// Integer GEMM with int32 output: D (M, N) s32 = A (M, K) · W (N, K)ᵀ, exact.
/// Operand pairs: s8×s8, s8×s4 (A int8, W int4) and s4×s4. A and W row-major with K contiguous
/// (4-bit operands packed along K); K ≤ max_int32_accumulation_k(A, W), else out_of_range.
void gemm_s32(const TensorView& a, const TensorView& w, const TensorView& d,
              Stream stream = nullptr);

/// Quantized linear with quantized activations (W4A8, W8A8, W4A4, W4A8-FP8):
///   per-channel weights:  D[m,n] = sa[m] · sw[n] · Σ_k qa[m,k]·qw[n,k]           (+ bias[n])
///   group-wise weights:   D[m,n] = sa[m] · Σ_g sw[n,g] · Σ_{k∈g} qa[m,k]·qw[n,k]  (+ bias[n])
///   two-level weights:    D[m,n] = sa[m] · s_ch[n] · Σ_k qa[m,k]·w8[n,k]          (+ bias[n])
/// Integer activations accumulate exactly in int32 (per channel: K within the int32 limit),
/// fp8 activations in f32; partial sums are rescaled and summed in f32.
/// d: (M, N) f32, f16 or bf16; bias: nullptr or (N) f32/f16/bf16.
void linear(const QuantizedActivationView& a, const QuantizedWeightView& w,
            const TensorView* bias, const TensorView& d, Stream stream = nullptr);

/// Weight-only quantized linear (W4A16, W8A16): D = x · deq(W)ᵀ (+ bias), x (M, K) f32/f16/bf16,
/// products and sums in f32.
void linear(const TensorView& x, const QuantizedWeightView& w, const TensorView* bias,
            const TensorView& d, Stream stream = nullptr);

/// Quantized linear with weights packed by pack_weight (layout w4_mma_k128): W4A8 per channel,
/// group-wise and two-level, with s8 per-token or per-tensor activations. Same formula as the
/// logical-weight overload; on CUDA it runs the tensor-core kernels (K % 32 == 0, rows of a.q
/// 16-byte aligned), on the CPU the reference.
void linear(const QuantizedActivationView& a, const PackedWeightView& w, const TensorView* bias,
            const TensorView& d, Stream stream = nullptr);

/// Weight-only quantized linear (W4A16, W8A16) with weights packed by pack_weight in layout
/// w4_mma16_k128 (s4_sym, u4_asym, u4_fzp) or w8_mma16_k128 (s8_sym):
///   per channel:  D[m,n] = s[n] · Σ_k x[m,k]·q[n,k]                           (+ bias[n])
///   group-wise:   D[m,n] = Σ_k x[m,k]·deq(W)[n,k]                              (+ bias[n])
/// On CUDA x is (M, K) bf16 or f16 with 16-byte rows (K % 8 == 0) and runs the 16-bit tensor-core
/// kernel: the integer weight enters exactly and per-channel scales multiply the f32 sum;
/// group-wise, each weight is dequantized and rounded once to x's type (relative error ≤ 2⁻⁹
/// for bf16, 2⁻¹² for f16), products and sums f32. On the CPU (x f32/f16/bf16) the reference.
/// With W4A8 weights (layout w4_mma_k128) the activations x (M, K) f32/f16/bf16 are quantized
/// per token to int8 (dynamic, the same codes and scales as quantize_activation), so the result
/// equals quantize_activation + the quantized-activation overload (bit for bit when the same
/// kernel runs both; the f32 epilogue's rounding may differ between kernels). On CUDA the
/// activation kernel quantizes into a per-stream workspace (allocated on the first call:
/// capture CUDA graphs after a warm-up call) and the int8 kernels follow: two launches, measured
/// faster than quantizing inside the GEMM. With a LinearFusion that fuses a norm or a residual
/// (below), for M ≤ 4 where each CTA's rows of its K range fit in 16 KB of shared memory
/// (M = 1: any layer up to K = 16368 per split), the quantization runs inside the GEMM instead
/// (one launch, with the fusions).
/// NIBBLE_FUSED_ACT_QUANT=1 fuses wherever it fits, =0 never; explain() says which runs.
void linear(const TensorView& x, const PackedWeightView& w, const TensorView* bias,
            const TensorView& d, Stream stream = nullptr);

/// Fusions of linear(x, w, bias, d, fusion) for a pre-norm residual stream (a Llama block:
/// r += o(attn); h = rmsnorm(r)·g; qkv(h); ...; r += down(mlp); ...) with no separate add or
/// norm kernel. The linear that adds into the residual r also writes r's row sums of squares in
/// 16-column granules; the next linear, reading r as its x, normalizes it from those sums inside
/// its per-token quantization. Every sum has a defined order, so all backends agree bit for bit
/// (docs/formats.md §6.2):
///   granule sums   s[m,b] = tree16_{n = 16b .. 16b+15} f64(d[m,n])²   (columns past N: 0)
///   row total      t[m]   = tree32_{l < 32} (Σ_{b ≡ l mod 32, b ascending} s[m,b])
///   tree16/tree32: v[i] ← v[i] + v[i XOR o] for o = 8, 4, 2, 1 (16, 8, ..., 1); the sum is v[0]
///   norm           inv[m] = f32(1 / sqrt(t[m] / K + eps))       (f64 division, sum and sqrt)
///                  y[m,k] = RN(RN(x[m,k] · inv[m]) · norm_weight[k])   (f32)
/// then y is quantized per token exactly as quantize_activation would.
/// Columns per granule sum, and the granule sums of a row of n columns (LinearFusion's sums are
/// (M, sumsq_granules(N)) and (M, sumsq_granules(K))).
constexpr int64_t kSumsqGranule = 16;
inline int64_t sumsq_granules(int64_t n) { return (n + kSumsqGranule - 1) / kSumsqGranule; }

struct LinearFusion {
  /// Output side, d f32: d = d + result (one f32 addition per element).
  bool accumulate = false;
  /// Output side: when given, (M, ceil(N/16)) f64, rows contiguous, receives the granule sums s
  /// of the values d holds after the call. Needs d f32.
  TensorView out_sumsq;
  /// Input side: RMSNorm of x from the granule sums of x's rows written by the linear that
  /// produced x: (M, ceil(K/16)) f64, rows contiguous; empty: no norm.
  TensorView in_sumsq;
  TensorView norm_weight;  ///< (K) f32, with in_sumsq
  float norm_eps = 1e-6f;  ///< positive and finite, with in_sumsq
};

/// linear(x, w, bias, d) with `fusion`: packed W4A8 weights only (layout w4_mma_k128). On CUDA,
/// for f32 x where the quantization runs inside the GEMM (M ≤ 4; explain()), the norm runs in its
/// prologue and the add and the sums in its epilogue (one launch); otherwise small kernels do
/// them around the unfused path, with the same results.
void linear(const TensorView& x, const PackedWeightView& w, const TensorView* bias,
            const TensorView& d, const LinearFusion& fusion, Stream stream = nullptr);

/// Integer GEMM D (M, N) s32 = A (M, K) s8 · W (N, K)ᵀ with s4 weights packed by pack_s4_matrix
/// (or any packed s4_sym weight, whose scales are then ignored). Exact; same limits as above.
void gemm_s32(const TensorView& a, const PackedWeightView& w, const TensorView& d,
              Stream stream = nullptr);

/// Which implementation would run `linear` for this format, shape and device, and why.
std::string explain(const LinearFormat& format, int64_t m, int64_t n, int64_t k, Device device);

}  // namespace nibble
