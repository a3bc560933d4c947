// Helpers for the GPU tests: skip without a GPU, and compare device results with CPU reference
// results computed from the same quantized operands. Random data comes from test_util.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "nibble/nibble.h"
#include "test_util.h"

namespace nibble {

#define NIBBLE_REQUIRE_GPU()                                                          \
  do {                                                                                \
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason(); \
  } while (0)

// Relative Frobenius error bound for float outputs computed from the same quantized operands:
// differences come only from f32 summation order and the final rounding to the output dtype.
constexpr double kRelTolF32Out = 1e-5;
constexpr double kRelTolHalfOut = 8e-3;  // bf16 rounding of each output element dominates

/// Bit-identical contents, wherever each tensor lives.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return test::bytes_of(a) == test::bytes_of(b);
}

inline double rel_error(const Tensor& got, const Tensor& ref) {
  const Tensor g = got.to(Device::cpu());
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.view().numel(); ++i) {
    const double x = load_float(g.data(), g.view().dtype, i);
    const double y = load_float(ref.data(), ref.view().dtype, i);
    if (!std::isfinite(x)) return INFINITY;  // also catches unwritten (poisoned) elements
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace nibble
