// The producer side of a Hopper TMA ring launched to overlap the kernel before it
// (cuda/launch/pdl_launch.h, the cluster-split grids of sm90_w4a8_gemm and
// sm90_weight_only_gemm): one thread issues the weight half of the ring's first stages before
// ptx::griddep_wait and everything else after it, as cuda/common/overlap_prologue.cuh does for
// the cp.async pipelines of the sm80 kernels.
#pragma once

#include <cstdint>

#include "cuda/common/overlap_prologue.cuh"
#include "cuda/common/ptx_sm90.cuh"

namespace nibble::cuda {

/// The producer loop of a TMA ring's one tile (K blocks [kb_begin, kb_begin + num_kb)),
/// issued by the producer thread of a CTA launched to overlap the kernel before it: the weight
/// parts of the first min(kStages, num_kb) stages before ptx::griddep_wait, their activation
/// parts after it, then the remaining K blocks whole, each once the consumers have freed its
/// stage (`empty`, the ring's phase parity). load_stage(stage, kb, parts) must make the stage's
/// `full` barrier expect all of the stage's bytes with its weight part, so the barrier
/// completes only once the activations have landed too.
template <int kStages, class LoadStage>
__device__ __forceinline__ void load_tma_tile_overlapped(int kb_begin, int num_kb,
                                                         uint64_t* empty,
                                                         LoadStage&& load_stage) {
  const int early = num_kb < kStages ? num_kb : kStages;
  for (int s = 0; s < early; ++s) load_stage(s, kb_begin + s, kStageWeights);
  ptx::griddep_wait();
  for (int s = 0; s < early; ++s) load_stage(s, kb_begin + s, kStageActivations);
  for (int it = early; it < num_kb; ++it) {
    const int s = it % kStages;
    if (it >= kStages) ptx::mbarrier_wait(&empty[s], ((it / kStages) + 1) & 1);
    load_stage(s, kb_begin + it, kStageAll);
  }
}

}  // namespace nibble::cuda
