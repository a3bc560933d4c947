// Launcher of the sm80_w4a8_gemm family: the instance list, the tile choice per M bucket, the
// split-K choice from the device's SM count, and the workspace for split-K partials.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>
#include <utility>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "cuda/launch/sm80_w4a8_gemm.h"
#include "cuda/launch/built_archs.h"
#include "cuda/launch/dynamic_smem.h"
#include "cuda/launch/pdl_launch.h"
#include "cuda/launch/sm90_w4a8_gemm.h"
#include "cuda/launch/split_k_workspace.h"
#include "cuda/launch/sm80_w4a8_instances.cuh"
#include "nibble/device.h"
#include "nibble/formats.h"
#include "nibble/gemm.h"

namespace nibble::cuda {

using sm80::W4A8Epilogue;
using sm80::W4A8GemmParams;

namespace {

using namespace sm80_w4a8;  // Tile, Instance, Instance8, launch templates

struct TileInfo {
  int bm, bn, warps, stages;
};

template <Tile T, W4A8Epilogue E, int G, W4Decode D>
TileInfo tile_info() {
  using Cfg = typename Instance<T, E, G, D>::Cfg;
  return {Cfg::BM, Cfg::BN, Cfg::kThreads / 32, Cfg::STAGES};
}

template <Tile T>
TileInfo tile_info(W4A8Epilogue e, W4Decode d, int group) {
  constexpr W4Decode hi = W4Decode::high_nibble, ox = W4Decode::offset_xor;
  switch (e) {
    case W4A8Epilogue::s32:
    case W4A8Epilogue::per_channel:
      if constexpr (thin(T))
        if (d == hi) return tile_info<T, W4A8Epilogue::per_channel, 0, hi>();
      return tile_info<T, W4A8Epilogue::per_channel, 0, ox>();
    case W4A8Epilogue::two_level: return tile_info<T, W4A8Epilogue::two_level, 128, ox>();
    case W4A8Epilogue::group: {
      constexpr W4Decode gd = grouped_decode(T, W4A8Epilogue::group);
      return group == 32 ? tile_info<T, W4A8Epilogue::group, 32, gd>()
                         : tile_info<T, W4A8Epilogue::group, 128, gd>();
    }
  }
  return {};
}

template <Tile T>
TileInfo tile_info8() {
  using Cfg = typename Instance8<T, W4A8Epilogue::per_channel>::Cfg;
  return {Cfg::BM, Cfg::BN, Cfg::kThreads / 32, Cfg::STAGES};
}

template <Tile T, W4A8Epilogue E>
TileInfo tile_info_fp8() {
  using Cfg = typename InstanceFp8<T, E>::Cfg;
  return {Cfg::BM, Cfg::BN, Cfg::kThreads / 32, Cfg::STAGES};
}

// W4A-FP8: the 16-token tile up to M = 16, the 32-token one above.
TileInfo tile_info_fp8(Tile t, W4A8Epilogue e) {
  const bool g = e == W4A8Epilogue::group;
  if (t == Tile::m16)
    return g ? tile_info_fp8<Tile::m16, W4A8Epilogue::group>()
             : tile_info_fp8<Tile::m16, W4A8Epilogue::per_channel>();
  return g ? tile_info_fp8<Tile::m32, W4A8Epilogue::group>()
           : tile_info_fp8<Tile::m32, W4A8Epilogue::per_channel>();
}

TileInfo tile_info(Tile t, W4A8Epilogue e, W4Decode d, int group, int weight_bits) {
  if (weight_bits == 8) {
    switch (t) {
      case Tile::m16: return tile_info8<Tile::m16>();
      case Tile::m32: return tile_info8<Tile::m32>();
      case Tile::m64: return tile_info8<Tile::m64>();
      case Tile::m128: return tile_info8<Tile::m128>();
    }
  }
  switch (t) {
    case Tile::m16: return tile_info<Tile::m16>(e, d, group);
    case Tile::m32: return tile_info<Tile::m32>(e, d, group);
    case Tile::m64: return tile_info<Tile::m64>(e, d, group);
    case Tile::m128: return tile_info<Tile::m128>(e, d, group);
  }
  return {};
}

// Whether a plan's tiles are cluster split-K candidates on sm_90+: the thin tiles with packed
// int4 weights, whose splits the planner caps at a cluster's 8. Measured on the H100
// (2026-11-24): at M = 1, 4096x4096 6.9 us against 7.9 through the workspace, 6144x4096 8.7
// against 9.5, 10240x8192 17.1 against 17.9, 4096x14336 15.2-15.5 in a cluster of 8 against
// 14.7-15.5 with 9 splits through the workspace; at M = 16 that layer ran 15.9 us in the cluster
// against 21.0 through the workspace (the partials are 16 rows), so the cap stays. The
// int8-weight tiles (W8A8) were slower in a cluster (4096x4096 13.0 against 9.7 us) and keep the
// workspace.
bool cluster_candidate(const W4A8Plan& plan) {
  return thin(static_cast<Tile>(plan.tile)) && plan.weight_bits == 4 && !plan.a4;
}

// Fewest K blocks a split reduced in a cluster keeps (4 through the workspace; see the planner).
constexpr int kMinKBlocksPerClusterSplit = 2;

}  // namespace

bool sm80_w4afp8_available(int device) {
  const DeviceInfo info = cuda_device_info(device);
  if (info.cc_major == 9 && info.cc_minor == 0)
    return cuda_code_built("90a") || cuda_code_built("90");
  if (info.cc_major == 8 && info.cc_minor == 9) return cuda_code_built("89");
  return false;  // sm_80/86: no fp8 MMA; newer GPUs: no code of theirs built for it yet
}

W4A8Plan plan_sm80_w4a8(int64_t m, int64_t n_pad, int64_t k, int64_t k_pad,
                        W4A8Epilogue epilogue, int group, int sm_count, bool clusters,
                        int weight_bits, bool a4, bool a_e4m3) {
  W4A8Plan plan;
  plan.weight_bits = weight_bits;
  plan.a4 = a4;
  plan.a_e4m3 = a_e4m3;
  const bool whole_k = epilogue == W4A8Epilogue::s32 || epilogue == W4A8Epilogue::per_channel;
  plan.tile = a_e4m3 ? (m <= 16 ? 0 : 1) : m <= 16 ? 0 : m <= 32 ? 1 : m <= 64 ? 2 : 3;
  const bool fits = !whole_k || k <= max_int32_accumulation_k(DType::s8, DType::s8);
  plan.decode = fits && weight_bits == 4 && !a4 && !a_e4m3
                    ? grouped_decode(static_cast<Tile>(plan.tile), epilogue)
                    : W4Decode::offset_xor;
  const TileInfo t =
      a_e4m3 ? tile_info_fp8(static_cast<Tile>(plan.tile), epilogue)
             : tile_info(static_cast<Tile>(plan.tile), epilogue, plan.decode, group,
                         a4 ? 8 : weight_bits);  // W4A4 tiles are the int8 ones
  plan.bm = t.bm;
  plan.bn = t.bn;
  plan.stages = t.stages;
  plan.warps = t.warps;
  plan.tiles_m = static_cast<int>((m + t.bm - 1) / t.bm);
  plan.tiles_n = static_cast<int>((n_pad + t.bn - 1) / t.bn);
  const int kblocks = static_cast<int>(k_pad / 128);
  // Split K only when the output tiles alone cannot occupy the GPU: aim for about two CTAs per
  // SM, keep at least 4 K blocks (512 of K) per split, and align splits to a 256-group's two
  // blocks so every group is rescaled by exactly one CTA. Splits reduced in a cluster keep at
  // least 2 K blocks: on the H200 (2026-11-28, bench/results/h200_w4a8_cluster16_split_sweep_d04e6ea.txt)
  // 2048x2048 ran 8 splits of 2 blocks in 4.40 us at M = 16 against 5.01 in 4 of 4 (W4A8 per
  // channel; 3.75 against 3.86 at M = 1); a workspace split pays a partial tile's round trip.
  const int tiles = plan.tiles_m * plan.tiles_n;
  const int align = group == 256 ? 2 : 1;
  const bool cluster = clusters && cluster_candidate(plan);
  const int most = cluster_candidate(plan) ? kMaxPortableClusterSplitK : kMaxSplitK;
  const int min_kblocks = cluster ? kMinKBlocksPerClusterSplit : 4;
  int splits = 1;
  if (tiles < sm_count) {
    const int want = (2 * sm_count + tiles - 1) / tiles;
    splits = std::clamp(std::min(want, kblocks / min_kblocks), 1, most);
  }
  // NIBBLE_SM80_SPLITS=1..16 forces the split count (at most a cluster's 8 where the splits are
  // one).
  if (const int forced = forced_sm80_splits(); forced >= 0)
    splits = std::clamp(forced, 1, std::min(most, std::max(kblocks, 1)));
  int per_split = (kblocks + splits - 1) / splits;
  per_split = (per_split + align - 1) / align * align;
  plan.splits = (kblocks + per_split - 1) / per_split;
  plan.kblocks_per_split = per_split;
  plan.cluster_split = cluster && plan.splits > 1;
  return plan;
}

std::string describe(const W4A8Plan& plan) {
  const char* decode = plan.a4                                     ? "int4 x int4"
                       : plan.a_e4m3                                ? "e4m3 activations, f32 sums"
                       : plan.weight_bits == 8                      ? "int8 weights"
                       : plan.decode == sm80::W4Decode::high_nibble ? "high_nibble"
                                                                    : "offset_xor";
  const char* name = plan.a4                  ? "sm80_w4a4_gemm "
                     : plan.a_e4m3            ? "sm80_w4afp8_gemm "
                     : plan.weight_bits == 8  ? "sm80_w8a8_gemm "
                                              : "sm80_w4a8_gemm ";
  return std::string(name) + decode + " tile " +
         std::to_string(plan.bm) + "x" + std::to_string(plan.bn) +
         "x128, " + std::to_string(plan.warps) + " warps, " + std::to_string(plan.stages) +
         " stages, grid " + std::to_string(plan.tiles_n) + "x" + std::to_string(plan.tiles_m) +
         (plan.splits > 1 ? " with split-K " + std::to_string(plan.splits) +
                                " (tiles alone would leave SMs idle)"
                          : "");
}

void launch_sm80_w4a8(const W4A8Launch& l, Stream stream) {
  const DeviceInfo dev = cuda_device_info(l.device);
  if (l.a_e4m3 && (!sm80_w4afp8_available(l.device) || l.weight_bits != 4 || l.a4 ||
                   l.x != nullptr || l.residual_fusion() ||
                   !sm90_w4a8_handles(l.epilogue, l.group, true)))  // the W4A-FP8 MMA formats
    nibble::detail::fail(ErrorCode::internal,
                         "sm80_w4afp8_gemm: needs sm_89+ code for this GPU, int4 weights per "
                         "channel or g128 and e4m3 activations quantized by the caller");
  const W4A8Plan plan = plan_sm80_w4a8(l.m, l.n_pad, l.k, l.k_pad, l.epilogue, l.group,
                                       dev.sm_count, dev.cc_major >= 9, l.weight_bits, l.a4,
                                       l.a_e4m3);
  W4A8GemmParams p;
  p.a = static_cast<const int8_t*>(l.a);
  p.lda = l.lda;
  p.a_scales = l.a_scales;
  p.a_scale_step = l.a_per_tensor ? 0 : 1;
  p.w = static_cast<const uint8_t*>(l.w);
  p.w_scales = l.w_scales;
  p.w_params = static_cast<const uint16_t*>(l.w_params);
  p.bias = l.bias;
  p.bias_dtype = l.bias_dtype;
  p.d = l.d;
  p.ldd = l.ldd;
  p.d_dtype = l.d_dtype;
  p.m = static_cast<int>(l.m);
  p.n = static_cast<int>(l.n);
  p.k = static_cast<int>(l.k);
  p.n_pad = static_cast<int>(l.n_pad);
  p.kblocks = static_cast<int>(l.k_pad / 128);
  p.splits = plan.splits;
  p.kblocks_per_split = plan.kblocks_per_split;
  p.overlap_allowed = overlap_split_k_launch(dev.cc_major, plan.splits);
  p.prefetch_blocks = overlap_prefetch_blocks(p.overlap_allowed);
  p.early_weight_stages = overlap_early_weight_stages(p.overlap_allowed);
  p.ldw = l.ldw;
  p.w_scale_dtype = l.w_scale_dtype;
  p.x = l.x;
  p.ldx = l.ldx;
  // sm_90+: the splits of a thin tile are one thread-block cluster and reduce over distributed
  // shared memory (cuda/common/split_k.cuh) instead of through the workspace.
  p.cluster_split = plan.cluster_split;
  if (plan.splits > 1 && !p.cluster_split) {
    SplitKWorkspace ws = split_k_workspace(l.device, stream, size_t(plan.splits) * l.m * l.n * 4,
                                  size_t(plan.tiles_m) * plan.tiles_n);
    p.workspace = ws.partials;
    p.counters = ws.counters;
  }
  const dim3 grid(plan.tiles_n, plan.tiles_m, plan.splits);
  const W4A8Epilogue e = l.epilogue;
  if (l.x != nullptr) {
    if (!fused_quant_fits(plan, l.m))
      nibble::detail::fail(ErrorCode::internal,
                           "sm80_w4a8_gemm: fused activation quantization needs the m16 tile and "
                           "M rows of the K range within the resident A (fused_quant_fits)");
    p.resident_pitch = fused_resident_pitch(plan);
    if (l.residual_fusion()) {
      if (l.x_dtype != DType::f32 || l.d_dtype != DType::f32 ||
          !residual_fusion_fits(plan, l.m, dev.cc_major))
        nibble::detail::fail(ErrorCode::internal,
                             "sm80_w4a8_gemm: the residual fusions need f32 x and d, and an unsplit "
                             "tile or one split in a cluster (residual_fusion_fits)");
      p.in_sumsq = l.in_sumsq;
      p.in_sumsq_ld = l.in_sumsq_ld;
      p.in_granules = static_cast<int>(sumsq_granules(l.k));
      p.norm_inv_k = 1.0 / static_cast<double>(l.k);
      p.norm_eps = l.norm_eps;
      p.norm_weight = l.norm_weight;
      p.accumulate = l.accumulate;
      p.out_sumsq = l.out_sumsq;
      p.out_sumsq_ld = l.out_sumsq_ld;
      return launch_fused_residual(p, e, plan.decode, l.group, grid, stream);
    }
    if (l.x_dtype == DType::f32) return launch_fused_f32(p, e, plan.decode, l.group, grid, stream);
    return launch_fused(p, l.x_dtype, e, plan.decode, l.group, grid, stream);
  }
  if (l.residual_fusion())
    nibble::detail::fail(ErrorCode::internal,
                         "sm80_w4a8_gemm: the residual fusions need x quantized in the kernel");
  if (l.a_e4m3) return launch_fp8(p, static_cast<Tile>(plan.tile), e, grid, stream);
  if (l.a4) {
    switch (static_cast<Tile>(plan.tile)) {
      case Tile::m16: return launch_tile8<Tile::m16, true>(p, e, grid, stream);
      case Tile::m32: return launch_tile8<Tile::m32, true>(p, e, grid, stream);
      case Tile::m64: return launch_tile8<Tile::m64, true>(p, e, grid, stream);
      case Tile::m128: return launch_tile8<Tile::m128, true>(p, e, grid, stream);
    }
  }
  if (l.weight_bits == 8) {
    switch (static_cast<Tile>(plan.tile)) {
      case Tile::m16: return launch_tile8<Tile::m16>(p, e, grid, stream);
      case Tile::m32: return launch_tile8<Tile::m32>(p, e, grid, stream);
      case Tile::m64: return launch_tile8<Tile::m64>(p, e, grid, stream);
      case Tile::m128: return launch_tile8<Tile::m128>(p, e, grid, stream);
    }
  }
  switch (static_cast<Tile>(plan.tile)) {
    case Tile::m16: return launch_tile<Tile::m16>(p, e, plan.decode, l.group, grid, stream);
    case Tile::m32: return launch_tile<Tile::m32>(p, e, plan.decode, l.group, grid, stream);
    case Tile::m64: return launch_tile<Tile::m64>(p, e, plan.decode, l.group, grid, stream);
    case Tile::m128: return launch_tile<Tile::m128>(p, e, plan.decode, l.group, grid, stream);
  }
}

}  // namespace nibble::cuda
