// The prologue of a decode-tile GEMM launched to overlap the kernel before it
// (cuda/launch/pdl_launch.h): let the next kernel start, ask L2 for this CTA's first weight
// blocks, then wait for the earlier kernels. The prefetch runs while the previous kernel
// finishes, so the pipeline's first cp.async loads hit L2 instead of paying HBM's latency after
// the launch. Without the overlapping launch attribute the wait returns at once and the
// prefetch only warms L2 a moment early.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace nibble::cuda {

/// Lets the next kernel start, asks L2 for `bytes` (a multiple of 16) at each of `rows` rows
/// of this CTA's weights (`first`, rows `pitch` bytes apart, 16-byte aligned; thread r asks for
/// row r, so rows ≤ the block's threads), then waits for the earlier kernels. Every thread of the
/// CTA calls it.
__device__ __forceinline__ void overlap_prologue(const uint8_t* first, int64_t pitch, int rows,
                                                 int bytes) {
  ptx::griddep_launch_dependents();
  const int r = static_cast<int>(threadIdx.x);
  if (r < rows && bytes > 0) ptx::prefetch_l2(first + r * pitch, static_cast<uint32_t>(bytes));
  ptx::griddep_wait();
}

/// The same for the blocked layouts (w4_mma_k128, w4_mma16_k128, w8_mma16_k128): n8 row nb's
/// 8×128 blocks are contiguous, block (nb, kb) at (nb·kblocks + kb)·block_bytes. Asks for the
/// first `prefetch_blocks` of this CTA's num_kb blocks from kb_begin, in its rows8 n8 rows
/// from first_row8, skipping rows at or past rows8_total (the last tile's padding).
__device__ __forceinline__ void overlap_prologue_blocked(const uint8_t* w, int first_row8, int rows8,
                                                         int rows8_total, int kblocks,
                                                         int kb_begin, int num_kb,
                                                         int block_bytes, int prefetch_blocks) {
  const int blocks = num_kb < prefetch_blocks ? num_kb : prefetch_blocks;
  const int rows = rows8_total - first_row8 < rows8 ? rows8_total - first_row8 : rows8;
  overlap_prologue(w + (int64_t(first_row8) * kblocks + kb_begin) * block_bytes,
                   int64_t(kblocks) * block_bytes, rows, blocks * block_bytes);
}

}  // namespace nibble::cuda
