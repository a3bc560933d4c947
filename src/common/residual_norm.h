// The sums of the residual-stream fusions of linear (LinearFusion, include/nibble/gemm.h;
// docs/formats.md §6.2), host side: the normative definitions the CUDA kernels reproduce bit for
// bit (cuda/common/residual_norm.cuh).
//
//   granule sums  s[b] = tree16_{i < 16} f64(d[16b + i])²    (columns past N: +0)
//   row total     t    = tree32_{l < 32} L[l],  L[l] = Σ_{b ≡ l mod 32, b ascending} s[b]
//   tree_n        v[i] ← v[i] + v[i XOR o] for o = n/2, ..., 1 (all i at once); the sum is v[0]
//   norm          ms   = f32(t · RN64(1/K));  inv = 1 / sqrt(ms + eps)  (f32, correctly rounded)
//                 y[k] = RN(RN(x[k] · inv) · w[k])                       (f32)
//
// Why trees: on the GPU a granule is 16 lanes of a half-warp and the row total one warp's lanes,
// each reduced by XOR shuffles; the shuffle butterfly is exactly tree_n (every lane ends with
// v[0], as the additions are commutative), so the CPU reproduces it. Squares of f32 values are
// exact in f64. ms and inv follow ActQuantFusion's RMSNorm (§6.1): a product with the f64
// reciprocal of K, f32 add, sqrt and division.
#pragma once

#include <cmath>
#include <cstdint>

#include "nibble/gemm.h"

namespace nibble::detail {

/// Lanes of the row total's first level (the granule is nibble::kSumsqGranule columns).
constexpr int kSumsqLanes = 32;

/// tree_n over v[0..n) (n a power of two), in place; returns the sum.
inline double tree_sum(double* v, int n) {
  double w[kSumsqLanes];
  for (int o = n / 2; o > 0; o /= 2) {
    for (int i = 0; i < n; ++i) w[i] = v[i] + v[i ^ o];
    for (int i = 0; i < n; ++i) v[i] = w[i];
  }
  return v[0];
}

/// s[b] for a row of n f32 values `d` (s has sumsq_granules(n) entries).
inline void granule_sums(const float* d, int64_t n, double* s) {
  for (int64_t b = 0; b < sumsq_granules(n); ++b) {
    double v[kSumsqGranule];
    for (int i = 0; i < kSumsqGranule; ++i) {
      const int64_t c = b * kSumsqGranule + i;
      v[i] = c < n ? static_cast<double>(d[c]) * static_cast<double>(d[c]) : 0.0;
    }
    s[b] = tree_sum(v, kSumsqGranule);
  }
}

/// inv of a row from its granule sums s[0..granules) (K columns, eps > 0).
inline float rms_inverse(const double* s, int64_t granules, int64_t k, float eps) {
  double lanes[kSumsqLanes];
  for (int l = 0; l < kSumsqLanes; ++l) {
    lanes[l] = 0.0;
    for (int64_t b = l; b < granules; b += kSumsqLanes) lanes[l] += s[b];
  }
  const double t = tree_sum(lanes, kSumsqLanes);
  const auto ms = static_cast<float>(t * (1.0 / static_cast<double>(k)));
  const float u = std::sqrt(ms + eps);
  return 1.0f / u;
}

/// y = RN(RN(x · inv) · w) in f32 (two products: nothing to contract into an FMA).
inline float rms_apply(float x, float inv, float w) { return (x * inv) * w; }

}  // namespace nibble::detail
