// The CPU reference: the normative definition of every format and operation.
//
// These functions assume validated arguments (src/api/ validates); they handle any row stride
// with a contiguous last dimension. Integer accumulations are exact; float work is f32.
#pragma once

#include <cstdint>
#include <vector>

#include "nibble/quantize.h"
#include "nibble/types.h"

namespace nibble::cpu {

/// The stored weight scale of formats.md: range / span rounded to dtype t, then nudged up until
/// span steps cover range. Throws out_of_range (naming `row`) when it overflows t.
float stored_scale(float range, float span, DType t, int64_t row);
/// (scale == 0) ? 0 : clamp(rne(x / scale), lo, hi), the f32 division of every quantizer.
int quantize_int(float x, float scale, int lo, int hi);

void quantize_weight(const TensorView& w, const QuantizedWeightView& out);
void dequantize_weight(const QuantizedWeightView& w, const TensorView& out);

/// Activation quantization runs in two steps so that the API can check the fused values before
/// any output is written: fuse_activation computes, for x (M, K) and ActQuantFusion, the values
/// v that get quantized and the normalized rows y (both (M, K) row-major f32; y holds values of
/// x's dtype and is empty without RMSNorm); the quantizers then write q and the scales.
struct FusedActivation {
  int64_t m = 0, k = 0;
  std::vector<float> v, y;
};
FusedActivation fuse_activation(const TensorView& x, const ActQuantFusion& fusion);
void quantize_activation(const FusedActivation& a, const QuantizedActivationView& out);
void quantize_activation_static(const FusedActivation& a, float scale,
                                const QuantizedActivationView& out);
void store_normed(const FusedActivation& a, const TensorView& normed);

/// RMSNorm's mean of squares of a row (docs/formats.md §6.1): with amax = max|x| < 2^e, the
/// terms rne(x² · 2^(bits − 2e)) are summed exactly in a uint64, and
/// ms = f32(f64(sum) · 2^(2e − bits) · RN64(1/K)); 0 for a zero row.
float rms_mean_square(const float* row, int64_t k);
/// bits = 62 − ceil(log2 K): K terms of at most 2^bits sum to at most 2^62.
int rms_fixed_point_bits(int64_t k);
void dequantize_activation(const QuantizedActivationView& a, const TensorView& out);
void pack_int4(const TensorView& unpacked, const TensorView& packed);
void unpack_int4(const TensorView& packed, const TensorView& unpacked);

void gemm_s32(const TensorView& a, const TensorView& w, const TensorView& d);
void linear(const QuantizedActivationView& a, const QuantizedWeightView& w,
            const TensorView* bias, const TensorView& d);
void linear(const TensorView& x, const QuantizedWeightView& w, const TensorView* bias,
            const TensorView& d);

}  // namespace nibble::cpu
