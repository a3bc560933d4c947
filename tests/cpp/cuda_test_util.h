// Helpers for the GPU tests: skip without a GPU, random operands with fresh seeds, comparisons
// of device results with CPU reference results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "nibble/nibble.h"

namespace nibble {

#define NIBBLE_REQUIRE_GPU()                                                          \
  do {                                                                                \
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason(); \
  } while (0)

// Relative Frobenius error bound for float outputs computed from the same quantized operands:
// differences come only from f32 summation order and the final rounding to the output dtype.
constexpr double kRelTolF32Out = 1e-5;
constexpr double kRelTolHalfOut = 8e-3;  // bf16 rounding of each output element dominates

inline uint32_t fresh_seed() { return std::random_device{}(); }

inline Tensor random_float(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = Tensor::empty(dtype, {rows, cols});
  std::normal_distribution<float> normal(0.0f, scale);
  std::uniform_int_distribution<int64_t> pick(0, cols - 1);
  const int64_t outlier = pick(rng);  // one outlier channel, as in LLM activations
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      store_float(t.data(), dtype, r * cols + c, normal(rng) * (c == outlier ? 30.0f : 1.0f));
  return t;
}

inline Tensor random_int(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  Tensor t = Tensor::empty(dtype, {rows, cols});
  const int lo = dtype == DType::s8 ? -128 : -8, hi = dtype == DType::s8 ? 127 : 7;
  std::uniform_int_distribution<int> dist(lo, hi);
  for (int64_t i = 0; i < rows * cols; ++i) store_int(t.data(), dtype, i, dist(rng));
  return t;
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.data(), hb.data(), ha.nbytes()) == 0;
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

/// A rank-1 view of the first row of a (1, N) tensor, for bias vectors.
inline TensorView as_vector(const Tensor& t) {
  TensorView v = t.view();
  v.rank = 1;
  v.shape[0] = t.view().numel();
  v.strides[0] = 1;
  return v;
}

}  // namespace nibble
