// The residual-stream fusions of linear (LinearFusion, include/nibble/gemm.h; docs/formats.md
// §6.2) on the GPU: the same sums as the host definitions in common/residual_norm.h, bit for bit.
// A granule's 16 squares are 16 lanes of a half-warp and a row total the 32 lanes of one warp,
// each reduced by an XOR-shuffle butterfly, which is exactly the definitions' tree_n. Used by
// sm80_w4a8_gemm (the kResidual instances) and the unfused path's kernels
// (cuda/generic/residual_norm.cu).
#pragma once

#include <cstdint>

#include "common/rounded_math.h"

namespace nibble::cuda {

/// tree16 over the 16 lanes of each half-warp; every lane of the warp must call it.
__device__ __forceinline__ double half_warp_tree_sum(double v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

/// inv of one row from its granule sums (`sums`, `granules` entries; nullptr for a warp without a
/// row, which then gets the inv of a zero row), in every lane. Every lane of the warp must call
/// it. inv_k = RN64(1/K).
__device__ __forceinline__ float warp_rms_inverse(const double* sums, int granules, double inv_k,
                                                  float eps) {
  double lane_sum = 0.0;
  if (sums != nullptr) {
#pragma unroll 4
    for (int b = static_cast<int>(threadIdx.x % 32); b < granules; b += 32)
      lane_sum = __dadd_rn(lane_sum, __ldg(sums + b));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    lane_sum = __dadd_rn(lane_sum, __shfl_xor_sync(0xFFFFFFFFu, lane_sum, o));
  const float ms = __double2float_rn(__dmul_rn(lane_sum, inv_k));
  return detail::reciprocal_sqrt_rn(__fadd_rn(ms, eps));  // 1 / sqrt(ms + eps)
}

/// y = RN(RN(x · inv) · w).
__device__ __forceinline__ float rms_apply(float x, float inv, float w) {
  return __fmul_rn(__fmul_rn(x, inv), w);
}

/// The element of d this thread adds to in the first pass of store_residual_tile(begin, end,
/// m0, n0), or 0 where it has none: loaded early, its L2 round trip is off the epilogue's path.
template <int BN>
__device__ __forceinline__ float first_residual(const float* d, int64_t ldd, int n, int begin,
                                                int end, int m0, int n0) {
  const int i = begin + static_cast<int>(threadIdx.x), col = n0 + i % BN;
  return i < end && col < n ? d[int64_t(m0 + i / BN) * ldd + col] : 0.0f;
}

/// Stores elements [begin, end) of a row-major BM×BN output tile at (m0, n0) — begin, end, BN
/// and n0 multiples of 16 — one element per thread per pass: d = v or d + v (f32), v =
/// value(i, row, col) for the elements inside N, the first pass adding first_d (this thread's
/// first_residual) instead of reading d again; with `sums`, each granule's tree16 of the stored
/// values' squares into sums[row·ld_sums + col/16]. Every thread of the block calls it.
template <int BN, int kThreads, class Value>
__device__ __forceinline__ void store_residual_tile(float* d, int64_t ldd, int n, bool accumulate,
                                                    float first_d, double* sums, int64_t ld_sums,
                                                    int begin, int end, int m0, int n0,
                                                    Value&& value) {
  static_assert(BN % 16 == 0 && kThreads % 32 == 0, "granules are half-warps of one tile row");
  for (int base = begin; base < end; base += kThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    const int row = m0 + i / BN, col = n0 + i % BN;
    const bool inside = i < end && col < n;
    double square = 0.0;
    if (inside) {
      float v = value(i, row, col);
      float* at = d + int64_t(row) * ldd + col;
      if (accumulate) v = __fadd_rn(base == begin ? first_d : *at, v);
      *at = v;
      square = __dmul_rn(double(v), double(v));
    }
    if (sums != nullptr) {
      square = half_warp_tree_sum(square);
      if (inside && i % 16 == 0) sums[int64_t(row) * ld_sums + col / 16] = square;
    }
  }
}

}  // namespace nibble::cuda
