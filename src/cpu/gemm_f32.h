// Fast float products on the host for the LLM runner and the quantization algorithms:
// y (m, n) = x (m, k) · w (n, k)ᵀ with every output computed exactly as dot_f32 computes it
// (eight interleaved partial sums, lane j taking the elements i ≡ j mod 8 in order, combined as
// ((a0+a4)+(a1+a5))+((a2+a6)+(a3+a7))), so results do not depend on m, on the tile an output
// falls in, nor on how the rows are split over threads. Register tiles of 4 rows of x × 2 rows
// of w reuse each load (the plain dot product reloads both operands for every multiply-add):
// 8 accumulators fit the 16 AVX registers with the loads (4×3 spills; measured on this 2-core
// AMD EPYC, one core, 512×576 · 1536×576: 4×2 23 GMAC/s, 4×3 8.3, 1×1 about 6).
// Compiled for x86-64-v3 (AVX2 + FMA) and the baseline, picked at load time.
#pragma once

#include <cstdint>

namespace nibble::cpu {

/// Dot product of two f32 vectors with the fixed summation order above.
float dot_f32(const float* a, const float* b, int64_t n);

/// y[r·ldy + c] = dot_f32(x + r·ldx, w + c·ldw, k) for r < m, c < n.
void gemm_f32_nt(const float* x, int64_t ldx, int64_t m, const float* w, int64_t ldw, int64_t n,
                 int64_t k, float* y, int64_t ldy);

/// The same with w in bf16 bits (each widened to f32 exactly): what the runner's bf16 mode and
/// its bf16 output projection compute.
void gemm_bf16w_nt(const float* x, int64_t ldx, int64_t m, const uint16_t* w, int64_t ldw,
                   int64_t n, int64_t k, float* y, int64_t ldy);

}  // namespace nibble::cpu
