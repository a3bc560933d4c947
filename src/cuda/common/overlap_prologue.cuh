// The prologue of a decode-tile GEMM launched to overlap the kernel before it
// (cuda/launch/pdl_launch.h): let the next kernel start, ask L2 for some of this CTA's weight
// blocks, issue the pipeline's first weight stages into shared memory, and only then wait for
// the earlier kernels (ptx::griddep_wait) and load the activations. The weights' HBM latency
// and transfer overlap the previous kernel's tail; a decode tile's CTA often has no more K
// blocks than its ring holds, so its whole weight stream can be in flight before the wait.
// Without the overlapping launch attribute the wait returns at once and nothing changes.
// Loading weights before the wait is safe because a weight is never the output of a kernel
// that lets its dependents start early (ptx::griddep_launch_dependents): those kernels write
// activations only. Used by sm80_w4a8_gemm and sm80_weight_only_gemm, and
// (cuda/sm90/overlapped_tma_producer.cuh) by the cluster-split grids of sm90_w4a8_gemm and
// sm90_weight_only_gemm.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace nibble::cuda {

/// Lets the next kernel start and asks L2 for `bytes` (a multiple of 16) at each of `rows` rows
/// of this CTA's weights (`first`, rows `pitch` bytes apart, 16-byte aligned; thread r asks for
/// row r, so rows ≤ the block's threads). Every thread of the CTA calls it; the CTA must then
/// call ptx::griddep_wait before reading anything an earlier kernel writes.
__device__ __forceinline__ void overlap_prologue_start(const uint8_t* first, int64_t pitch,
                                                       int rows, int bytes) {
  ptx::griddep_launch_dependents();
  const int r = static_cast<int>(threadIdx.x);
  if (r < rows && bytes > 0) ptx::prefetch_l2(first + r * pitch, static_cast<uint32_t>(bytes));
}

/// overlap_prologue_start for the blocked layouts (w4_mma_k128, w4_mma16_k128, w8_mma16_k128):
/// n8 row nb's 8×128 blocks are contiguous, block (nb, kb) at (nb·kblocks + kb)·block_bytes.
/// Asks for `blocks` blocks from kb_first in the CTA's rows8 n8 rows from first_row8, skipping
/// rows at or past rows8_total (the last tile's padding).
__device__ __forceinline__ void overlap_prologue_start_blocked(const uint8_t* w, int first_row8,
                                                               int rows8, int rows8_total,
                                                               int kblocks, int kb_first,
                                                               int blocks, int block_bytes) {
  const int rows = rows8_total - first_row8 < rows8 ? rows8_total - first_row8 : rows8;
  overlap_prologue_start(w + (int64_t(first_row8) * kblocks + kb_first) * block_bytes,
                         int64_t(kblocks) * block_bytes, rows, blocks * block_bytes);
}

/// The parts of a pipeline stage a GEMM's load_stage(stage, kb, parts) issues: the activation
/// half (an earlier kernel's output), the weight half (weights, group data), or both.
enum StageParts : int { kStageActivations = 1, kStageWeights = 2, kStageAll = 3 };

/// Issues the first kStages − 1 stages of a cp.async pipeline from K block kb_begin, one commit
/// group each (num_kb blocks in all). With kOverlap (a decode tile launched to overlap the
/// kernel before it, after overlap_prologue_start) the weight halves of the first `early`
/// stages go out before ptx::griddep_wait and their activation halves after it, so the first
/// commit group holds those weight loads and stage 0's activations: the main loop's wait for
/// stage 0 covers them.
template <bool kOverlap, int kStages, class LoadStage>
__device__ __forceinline__ void load_prologue_stages(int kb_begin, int num_kb, int early,
                                                     LoadStage&& load_stage) {
  if constexpr (kOverlap) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s)
      if (s < early) load_stage(s, kb_begin + s, kStageWeights);
    ptx::griddep_wait();
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_kb)
      load_stage(s, kb_begin + s, kOverlap && s < early ? kStageActivations : kStageAll);
    ptx::cp_async_commit();
  }
}

}  // namespace nibble::cuda
