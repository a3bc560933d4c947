// The residual-stream fusions of linear (LinearFusion, include/nibble/gemm.h) as kernels of their
// own: the path taken where sm80_w4a8_gemm cannot run them inside (M > 4, 16-bit x, a split-K
// workspace tile). Same definitions and bits as the fused kernel (common/residual_norm.h).
#pragma once

#include <cstdint>

#include "cuda/common/operand.h"
#include "nibble/types.h"

namespace nibble::cuda {

/// y (M, K) f32, row stride ldy = RMSNorm of x (M, K) f32/f16/bf16 from its granule sums
/// (M, ceil(K/16)) f64 and weights w (K) f32.
void launch_rms_from_sums(int64_t m, int64_t k, const Operand& x, const double* sums,
                          int64_t sums_ld, const float* w, float eps, float* y, int64_t ldy,
                          Stream stream);

/// d (M, N) f32 = t (+ d when accumulate), t (M, N) f32 with row stride ldt; with `sums`, the
/// granule sums of the stored d into (M, ceil(N/16)) f64.
void launch_residual_store(int64_t m, int64_t n, const float* t, int64_t ldt, float* d,
                           int64_t ldd, bool accumulate, double* sums, int64_t sums_ld,
                           Stream stream);

}  // namespace nibble::cuda
