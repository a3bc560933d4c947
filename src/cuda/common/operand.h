// A kernel operand passed by value: base pointer, dtype and row stride in elements. Rank-1
// tensors use their element stride as the row stride and are indexed as (i, 0).
#pragma once

#include <cstdint>

#include "nibble/types.h"

namespace nibble::cuda {

struct Operand {
  const void* data = nullptr;
  DType dtype = DType::f32;
  int64_t row_stride = 0;
};

inline Operand operand(const TensorView& t) {
  if (t.data == nullptr) return {};
  return {t.data, t.dtype, t.stride(0)};
}

}  // namespace nibble::cuda
