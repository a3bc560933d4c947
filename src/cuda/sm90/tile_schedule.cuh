// Which pieces of work a CTA of the swap-AB wgmma kernels (sm90_w4a8_gemm, sm90_weight_only_gemm)
// computes, and the stream-K fix-up of tiles that several CTAs share.
//
// A piece of work is a segment: K blocks [kb_begin, kb_end) of one output tile, the tile named
// by its position tile_seq in band_raster order. A CTA of a grid of one CTA per tile (or split)
// has one segment; TileWalk yields a persistent CTA's segments in order:
//
//   tiles       persistent CTA c of C: whole tiles c, c + C, c + 2C, ...
//   stream_k    persistent CTA c of C: the units (tile, K block) of all tiles, numbered tile by
//               tile, cut into C ranges of equal length (the first units % C one longer);
//               CTA c takes range c. A range starts inside a tile (the end of that tile), goes
//               through whole tiles, and ends inside a tile (the start of that one).
//
// Why stream-K: the tile grid of a layer rarely fills the SMs evenly. 80 channel tiles of
// 10240×8192 at M = 256 leave 52 of 132 H100 SMs idle, and splitting K in 2 makes 160 CTAs, a
// second wave of 28; cut into ranges of units, every SM gets the same number of K blocks.
//
// The fix-up, deterministic run to run: the CTA whose segment starts at a tile's first K block
// owns the tile. It is the CTA whose range ends in that tile, so it computes that segment last
// of all its work; the CTAs after it computed the rest of the tile first of all theirs, each
// storing its partial accumulators in its slot of the workspace and then raising its flag.
// The owner adds those partials to its accumulators in K order (waiting for each flag, which it
// lowers again for the next launch), then stores the tile. Only a range's first segment can
// start past a tile's first K block, so each CTA stores at most one partial: slot and flag c.
// Waiting cannot deadlock: the partial a CTA stores is its first piece of work, which waits for
// nobody, and every CTA of the grid is resident at once (one per SM).
//
// The partials keep the accumulators' register layout: thread t of the 256 consumer threads
// stores accumulators 4j..4j+3 as the 16 bytes at (j·256 + t)·16 of its slot, and the owner's
// thread t reads them back into the same registers (no shared memory, coalesced 16-byte
// accesses).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/ptx.cuh"

namespace nibble::cuda::sm90 {

struct TileSegment {
  int tile_seq = 0, kb_begin = 0, kb_end = 0;
};

/// The first unit of stream-K range `cta` of `ctas` over `units` units.
__device__ __forceinline__ int stream_k_start(int cta, int ctas, int units) {
  const int q = units / ctas, r = units % ctas;
  return cta * q + min(cta, r);
}

/// A persistent CTA's segments, whole tiles or a stream-K range. One register: the range's end
/// and the stride are recomputed from kernel parameters at each step (the wgmma consumers hold
/// up to 160 registers of accumulators and fragments across the main loop; every register held
/// beside them spilled).
class TileWalk {
 public:
  __device__ TileWalk(bool stream_k, int tile_count, int kblocks)
      : pos_(stream_k ? stream_k_start(blockIdx.x, gridDim.x, tile_count * kblocks)
                      : int(blockIdx.x)) {}

  /// The next segment, or false when the CTA's work is done.
  __device__ __forceinline__ bool next(TileSegment& s, bool stream_k, int tile_count,
                                       int kblocks) {
    if (stream_k) {  // pos_ is a unit
      const int end = stream_k_start(blockIdx.x + 1, gridDim.x, tile_count * kblocks);
      if (pos_ >= end) return false;
      s.tile_seq = pos_ / kblocks;
      s.kb_begin = pos_ - s.tile_seq * kblocks;
      s.kb_end = min(kblocks, s.kb_begin + (end - pos_));
      pos_ += s.kb_end - s.kb_begin;
    } else {  // pos_ is a whole tile
      if (pos_ >= tile_count) return false;
      s.tile_seq = pos_;
      s.kb_begin = 0;
      s.kb_end = kblocks;
      pos_ += gridDim.x;
    }
    return true;
  }

 private:
  int pos_;
};

/// body(segment) for each of a CTA's segments: `one` (the grid's tile or split, for grids of one
/// CTA per tile: a single call, which the compiler sees as such) or the persistent CTA's whole
/// tiles blockIdx.x, blockIdx.x + gridDim.x, ... or its stream-K range.
template <bool kPersistent, class Body>
__device__ __forceinline__ void for_each_segment(const TileSegment& one, bool stream_k,
                                                 int tile_count, int kblocks, Body&& body) {
  if constexpr (kPersistent) {
    TileWalk walk(stream_k, tile_count, kblocks);
    for (TileSegment s; walk.next(s, stream_k, tile_count, kblocks);) body(s);
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
  __threadfence();  // every consumer's stores are visible device-wide before the flag says so
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  if (ctid == 0) ptx::st_release_gpu(flags + cta, 1);
}

/// The owner (CTA `cta`, which computed the tile's K blocks [0, covered)) adds the partials of
/// the CTAs after it, in K order, to its accumulators. units = tile_count · kblocks, ctas the
/// grid's CTAs.
template <class A, int kAcc>
__device__ __forceinline__ void stream_k_add_partials(A (&acc)[kAcc], const void* workspace,
                                                      int* flags, int cta, int covered,
                                                      int kblocks, int ctas, int units,
                                                      int ctid) {
  for (int c = cta + 1; covered < kblocks && c < ctas; ++c) {
    // CTA c's range starts at this tile's K block `covered`.
    covered += stream_k_start(c + 1, ctas, units) - stream_k_start(c, ctas, units);
    if (ctid == 0) {
      while (ptx::ld_acquire_gpu(flags + c) == 0) __nanosleep(32);
      flags[c] = 0;  // lowered for the next launch (nothing else raises it in this one)
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // the partial is there for all 256
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
