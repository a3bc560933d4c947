// Which pieces of work a CTA of the swap-AB wgmma kernels (sm90_w4a8_gemm, sm90_weight_only_gemm)
// computes, and the stream-K fix-up of tiles that several CTAs share.
//
// A piece of work is a segment: K blocks [kb_begin, kb_end) of one output tile, the tile named
// by its position tile_seq in band_raster order. How the grid's CTAs cover the tiles is a
// TileSchedule:
//
//   one_tile     a grid of one CTA per tile (or split): one segment
//   whole_tiles  persistent CTA c of C: whole tiles c, c + C, c + 2C, ...
//   stream_k     persistent CTA c of C: first the whole tiles c, c + C, ... below whole_tiles
//                (a multiple of C, often 0), then the units (tile, K block) of the other tiles,
//                numbered tile by tile, cut into C ranges of equal length (the first units % C
//                one longer); CTA c takes range c. A range starts inside a tile (the end of that
//                tile), goes through whole tiles, and ends inside a tile (the start of that one).
//                The CTA walks the whole tiles of its range first, then the end of its first
//                tile, then the start of its last (stream_k_order.h says why).
//
// The schedule is a kernel instance's compile-time choice, not a launch parameter: with both
// persistent walks in one loop behind a run-time flag, ptxas (13.0) kept the weight-only
// kernel's ring position and wgmma descriptors in vector registers (an R2UR pair before every
// wgmma: 411 instructions per two K blocks against 362 with one walk per instance, bf16 g128,
// BM = 128; one tile per CTA 365), and with both walks as two loops of one kernel its code
// doubled. The kernels' other run-time choices inside the tile loop did the same (sm90_w4a8_gemm:
// the persistent tiles' two ways out, CTA pairs).
//
// Why stream-K: the tile grid of a layer rarely fills the SMs evenly. 80 channel tiles of
// 10240×8192 at M = 256 leave 52 of 132 H100 SMs idle, and splitting K in 2 makes 160 CTAs, a
// second wave of 28; cut into ranges of units, every SM gets the same number of K blocks.
// Whole tiles first (the hybrid of the Stream-K paper, Osama et al. 2023): a grid of 2.4 waves
// (320 tiles on 132 SMs) may walk two waves whole and cut only the last 56 tiles into ranges,
// so only those pay for partials and fix-ups. Measured on the H100 it rarely paid: the few
// tiles left are each shared by several CTAs, whose owners add several partials at the very
// end (docs/kernels.md, "Stream-K after whole waves"). The planners walk no whole waves unless
// NIBBLE_SM90_STREAM_K_WHOLE_WAVES asks (sm90_tiling.h).
//
// The fix-up, deterministic run to run: the CTA whose segment starts at a tile's first K block
// owns the tile. It is the CTA whose range ends in that tile, and it computes that segment last
// of all its work; each CTA after it that covers the rest of the tile stores its partial
// accumulators in its slot of the workspace and then raises its flag. The owner adds those
// partials to its accumulators in K order (waiting for each flag, which it lowers again for the
// next launch), then stores the tile. Only a range's first tile can be entered past its first
// K block, so each CTA stores at most one partial: slot and flag c. Waiting cannot deadlock:
// before the partial a CTA stores come only whole tiles, and none of that work waits for
// anybody; every CTA of the grid is resident at once (one per SM).
//
// The partials keep the accumulators' register layout: thread t of the 256 consumer threads
// stores accumulators 4j..4j+3 as the 16 bytes at (j·256 + t)·16 of its slot, and the owner's
// thread t reads them back into the same registers (no shared memory, coalesced 16-byte
// accesses).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/ptx.cuh"
#include "cuda/sm90/stream_k_order.h"

namespace nibble::cuda::sm90 {

enum class TileSchedule { one_tile, whole_tiles, stream_k };

/// A stream-K CTA's segments, in stream_k_order.h's order. One register, the step: the segment
/// is recomputed from blockIdx.x, gridDim.x and kernel parameters at each step (the wgmma
/// consumers hold up to 160 registers of accumulators and fragments across the main loop; every
/// register held beside them spilled), all uniform across the CTA.
class StreamKWalk {
 public:
  /// The next segment, or false when the CTA's work is done.
  __device__ __forceinline__ bool next(TileSegment& s, int tile_count, int whole_tiles,
                                       int kblocks) {
    if (!stream_k_segment(blockIdx.x, gridDim.x, step_, tile_count, whole_tiles, kblocks, s))
      return false;
    ++step_;
    return true;
  }

 private:
  int step_ = 0;
};

/// body(segment) for each of a CTA's segments under schedule kSchedule: `one` (the grid's tile
/// or split: a single call, which the compiler sees as such), the whole tiles blockIdx.x,
/// blockIdx.x + gridDim.x, ... below tile_count, or (stream-K) those below whole_tiles and then
/// the CTA's range of the other tiles' units.
template <TileSchedule kSchedule, class Body>
__device__ __forceinline__ void for_each_segment(const TileSegment& one, int tile_count,
                                                 int whole_tiles, int kblocks, Body&& body) {
  if constexpr (kSchedule == TileSchedule::whole_tiles) {
    for (int t = blockIdx.x; t < tile_count; t += gridDim.x) body(TileSegment{t, 0, kblocks});
  } else if constexpr (kSchedule == TileSchedule::stream_k) {
    StreamKWalk walk;
    for (TileSegment s; walk.next(s, tile_count, whole_tiles, kblocks);) body(s);
  } else {
    body(one);
  }
}

template <class A>
__device__ __forceinline__ uint32_t acc_bits(A v) {
  if constexpr (std::is_floating_point_v<A>) return __float_as_uint(v);
  else return static_cast<uint32_t>(v);
}

/// acc += the partial's bits: f32 for float accumulators, int32 with wrap-around otherwise.
template <class A>
__device__ __forceinline__ void add_acc_bits(A& acc, uint32_t bits) {
  if constexpr (std::is_floating_point_v<A>) acc += __uint_as_float(bits);
  else acc = static_cast<A>(static_cast<uint32_t>(acc) + bits);
}

/// Stores this CTA's partial of a tile it does not own into slot `cta` and raises flag `cta`.
/// ctid: the consumer thread 0..255; all 256 call it.
template <class A, int kAcc>
__device__ __forceinline__ void stream_k_put_partial(const A (&acc)[kAcc], void* workspace,
                                                     int* flags, int cta, int ctid) {
  static_assert(kAcc % 4 == 0, "16-byte pieces of the accumulators");
  uint4* slot = static_cast<uint4*>(workspace) + int64_t(cta) * (kAcc / 4) * 256;
#pragma unroll
  for (int j = 0; j < kAcc / 4; ++j)
    __stcg(slot + j * 256 + ctid, make_uint4(acc_bits(acc[4 * j]), acc_bits(acc[4 * j + 1]),
                                             acc_bits(acc[4 * j + 2]), acc_bits(acc[4 * j + 3])));
  // The flag's release by thread 0 after the barrier publishes every consumer's stores: the
  // barrier orders them before it and a release is cumulative (the PTX memory model; CUTLASS's
  // split-K semaphore does the same). A fence per thread (fence.sc.gpu, MEMBAR.SC.GPU) before
  // the barrier made each of the 256 threads wait for its stores to reach L2.
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  if (ctid == 0) ptx::st_release_gpu(flags + cta, 1);
}

/// The owner (CTA `cta`, which computed the tile's K blocks [0, covered)) adds the partials of
/// the CTAs after it, in K order, to its accumulators. units: the stream-K ranges' units
/// (stream_k_units), ctas the grid's CTAs. kEveryThreadWaits: all 256 threads wait for each
/// flag, else thread 0 waits and the named barrier tells the others; the choice only moves
/// ptxas's register allocation (13.0): the weight-only kernel's 256-token stream-K instances
/// spilled 4 bytes with one waiter, the W4A8 kernel's 256-token persistent ones 4 bytes with
/// every thread waiting.
template <bool kEveryThreadWaits, class A, int kAcc>
__device__ __forceinline__ void stream_k_add_partials(A (&acc)[kAcc], const void* workspace,
                                                      int* flags, int cta, int covered,
                                                      int kblocks, int ctas, int units,
                                                      int ctid) {
  for (int c = cta + 1; covered < kblocks && c < ctas; ++c) {
    // CTA c's range starts at this tile's K block `covered`.
    covered += stream_k_start(c + 1, ctas, units) - stream_k_start(c, ctas, units);
    if (kEveryThreadWaits || ctid == 0)
      while (ptx::ld_acquire_gpu(flags + c) == 0) __nanosleep(32);
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // the partial is there for all 256
    // Lowered for the next launch (nothing else raises it in this one); every waiter has seen it.
    if (ctid == 0) flags[c] = 0;
    const uint4* slot = static_cast<const uint4*>(workspace) + int64_t(c) * (kAcc / 4) * 256;
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      const uint4 v = __ldcg(slot + j * 256 + ctid);
      add_acc_bits(acc[4 * j], v.x);
      add_acc_bits(acc[4 * j + 1], v.y);
      add_acc_bits(acc[4 * j + 2], v.z);
      add_acc_bits(acc[4 * j + 3], v.w);
    }
  }
}

}  // namespace nibble::cuda::sm90
