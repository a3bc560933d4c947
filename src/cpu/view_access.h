// Element access for the CPU reference: (row, column) of a rank-1 or rank-2 view with a
// contiguous last dimension and any row stride. Rank-1 views ignore the column.
#pragma once

#include <cstdint>

#include "nibble/numeric.h"
#include "nibble/quantize.h"
#include "nibble/types.h"

namespace nibble::cpu {

inline int64_t element_offset(const TensorView& t, int64_t r, int64_t c) {
  return t.rank == 1 ? r * t.stride(0) : r * t.stride(0) + c * t.stride(1);
}
inline float get_float(const TensorView& t, int64_t r, int64_t c) {
  return load_float(t.data, t.dtype, element_offset(t, r, c));
}
inline void set_float(const TensorView& t, int64_t r, int64_t c, float v) {
  store_float(t.data, t.dtype, element_offset(t, r, c), v);
}
inline int32_t get_int(const TensorView& t, int64_t r, int64_t c) {
  return load_int(t.data, t.dtype, element_offset(t, r, c));
}
inline void set_int(const TensorView& t, int64_t r, int64_t c, int32_t v) {
  store_int(t.data, t.dtype, element_offset(t, r, c), v);
}

/// The exact int8 weight of the two-level format: w8 = g_s · (q − g_z).
inline int32_t two_level_w8(const QuantizedWeightView& w, int64_t n, int64_t k) {
  const int64_t gi = k / w.format.group_size;
  return get_int(w.group_scales, n, gi) * (get_int(w.q, n, k) - get_int(w.zeros, n, gi));
}

/// One element of deq(W) as f32 (the format's exact inverse mapping).
float dequantize_weight_element(const QuantizedWeightView& w, int64_t n, int64_t k);

}  // namespace nibble::cpu
