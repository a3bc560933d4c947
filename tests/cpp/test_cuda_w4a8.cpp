// GPU tests of the W4A8 tensor-core kernels (sm80_w4a8_gemm, and sm90_w4a8_gemm on Hopper) with
// packed weights, against the CPU reference on the same quantized operands. The odd-shape tests
// run every shape through each kernel in turn (NIBBLE_W4A8_KERNEL), not only the one dispatch
// picks for that M.
#include <gtest/gtest.h>

#if NIBBLE_WITH_CUDA
#include <cuda_runtime.h>

#include "cuda/launch/sm80_w4a8_gemm.h"
#include "cuda/launch/sm90_tiling.h"
#endif

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "nibble/nibble.h"

namespace nibble {
namespace {

// The M values the issue names, covering every tile bucket and its edges.
const std::vector<int64_t> kOddM = {1, 2, 3, 7, 15, 16, 17, 31, 64, 100, 127, 128, 255, 1000};

// The W4A8 kernels a packed-weight call can run here; dispatch picks by M, the tests force each.
std::vector<std::string> w4a8_kernels() {
  std::vector<std::string> k = {"sm80_w4a8_gemm"};
  if (sm90a_kernels_here()) k.push_back("sm90_w4a8_gemm");
  return k;
}

TEST(CudaW4A8, S32IsBitExactOnOddShapes) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;  // fresh seed, printed on failure
  // N = 13: rows of 52 bytes, so the sm90 epilogue's unaligned (scalar) store path runs.
  const std::pair<int64_t, int64_t> nk[] = {{8, 32}, {13, 64}, {72, 160}, {264, 4096}, {1000, 544}};
  for (auto [n, k] : nk) {
    const Tensor w = test::random_int(DType::s4, n, k, rng);
    const PackedWeight wd = pack_s4_matrix(w.view(), Device::cuda());
    for (int64_t m : kOddM) {
      const Tensor a = test::random_int(DType::s8, m, k, rng);
      Tensor ref = Tensor::empty(DType::s32, {m, n});
      gemm_s32(a.view(), w.view(), ref.view());
      for (const std::string& kernel : w4a8_kernels()) {
        SCOPED_TRACE(kernel + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                     " K=" + std::to_string(k));
        const ScopedEnv force("NIBBLE_W4A8_KERNEL", kernel);
        ASSERT_TRUE(same_bytes(gpu_s32(a, wd, m, n), ref));
      }
    }
  }
}

TEST(CudaW4A8, S32ExtremeValuesAtTheDocumentedMaximumK) {
  NIBBLE_REQUIRE_GPU();
  // K at the largest multiple of 32 within max_int32_accumulation_k(s8, s4): every product at
  // its extreme, so the exact sum sits next to the int32 bound (and overflows if anything is off).
  const int64_t k = max_int32_accumulation_k(DType::s8, DType::s4) / 32 * 32;
  const int64_t m = 3, n = 16;
  for (auto [a_byte, w_byte] : std::vector<std::pair<uint8_t, uint8_t>>{{0x80, 0x88}, {0x80, 0x77}, {0x7F, 0x88}, {0x81, 0x77}}) {
    SCOPED_TRACE("a byte " + std::to_string(a_byte) + " w byte " + std::to_string(w_byte));
    Tensor a = Tensor::empty(DType::s8, {m, k}), w = Tensor::empty(DType::s4, {n, k});
    a.fill_bytes(a_byte);
    w.fill_bytes(w_byte);
    Tensor ref = Tensor::empty(DType::s32, {m, n});
    gemm_s32(a.view(), w.view(), ref.view());
    const PackedWeight wd = pack_s4_matrix(w.view(), Device::cuda());
    for (const std::string& kernel : w4a8_kernels()) {
      SCOPED_TRACE(kernel);
      const ScopedEnv force("NIBBLE_W4A8_KERNEL", kernel);
      EXPECT_TRUE(same_bytes(gpu_s32(a, wd, m, n), ref));
    }
  }
}

// sm90_w4a8_gemm decodes s4_sym weights as 16·v (high_nibble) while the 16× sums stay within
// int32, up to K = max_int32_accumulation_k(s8, s8), and exactly (offset_xor) beyond. At that
// bound, in one unsplit tile, every product at its extreme puts the sum next to the int32
// limit: both decodings must give the reference's bytes, on random values too. One K block
// more turns high_nibble off.
TEST(CudaW4A8, Sm90HighNibbleDecodingHoldsUpToItsKBound) {
  NIBBLE_REQUIRE_GPU();
  if (!sm90a_kernels_here()) GTEST_SKIP() << "sm90_w4a8_gemm needs an sm_90a build on sm_90";
  const ScopedEnv force("NIBBLE_W4A8_KERNEL", "sm90_w4a8_gemm");
  const ScopedEnv unsplit("NIBBLE_SM90_SPLITS", "1");
  const int64_t k = max_int32_accumulation_k(DType::s8, DType::s8) / 128 * 128;
  const int64_t m = 3, n = 16;
  const LinearFormat pc = parse_linear_format("w4a8_pc");
  EXPECT_NE(explain(pc, m, n, k, Device::cuda()).find("high_nibble"), std::string::npos);
  EXPECT_EQ(explain(pc, m, n, k + 128, Device::cuda()).find("high_nibble"), std::string::npos);
  test::Rng rng;  // fresh seed, printed on failure
  std::vector<std::pair<Tensor, Tensor>> cases;  // (a, w)
  for (auto [a_byte, w_byte] : std::vector<std::pair<uint8_t, uint8_t>>{
           {0x80, 0x88}, {0x80, 0x77}, {0x7F, 0x88}, {0x81, 0x77}}) {
    Tensor a = Tensor::empty(DType::s8, {m, k}), w = Tensor::empty(DType::s4, {n, k});
    a.fill_bytes(a_byte);
    w.fill_bytes(w_byte);
    cases.emplace_back(std::move(a), std::move(w));
  }
  cases.emplace_back(test::random_int(DType::s8, m, k, rng),
                     test::random_int(DType::s4, n, k, rng));
  for (size_t c = 0; c < cases.size(); ++c) {
    const auto& [a, w] = cases[c];
    Tensor ref = Tensor::empty(DType::s32, {m, n});
    gemm_s32(a.view(), w.view(), ref.view());
    const PackedWeight wd = pack_s4_matrix(w.view(), Device::cuda());
    for (const char* decoding : {"high_nibble", "offset_xor"}) {
      SCOPED_TRACE(std::string(decoding) + (c + 1 < cases.size() ? ", extremes " : ", random ") +
                   std::to_string(c));
      const ScopedEnv decode("NIBBLE_SM90_W4_DECODE", decoding);
      EXPECT_TRUE(same_bytes(gpu_s32(a, wd, m, n), ref));
    }
  }
}

TEST(CudaW4A8, SplitKIsDeterministic) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;  // fresh seed, printed on failure
  const int64_t n = 512, k = 8192;  // few tiles, long K: split-K is chosen
  QuantizedWeight qw = test::random_quantized_weight(parse_weight_format("w4_g128"), n, k, rng);
  const PackedWeight wd = pack_weight(qw.view(), Device::cuda());
  for (int64_t m : {5, 100}) {  // the thin sm80 tiles; sm90 (or sm80's large tiles) at M = 100
    QuantizedActivation qa(ActScheme::s8_per_token, m, k);
    quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
    const QuantizedActivation qad = qa.to(Device::cuda());
    for (const std::string& kernel : w4a8_kernels()) {
      SCOPED_TRACE(kernel + " M=" + std::to_string(m));
      const ScopedEnv force("NIBBLE_W4A8_KERNEL", kernel);
      Tensor d1 = Tensor::empty(DType::f32, {m, n}, Device::cuda()), d2 = d1.to(Device::cuda());
      linear(qad.view(), wd.view(), nullptr, d1.view());
      for (int i = 0; i < 5; ++i) linear(qad.view(), wd.view(), nullptr, d2.view());
      synchronize(Device::cuda());
      EXPECT_TRUE(same_bytes(d1, d2));
      EXPECT_NE(explain(parse_linear_format("w4a8_g128"), m, n, k, Device::cuda()).find("split-K"),
                std::string::npos);
    }
  }
}

class CudaW4A8Linear : public ::testing::TestWithParam<LinearCase> {};

TEST_P(CudaW4A8Linear, MatchesReferenceOnOddShapes) {
  NIBBLE_REQUIRE_GPU();
  expect_int8_linear_matches_reference(
      parse_linear_format(GetParam().format), GetParam().out, kOddM, w4a8_kernels(),
      "NIBBLE_W4A8_KERNEL",
      [](const QuantizedWeight& qw) { return pack_weight(qw.view(), Device::cuda()); });
}

INSTANTIATE_TEST_SUITE_P(
    Formats, CudaW4A8Linear,
    ::testing::Values(LinearCase{"w4a8_pc", DType::bf16}, LinearCase{"w4a8_pc", DType::f32},
                      LinearCase{"w4a8_g128", DType::bf16}, LinearCase{"w4a8_g128", DType::f32},
                      LinearCase{"w4a8_g32", DType::f16}, LinearCase{"w4a8_g64", DType::f32},
                      LinearCase{"w4a8_g256", DType::f32}, LinearCase{"w4a8_g128_2level", DType::bf16},
                      LinearCase{"w4a8_g128_2level", DType::f32}, LinearCase{"w4a8_g32_2level", DType::f32},
                      LinearCase{"w4a8_pc_static", DType::bf16}),
    [](const auto& p) {
      return std::string(p.param.format) + "_" + to_string(p.param.out);
    });

// Float activations with W4A8 weights: quantized per token by the activation kernel (the
// default, and NIBBLE_FUSED_ACT_QUANT=0), or inside the GEMM with NIBBLE_FUSED_ACT_QUANT=1 where
// the m16 tile holds its rows of its K range (fused_quant_fits; one launch). Either way the int8 codes and scales are those of
// quantize_activation, so with the same kernel (sm80_w4a8_gemm forced) the output bytes equal
// quantize_activation + linear, fused or not; with the dispatcher's choice, the CPU reference's
// tolerance.
TEST_P(CudaW4A8Linear, FloatActivationsMatchQuantizeThenLinear) {
  NIBBLE_REQUIRE_GPU();
  const LinearFormat f = parse_linear_format(GetParam().format);
  if (f.act != ActScheme::s8_per_token) GTEST_SKIP() << "float-in W4A8 is dynamic per token";
  const DType out = GetParam().out;
  test::Rng rng;  // fresh seed, printed on failure
  // {1000, 1536} and {256, 4096} split K (on sm_90: the splits are one cluster, and each CTA
  // reduces max |x| over its own split, so the last row gets an outlier in the last split).
  // {17000, 2048} is one wave without splits: fused at M = 1 (2 KB rows), two launches at M = 16
  // (beyond kFusedQuantMaxTokens, and 16 rows of 2 KB would not fit the 16 KB resident A).
  const std::pair<int64_t, int64_t> nk[] = {{136, 512}, {20, 256}, {1000, 1536}, {256, 4096},
                                            {17000, 2048}};
  for (auto [n, k] : nk) {
    if (!f.weight.per_channel() && k % f.weight.group_size != 0) continue;
    QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
    const PackedWeight wd = pack_weight(qw.view(), Device::cuda());
    const Tensor bias_d = test::random_normal(DType::bf16, 1, n, rng).to(Device::cuda());
    const TensorView bias_dv = test::as_vector(bias_d);
    const bool wide = n > 4096;
    for (int64_t m : {1, 2, 3, 7, 15, 16, 17, 64, 100}) {
      if (wide && m != 1 && m != 3 && m != 16) continue;  // the CPU reference is slow there
      for (DType xt : {DType::f32, DType::bf16, DType::f16}) {
        if (wide && xt == DType::f16) continue;
        SCOPED_TRACE("M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" +
                     std::to_string(k) + " x " + to_string(xt));
        Tensor x = test::random_activations(xt, m, k, rng);
        test::put_float(x.view(), m - 1, k - 5, -300.0 * static_cast<double>(1 + m % 3));
        QuantizedActivation qa(ActScheme::s8_per_token, m, k);
        quantize_activation(x.view(), qa.view());
        Tensor ref = Tensor::empty(out, {m, n});
        linear(qa.view(), qw.view(), nullptr, ref.view());
        const Tensor xd = x.to(Device::cuda());
        const QuantizedActivation qad = qa.to(Device::cuda());
        Tensor got = Tensor::empty(out, {m, n}, Device::cuda());
        got.fill_bytes(0xFF);  // NaN in every float dtype
        linear(xd.view(), wd.view(), nullptr, got.view());
        synchronize(Device::cuda());
        ASSERT_LE(rel_error(got, ref), out == DType::f32 ? kRelTolF32Out : kRelTolHalfOut);
        const ScopedEnv force("NIBBLE_W4A8_KERNEL", "sm80_w4a8_gemm");
        Tensor split = Tensor::empty(out, {m, n}, Device::cuda());
        split.fill_bytes(0xFF);
        linear(qad.view(), wd.view(), &bias_dv, split.view());
        for (const char* fuse : {"1", "0"}) {
          const ScopedEnv fused_or_not("NIBBLE_FUSED_ACT_QUANT", fuse);
          SCOPED_TRACE(std::string("NIBBLE_FUSED_ACT_QUANT=") + fuse);
          Tensor fused = Tensor::empty(out, {m, n}, Device::cuda());
          fused.fill_bytes(0xFF);
          linear(xd.view(), wd.view(), &bias_dv, fused.view());
          synchronize(Device::cuda());
          ASSERT_TRUE(same_bytes(fused, split));
        }
      }
    }
  }
}

// Where the fused path runs, as explain() reports it: by default nowhere for a plain linear
// (only under a LinearFusion); with NIBBLE_FUSED_ACT_QUANT=1 at M = 1 on any of these layers,
// up to kFusedQuantMaxTokens (4) where the M rows of the CTA's K range fit in the resident 16 KB.
TEST(CudaW4A8, ExplainSaysWhereTheQuantizationIsFused) {
  NIBBLE_REQUIRE_GPU();
  const LinearFormat f = parse_linear_format("w4a8_pc");
  const std::string fused = "fused into sm80_w4a8_gemm";
  {
    const ScopedEnv unset("NIBBLE_FUSED_ACT_QUANT", "");  // empty: as if unset
    const std::string s = explain(f, 1, 4096, 4096, Device::cuda());
    EXPECT_EQ(s.find(fused), std::string::npos) << s;
    EXPECT_NE(s.find("act_quant quantizes them first"), std::string::npos) << s;
  }
  {
    const ScopedEnv bad("NIBBLE_FUSED_ACT_QUANT", "yes");
    EXPECT_THROW(explain(f, 1, 4096, 4096, Device::cuda()), Error);
  }
  const ScopedEnv everywhere("NIBBLE_FUSED_ACT_QUANT", "1");
  EXPECT_NE(explain(f, 1, 4096, 4096, Device::cuda()).find(fused), std::string::npos);
  EXPECT_NE(explain(f, 1, 28672, 4096, Device::cuda()).find(fused), std::string::npos);
  EXPECT_NE(explain(f, 1, 4096, 14336, Device::cuda()).find(fused), std::string::npos);
  EXPECT_NE(explain(f, 4, 4096, 4096, Device::cuda()).find(fused), std::string::npos);
  EXPECT_EQ(explain(f, 5, 4096, 4096, Device::cuda()).find(fused), std::string::npos);
  EXPECT_NE(explain(f, 4, 17000, 2048, Device::cuda()).find(fused), std::string::npos);
  // One wave without splits: 4 rows of the whole K, 4 × (4096 + 16) bytes, do not fit.
  EXPECT_EQ(explain(f, 4, 17000, 4096, Device::cuda()).find(fused), std::string::npos);
  const ScopedEnv off("NIBBLE_FUSED_ACT_QUANT", "0");
  EXPECT_EQ(explain(f, 1, 4096, 4096, Device::cuda()).find(fused), std::string::npos);
}

#if NIBBLE_WITH_CUDA
TEST(CudaW4A8, FusedQuantizationReplaysInACudaGraph) {
  NIBBLE_REQUIRE_GPU();
  // The decode step's linear: bf16 in, bf16 out, one launch (NIBBLE_FUSED_ACT_QUANT=1: a plain
  // linear fuses only when asked), inside a captured graph.
  const ScopedEnv everywhere("NIBBLE_FUSED_ACT_QUANT", "1");
  test::Rng rng;
  const int64_t m = 1, n = 4096, k = 4096;
  QuantizedWeight qw = test::random_quantized_weight(parse_weight_format("w4_g128"), n, k, rng);
  const PackedWeight wd = pack_weight(qw.view(), Device::cuda());
  const Tensor xd = test::random_activations(DType::bf16, m, k, rng).to(Device::cuda());
  Tensor eager = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
  Tensor replay = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
  size_t nodes = 0;
  expect_graph_replay_matches(
      [&](cudaStream_t stream, Tensor& out) {
        linear(xd.view(), wd.view(), nullptr, out.view(), stream);
      },
      eager, replay, &nodes);
  EXPECT_EQ(nodes, 1u);  // one kernel: the quantization is inside the GEMM
}
#endif

// A random problem of a W4A8-family format: its weights, a bf16 bias (on the host and the GPU),
// bf16 activations quantized as the format asks (a static scale of 0.6 for s8_per_tensor), on
// the host and the GPU, and the CPU reference output (`ref`, of dtype `out`).
struct LinearProblem {
  QuantizedWeight qw;
  Tensor bias, bias_d;
  QuantizedActivation qa, qad;
  Tensor ref;
};

LinearProblem make_linear_problem(const LinearFormat& f, int64_t m, int64_t n, int64_t k,
                                  DType out, test::Rng& rng) {
  LinearProblem pr;
  pr.qw = test::random_quantized_weight(f.weight, n, k, rng);
  pr.bias = test::random_normal(DType::bf16, 1, n, rng);
  pr.bias_d = pr.bias.to(Device::cuda());
  pr.qa = QuantizedActivation(f.act, m, k);
  const Tensor x = test::random_activations(DType::bf16, m, k, rng);
  if (f.act == ActScheme::s8_per_tensor) quantize_activation_static(x.view(), 0.6f, pr.qa.view());
  else quantize_activation(x.view(), pr.qa.view());
  pr.qad = pr.qa.to(Device::cuda());
  pr.ref = Tensor::empty(out, {m, n});
  const TensorView bias_v = test::as_vector(pr.bias);
  linear(pr.qa.view(), pr.qw.view(), &bias_v, pr.ref.view());
  return pr;
}

// sm90_w4a8_gemm's f32 group format with 16·v weights (high_nibble): each K block's sums are
// 16·Σ and fold with s/16, the same products as offset_xor's Σ with s; where s/16 would be
// subnormal (0 < |s| < 2^-122) the sums are shifted back first. Both decodings must give the
// same bytes, within the reference's tolerance: random scales, and channels whose every group
// scale sits below 2^-122 (1.5·2^-124, and a bf16 subnormal 2^-130) or at it; K past the
// per-channel format's int32 bound (block sums restart, so the group format has none), a
// 128-token tile, and a ragged last token tile. explain names the decoding.
TEST(CudaW4A8, Sm90HighNibbleGroupScalesFoldLikeOffsetXor) {
  NIBBLE_REQUIRE_GPU();
  if (!sm90a_kernels_here()) GTEST_SKIP() << "sm90_w4a8_gemm needs an sm_90a build on sm_90";
  const ScopedEnv force("NIBBLE_W4A8_KERNEL", "sm90_w4a8_gemm");
  test::Rng rng;  // fresh seed, printed on failure
  const LinearFormat f = parse_linear_format("w4a8_g128");
  const int64_t long_k = (max_int32_accumulation_k(DType::s8, DType::s8) / 128 + 2) * 128;
  const int64_t shapes[][3] = {{3, 40, long_k}, {100, 384, 4096}, {250, 200, 1152}};
  for (const auto& sh : shapes) {
    const int64_t m = sh[0], n = sh[1], k = sh[2];
    SCOPED_TRACE("M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
    EXPECT_NE(explain(f, m, n, k, Device::cuda()).find("high_nibble"), std::string::npos);
    LinearProblem pr = make_linear_problem(f, m, n, k, DType::f32, rng);
    const double tiny[] = {std::ldexp(1.5, -124), std::ldexp(1.0, -130), std::ldexp(1.0, -122)};
    for (int64_t g = 0; g < k / 128; ++g)
      for (int c = 0; c < 3; ++c) test::put_float(pr.qw.scales.view(), 1 + 5 * c, g, tiny[c]);
    const TensorView bias_v = test::as_vector(pr.bias), bias_dv = test::as_vector(pr.bias_d);
    linear(pr.qa.view(), pr.qw.view(), &bias_v, pr.ref.view());
    const PackedWeight wd = pack_weight(pr.qw.view(), Device::cuda());
    Tensor got[2];
    for (int run = 0; run < 2; ++run) {
      const ScopedEnv decode("NIBBLE_SM90_W4_DECODE", run == 0 ? "high_nibble" : "offset_xor");
      if (run == 1) {
        EXPECT_EQ(explain(f, m, n, k, Device::cuda()).find("high_nibble"), std::string::npos);
      }
      got[run] = Tensor::empty(DType::f32, {m, n}, Device::cuda());
      got[run].fill_bytes(0xFF);  // NaN: every element must be written
      linear(pr.qad.view(), wd.view(), &bias_dv, got[run].view());
    }
    synchronize(Device::cuda());
    EXPECT_LE(rel_error(got[0], pr.ref), kRelTolF32Out);
    EXPECT_TRUE(same_bytes(got[0], got[1]));
  }
}

// Unsplit sm90 grids of more tiles than SMs run persistent CTAs: each walks several tiles while
// its producer loads the next tile's stages, and stores each by TMA (16-bit outputs,
// store_tile_by_tma; s32 outputs go through a 32-token slab). They must give the bytes one CTA
// per tile gives (NIBBLE_SM90_PERSISTENT=0) and match the reference, in bf16 and f16. Shapes (M, N, K): the last token tile partly past M (1000 in
// 256-token tiles, 300 in 128-token ones, its last slab partly filled), or one slab of a
// 64-token tile (M = 20); the last channel tile partly past N; a K tail (352).
TEST(CudaW4A8, Sm90PersistentTilesMatchOneTilePerCta) {
  NIBBLE_REQUIRE_GPU();
  if (w4a8_kernels().size() < 2) GTEST_SKIP() << "needs sm90_w4a8_gemm (H100, sm_90a build)";
  test::Rng rng;  // fresh seed, printed on failure
  const ScopedEnv force("NIBBLE_W4A8_KERNEL", "sm90_w4a8_gemm");
  const int64_t shapes[][3] = {{1000, 9000, 256}, {20, 34000, 128}, {300, 17000, 352}};
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    // f32 outputs (TMA stores 16-bit ones only) are planned one tile per CTA: the same bytes.
    for (const char* format :
         {"w4a8_pc", "w4a8_g128_2level", "w4a8_pc_static", "w4a8_pc f16", "w4a8_pc f32"}) {
      const std::string name = format;
      const DType out_dtype = name.ends_with(" f16")   ? DType::f16
                              : name.ends_with(" f32") ? DType::f32
                                                       : DType::bf16;
      const LinearFormat f = parse_linear_format(name.substr(0, name.find(' ')));
      if (!f.weight.per_channel() && k % f.weight.group_size != 0) continue;
      SCOPED_TRACE(name + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                   " K=" + std::to_string(k));
      const std::string why = explain(f, m, n, k, Device::cuda());
      ASSERT_NE(why.find("persistent CTAs"), std::string::npos) << why;
      const LinearProblem pr = make_linear_problem(f, m, n, k, out_dtype, rng);
      const PackedWeight wd = pack_weight(pr.qw.view(), Device::cuda());
      const TensorView bias_dv = test::as_vector(pr.bias_d);
      const QuantizedActivation& qad = pr.qad;
      const Tensor& ref = pr.ref;
      // got[0]: persistent, TMA stores; got[1]: one tile per CTA.
      Tensor got[2];
      for (int run = 0; run < 2; ++run) {
        const ScopedEnv persistent("NIBBLE_SM90_PERSISTENT", run == 1 ? "0" : "1");
        got[run] = Tensor::empty(out_dtype, {m, n}, Device::cuda());
        got[run].fill_bytes(0xFF);  // NaN: every element must be written
        linear(qad.view(), wd.view(), &bias_dv, got[run].view());
      }
      synchronize(Device::cuda());
      EXPECT_LE(rel_error(got[0], ref),
                out_dtype == DType::f32 ? kRelTolF32Out : kRelTolHalfOut);
      EXPECT_TRUE(same_bytes(got[0], got[1]));
    }
    // The raw sums, bit for bit.
    const Tensor a = test::random_int(DType::s8, m, k, rng);
    const Tensor w = test::random_int(DType::s4, n, k, rng);
    Tensor ref32 = Tensor::empty(DType::s32, {m, n});
    gemm_s32(a.view(), w.view(), ref32.view());
    EXPECT_TRUE(same_bytes(gpu_s32(a, pack_s4_matrix(w.view(), Device::cuda()), m, n), ref32));
  }
}

// Problem pr's weights on the GPU as linear() takes them for format f (W8A8 the logical
// weights, the int4 formats their packed layout), and a run of the GPU linear into a fresh
// NaN-filled output (every element must be written) under the environment the caller set.
class GpuLinear {
 public:
  GpuLinear(const LinearFormat& f, const LinearProblem& pr)
      : pr_(pr), logical_(f.weight.scheme == WeightScheme::s8_sym) {
    if (logical_) w_logical_ = pr.qw.to(Device::cuda());
    else w_packed_ = pack_weight(pr.qw.view(), packed_layout(f), Device::cuda());
  }
  Tensor run(int64_t m, int64_t n) const {
    const TensorView bias_dv = test::as_vector(pr_.bias_d);
    Tensor got = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
    got.fill_bytes(0xFF);
    if (logical_) linear(pr_.qad.view(), w_logical_.view(), &bias_dv, got.view());
    else linear(pr_.qad.view(), w_packed_.view(), &bias_dv, got.view());
    return got;
  }

 private:
  const LinearProblem& pr_;
  bool logical_;
  QuantizedWeight w_logical_;
  PackedWeight w_packed_;
};

// Stream-K (cuda/sm90/tile_schedule.cuh; NIBBLE_SM90_STREAM_K=1 takes it wherever the format
// allows): the persistent CTAs take equal ranges of all the tiles' K blocks, and a tile's owner
// adds the partials of the CTAs that computed the rest of it. Integer sums add exactly, so the
// int8-activation formats with integer partials give the bytes whole tiles give
// (NIBBLE_SM90_STREAM_K=0); with f32 partials (fp8 activations, or the f32 group scales'
// running sums of w4a8_g128: another order of additions) the reference decides. Every call is
// run twice: the owners lower the flags for the next call. Shapes (M, N, K): fewer tiles than
// SMs (what stream-K is for) with the last tile past N; ranges of fewer K blocks than a tile's
// (K = 352: 3 blocks, so most tiles have several CTAs and some CTAs several tiles); more tiles
// than SMs; one partly filled 64-token tile.
TEST(CudaW4A8, Sm90StreamKMatchesWholeTiles) {
  NIBBLE_REQUIRE_GPU();
  if (w4a8_kernels().size() < 2) GTEST_SKIP() << "needs sm90_w4a8_gemm (H100, sm_90a build)";
  test::Rng rng;  // fresh seed, printed on failure
  const ScopedEnv force4("NIBBLE_W4A8_KERNEL", "sm90_w4a8_gemm");
  const ScopedEnv force8("NIBBLE_W8A8_KERNEL", "sm90_w8a8_gemm");
  // (Each has at least kMinStreamKBlocksPerCta K blocks for each of 132 CTAs.)
  const int64_t shapes[][3] = {{256, 10200, 1024}, {100, 2000, 8192}, {300, 17000, 352},
                               {20, 3000, 4096}};
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    for (const char* name :
         {"w4a8_pc", "w4a8_g128", "w4a8_g128_2level", "w4a8_pc_static", "w8a8", "w4afp8_pc",
          "w4afp8_g128"}) {
      const LinearFormat f = parse_linear_format(name);
      if (!f.weight.per_channel() && k % f.weight.group_size != 0) continue;
      SCOPED_TRACE(std::string(name) + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                   " K=" + std::to_string(k));
      {
        const ScopedEnv stream_k("NIBBLE_SM90_STREAM_K", "1");
        const std::string why = explain(f, m, n, k, Device::cuda());
        ASSERT_NE(why.find("stream-K"), std::string::npos) << why;
      }
      const LinearProblem pr = make_linear_problem(f, m, n, k, DType::bf16, rng);
      const GpuLinear gpu(f, pr);
      auto run = [&](const char* stream_k) {
        const ScopedEnv env("NIBBLE_SM90_STREAM_K", stream_k);
        return gpu.run(m, n);
      };
      const Tensor first = run("1"), second = run("1"), whole = run("0");
      synchronize(Device::cuda());
      EXPECT_LE(rel_error(first, pr.ref), kRelTolHalfOut);
      EXPECT_TRUE(same_bytes(first, second));
      const bool f32_group_sums = f.weight.scheme == WeightScheme::s4_sym && !f.weight.per_channel();
      const bool float_partials = f.act == ActScheme::e4m3_per_token || f32_group_sums;
      if (!float_partials) {
        EXPECT_TRUE(same_bytes(first, whole));
      }
    }
  }
}

// Stream-K after whole waves (NIBBLE_SM90_STREAM_K_WHOLE_WAVES): the persistent CTAs first walk
// whole tiles, then cut only the rest into ranges. 64-token tiles on 132 SMs: 200 tiles (one
// whole wave, 68 tiles in ranges of about four K blocks) and 315 (one wave, or two with 51
// tiles in ranges). Integer partials must give the bytes of whole tiles, float ones match the
// reference; every call repeats bit for bit and writes every element.
TEST(CudaW4A8, Sm90StreamKAfterWholeWavesMatchesWholeTiles) {
  NIBBLE_REQUIRE_GPU();
  if (w4a8_kernels().size() < 2) GTEST_SKIP() << "needs sm90_w4a8_gemm (H100, sm_90a build)";
  test::Rng rng;  // fresh seed, printed on failure
  const ScopedEnv force4("NIBBLE_W4A8_KERNEL", "sm90_w4a8_gemm");
  const ScopedEnv force8("NIBBLE_W8A8_KERNEL", "sm90_w8a8_gemm");
  const ScopedEnv bm("NIBBLE_SM90_BM", "64");
  const int64_t shapes[][3] = {{300, 5000, 1024}, {300, 8000, 1536}};
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    for (const char* name : {"w4a8_pc", "w4a8_g128", "w8a8", "w4afp8_g128"}) {
      const LinearFormat f = parse_linear_format(name);
      SCOPED_TRACE(std::string(name) + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                   " K=" + std::to_string(k));
      const LinearProblem pr = make_linear_problem(f, m, n, k, DType::bf16, rng);
      const GpuLinear gpu(f, pr);
      auto run = [&](const char* stream_k, const char* waves, const char* expect) {
        const ScopedEnv env("NIBBLE_SM90_STREAM_K", stream_k);
        const ScopedEnv whole("NIBBLE_SM90_STREAM_K_WHOLE_WAVES", waves);
        const std::string why = explain(f, m, n, k, Device::cuda());
        EXPECT_NE(why.find(expect), std::string::npos) << why;
        return gpu.run(m, n);
      };
      const char* most = n == 8000 ? "2 whole waves of tiles" : "1 whole wave of tiles";
      const Tensor one_wave = run("1", "1", "1 whole wave of tiles");
      const Tensor first = run("1", "-1", most), second = run("1", "-1", most);
      const Tensor whole = run("0", "0", "persistent CTAs");
      synchronize(Device::cuda());
      EXPECT_LE(rel_error(one_wave, pr.ref), kRelTolHalfOut);
      EXPECT_LE(rel_error(first, pr.ref), kRelTolHalfOut);
      EXPECT_TRUE(same_bytes(first, second));
      const bool float_partials = f.act == ActScheme::e4m3_per_token || !f.weight.per_channel();
      if (!float_partials) {
        EXPECT_TRUE(same_bytes(first, whole));
        EXPECT_TRUE(same_bytes(one_wave, whole));
      }
    }
  }
}

#if NIBBLE_WITH_CUDA
// The split-K choice of sm80_w4a8_gemm's 16-row tile on a 132-SM GPU: host logic, no GPU needed.
// It aims at two CTAs per SM; splits reduced in a cluster keep at least 2 K blocks, splits
// through the workspace at least 4.
TEST(Sm80W4A8Plan, ClusterSplitsKeepTwoKBlocks) {
  unsetenv("NIBBLE_SM80_SPLITS");
  using cuda::sm80::W4A8Epilogue;
  // 2048x2048: 16 tiles of 16 K blocks want 17 splits; a cluster takes 8 of 2 blocks.
  cuda::W4A8Plan plan =
      cuda::plan_sm80_w4a8(16, 2048, 2048, 2048, W4A8Epilogue::per_channel, 0, 132, true);
  EXPECT_EQ(plan.splits, 8);
  EXPECT_EQ(plan.kblocks_per_split, 2);
  EXPECT_TRUE(plan.cluster_split);
  // Without clusters (sm_80..sm_89) the workspace split keeps 4 blocks: 4 splits.
  plan = cuda::plan_sm80_w4a8(16, 2048, 2048, 2048, W4A8Epilogue::per_channel, 0, 132, false);
  EXPECT_EQ(plan.splits, 4);
  EXPECT_EQ(plan.kblocks_per_split, 4);
  EXPECT_FALSE(plan.cluster_split);
  // 6144x4096: 48 tiles want 6 splits (264 CTAs); the K blocks do not limit them.
  plan = cuda::plan_sm80_w4a8(1, 6144, 4096, 4096, W4A8Epilogue::per_channel, 0, 132, true);
  EXPECT_EQ(plan.splits, 6);
  EXPECT_TRUE(plan.cluster_split);
  // A 256-group keeps its two blocks in one split: 2048x2048 in 8 splits of 2.
  plan = cuda::plan_sm80_w4a8(1, 2048, 2048, 2048, W4A8Epilogue::group, 256, 132, true);
  EXPECT_EQ(plan.kblocks_per_split % 2, 0);
  // int8 weights (W8A8) reduce through the workspace: 4 blocks a split.
  plan = cuda::plan_sm80_w4a8(1, 2048, 2048, 2048, W4A8Epilogue::per_channel, 0, 132, true, 8);
  EXPECT_EQ(plan.splits, 4);
  EXPECT_FALSE(plan.cluster_split);
}

// sm90_w4a8_gemm's int4 planner on an H100-like GPU (132 SMs, clusters of s CTAs at once as the
// H100 reports them): a one-wave unsplit grid on long K becomes tiles of twice the tokens in
// two cluster splits; host logic, no GPU needed.
TEST(Sm90Tiling, Int4TilesDoubleAndSplitOnLongK) {
  const int clusters[cuda::kMaxSm90ClusterSplits + 1] = {0, 0, 66, 39, 30, 24, 18, 16, 14};
  const cuda::Sm90ClusterSplitK cluster{clusters, 4};
  auto pick = [&](int64_t m, int64_t n, int64_t k, int max_bm) {
    const cuda::Sm90TileChoice t =
        cuda::choose_sm90_tiles(m, n, k, 132, {256, 128, 64}, 24, cluster);
    return cuda::prefer_doubled_tile_split(t, m, k, 132, max_bm, cluster);
  };
  // 4096x14336 at M = 256: 128 tiles of 64 tokens on 112 K blocks -> 64 tiles of 128 tokens,
  // each in 2 splits of 56 blocks (H100: 27.4 against 33.8 us).
  cuda::Sm90TileChoice t = pick(256, 4096, 14336, 256);
  EXPECT_EQ(t.bm, 128);
  EXPECT_EQ(t.tiles_m * t.tiles_n, 64);
  EXPECT_EQ(t.splits, 2);
  EXPECT_EQ(t.kblocks_per_split, 56);
  EXPECT_TRUE(t.cluster_split);
  // Short K: the reduction costs what the conversion saves (H100: 13.9 against 13.6 us).
  t = pick(256, 4096, 4096, 256);
  EXPECT_EQ(t.bm, 64);
  EXPECT_EQ(t.splits, 1);
  // 96 tiles of 128 tokens on 32 K blocks stay.
  t = pick(256, 6144, 4096, 256);
  EXPECT_EQ(t.bm, 128);
  EXPECT_EQ(t.splits, 1);
  // 8192x28672: 128 tiles of 128 tokens -> 64 of 256 in pairs, unless the format has no
  // 256-token tile (the f32 group scales).
  t = pick(256, 8192, 28672, 256);
  EXPECT_EQ(t.bm, 256);
  EXPECT_EQ(t.splits, 2);
  t = pick(256, 8192, 28672, 128);
  EXPECT_EQ(t.bm, 128);
  EXPECT_EQ(t.splits, 1);
  // Grids of more than one wave, and grids already split, are left as they are.
  t = pick(4096, 4096, 14336, 256);
  EXPECT_EQ(t.bm, 256);
  EXPECT_EQ(t.splits, 1);
  t = pick(64, 4096, 14336, 256);
  EXPECT_EQ(t.bm, 64);
  EXPECT_GT(t.splits, 2);
  // The doubled tile's clusters must all fit at once: 10240x8192 at M = 128 runs 80 tiles of
  // 128 tokens; as 256-token tiles in pairs it would need 80 clusters of two (66 run at once).
  t = pick(128, 10240, 8192, 256);
  EXPECT_EQ(t.splits, 1);
}

// sm90_w4a8_gemm's stream-K rule on 132 SMs, from the H200 A/B of 2026-11-29 (plan_sm90_w4a8):
// host logic, no GPU needed.
TEST(Sm90Tiling, W4A8StreamKOnlyOnASparseLastWave) {
  auto pays = [](int tiles_m, int tiles_n, int sms, int bm, int bits, bool heavy = false) {
    return cuda::sm90_w4a8_stream_k_pays(tiles_m, tiles_n, sms, bm, bits, heavy);
  };
  // 80 channel tiles of 10240x8192: int4 weights from 64-token tiles on (0.85-0.94x the time),
  // int8 weights on 256-token tiles (0.93x) but not 64 or 128 (1.07x, 1.12x slower).
  for (int bm : {64, 128, 256}) EXPECT_TRUE(pays(1, 80, 132, bm, 4)) << bm;
  EXPECT_FALSE(pays(1, 80, 132, 64, 8));
  EXPECT_FALSE(pays(1, 80, 132, 128, 8));
  EXPECT_TRUE(pays(1, 80, 132, 256, 8));
  // 96 tiles of 6144x4096 at M = 256 ran 1.13-1.28x slower: more than 132 / 1.5 = 88 tiles.
  EXPECT_TRUE(pays(1, 88, 132, 128, 4));
  EXPECT_FALSE(pays(1, 89, 132, 128, 4));
  EXPECT_FALSE(pays(2, 48, 132, 128, 4));
  // Two waves: 160 tiles (2 token tiles) leave the second a fifth full (w4a8_g128 ran 0.78x the
  // time, w4a8_pc 0.96x); from 177 tiles it is more than a third full. With more than two token
  // tiles the ranges read the weights from DRAM more often: whole tiles.
  EXPECT_TRUE(pays(2, 80, 132, 128, 4));
  EXPECT_TRUE(pays(2, 88, 132, 128, 4));
  EXPECT_FALSE(pays(2, 89, 132, 128, 4));
  EXPECT_FALSE(pays(4, 40, 132, 128, 4));
  EXPECT_FALSE(pays(4, 80, 132, 128, 4));
  EXPECT_TRUE(pays(4, 20, 132, 128, 4));  // one wave: any token tiles
  // A GPU of fewer SMs takes fewer tiles.
  EXPECT_FALSE(pays(1, 80, 114, 256, 4));
  EXPECT_TRUE(pays(1, 76, 114, 256, 4));
  // Heavy K blocks (the f32 group format, H100, 2026-12-08): grids of more than one wave up to
  // 1 / 1.25 of their slots, any token tiles. 296 tiles of 18944x3584 at M = 256 and 192 of
  // 12288x4096 (M = 256) and 6144x4096 (M = 512) ran 0.90-0.92x the time in ranges; 216 tiles
  // (13824x5120, M = 256) 1.04x. One wave as before: 96 tiles of 6144x4096 ran 1.05x.
  EXPECT_TRUE(pays(2, 148, 132, 128, 4, true));
  EXPECT_FALSE(pays(2, 148, 132, 128, 4));
  EXPECT_TRUE(pays(2, 96, 132, 128, 4, true));
  EXPECT_TRUE(pays(4, 48, 132, 128, 4, true));
  EXPECT_FALSE(pays(4, 48, 132, 128, 4));
  EXPECT_FALSE(pays(2, 108, 132, 128, 4, true));
  EXPECT_FALSE(pays(4, 80, 132, 128, 4, true));  // 320 tiles: 400 > 396 slots
  EXPECT_FALSE(pays(2, 48, 132, 128, 4, true));
  EXPECT_TRUE(pays(2, 80, 132, 128, 4, true));
}

// The f32 group format (tiles of at most 128 tokens) on 10240x8192 at M = 256: choose_sm90_tiles
// takes 320 tiles of 64 tokens (3 waves), which stream-K would not help; 160 tiles of 128 tokens
// in ranges are estimated faster (1.21 waves x 176 x 1.25 = 267 against 3 x 112) and ran 59.3 us
// against 84.4 (H100, 2026-12-07). Grids stream-K already suits, or whose doubled grid it would
// not suit, stay.
TEST(Sm90Tiling, W4A8TilesDoubleIntoStreamK) {
  struct Case {
    int64_t m, n, k;
    bool heavy;
    int bm, tiles;
    const char* why;
  };
  const Case cases[] = {
      {256, 10240, 8192, false, 128, 160, "320 tiles of 64 tokens (3 waves) become 160 of 128"},
      {256, 10240, 8192, true, 128, 160, "320 tiles of 64 tokens (3 waves) become 160 of 128"},
      {256, 5120, 5120, true, 128, 80, "80 tiles of 128 tokens already: stream-K pays as they are"},
      {512, 5120, 5120, false, 64, 320, "160 tiles of 128 would be 4 token tiles: unchanged"},
      {512, 5120, 5120, true, 128, 160, "heavy K blocks: 4 token tiles in ranges too"},
      {1024, 10240, 8192, true, 128, 640, "640 tiles of 128 tokens: nothing to double into"},
      {512, 6144, 4096, false, 64, 384, "192 doubled tiles would fill the second wave over a third"},
      {512, 6144, 4096, true, 128, 192, "heavy K blocks: 192 tiles fill 0.73 of two waves"},
      {256, 12288, 4096, true, 128, 192, "heavy K blocks: 384 tiles of 64 tokens become 192"},
      {256, 13824, 5120, true, 128, 216, "216 tiles of 128 already, 0.82 of two waves: whole"},
  };
  for (const Case& c : cases) {
    const cuda::Sm90TileChoice whole =
        cuda::choose_sm90_tiles(c.m, c.n, c.k, 132, {128, 64}, 24, {});
    const cuda::Sm90TileChoice t =
        cuda::prefer_doubled_tile_stream_k(whole, c.m, c.k, 132, 128, 4, c.heavy);
    EXPECT_EQ(t.bm, c.bm) << c.why;
    EXPECT_EQ(t.tiles_m * t.tiles_n, c.tiles) << c.why;
    EXPECT_EQ(t.splits, 1) << c.why;
  }
}
#endif

TEST(CudaW4A8, RejectsMisalignedActivationsBeforeLaunch) {
  NIBBLE_REQUIRE_GPU();
  const int64_t m = 4, n = 64, k = 64;
  QuantizedWeight qw(parse_weight_format("w4_pc"), n, k);
  test::Rng rng;
  quantize_weight(test::random_normal(DType::f32, n, k, rng).view(), qw.view());
  const PackedWeight wd = pack_weight(qw.view(), Device::cuda());
  QuantizedActivation qa(ActScheme::s8_per_token, m, k + 16, Device::cuda());
  QuantizedActivationView v = qa.view();
  v.q.shape[1] = k;
  v.q.data = static_cast<int8_t*>(v.q.data) + 1;  // misaligned base
  Tensor d = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
  try {
    linear(v, wd.view(), nullptr, d.view());
    FAIL() << "expected an alignment error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("'a.q'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nibble
