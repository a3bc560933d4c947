// nibble — quantizing weights and activations into the logical formats of formats.h.
//
// Quantized tensors are described by views of caller-owned memory. `weight_storage()` says
// which buffers a weight format needs, with their shapes and dtypes; `QuantizedWeight` (in
// tensor.h) allocates them on the host. All quantizers round half to even.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "nibble/formats.h"
#include "nibble/types.h"

namespace nibble {

/// A quantized weight matrix W[N,K] in a logical format. Unused members stay empty (rank 0).
struct QuantizedWeightView {
  WeightFormat format;
  int64_t n = 0, k = 0;
  TensorView q;             ///< (N, K) s4/u4/s8 values; 4-bit types packed two per byte
  TensorView scales;        ///< (N) or (N, K/G) in format.scale_dtype; two-level: s_ch (N)
  TensorView zeros;         ///< u4_asym: (N, K/G) u8 in [0,15]; u4_fzp: (N, K/G) scale_dtype
  TensorView group_scales;  ///< s4_two_level only: (N, K/G) u8 in [1,255]; zeros hold g_z
};

/// Quantized activations A[M,K].
struct QuantizedActivationView {
  ActScheme scheme = ActScheme::s8_per_token;
  TensorView q;       ///< (M, K) s8, s4 or e4m3
  TensorView scales;  ///< (M) f32 for per-token schemes, (1) f32 for per-tensor
};

/// Shape and dtype of one buffer of a quantized weight (rank 0 when the format has none).
struct BufferSpec {
  DType dtype = DType::f32;
  int rank = 0;
  int64_t shape[2] = {0, 0};
};

/// The buffers a weight format needs for an N×K matrix. Throws if N, K or the group size do
/// not fit the format (K even for 4-bit values, K divisible by the group size).
struct WeightStorage {
  BufferSpec q, scales, zeros, group_scales;
};
WeightStorage weight_storage(const WeightFormat& f, int64_t n, int64_t k);

/// Quantizes w (N, K) f32/f16/bf16, row-major, on the CPU, with round-to-nearest of min-max
/// statistics. Symmetric: s = max|w|/qmax. u4_asym: the group range is widened to include 0,
/// s = (max − min)/15, integer zero z = round(−min/s). u4_fzp: the group's own min and max,
/// s = (max − min)/15, float zero = min + 8s. Scales are rounded to their storage dtype before q
/// is computed (and nudged up by one step if rounding would clip), so |w − deq(q)| ≤ s/2 for
/// s4_sym, s8_sym and u4_asym; u4_fzp adds half a step of the stored zero. Two-level:
/// per-channel int8 w8 in the protective range [-119, 119] (step s_ch), then per group uint4
/// with integer scale g_s and zero g_z; the bound is s_ch·(1 + g_s)/2. docs/formats.md.
void quantize_weight(const TensorView& w, const QuantizedWeightView& out);

/// Dequantizes to f32 (N, K) on the CPU: the exact inverse mapping of the format.
void dequantize_weight(const QuantizedWeightView& w, const TensorView& out);

/// How GPTQ and AWQ tools pack a 4-bit linear layer of n outputs and k inputs in groups of G
/// along k (Hugging Face checkpoints with a quantization_config). Every layout stores, per group,
/// 4-bit codes q, a 4-bit zero z and an f16 scale s with w = s·(q − z):
///   gptq     (AutoGPTQ, GPTQModel, optimum; checkpoint_format "gptq")
///            qweight (k/8, n) s32, packed along k: bits 4j..4j+3 of [i, c] hold q[c, 8i + j];
///            qzeros (k/G, n/8) s32, packed along n: bits 4j.. of [g, c] hold z[g, 8c + j] − 1;
///            scales (k/G, n) f16; g_idx (k) s32, the group of each input, or empty
///   gptq_v2  the same with each zero as it is
///   awq      (AutoAWQ, version "gemm") qweight (k, n/8) and qzeros (k/G, n/8) s32, packed
///            along n in AutoAWQ's order: nibble i of word c holds column 8c + {0,2,4,6,1,3,5,7}[i];
///            zeros as they are; scales (k/G, n) f16
enum class Int4Packing : uint8_t { gptq, gptq_v2, awq };
const char* to_string(Int4Packing p);
/// "gptq", "gptq_v2" or "awq"; throws nibble::Error(invalid_argument) naming the others.
Int4Packing parse_int4_packing(std::string_view name);

/// A checkpoint's quantization_config as Hugging Face tools write it (config.json); keys it
/// lacks keep these defaults.
struct Int4CheckpointConfig {
  std::string quant_method;                ///< "gptq" or "awq", any case
  int64_t bits = 0;                        ///< "bits" (AutoAWQ's older configs: "w_bit")
  int64_t group_size = 0;                  ///< "group_size" (older: "q_group_size"); −1 per channel
  std::string checkpoint_format = "gptq";  ///< GPTQ: "gptq" (zeros stored minus 1) or "gptq_v2"
  std::string version = "gemm";            ///< AWQ's packing, any case
  bool zero_point = true;                  ///< AWQ
  bool lm_head = false;                    ///< the output layer is quantized too
};
/// The packing of such a checkpoint. nibble::Error(unsupported) naming the key for what nibble
/// does not import: other methods (bitsandbytes, fp8, compressed-tensors, ...), bits other than
/// 4, group sizes other than 32, 64, 128, 256 (per channel included), another GPTQ
/// checkpoint_format (e.g. marlin), AWQ GEMV packing or no zero point, a quantized lm_head.
Int4Packing int4_packing_of(const Int4CheckpointConfig& config);

/// Unpacks one such layer (CPU arrays, row-major) into `out`, a weight of format
/// w4_g<G>_asym_sf16 — u4_asym with f16 scales, the same numbers, nothing re-rounded — with
/// out.n = n and out.k ≥ k (k = groups · G; columns past k become zero weights) and contiguous
/// buffers. n and the group count come from scales (k/G, n). Throws nibble::Error naming the
/// argument: unsupported for an act-order g_idx (not k / G: it permutes the inputs, which no
/// nibble format does) and for a gptq zero that overflows to 16 (stored 15 as z − 1);
/// invalid_argument for shapes, dtypes and devices.
void unpack_int4_checkpoint(Int4Packing packing, const TensorView& qweight,
                            const TensorView& qzeros, const TensorView& scales,
                            const TensorView& g_idx, const QuantizedWeightView& out);

/// Operations fused in front of activation quantization: the RMSNorm that precedes a linear
/// layer in Llama, and SmoothQuant's per-channel division. A default-constructed (rank 0, null)
/// view switches its step off; with every view empty the quantizers see x itself. For a row x of
/// dtype T (f32/f16/bf16), step by step (docs/formats.md §6.1 has the exact rounding points):
///
///   RMSNorm:     r    = 1 / sqrt(ms + eps)             ms = mean_k x[k]² (f32, see below)
///                y[k] = round_T(round_T(x[k] · r) · rms_weight[k])      (each product in f32)
///   SmoothQuant: v[k] = y[k] / smooth[k]                                 (one f32 division)
///   quantize v:  per token (s = max_k |v[k]| / qmax) or static (the given scale)
///
/// Without RMSNorm y = x; without smooth v = y. ms is the mean of the squares summed exactly in
/// 62-bit fixed point on a grid set by the row's largest |x| (relative error below 2^-29 for
/// K ≤ 65536), so CPU and GPU agree to the bit whatever their summation order.
struct ActQuantFusion {
  TensorView rms_weight;  ///< (K) x's dtype or f32: RMSNorm weight; empty: no RMSNorm
  float rms_eps = 1e-6f;  ///< RMSNorm epsilon, positive and finite (HF Llama's default 1e-6)
  TensorView smooth;      ///< (K) f32/f16/bf16 SmoothQuant divisor, positive; empty: none
  TensorView normed;      ///< (M, K) x's dtype, any row stride: receives y (needs rms_weight);
                          ///< may be x itself (in place); empty: not written
};

/// Dynamic per-token quantization of x (M, K) f32/f16/bf16: for each row, amax = max|x|,
/// s = amax/qmax (qmax 127 for s8, 7 for s4, 448 for e4m3), q = round(x / s) clamped to
/// [-qmax, qmax] (e4m3: converted with satfinite). A row of zeros gets s = 0 and q = 0.
/// x must be finite: the CPU rejects NaN/inf (invalid_argument); on the GPU such a row gets a
/// non-finite scale, so its linear output is NaN/inf rather than silently finite.
/// Runs on the device of x (CPU reference, or CUDA).
void quantize_activation(const TensorView& x, const QuantizedActivationView& out,
                         Stream stream = nullptr);

/// The same with RMSNorm and/or a SmoothQuant divide fused in front (ActQuantFusion): the row
/// is read once, normalized, divided, its scale found and quantized in one kernel on the GPU.
/// Every fusion view must be on x's device with a contiguous last dimension. On the CPU the
/// values v must come out finite (a zero or tiny smooth[k] is rejected with the position); the
/// GPU does not check smooth, rms_weight or v (a zero smooth[k] gives that row a non-finite
/// scale).
void quantize_activation(const TensorView& x, const QuantizedActivationView& out,
                         const ActQuantFusion& fusion, Stream stream = nullptr);

/// Static per-tensor int8: q = clamp(round(x / scale), -127, 127); out.scales (1) gets scale.
void quantize_activation_static(const TensorView& x, float scale,
                                const QuantizedActivationView& out, Stream stream = nullptr);

/// Static per-tensor int8 of the fused values v (ActQuantFusion): q = clamp(round(v / scale),
/// -127, 127), with the calibrated scale of v (after the norm and the divide).
void quantize_activation_static(const TensorView& x, float scale,
                                const QuantizedActivationView& out, const ActQuantFusion& fusion,
                                Stream stream = nullptr);

/// Dequantizes activations to f32 (M, K) on the CPU.
void dequantize_activation(const QuantizedActivationView& a, const TensorView& out);

/// Packs integers from an s8/u8 tensor (R, C) into a 4-bit s4/u4 tensor (R, C), element 2i in
/// the low nibble. Values must be in the 4-bit range (checked). CPU only.
void pack_int4(const TensorView& unpacked, const TensorView& packed);
/// The inverse of pack_int4: s4 → s8 (sign-extended), u4 → u8.
void unpack_int4(const TensorView& packed, const TensorView& unpacked);

}  // namespace nibble
