// The CPU reference: the normative definition of every format and operation.
//
// These functions assume validated arguments (src/api/ validates); they handle any row stride
// with a contiguous last dimension. Integer accumulations are exact; float work is f32.
#pragma once

#include <cstdint>

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
void quantize_activation(const TensorView& x, const QuantizedActivationView& out);
void quantize_activation_static(const TensorView& x, float scale,
                                const QuantizedActivationView& out);
void dequantize_activation(const QuantizedActivationView& a, const TensorView& out);
void pack_int4(const TensorView& unpacked, const TensorView& packed);
void unpack_int4(const TensorView& packed, const TensorView& unpacked);

void gemm_s32(const TensorView& a, const TensorView& w, const TensorView& d);
void linear(const QuantizedActivationView& a, const QuantizedWeightView& w,
            const TensorView* bias, const TensorView& d);
void linear(const TensorView& x, const QuantizedWeightView& w, const TensorView* bias,
            const TensorView& d);

}  // namespace nibble::cpu
