// Element access for the CPU reference: (row, column) of a rank-1 or rank-2 view with a
// contiguous last dimension and any row stride. Rank-1 views ignore the column.
#pragma once

#include <cstdint>
#include <vector>

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

/// Row r of an integer tensor (rank 2) widened to int32, 4-bit values unpacked.
void load_int_row(const TensorView& t, int64_t r, int64_t cols, std::vector<int32_t>& row);

/// Row n of the integer weights the GEMMs multiply: q, or for the two-level format the exact
/// int8 weight w8 = g_s · (q − g_z).
void load_weight_int_row(const QuantizedWeightView& w, int64_t n, std::vector<int32_t>& row);

/// Row n of deq(W) as f32, the format's exact inverse mapping (`q` is scratch for the integers).
void dequantize_weight_row(const QuantizedWeightView& w, int64_t n, std::vector<int32_t>& q,
                           std::vector<float>& row);

}  // namespace nibble::cpu
