// nibble — host conversions between f32 and the narrow float formats, and the rounding rule.
//
// These are the normative conversions of the CPU reference: round to nearest, ties to even,
// in every direction; f16/bf16 overflow to ±inf; e4m3 saturates to ±448 (the `satfinite` mode
// of the CUDA intrinsics). The GPU kernels use the matching hardware conversions.
#pragma once

#include <cmath>
#include <cstdint>

#include "nibble/types.h"

namespace nibble {

uint16_t f32_to_f16_bits(float x);
float f16_bits_to_f32(uint16_t h);
uint16_t f32_to_bf16_bits(float x);
float bf16_bits_to_f32(uint16_t h);
uint8_t f32_to_e4m3_bits(float x);
float e4m3_bits_to_f32(uint8_t b);

/// Rounds `x` to the nearest value representable in `t` (f32, f16, bf16 or e4m3) and returns it
/// as f32. Used to make the reference compute with exactly the scales that get stored.
float round_to_dtype(float x, DType t);

/// Round half to even, the rounding of every quantizer (`__float2int_rn` on the GPU).
inline float round_half_even(float x) { return std::nearbyint(x); }

/// Reads element `i` of a contiguous float buffer of dtype f32/f16/bf16/e4m3 as f32.
float load_float(const void* base, DType t, int64_t i);
/// Writes `x`, rounded to dtype `t` (f32/f16/bf16/e4m3), to element `i` of a float buffer.
void store_float(void* base, DType t, int64_t i, float x);

/// Reads element `i` of a contiguous integer buffer of dtype s8/u8/s4/u4/s32.
int32_t load_int(const void* base, DType t, int64_t i);
/// Writes element `i` of an integer buffer; the value must be in the dtype's range.
void store_int(void* base, DType t, int64_t i, int32_t v);

}  // namespace nibble
