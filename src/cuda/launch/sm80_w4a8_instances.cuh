// The instance list of the sm80_w4a8_gemm family and its launch templates, shared by the
// launcher's translation units (sm80_w4a8_gemm.cu: int8 activations in, int4 and int8 weights;
// sm80_w4a8_gemm_fused.cu and sm80_w4a8_gemm_fused_f32.cu: bf16 / f16 and f32 activations
// quantized in the kernel; sm80_w4a8_gemm_residual.cu: f32 with the residual-stream fusions),
// which instantiate disjoint sets so they compile in parallel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "cuda/launch/dynamic_smem.h"
#include "cuda/launch/pdl_launch.h"
#include "cuda/launch/sm80_w4a8_gemm.h"
#include "cuda/sm80/sm80_w4a8_gemm.cuh"

namespace nibble::cuda::sm80_w4a8 {

using sm80::W4A8Epilogue;
using sm80::W4A8GemmParams;

// Tile shapes, by M bucket. Small M is a weight stream: a thin tile, a deep pipeline and
// split-K to put every SM to work; warps split N only, so no two warps convert the same
// weights. Large M is compute: 128×128 tiles of 64×32 warp tiles; per channel at
// 2 CTAs/SM (127 registers), the f32 group epilogue (a second accumulator set) and the
// two-level conversion (per-column group parameters) at 1 CTA/SM to stay spill-free.
enum class Tile : int { m16, m32, m64, m128 };
using sm80::W4Decode;

// R: the residual-stream fusions (LinearFusion), on the m16 tile with f32 x only.
template <Tile T, W4A8Epilogue E, int G, W4Decode D, class X = int8_t, bool R = false>
struct Instance;
template <W4A8Epilogue E, int G, W4Decode D, class X, bool R>
struct Instance<Tile::m16, E, G, D, X, R> {
  using Cfg = sm80::W4A8GemmConfig<16, 128, 1, 4, 6, E, G, 1, D, 4, X, false, R>;
};
template <W4A8Epilogue E, int G, W4Decode D, class X>
struct Instance<Tile::m32, E, G, D, X> {
  using Cfg = sm80::W4A8GemmConfig<32, 128, 1, 4, 5, E, G, 1, D, 4, X>;
};
// The f32 group epilogue with 32-wide groups rescales after every k32 step; its 64-accumulator
// warp tiles would spill, so it uses 32×32 warp tiles (8 warps) at M > 32.
template <W4A8Epilogue E, int G, W4Decode D, class X>
struct Instance<Tile::m64, E, G, D, X> {
  using Cfg = std::conditional_t<E == W4A8Epilogue::group,
                                 sm80::W4A8GemmConfig<64, 128, 2, 4, 4, E, G, 1, D, 4, X>,
                                 sm80::W4A8GemmConfig<64, 128, 1, 4, 4, E, G, 1, D, 4, X>>;
};
template <W4A8Epilogue E, int G, W4Decode D, class X>
struct Instance<Tile::m128, E, G, D, X> {
  using Cfg = std::conditional_t<
      E == W4A8Epilogue::group && G == 32, sm80::W4A8GemmConfig<64, 128, 2, 4, 4, E, G, 1, D, 4, X>,
      std::conditional_t<E == W4A8Epilogue::group || E == W4A8Epilogue::two_level,
                         sm80::W4A8GemmConfig<128, 128, 2, 4, 4, E, G, 1, D, 4, X>,
                         sm80::W4A8GemmConfig<128, 128, 2, 4, 4, E, G, 2, D, 4, X>>>;
};

// 8-bit weights (W8A8): a W tile is twice the bytes of an int4 one, so the stage counts drop to
// keep shared memory near 100 KB per CTA (two CTAs per SM on sm_80 and sm_90); only the
// per-channel and s32 epilogues exist. The M = 128 tile keeps 2 CTAs/SM with 3 stages.
// W4A4 (A4) loads its row-major int4 tiles the same way, with the same shared-memory budget;
// its g128 epilogue (A4 only) keeps a second, f32 accumulator set, so like W4A8's group tiles
// it uses 32×32 warp tiles at M = 64 and one CTA per SM at M = 128.
template <Tile T, W4A8Epilogue E, bool A4 = false>
struct Instance8;
template <W4A8Epilogue E, bool A4>
struct Instance8<Tile::m16, E, A4> {
  using Cfg = sm80::W4A8GemmConfig<16, 128, 1, 4, 6, E, E == W4A8Epilogue::group ? 128 : 0, 1,
                                   W4Decode::offset_xor, A4 ? 4 : 8, int8_t, A4>;
};
template <W4A8Epilogue E, bool A4>
struct Instance8<Tile::m32, E, A4> {
  using Cfg = sm80::W4A8GemmConfig<32, 128, 1, 4, 5, E, E == W4A8Epilogue::group ? 128 : 0, 1,
                                   W4Decode::offset_xor, A4 ? 4 : 8, int8_t, A4>;
};
template <W4A8Epilogue E, bool A4>
struct Instance8<Tile::m64, E, A4> {
  static constexpr bool kGroup = E == W4A8Epilogue::group;
  using Cfg = sm80::W4A8GemmConfig<64, 128, kGroup ? 2 : 1, 4, 4, E, kGroup ? 128 : 0, 1,
                                   W4Decode::offset_xor, A4 ? 4 : 8, int8_t, A4>;
};
template <W4A8Epilogue E, bool A4>
struct Instance8<Tile::m128, E, A4> {
  static constexpr bool kGroup = E == W4A8Epilogue::group;
  using Cfg = sm80::W4A8GemmConfig<128, 128, 2, 4, 3, E, kGroup ? 128 : 0, kGroup ? 1 : 2,
                                   W4Decode::offset_xor, A4 ? 4 : 8, int8_t, A4>;
};

// W4A-FP8 (e4m3 activations, f32 MMA sums): the thin tiles only, the W4A8 ones' shapes, per
// channel or g128. On Hopper the wgmma kernel takes M > 32 (the launchers never ask for more
// here); on sm_89, where it is the only tensor-core kernel, the 32-token tile covers every M.
template <Tile T, W4A8Epilogue E>
struct InstanceFp8 {
  static_assert(T == Tile::m16 || T == Tile::m32, "W4A-FP8 has the thin tiles only");
  static constexpr bool kM16 = T == Tile::m16;
  using Cfg = sm80::W4A8GemmConfig<kM16 ? 16 : 32, 128, 1, 4, kM16 ? 6 : 5, E,
                                   E == W4A8Epilogue::group ? 128 : 0, 1, W4Decode::offset_xor, 4,
                                   int8_t, false, false, true>;
};

// The decoding each (tile, epilogue) is instantiated with. high_nibble saves ALU work where
// the tile is thin (M ≤ 32: one m16 tile per warp, so every converted B fragment feeds one or
// two MMAs); on the large tiles it measured no faster (2026-11-23, H100) and its extra live
// registers make the 2-CTA/SM per-channel tile spill, so those keep offset_xor. Two-level
// weights always need offset_xor; per channel and s32 also fall back to it when K exceeds the
// high_nibble bound (decided at run time).
constexpr bool thin(Tile t) { return t == Tile::m16 || t == Tile::m32; }
constexpr W4Decode grouped_decode(Tile t, W4A8Epilogue e) {
  return e == W4A8Epilogue::two_level || !thin(t) ? W4Decode::offset_xor : W4Decode::high_nibble;
}

template <class Cfg>
void launch_config(const W4A8GemmParams& p, dim3 grid, Stream stream) {
  constexpr auto kernel = sm80::sm80_w4a8_gemm_kernel<Cfg>;
  allow_dynamic_smem<kernel>(Cfg::kSmemBytes);
  launch_overlapping(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, stream,
                     Cfg::kOverlapLaunch && p.overlap_allowed,
                     Cfg::kOverlapLaunch && p.cluster_split ? grid.z : 1u, p);
}

template <Tile T, W4A8Epilogue E, int G, W4Decode D, class X = int8_t, bool R = false>
void launch_instance(const W4A8GemmParams& p, dim3 grid, Stream stream) {
  launch_config<typename Instance<T, E, G, D, X, R>::Cfg>(p, grid, stream);
}

template <Tile T, bool A4 = false>
void launch_tile8(const W4A8GemmParams& p, W4A8Epilogue e, dim3 grid, Stream stream) {
  if (e == W4A8Epilogue::s32)
    return launch_config<typename Instance8<T, W4A8Epilogue::s32, A4>::Cfg>(p, grid, stream);
  if (e == W4A8Epilogue::per_channel)
    return launch_config<typename Instance8<T, W4A8Epilogue::per_channel, A4>::Cfg>(p, grid,
                                                                                 stream);
  if constexpr (A4)
    if (e == W4A8Epilogue::group)
      return launch_config<typename Instance8<T, W4A8Epilogue::group, true>::Cfg>(p, grid, stream);
  nibble::detail::fail(ErrorCode::internal,
                       "sm80_w8a8_gemm / sm80_w4a4_gemm: per-channel, g128 (W4A4) or s32 only");
}

template <Tile T, W4A8Epilogue E, class X = int8_t, bool R = false>
void launch_grouped(const W4A8GemmParams& p, int group, dim3 grid, Stream stream) {
  constexpr W4Decode D = grouped_decode(T, E);
  switch (group) {
    case 32: return launch_instance<T, E, 32, D, X, R>(p, grid, stream);
    case 64: return launch_instance<T, E, 64, D, X, R>(p, grid, stream);
    case 128: return launch_instance<T, E, 128, D, X, R>(p, grid, stream);
    case 256: return launch_instance<T, E, 256, D, X, R>(p, grid, stream);
  }
  nibble::detail::fail(ErrorCode::internal, "sm80_w4a8_gemm: no instance for group " +
                                                std::to_string(group));
}

template <Tile T, W4A8Epilogue E, class X = int8_t, bool R = false>
void launch_whole_k(const W4A8GemmParams& p, W4Decode decode, dim3 grid, Stream stream) {
  if constexpr (thin(T)) {
    if (decode == W4Decode::high_nibble)
      return launch_instance<T, E, 0, W4Decode::high_nibble, X, R>(p, grid, stream);
  }
  launch_instance<T, E, 0, W4Decode::offset_xor, X, R>(p, grid, stream);
}

// X = int8_t: quantized activations in; f32 / bf16 / f16: fused quantization (no s32 mode).
// R: the residual-stream fusions (f32 X on the m16 tile).
template <Tile T, class X = int8_t, bool R = false>
void launch_tile(const W4A8GemmParams& p, W4A8Epilogue e, W4Decode decode, int group, dim3 grid,
                 Stream stream) {
  switch (e) {
    case W4A8Epilogue::s32:
      if constexpr (std::is_same_v<X, int8_t>)
        return launch_whole_k<T, W4A8Epilogue::s32>(p, decode, grid, stream);
      break;
    case W4A8Epilogue::per_channel:
      return launch_whole_k<T, W4A8Epilogue::per_channel, X, R>(p, decode, grid, stream);
    case W4A8Epilogue::group:
      return launch_grouped<T, W4A8Epilogue::group, X, R>(p, group, grid, stream);
    case W4A8Epilogue::two_level:
      return launch_grouped<T, W4A8Epilogue::two_level, X, R>(p, group, grid, stream);
  }
  nibble::detail::fail(ErrorCode::internal, "sm80_w4a8_gemm: the s32 mode takes int8 activations");
}

/// The fused-quantization launches: the m16 tile, bf16 or f16 x (sm80_w4a8_gemm_fused.cu) and
/// f32 x (sm80_w4a8_gemm_fused_f32.cu).
void launch_fused(const W4A8GemmParams& p, DType x_dtype, W4A8Epilogue e, W4Decode decode,
                  int group, dim3 grid, Stream stream);
void launch_fused_f32(const W4A8GemmParams& p, W4A8Epilogue e, W4Decode decode, int group,
                      dim3 grid, Stream stream);
/// W4A-FP8 on the thin tiles (sm80_w4afp8_gemm.cu): per channel or g128.
void launch_fp8(const W4A8GemmParams& p, Tile tile, W4A8Epilogue e, dim3 grid, Stream stream);
/// The same with the residual-stream fusions (sm80_w4a8_gemm_residual.cu).
void launch_fused_residual(const W4A8GemmParams& p, W4A8Epilogue e, W4Decode decode, int group,
                           dim3 grid, Stream stream);

}  // namespace nibble::cuda::sm80_w4a8
