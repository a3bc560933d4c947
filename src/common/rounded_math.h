// Correctly rounded f32 division and square root built from multiplications and FMAs only,
// for the activation kernel (src/cuda/generic/act_quant.cu) and its host tests.
//
// Why: CUDA's IEEE division and square root (__fdiv_rn, __fsqrt_rn, __frcp_rn, __ddiv_rn) end
// in a call to a slow-path subroutine, and a call in a kernel that keeps a whole row in
// registers makes ptxas save registers around it (spills) in ways that change from build to
// build. These functions give the same bits as the IEEE operations without any call:
//
//   divide_by_reciprocal(v, s, RN(1/s))  three operations (Markstein's correction step):
//       q0 = RN(v·y), r = v − q0·s (exact, one FMA), q = RN(q0 + r·y) = RN(v/s), for
//       s ∈ [2^-22, 2) and |v/s| ≤ 2^14 (the caller scales s by a power of two into range)
//   divide_rn(a, b, seed)                RN32(a/b) for any finite a, b ≠ 0 with a finite quotient:
//       the f64 reciprocal of b refined from `seed` by three Newton steps, times a, rounded to
//       f32 — exact because a quotient of two f32 is either representable or at least 2^-50
//       (relative) away from every rounding boundary of f32's normal range, farther than the
//       f64 error (≈ 2^-52); in the subnormal range, where exact ties exist (2^-149 / 2), the
//       last step is redone exactly on the integer grid of 2^-149
//   divide_rn_f32_seed(a, b, y0)         RN32(a/b) in f32 for |a|, |b| ∈ [2^-60, 2^61) from a
//       seed within 2 ulp of 1/b: one Newton step and Markstein's correction (the sequence of
//       CUDA's division when its range check passes); divide() picks it or divide_rn
//   sqrt_rn(t, seed)                     RN32(sqrt(t)) for finite t > 0: the f64 1/sqrt(t)
//       refined from `seed` by three Newton steps, times t, one Heron correction, rounded to
//       f32 (a square root of an f32 is never within 2^-51 of an f32 boundary)
//
// On the GPU the seeds are rcp.approx / rsqrt.approx .ftz.f64 (MUFU); three Newton steps make
// the result independent of the seed's last bits (they converge from a seed as poor as 2^-6).
// Verified on the host against IEEE f32 with seeds perturbed by up to 2^-8:
//   divide_rn: 9·10^8 pairs (random sign/exponent/significand including subnormals, every
//     significand of a for six divisors at four exponents, exact subnormal ties ±2 ulp);
//   sqrt_rn and divide_rn(1, t): every positive finite f32 t;
//   f32(f64(a) · RN64(1/qmax)) == a / qmax for every non-negative finite a, qmax 7, 127, 448;
//   divide_by_reciprocal: 1.75·10^9 pairs (divisors in [2^-64, 2^100], quotients 2^-45…2^14);
//   divide_rn_f32_seed: 10^9 random pairs in its range, seeds off by up to ±2 ulp.
// tests/cpp/test_quantize_fusion.cpp repeats a sample of these on every run.
#pragma once

#include <math.h>
#include <string.h>

#include <cmath>
#include <cstdint>

#include "common/host_device.h"

namespace nibble::detail {

#if defined(__CUDA_ARCH__)
#define NIBBLE_FMA(a, b, c) __fma_rn(a, b, c)
#define NIBBLE_FMAF(a, b, c) __fmaf_rn(a, b, c)
#define NIBBLE_DMUL(a, b) __dmul_rn(a, b)
#else
#define NIBBLE_FMA(a, b, c) std::fma(a, b, c)
#define NIBBLE_FMAF(a, b, c) std::fma(a, b, c)
#define NIBBLE_DMUL(a, b) ((a) * (b))
#endif

/// divide_by_reciprocal up to the sign of a zero quotient (which can come out +0 for v = -0):
/// for integer codes, to which ±0 are the same.
NIBBLE_HOST_DEVICE inline float divide_by_reciprocal_any_zero_sign(float v, float s, float y) {
#if defined(__CUDA_ARCH__)
  const float q0 = __fmul_rn(v, y);
#else
  const float q0 = v * y;
#endif
  return NIBBLE_FMAF(NIBBLE_FMAF(-q0, s, v), y, q0);
}

/// RN(v / s) from y = RN(1 / s), for s ∈ [2^-22, 2) and |v / s| ≤ 2^14 (see above).
NIBBLE_HOST_DEVICE inline float divide_by_reciprocal(float v, float s, float y) {
#if defined(__CUDA_ARCH__)
  return copysignf(divide_by_reciprocal_any_zero_sign(v, s, y), v);
#else
  return std::copysign(divide_by_reciprocal_any_zero_sign(v, s, y), v);
#endif
}

/// 1/b in f64 to about 2^-52, from a seed within 2^-6 of it.
NIBBLE_HOST_DEVICE inline double refine_reciprocal(double b, double y) {
  for (int i = 0; i < 3; ++i) y = NIBBLE_FMA(y, NIBBLE_FMA(-b, y, 1.0), y);
  return y;
}

/// RN32(a / b) for finite a, b ≠ 0 whose quotient is finite, `seed` ≈ 1/b (see above).
NIBBLE_HOST_DEVICE inline float divide_rn(float a, float b, double seed) {
  const double ad = a, bd = b;
  const double q = NIBBLE_DMUL(ad, refine_reciprocal(bd, seed));
  if (!(fabs(q) < 0x1p-125)) return static_cast<float>(q);
  // Subnormal range: n = rne(a/b · 2^149) from an estimate within one, with the exact
  // remainder a·2^149 − n·b (n < 2^24 and b have 48 bits together: exact in f64).
  double n = nearbyint(NIBBLE_DMUL(q, 0x1p149));
  const double rem = NIBBLE_FMA(-n, bd, NIBBLE_DMUL(ad, 0x1p149));
  const double twice = 2.0 * fabs(rem), mag = fabs(bd);
  const double step = (rem < 0) != (bd < 0) ? -1.0 : 1.0;  // toward the exact quotient
  const bool odd = (static_cast<long long>(n) & 1) != 0;
  if (twice > mag || (twice == mag && odd)) n += step;
  return copysignf(static_cast<float>(NIBBLE_DMUL(fabs(n), 0x1p-149)), static_cast<float>(q));
}

/// RN32(a / b) by the f32 sequence CUDA's own division takes when its operands are in range:
/// a reciprocal seed y0 within 2 ulp of 1/b (MUFU.RCP is within 1), one Newton step, then
/// Markstein's correction. For |a|, |b| ∈ [2^-60, 2^61) nothing overflows or underflows and
/// the result is exact (host-checked with seeds off by up to ±2 ulp).
NIBBLE_HOST_DEVICE inline float divide_rn_f32_seed(float a, float b, float y0) {
  const float y1 = NIBBLE_FMAF(y0, NIBBLE_FMAF(-b, y0, 1.0f), y0);
#if defined(__CUDA_ARCH__)
  const float q0 = __fmul_rn(a, y1);
#else
  const float q0 = a * y1;
#endif
  return NIBBLE_FMAF(NIBBLE_FMAF(-b, q0, a), y1, q0);
}

/// Whether |a| and |b| are in [2^-60, 2^61), where divide_rn_f32_seed is exact.
NIBBLE_HOST_DEVICE inline bool in_f32_division_range(float a, float b) {
  uint32_t ua, ub;
  memcpy(&ua, &a, 4);
  memcpy(&ub, &b, 4);
  return ((ua >> 23) & 0xFFu) - 67u <= 120u && ((ub >> 23) & 0xFFu) - 67u <= 120u;
}

/// RN32(sqrt(t)) for finite t > 0, `seed` ≈ 1/sqrt(t) (see above).
NIBBLE_HOST_DEVICE inline float sqrt_rn(float t, double seed) {
  const double td = t;
  double y = seed;
  for (int i = 0; i < 3; ++i) y = NIBBLE_FMA(0.5 * y, NIBBLE_FMA(-NIBBLE_DMUL(td, y), y, 1.0), y);
  const double s = NIBBLE_DMUL(td, y);
  return static_cast<float>(NIBBLE_FMA(NIBBLE_FMA(-s, s, td), 0.5 * y, s));
}

#if defined(__CUDACC__)
/// Seeds: the hardware approximations (MUFU.RCP64H / MUFU.RSQ64H), no subroutine call.
__device__ __forceinline__ double reciprocal_seed(double b) {
  double y;
  asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(y) : "d"(b));
  return y;
}
__device__ __forceinline__ double rsqrt_seed(double t) {
  double y;
  asm("rsqrt.approx.ftz.f64 %0, %1;" : "=d"(y) : "d"(t));
  return y;
}
__device__ __forceinline__ float reciprocal_seed_f32(float b) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(b));
  return y;
}

/// RN32(1 / RN32(sqrt(t))) for t > 0 (RMSNorm's r), each step correctly rounded without a
/// subroutine call; t = +inf (a mean square that overflowed f32) gives 0 as IEEE's sqrt and
/// division do — the refinements alone would turn it into NaN.
__device__ __forceinline__ float reciprocal_sqrt_rn(float t) {
  if (t == INFINITY) return 0.0f;
  const float u = sqrt_rn(t, rsqrt_seed(t));
  return divide_rn(1.0f, u, reciprocal_seed(u));
}

/// RN32(a / b) for finite a, b ≠ 0 with a finite quotient: the f32 sequence in range, the f64
/// one (divide_rn) otherwise; a zero a gives IEEE's signed zero.
__device__ __forceinline__ float divide(float a, float b) {
  if (a == 0.0f) return __fmul_rn(a, b);
  if (in_f32_division_range(a, b)) return divide_rn_f32_seed(a, b, reciprocal_seed_f32(b));
  return divide_rn(a, b, reciprocal_seed(b));
}
#endif

#undef NIBBLE_FMA
#undef NIBBLE_FMAF
#undef NIBBLE_DMUL

}  // namespace nibble::detail
