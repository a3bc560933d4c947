// The bf16 tensor-core instructions of the runner's prefill attention (sm_80+) that
// src/cuda/common/ptx.cuh (the int8 GEMMs' wrappers, re-exported here) lacks. One instruction
// per wrapper; the comments give the fragment layouts.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace nibble::llm::cuda::ptx {

using nibble::cuda::ptx::cp_async_16;
using nibble::cuda::ptx::cp_async_commit;
using nibble::cuda::ptx::cp_async_wait;
using nibble::cuda::ptx::ldmatrix_x4;
using nibble::cuda::ptx::smem_addr;

/// ldmatrix.x4.trans: as ldmatrix_x4, each 8×8 b16 matrix transposed on the way (lane l gets
/// elements (2(l%4), l/4) and (2(l%4)+1, l/4) of each matrix). For a row-major (k, n) tile this
/// yields the "col" B fragment of mma.m16n8k16 (the runner's P·V, V stored key-major).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}

/// D = A·B + D with bf16 operands and f32 accumulators, m16n8k16, A row-major, B column-major.
/// Fragments (g = lane/4, c = lane%4; each register holds two bf16, the lower k in the low half):
///   a[0]: row g,   k 2c, 2c+1      a[1]: row g+8, k 2c, 2c+1
///   a[2]: row g,   k 2c+8, 2c+9    a[3]: row g+8, k 2c+8, 2c+9
///   b[0]: col g,   k 2c, 2c+1      b[1]: col g,   k 2c+8, 2c+9
///   d[0..1]: row g, cols 2c, 2c+1  d[2..3]: row g+8, cols 2c, 2c+1
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace nibble::llm::cuda::ptx
