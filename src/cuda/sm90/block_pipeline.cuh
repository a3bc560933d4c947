// The consumers' main loop of the register-A wgmma kernels (sm90_w4a8_gemm's integer formats,
// sm90_weight_only_gemm): one K block's wgmma group stays in flight while the next block's A
// fragments are converted and its wgmma issued.
//
//   issue_block(it, frag)  waits for block it's stage, converts into `frag`, issues and commits
//                          the block's wgmma; returns the stage, or -1 when the caller's unit
//                          is part of a block whose stage a later unit releases
//   keep_until_here(frag)  a register fence: wgmma reads its register operands asynchronously,
//                          so a block's fragments must stay untouched until its group has
//                          completed, which this fence after the wait records
//   release(stage)         hands the stage back to the producer
//
// Fragments alternate between two register sets with compile-time indices (the loop is
// unrolled by two); a stage is released once the block after it is issued, i.e. when
// wgmma.wait_group 1 says its own group is done. With kKeepLastStage the last block's stage is
// not released but returned (the caller's epilogue borrows it and releases it afterwards).
//
// run_blocks_with_running_sums is the loop of the formats that fold the tensor cores' sums
// into f32 running sums (f32 group scales, with int8 or fp8 activations), which must wait for a
// block's wgmma before folding it:
//   decode_block(it, frag) waits for block it's stage and converts into `frag`; returns the stage
//   issue(stage, frag, restart) issues and commits the block's wgmma (restart: the block's
//                          first wgmma overwrites the accumulators instead of adding to them)
//   fold(stage)            adds the accumulators into the running sums (the stage still holds
//                          the block's group scales)
// The next block is converted while this block's wgmma runs, so the wait before folding
// covers only the tensor cores' latency, not the conversion (measured on the H100: the int8
// g128 format went from about 700 to 850-910 TOPS at M = 4096).
#pragma once

#include <type_traits>

#include "cuda/common/ptx_sm90.cuh"

namespace nibble::cuda::sm90 {

template <bool kKeepLastStage = false, class Frag, class Issue, class Keep, class Release>
__device__ __forceinline__ int run_blocks_one_in_flight(int num_kb, Frag (&frag)[2],
                                                        Issue&& issue_block,
                                                        Keep&& keep_until_here,
                                                        Release&& release) {
  int it = 0, prev_s = -1;
  auto step = [&](auto buf) {
    constexpr int b = decltype(buf)::value;
    const int s = issue_block(it, frag[b]);
    ptx::wgmma_wait<1>();  // the previous block's group is done
    keep_until_here(frag[b ^ 1]);
    if (prev_s >= 0) release(prev_s);
    prev_s = s;
    ++it;
  };
  while (it + 1 < num_kb) {
    step(std::integral_constant<int, 0>{});
    step(std::integral_constant<int, 1>{});
  }
  if (it < num_kb) step(std::integral_constant<int, 0>{});
  ptx::wgmma_wait<0>();
  keep_until_here(frag[0]);
  keep_until_here(frag[1]);
  if constexpr (kKeepLastStage) return prev_s;
  if (prev_s >= 0) release(prev_s);
  return -1;
}

template <class Frag, class Decode, class Issue, class Keep, class Fold, class Release>
__device__ __forceinline__ void run_blocks_with_running_sums(int num_kb, Frag (&frag)[2],
                                                             Decode&& decode_block, Issue&& issue,
                                                             Keep&& keep_until_here, Fold&& fold,
                                                             Release&& release) {
  if (num_kb <= 0) return;
  int it = 0;
  int next_s = decode_block(0, frag[0]);
  auto step = [&](auto buf) {
    constexpr int b = decltype(buf)::value;
    const int s = next_s;
    issue(s, frag[b], /*restart=*/true);
    // The previous block was waited for and folded: its fragments are free for the next block,
    // converted while this one's wgmma runs.
    keep_until_here(frag[b ^ 1]);
    if (it + 1 < num_kb) next_s = decode_block(it + 1, frag[b ^ 1]);
    ++it;
    ptx::wgmma_wait<0>();
    keep_until_here(frag[b]);
    fold(s);
    release(s);
  };
  while (it + 1 < num_kb) {
    step(std::integral_constant<int, 0>{});
    step(std::integral_constant<int, 1>{});
  }
  if (it < num_kb) step(std::integral_constant<int, 0>{});
}

}  // namespace nibble::cuda::sm90
