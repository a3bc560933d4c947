// GPU tests of the weight-only tensor-core kernels (sm80_weight_only_gemm, and
// sm90_weight_only_gemm on Hopper: W4A16, W8A16) with packed weights, against the CPU reference
// on the same quantized weights and the same 16-bit activations. Every shape runs through each
// kernel in turn (NIBBLE_WEIGHT_ONLY_KERNEL), not only the one dispatch picks for that M, and
// through sm90_weight_only_gemm's 256-token tile too (NIBBLE_SM90_WEIGHT_ONLY_BM), which dispatch
// picks only for large M × N.
#include <gtest/gtest.h>

#if NIBBLE_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include <cstdlib>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "nibble/nibble.h"
#if NIBBLE_WITH_CUDA
#include "cuda/launch/sm80_weight_only_gemm.h"
#include "cuda/launch/sm90_tiling.h"
#endif

namespace nibble {
namespace {

// Every tile bucket and its edges (16 / 32 / 64 / 128-row tiles).
const std::vector<int64_t> kOddM = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 100, 127, 128, 255, 1000};

// Relative Frobenius error of the kernel against the reference on the same operands.
//   Per channel the integer weight enters the tensor cores exactly and the scale multiplies the
//   f32 sum: only summation order differs (f32 outputs), or the output rounding (16-bit).
//   Group-wise each weight is rounded once to the activation type after its scale: independent
//   relative errors ≤ 2⁻⁹ (bf16) / 2⁻¹² (f16), RMS about that over √3 (1.1e-3 / 1.4e-4).
double tolerance(const LinearFormat& f, DType x, DType out) {
  const double out_rounding = out == DType::f32 ? 1e-5 : out == DType::f16 ? 1e-3 : 5e-3;
  if (f.weight.per_channel()) return out_rounding;
  const double weight_rounding = x == DType::bf16 ? 3e-3 : 4e-4;
  return out_rounding + weight_rounding;
}

// Kernel choices to force: a kernel name, optionally "/bm<tokens>" for sm90's token tile.
std::vector<std::string> weight_only_kernels() {
  std::vector<std::string> k = {"sm80_weight_only_gemm"};
  if (sm90a_kernels_here()) {
    k.push_back("sm90_weight_only_gemm");
    k.push_back("sm90_weight_only_gemm/bm256");
  }
  return k;
}

std::string kernel_name(const std::string& choice) { return choice.substr(0, choice.find('/')); }

// Forces one of weight_only_kernels() for the scope (the automatic tile where none is named).
class ForceKernel {
 public:
  explicit ForceKernel(const std::string& choice)
      : kernel_("NIBBLE_WEIGHT_ONLY_KERNEL", kernel_name(choice)),
        bm_("NIBBLE_SM90_WEIGHT_ONLY_BM",
            choice.find("/bm") == std::string::npos ? "" : choice.substr(choice.find("/bm") + 3)) {}

 private:
  ScopedEnv kernel_, bm_;
};

struct Case {
  const char* format;
  DType x;
  DType out;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.format << "_x" << to_string(c.x) << "_" << to_string(c.out);
}

class CudaWeightOnlyLinear : public ::testing::TestWithParam<Case> {};

TEST_P(CudaWeightOnlyLinear, MatchesReferenceOnOddShapes) {
  NIBBLE_REQUIRE_GPU();
  const Case c = GetParam();
  const LinearFormat f = parse_linear_format(c.format);
  test::Rng rng;  // fresh seed, printed on failure
  // K = 352 and 2056 are not multiples of the layout's 128 (zero-filled tail; 2056 is only a
  // multiple of 8); N = 20 takes the unaligned store path; 1000 × 1536 several N tiles.
  const std::pair<int64_t, int64_t> nk[] = {{136, 512}, {1000, 1536}, {72, 352}, {20, 256},
                                            {264, 2056}};
  for (auto [n, k] : nk) {
    if (!f.weight.per_channel() && k % f.weight.group_size != 0) continue;
    QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
    const PackedWeight wd = pack_weight(qw.view(), packed_layout(f), Device::cuda());
    const Tensor bias = test::random_normal(DType::bf16, 1, n, rng);
    const Tensor bias_d = bias.to(Device::cuda());
    const TensorView bias_v = test::as_vector(bias), bias_dv = test::as_vector(bias_d);
    for (int64_t m : kOddM) {
      SCOPED_TRACE("M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" +
                   std::to_string(k));
      const Tensor x = test::random_activations(c.x, m, k, rng);
      Tensor ref = Tensor::empty(c.out, {m, n});
      linear(x.view(), qw.view(), &bias_v, ref.view());
      const Tensor xd = x.to(Device::cuda());
      for (const std::string& kernel : weight_only_kernels()) {
        SCOPED_TRACE(kernel);
        const ForceKernel force(kernel);
        Tensor got = Tensor::empty(c.out, {m, n}, Device::cuda());
        got.fill_bytes(0xFF);  // NaN in every float dtype: every element must be written
        linear(xd.view(), wd.view(), &bias_dv, got.view());
        synchronize(Device::cuda());
        ASSERT_LE(rel_error(got, ref), tolerance(f, c.x, c.out));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, CudaWeightOnlyLinear,
    ::testing::Values(Case{"w4a16_pc", DType::bf16, DType::f32},
                      Case{"w4a16_pc", DType::f16, DType::f16},
                      Case{"w4a16_g128", DType::bf16, DType::bf16},
                      Case{"w4a16_g128", DType::f16, DType::f32},
                      Case{"w4a16_g32", DType::bf16, DType::f32},
                      Case{"w4a16_g128_asym", DType::bf16, DType::bf16},
                      Case{"w4a16_g64_asym", DType::f16, DType::f32},
                      Case{"w4a16_g128_fzp", DType::bf16, DType::f32},
                      Case{"w4a16_g256_fzp", DType::f16, DType::f16},
                      Case{"w8a16", DType::bf16, DType::bf16},
                      Case{"w8a16", DType::f16, DType::f32},
                      Case{"w8a16_g128", DType::bf16, DType::f32}),
    [](const auto& p) {
      return std::string(p.param.format) + "_x" + to_string(p.param.x) + "_" +
             to_string(p.param.out);
    });

// A shape with the sm90 token tile it is forced to (NIBBLE_SM90_WEIGHT_ONLY_BM).
struct TiledShape {
  int64_t m, n, k;
  const char* bm;
};
std::string case_name(const Case& c, const TiledShape& sh) {
  return std::string(c.format) + " M=" + std::to_string(sh.m) + " N=" + std::to_string(sh.n) +
         " K=" + std::to_string(sh.k) + " BM=" + sh.bm;
}
// 8-bit weights have no persistent 256-token instance (plan_sm90_weight_only).
bool has_persistent_instance(const LinearFormat& f, const TiledShape& sh) {
  return f.weight.scheme != WeightScheme::s8_sym || std::string(sh.bm) != "256";
}

// Random operands of one (format, shape) case on both devices, and the CPU reference's output.
struct LinearOperands {
  QuantizedWeight qw;
  PackedWeight wd;
  Tensor bias, bias_d, xd, ref;
  TensorView bias_dv;
};
LinearOperands random_linear_operands(const LinearFormat& f, const Case& c, int64_t m, int64_t n,
                                      int64_t k, test::Rng& rng) {
  LinearOperands o{test::random_quantized_weight(f.weight, n, k, rng), {}, {}, {}, {}, {}, {}};
  o.wd = pack_weight(o.qw.view(), packed_layout(f), Device::cuda());
  o.bias = test::random_normal(DType::bf16, 1, n, rng);
  o.bias_d = o.bias.to(Device::cuda());
  o.bias_dv = test::as_vector(o.bias_d);
  const TensorView bias_v = test::as_vector(o.bias);
  const Tensor x = test::random_activations(c.x, m, k, rng);
  o.ref = Tensor::empty(c.out, {m, n});
  linear(x.view(), o.qw.view(), &bias_v, o.ref.view());
  o.xd = x.to(Device::cuda());
  return o;
}

// Runs body(format, case, shape, operands) on sm90_weight_only_gemm for every shape at its token
// tile and every case that has a persistent instance there, on fresh random operands.
template <class Body>
void for_each_sm90_case(std::initializer_list<TiledShape> shapes, std::initializer_list<Case> cases,
                        Body body) {
  test::Rng rng;  // fresh seed, printed on failure
  const ScopedEnv kernel("NIBBLE_WEIGHT_ONLY_KERNEL", "sm90_weight_only_gemm");
  for (const TiledShape& sh : shapes) {
    const ScopedEnv bm("NIBBLE_SM90_WEIGHT_ONLY_BM", sh.bm);
    for (const Case& c : cases) {
      const LinearFormat f = parse_linear_format(c.format);
      if (!has_persistent_instance(f, sh)) continue;
      SCOPED_TRACE(case_name(c, sh));
      body(f, c, sh, random_linear_operands(f, c, sh.m, sh.n, sh.k, rng));
    }
  }
}

// Unsplit sm90 grids of more tiles than SMs run persistent CTAs: each walks several tiles and
// stores each through the stage of its last K block (half a tile at a time) while the producer
// loads the next tile. The result must be the bytes of one CTA per tile
// (NIBBLE_SM90_PERSISTENT=0) and match the reference, at every token tile; the last token and
// channel tiles lie partly past M and N.
TEST(CudaWeightOnly, Sm90PersistentTilesMatchOneTilePerCta) {
  NIBBLE_REQUIRE_GPU();
  if (weight_only_kernels().size() < 2) GTEST_SKIP() << "needs sm90_weight_only_gemm (H100)";
  const ScopedEnv whole_tiles("NIBBLE_SM90_STREAM_K", "0");  // stream-K: the next test
  for_each_sm90_case(
      {{100, 9000, 384, "64"}, {1000, 4200, 256, "128"}, {300, 9000, 384, "256"}},
      {{"w4a16_pc", DType::bf16, DType::f32},
       {"w4a16_g128", DType::bf16, DType::bf16},
       {"w4a16_g32_asym", DType::f16, DType::f32},
       {"w4a16_g128_fzp", DType::bf16, DType::bf16},
       {"w8a16", DType::f16, DType::f16},
       {"w8a16_g128", DType::bf16, DType::bf16}},
      [](const LinearFormat& f, const Case& c, const TiledShape& sh, const LinearOperands& o) {
        const std::string why = explain(f, sh.m, sh.n, sh.k, Device::cuda());
        ASSERT_NE(why.find("persistent CTAs"), std::string::npos) << why;
        Tensor got[2];
        for (int one_tile_per_cta = 0; one_tile_per_cta < 2; ++one_tile_per_cta) {
          const ScopedEnv persistent("NIBBLE_SM90_PERSISTENT", one_tile_per_cta ? "0" : "1");
          got[one_tile_per_cta] = Tensor::empty(c.out, {sh.m, sh.n}, Device::cuda());
          got[one_tile_per_cta].fill_bytes(0xFF);  // NaN: every element must be written
          linear(o.xd.view(), o.wd.view(), &o.bias_dv, got[one_tile_per_cta].view());
        }
        synchronize(Device::cuda());
        EXPECT_LE(rel_error(got[0], o.ref), tolerance(f, c.x, c.out));
        EXPECT_TRUE(same_bytes(got[0], got[1]));
      });
}

// Stream-K: every SM's CTA takes an equal range of the tiles' K blocks, and a tile's owner adds
// the other CTAs' partial tiles to its own (cuda/sm90/tile_schedule.cuh). The shapes make tiles
// shared by two to four CTAs (first), CTAs that finish a tile and start the next (second), and
// ranges of one K block that cover the end of one tile and the start of another (third); the
// last token and channel tiles lie partly past M and N. The result must match the reference,
// write every element, repeat bit for bit (the partials are summed in K order), and stay within
// the tolerance of the whole-tile plan. Every dequantization has its own stream-K instances.
TEST(CudaWeightOnly, Sm90StreamKMatchesTheReferenceAndRepeats) {
  NIBBLE_REQUIRE_GPU();
  if (weight_only_kernels().size() < 2) GTEST_SKIP() << "needs sm90_weight_only_gemm (H100)";
  for_each_sm90_case(
      {{100, 5000, 4096, "256"}, {700, 3000, 1024, "128"}, {300, 9000, 384, "64"}},
      {{"w4a16_g128", DType::bf16, DType::bf16},
       {"w4a16_g32_asym", DType::f16, DType::f32},
       {"w4a16_g128_fzp", DType::bf16, DType::bf16},
       {"w4a16_pc", DType::bf16, DType::f32},
       {"w8a16", DType::f16, DType::f16},
       {"w8a16_g128", DType::f16, DType::bf16}},
      [](const LinearFormat& f, const Case& c, const TiledShape& sh, const LinearOperands& o) {
        Tensor got[3];  // stream-K twice, whole tiles (each its own kernel instance)
        for (int run = 0; run < 3; ++run) {
          const ScopedEnv stream_k("NIBBLE_SM90_STREAM_K", run < 2 ? "1" : "0");
          const std::string why = explain(f, sh.m, sh.n, sh.k, Device::cuda());
          ASSERT_EQ(why.find("stream-K") != std::string::npos, run < 2) << why;
          got[run] = Tensor::empty(c.out, {sh.m, sh.n}, Device::cuda());
          got[run].fill_bytes(0xFF);  // NaN: every element must be written
          linear(o.xd.view(), o.wd.view(), &o.bias_dv, got[run].view());
        }
        synchronize(Device::cuda());
        EXPECT_LE(rel_error(got[0], o.ref), tolerance(f, c.x, c.out));
        EXPECT_TRUE(same_bytes(got[0], got[1]));
        EXPECT_LE(rel_error(got[0], got[2].to(Device::cpu())), tolerance(f, c.x, c.out));
      });
}

// Stream-K after whole waves (NIBBLE_SM90_STREAM_K_WHOLE_WAVES): the persistent CTAs first
// walk whole tiles, then cut only the rest into ranges. 200 tiles of 64 tokens on 132 SMs: one
// whole wave, 68 tiles in ranges of about four K blocks; 315 tiles: one wave (183 tiles in
// ranges) and two (51). The result must match the reference, write every element, repeat bit
// for bit, and stay within the tolerance of the whole-tile plan.
TEST(CudaWeightOnly, Sm90StreamKAfterWholeWavesMatchesTheReference) {
  NIBBLE_REQUIRE_GPU();
  if (weight_only_kernels().size() < 2) GTEST_SKIP() << "needs sm90_weight_only_gemm (H100)";
  for_each_sm90_case(
      {{300, 5000, 1024, "64"}, {300, 8000, 1536, "64"}},
      {{"w4a16_g128", DType::bf16, DType::bf16},
       {"w4a16_g32_asym", DType::f16, DType::f32},
       {"w8a16", DType::f16, DType::f16}},
      [](const LinearFormat& f, const Case& c, const TiledShape& sh, const LinearOperands& o) {
        Tensor got[4];  // one whole wave, the most whole waves twice, whole tiles
        for (int run = 0; run < 4; ++run) {
          const ScopedEnv stream_k("NIBBLE_SM90_STREAM_K", run < 3 ? "1" : "0");
          const ScopedEnv waves("NIBBLE_SM90_STREAM_K_WHOLE_WAVES", run == 0 ? "1" : "-1");
          const std::string why = explain(f, sh.m, sh.n, sh.k, Device::cuda());
          if (run < 3) {
            const bool two = run > 0 && sh.n == 8000;
            ASSERT_NE(why.find(two ? "2 whole waves of tiles" : "1 whole wave of tiles"),
                      std::string::npos) << why;
          }
          got[run] = Tensor::empty(c.out, {sh.m, sh.n}, Device::cuda());
          got[run].fill_bytes(0xFF);  // NaN: every element must be written
          linear(o.xd.view(), o.wd.view(), &o.bias_dv, got[run].view());
        }
        synchronize(Device::cuda());
        for (int run = 0; run < 3; ++run)
          EXPECT_LE(rel_error(got[run], o.ref), tolerance(f, c.x, c.out)) << run;
        EXPECT_TRUE(same_bytes(got[1], got[2]));
        EXPECT_LE(rel_error(got[1], got[3].to(Device::cpu())), tolerance(f, c.x, c.out));
      });
}

TEST(CudaWeightOnly, ExtremeIntegersArePassedExactly) {
  NIBBLE_REQUIRE_GPU();
  // Per channel with unit scales the kernel computes Σ x·v exactly in f32 for small integer x:
  // all weights at their extremes (−8 / 7, −128 / 127) and x = ±1 give exact integer sums.
  for (const char* name : {"w4a16_pc", "w8a16"}) {
    SCOPED_TRACE(name);
    const LinearFormat f = parse_linear_format(name);
    const int64_t m = 3, n = 16, k = 4096;
    const bool w8 = f.weight.scheme == WeightScheme::s8_sym;
    for (int lo_hi = 0; lo_hi < 2; ++lo_hi) {
      QuantizedWeight qw(f.weight, n, k);
      const int v = lo_hi == 0 ? (w8 ? -128 : -8) : (w8 ? 127 : 7);
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t kk = 0; kk < k; ++kk) store_int(qw.q.data(), qw.q.view().dtype, r * k + kk, v);
        store_float(qw.scales.data(), qw.scales.view().dtype, r, 1.0f);
      }
      Tensor x = Tensor::empty(DType::bf16, {m, k});
      for (int64_t i = 0; i < m * k; ++i) store_float(x.data(), DType::bf16, i, i % 3 == 0 ? -1.0f : 1.0f);
      Tensor ref = Tensor::empty(DType::f32, {m, n});
      linear(x.view(), qw.view(), nullptr, ref.view());
      const PackedWeight wd = pack_weight(qw.view(), packed_layout(f), Device::cuda());
      const Tensor xd = x.to(Device::cuda());
      for (const std::string& kernel : weight_only_kernels()) {
        SCOPED_TRACE(kernel);
        const ForceKernel force(kernel);
        Tensor got = Tensor::empty(DType::f32, {m, n}, Device::cuda());
        got.fill_bytes(0xFF);
        linear(xd.view(), wd.view(), nullptr, got.view());
        synchronize(Device::cuda());
        EXPECT_TRUE(same_bytes(got, ref));
      }
    }
  }
}

#if NIBBLE_WITH_CUDA
// The split-K choice of sm80_weight_only_gemm's decode tiles on an H100-like GPU (132 SMs, 3
// CTAs of the 8-bit 16-row tile per SM, fewer clusters of 8 than the tiles of 6144x4096): host
// logic, no GPU needed. A split that would not run in one wave is cut back.
TEST(Sm80WeightOnlyPlan, SplitsRunInOneWave) {
  unsetenv("NIBBLE_SM80_SPLITS");
  cuda::WeightOnlyOccupancy occ;
  occ.sm_count = 132;
  occ.ctas_per_sm = 3;
  occ.clusters_at_once = {0, 0, 66, 48, 33, 26, 22, 18, 16};
  // 224 channel tiles: two splits would be 448 CTAs on 396 slots, so none.
  auto plan = cuda::plan_sm80_weight_only(1, 28672, 4096, occ);
  EXPECT_EQ(plan.splits, 1);
  EXPECT_EQ(plan.resident_ctas, 224);
  EXPECT_FALSE(plan.cluster_split);
  // 48 tiles want 8 splits (K blocks allow 8); clusters of 3 are the largest that fit 48 at once.
  plan = cuda::plan_sm80_weight_only(1, 6144, 4096, occ);
  EXPECT_EQ(plan.splits, 3);
  EXPECT_TRUE(plan.cluster_split);
  EXPECT_EQ(plan.resident_ctas, 48 * 3);
  EXPECT_EQ(plan.kblocks_per_split, 11);
  // Without clusters the same 8 splits go through the workspace: 384 CTAs fit on 396 slots.
  cuda::WeightOnlyOccupancy no_clusters = occ;
  no_clusters.clusters_at_once = {};
  plan = cuda::plan_sm80_weight_only(16, 6144, 4096, no_clusters);
  EXPECT_EQ(plan.splits, 8);
  EXPECT_FALSE(plan.cluster_split);
  // 32 tiles of 112 K blocks want 13 splits through the workspace: 416 > 396, so 12 (10 blocks
  // each, the last 2).
  plan = cuda::plan_sm80_weight_only(1, 4096, 14336, occ);
  EXPECT_EQ(plan.splits, 12);
  EXPECT_EQ(plan.kblocks_per_split, 10);
  EXPECT_EQ(plan.resident_ctas, 384);
  // Where the GPU runs clusters of 12 (non-portable sizes, the H100) enough of them at once,
  // the same 12 splits reduce in a cluster instead.
  cuda::WeightOnlyOccupancy big_clusters = occ;
  big_clusters.clusters_at_once[12] = 32;
  plan = cuda::plan_sm80_weight_only(1, 4096, 14336, big_clusters);
  EXPECT_EQ(plan.splits, 12);
  EXPECT_TRUE(plan.cluster_split);
  EXPECT_EQ(plan.resident_ctas, 384);
  // 32 tiles of 32 K blocks want 13 splits: 11 of 3 blocks (the last 2); no cluster of 11 is
  // known here, so they go through the workspace, 352 CTAs on 396 slots.
  plan = cuda::plan_sm80_weight_only(1, 4096, 4096, occ);
  EXPECT_EQ(plan.splits, 11);
  EXPECT_EQ(plan.kblocks_per_split, 3);
  EXPECT_EQ(plan.resident_ctas, 352);
  // 2048x2048: 16 tiles of 16 K blocks, 8 splits of 2 (at least 2 blocks a split), a cluster.
  plan = cuda::plan_sm80_weight_only(16, 2048, 2048, occ);
  EXPECT_EQ(plan.splits, 8);
  EXPECT_EQ(plan.kblocks_per_split, 2);
  EXPECT_TRUE(plan.cluster_split);
  // Unknown occupancy (0 CTAs per SM): no cap.
  cuda::WeightOnlyOccupancy unknown;
  unknown.sm_count = 132;
  plan = cuda::plan_sm80_weight_only(1, 28672, 4096, unknown);
  EXPECT_EQ(plan.splits, 2);
  // Large M: whole tiles.
  plan = cuda::plan_sm80_weight_only(1000, 4096, 4096, occ);
  EXPECT_EQ(plan.splits, 1);
  // The measurement knob forces a split count, in equal ranges that cover K.
  setenv("NIBBLE_SM80_SPLITS", "5", 1);
  plan = cuda::plan_sm80_weight_only(1, 28672, 4096, occ);
  unsetenv("NIBBLE_SM80_SPLITS");
  EXPECT_EQ(plan.splits, 5);
  EXPECT_EQ(plan.kblocks_per_split, 7);
  EXPECT_TRUE(plan.cluster_split);
}

// The planner of sm90_weight_only_gemm on an H100-like GPU (132 SMs; clusters of s CTAs at once
// as the H100 reports them for 2..4): host logic, no GPU needed. The expected picks are the
// fastest measured cells of bench/results/h100_weight_only_tiles.log.
TEST(Sm90Tiling, CostModelWeighsWavesAgainstTileSize) {
  const int clusters[cuda::kMaxSm90ClusterSplits + 1] = {0, 0, 66, 39, 30, 24, 18, 16, 14};
  const cuda::Sm90TileCosts costs{0.5, 0.7, 1.3, 4.0, 2.0};
  const cuda::Sm90ClusterSplitK cluster{clusters, 8};
  auto pick = [&](int64_t m, int64_t n, int64_t k) {
    return cuda::choose_sm90_tiles_by_cost(m, n, k, 132, costs, 8, cluster);
  };
  // Many waves: the largest tile, unsplit.
  auto t = pick(4096, 4096, 4096);
  EXPECT_EQ(t.bm, 256);
  EXPECT_EQ(t.splits, 1);
  EXPECT_EQ(t.tiles_m * t.tiles_n, 16 * 32);
  // 32 channel tiles at M = 256: 128-token tiles in pairs fill 128 SMs.
  t = pick(256, 4096, 14336);
  EXPECT_EQ(t.bm, 128);
  EXPECT_EQ(t.splits, 2);
  EXPECT_TRUE(t.cluster_split);
  EXPECT_EQ(t.kblocks_per_split, 56);
  // 224 channel tiles: 256-token tiles in 2 waves beat 128-token tiles in 4.
  t = pick(256, 28672, 4096);
  EXPECT_EQ(t.bm, 256);
  EXPECT_EQ(t.splits, 1);
  // Few tiles: split as far as clusters fit in one wave and K blocks allow (32 / 8 = 4 > 3
  // fitting: 32 tiles of 3 CTAs in 39 clusters).
  t = pick(64, 4096, 4096);
  EXPECT_EQ(t.bm, 64);
  EXPECT_EQ(t.splits, 3);
  EXPECT_EQ(t.kblocks_per_split, 11);
  // Every split holds K blocks, and the splits cover K.
  for (int64_t k : {1024, 2048 + 128, 4096, 14336}) {
    t = pick(40, 512, k);
    EXPECT_GE(t.kblocks_per_split * t.splits, k / 128);
    EXPECT_LT(t.kblocks_per_split * (t.splits - 1), k / 128);
  }
  // No clusters at all: the workspace split of choose_sm90_tiles.
  const int none[cuda::kMaxSm90ClusterSplits + 1] = {};
  t = cuda::choose_sm90_tiles_by_cost(40, 512, 8192, 132, costs, 8, {none, 8});
  EXPECT_FALSE(t.cluster_split);
  EXPECT_GT(t.splits, 1);

  // With stream-K as a candidate: 80 channel tiles of 10240×8192 at M = 256 leave 52 SMs idle
  // whole, and 160 in clusters of two a second wave of 28; equal ranges of their 64 K blocks
  // (38–39 a CTA) win.
  cuda::Sm90TileCosts with_stream_k = costs;
  with_stream_k.stream_k_slowdown = 1.15;
  with_stream_k.stream_k_fixup_per_token = 8.0 / 256;
  t = cuda::choose_sm90_tiles_by_cost(256, 10240, 8192, 132, with_stream_k, 8, cluster);
  EXPECT_TRUE(t.stream_k);
  EXPECT_EQ(t.bm, 256);
  EXPECT_EQ(t.splits, 1);
  EXPECT_EQ(t.whole_tiles, 0);
  // Whole waves first only where asked for (NIBBLE_SM90_STREAM_K_WHOLE_WAVES): 160 tiles of 256
  // tokens of 5120×5120 at M = 1024, the most (-1) is one wave, then 28 tiles in ranges.
  t = cuda::choose_sm90_tiles_by_cost(1024, 5120, 5120, 132, with_stream_k, 8, cluster);
  EXPECT_TRUE(t.stream_k);
  EXPECT_EQ(t.whole_tiles, 0);
  with_stream_k.forced_whole_waves = -1;
  t = cuda::choose_sm90_tiles_by_cost(1024, 5120, 5120, 132, with_stream_k, 8, cluster);
  EXPECT_TRUE(t.stream_k);
  EXPECT_EQ(t.bm, 256);
  EXPECT_EQ(t.whole_tiles, 132);
  with_stream_k.forced_whole_waves.reset();
  // Forced whole waves are clipped to all but the last wave; negative counts from the most.
  EXPECT_EQ(cuda::stream_k_whole_waves(-1, 320, 132), 2);
  EXPECT_EQ(cuda::stream_k_whole_waves(-2, 320, 132), 1);
  EXPECT_EQ(cuda::stream_k_whole_waves(-9, 320, 132), 0);
  EXPECT_EQ(cuda::stream_k_whole_waves(5, 320, 132), 2);
  EXPECT_EQ(cuda::stream_k_whole_waves(-1, 264, 132), 1);
  EXPECT_EQ(cuda::stream_k_whole_waves(-1, 100, 132), 0);
  // 512 tiles fill 3.9 waves: whole tiles (stream-K is not a candidate under 10% idle).
  t = cuda::choose_sm90_tiles_by_cost(4096, 4096, 4096, 132, with_stream_k, 8, cluster);
  EXPECT_FALSE(t.stream_k);
  EXPECT_EQ(t.bm, 256);
  // Too few K blocks for ranges of 4: not a candidate even when asked for.
  with_stream_k.stream_k_only = true;
  t = cuda::choose_sm90_tiles_by_cost(64, 1024, 512, 132, with_stream_k, 8, cluster);
  EXPECT_FALSE(t.stream_k);
  EXPECT_GT(t.bm, 0);
}
#endif

TEST(CudaWeightOnly, SplitKIsDeterministicAndExplained) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;  // fresh seed, printed on failure
  const int64_t n = 512, k = 8192;  // few tiles, long K: split-K is chosen
  const LinearFormat f = parse_linear_format("w4a16_g128_asym");
  QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
  const PackedWeight wd = pack_weight(qw.view(), packed_layout(f), Device::cuda());
  for (int64_t m : {1, 5, 40}) {
    const Tensor xd = test::random_activations(DType::bf16, m, k, rng).to(Device::cuda());
    for (const std::string& kernel : weight_only_kernels()) {
      SCOPED_TRACE(kernel + " M=" + std::to_string(m));
      const ForceKernel force(kernel);
      Tensor d1 = Tensor::empty(DType::bf16, {m, n}, Device::cuda()), d2 = d1.to(Device::cuda());
      linear(xd.view(), wd.view(), nullptr, d1.view());
      for (int i = 0; i < 5; ++i) linear(xd.view(), wd.view(), nullptr, d2.view());
      synchronize(Device::cuda());
      EXPECT_TRUE(same_bytes(d1, d2));
      const std::string why = explain(f, m, n, k, Device::cuda());
      EXPECT_NE(why.find(kernel_name(kernel)), std::string::npos) << why;
      EXPECT_NE(why.find("split-K"), std::string::npos) << why;
    }
  }
}

#if NIBBLE_WITH_CUDA
TEST(CudaWeightOnly, CapturedGraphReplaysTheSameResult) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  const int64_t n = 4096, k = 4096;
  const LinearFormat f = parse_linear_format("w4a16_g128");
  QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
  const PackedWeight wd = pack_weight(qw.view(), packed_layout(f), Device::cuda());
  for (int64_t m : {1, 256}) {  // split-K on the sm80 kernel; the wgmma kernel on Hopper
    SCOPED_TRACE("M=" + std::to_string(m));
    const Tensor xd = test::random_activations(DType::bf16, m, k, rng).to(Device::cuda());
    Tensor eager = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
    Tensor replay = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
    expect_graph_replay_matches(
        [&](cudaStream_t stream, Tensor& out) {
          linear(xd.view(), wd.view(), nullptr, out.view(), stream);
        },
        eager, replay);
  }
}
#endif

#if NIBBLE_WITH_CUDA
// PyTorch warms a model up on a side stream and captures it on another: the first call on the
// capturing stream allocates its split-K workspace during the capture (and a larger M grows it
// there). The graph must capture and replay the eager result.
TEST(CudaWeightOnly, CapturesOnAStreamItNeverRanOn) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  const int64_t n = 512, k = 8192;  // 4 tiles, long K: 16 splits through the workspace
  const LinearFormat f = parse_linear_format("w4a16_g128");
  QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
  const PackedWeight wd = pack_weight(qw.view(), packed_layout(f), Device::cuda());
  cudaStream_t warm, capture;
  ASSERT_EQ(cudaStreamCreateWithFlags(&warm, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking), cudaSuccess);
  for (int64_t m : {1, 9}) {  // the second grows the capturing stream's workspace
    SCOPED_TRACE("M=" + std::to_string(m));
    const Tensor xd = test::random_activations(DType::bf16, m, k, rng).to(Device::cuda());
    Tensor eager = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
    Tensor replay = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
    expect_captured_replay_matches(
        [&](cudaStream_t stream, Tensor& out) {
          linear(xd.view(), wd.view(), nullptr, out.view(), stream);
        },
        eager, replay, warm, capture);
  }
  cudaStreamDestroy(warm);
  cudaStreamDestroy(capture);
}
#endif

TEST(CudaWeightOnly, RejectsF32ActivationsAndMisalignedRowsBeforeLaunch) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  const int64_t m = 2, n = 16, k = 128;
  QuantizedWeight qw(parse_weight_format("w4_g128"), n, k);
  quantize_weight(test::random_normal(DType::f32, n, k, rng).view(), qw.view());
  const PackedWeight wd = pack_weight(qw.view(), WeightLayout::w4_mma16_k128, Device::cuda());
  Tensor d = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
  const Tensor x32 = test::random_activations(DType::f32, m, k, rng).to(Device::cuda());
  try {
    linear(x32.view(), wd.view(), nullptr, d.view());
    FAIL() << "expected a dtype error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
  }
  Tensor wide = Tensor::empty(DType::bf16, {m, k + 4}, Device::cuda());
  TensorView v = wide.view();
  v.shape[1] = k;  // rows of 264 bytes: not a multiple of 16
  try {
    linear(v, wd.view(), nullptr, d.view());
    FAIL() << "expected an alignment error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nibble
