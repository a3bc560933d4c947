// GPU tests of the W8A8 tensor-core GEMMs (sm80_w8a8_gemm, and sm90_w8a8_gemm on Hopper), which
// read the logical row-major int8 weights directly (no packing), against the CPU reference on
// the same quantized operands: the w8a8 linear with its fused per-token × per-channel epilogue,
// and the raw s8 × s8 → s32 GEMM. Every shape runs through each kernel in turn
// (NIBBLE_W8A8_KERNEL), not only the one dispatch picks for that M.
#include <gtest/gtest.h>

#if NIBBLE_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "nibble/nibble.h"

namespace nibble {
namespace {

// Every tile bucket of both kernels and its edges.
const std::vector<int64_t> kOddM = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 100, 127, 128, 255, 1000};

std::vector<std::string> w8a8_kernels() {
  std::vector<std::string> k = {"sm80_w8a8_gemm"};
  if (sm90a_kernels_here()) k.push_back("sm90_w8a8_gemm");
  return k;
}

TEST(CudaW8A8, S32IsBitExactOnOddShapes) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;  // fresh seed, printed on failure
  // K = 48 and 160 end inside a 128-wide K block (zero-filled tail); N = 13 leaves a partial
  // channel tile and rows of 52 bytes (the unaligned store paths).
  const std::pair<int64_t, int64_t> nk[] = {{8, 16},    {13, 64},    {72, 160},
                                            {20, 48},   {264, 4096}, {1000, 544}};
  for (auto [n, k] : nk) {
    const Tensor w = test::random_int(DType::s8, n, k, rng);
    const Tensor wd = w.to(Device::cuda());
    for (int64_t m : kOddM) {
      const Tensor a = test::random_int(DType::s8, m, k, rng);
      Tensor ref = Tensor::empty(DType::s32, {m, n});
      gemm_s32(a.view(), w.view(), ref.view());
      for (const std::string& kernel : w8a8_kernels()) {
        SCOPED_TRACE(kernel + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                     " K=" + std::to_string(k));
        const ScopedEnv force("NIBBLE_W8A8_KERNEL", kernel);
        ASSERT_TRUE(same_bytes(gpu_s32(a, wd, m, n), ref));
      }
    }
  }
}

TEST(CudaW8A8, S32ExtremeValuesAtTheDocumentedMaximumK) {
  NIBBLE_REQUIRE_GPU();
  // The largest multiple of 16 within max_int32_accumulation_k(s8, s8): every product at its
  // extreme, so the exact sum sits next to the int32 bound.
  const int64_t k = max_int32_accumulation_k(DType::s8, DType::s8) / 16 * 16;
  const int64_t m = 3, n = 16;
  for (auto [a_byte, w_byte] : std::vector<std::pair<uint8_t, uint8_t>>{
           {0x80, 0x80}, {0x80, 0x7F}, {0x7F, 0x7F}, {0x81, 0x80}}) {
    SCOPED_TRACE("a byte " + std::to_string(a_byte) + " w byte " + std::to_string(w_byte));
    Tensor a = Tensor::empty(DType::s8, {m, k}), w = Tensor::empty(DType::s8, {n, k});
    a.fill_bytes(a_byte);
    w.fill_bytes(w_byte);
    Tensor ref = Tensor::empty(DType::s32, {m, n});
    gemm_s32(a.view(), w.view(), ref.view());
    const Tensor wd = w.to(Device::cuda());
    for (const std::string& kernel : w8a8_kernels()) {
      SCOPED_TRACE(kernel);
      const ScopedEnv force("NIBBLE_W8A8_KERNEL", kernel);
      EXPECT_TRUE(same_bytes(gpu_s32(a, wd, m, n), ref));
    }
  }
}

class CudaW8A8Linear : public ::testing::TestWithParam<LinearCase> {};

TEST_P(CudaW8A8Linear, MatchesReferenceOnOddShapes) {
  NIBBLE_REQUIRE_GPU();
  expect_int8_linear_matches_reference(
      parse_linear_format(GetParam().format), GetParam().out, kOddM, w8a8_kernels(),
      "NIBBLE_W8A8_KERNEL", [](const QuantizedWeight& qw) { return qw.to(Device::cuda()); });
}

INSTANTIATE_TEST_SUITE_P(
    Formats, CudaW8A8Linear,
    ::testing::Values(LinearCase{"w8a8", DType::bf16}, LinearCase{"w8a8", DType::f32},
                      LinearCase{"w8a8", DType::f16}, LinearCase{"w8a8_static", DType::bf16},
                      LinearCase{"w8a8_sbf16", DType::f32}, LinearCase{"w8a8_sf16", DType::bf16}),
    [](const auto& p) { return std::string(p.param.format) + "_" + to_string(p.param.out); });

TEST(CudaW8A8, DispatchPicksTheTensorCoreKernelAndSaysSo) {
  NIBBLE_REQUIRE_GPU();
  const LinearFormat f = parse_linear_format("w8a8");
  for (int64_t m : {1, 16, 64, 4096}) {
    const std::string why = explain(f, m, 4096, 4096, Device::cuda());
    SCOPED_TRACE(why);
    EXPECT_NE(why.find("runs sm80_w8a8_gemm / sm90_w8a8_gemm"), std::string::npos);
    EXPECT_TRUE(why.find("sm90_w8a8_gemm (wgmma") != std::string::npos ||
                why.find("sm80_w8a8_gemm int8 weights tile") != std::string::npos);
  }
  // K % 16 != 0 cannot use 16-byte copies: the SIMT kernel runs it, with the same results.
  EXPECT_NE(explain(f, 8, 64, 40, Device::cuda()).find("K % 16 != 0"), std::string::npos);
}

TEST(CudaW8A8, OddKAndStridedRowsRunTheFallbackWithTheSameResults) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  const int64_t m = 5, n = 24, k = 40;  // K % 16 != 0
  const LinearFormat f = parse_linear_format("w8a8");
  QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
  QuantizedActivation qa(f.act, m, k);
  quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
  Tensor ref = Tensor::empty(DType::f32, {m, n});
  linear(qa.view(), qw.view(), nullptr, ref.view());
  Tensor got = Tensor::empty(DType::f32, {m, n}, Device::cuda());
  got.fill_bytes(0xFF);
  linear(qa.to(Device::cuda()).view(), qw.to(Device::cuda()).view(), nullptr, got.view());
  synchronize(Device::cuda());
  EXPECT_LE(rel_error(got, ref), kRelTolF32Out);
}

// On request (NIBBLE_SM90_MULTICAST=1), unsplit sm90 plans of two or more waves of tiles run CTA
// pairs that share the activation tile (each loads half its token rows by TMA multicast into
// both CTAs' shared memory), and those persistent: each pair walks pair tiles. The output bytes
// must not depend on either (pairs with one tile per CTA, persistent CTAs unpaired).
TEST(CudaW8A8, Sm90CtaPairsSharingTheActivationTileMatchTheReference) {
  NIBBLE_REQUIRE_GPU();
  if (w8a8_kernels().size() < 2) GTEST_SKIP() << "needs sm90_w8a8_gemm (H100, sm_90a build)";
  const ScopedEnv pairs("NIBBLE_SM90_MULTICAST", "1");
  const ScopedEnv persistent("NIBBLE_SM90_PERSISTENT", "1");
  test::Rng rng;  // fresh seed, printed on failure
  const LinearFormat f = parse_linear_format("w8a8");
  // (M, N, K): an odd number of channel tiles (the last pair's second CTA lies past N); a last
  // token tile whose second half lies partly (M = 300, 64-token tiles) or wholly (M = 20) past M.
  const int64_t shapes[][3] = {{300, 9000, 256}, {20, 34000, 128}, {1000, 9000, 1024}};
  const ScopedEnv force("NIBBLE_W8A8_KERNEL", "sm90_w8a8_gemm");
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    SCOPED_TRACE("M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
    const std::string why = explain(f, m, n, k, Device::cuda());
    ASSERT_NE(why.find("TMA multicast"), std::string::npos) << why;
    ASSERT_NE(why.find("persistent CTAs"), std::string::npos) << why;
    QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
    QuantizedActivation qa(f.act, m, k);
    quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
    Tensor ref = Tensor::empty(DType::bf16, {m, n});
    linear(qa.view(), qw.view(), nullptr, ref.view());
    Tensor got = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
    got.fill_bytes(0xFF);  // NaN: every element must be written
    const QuantizedActivation qad = qa.to(Device::cuda());
    const QuantizedWeight qwd = qw.to(Device::cuda());
    linear(qad.view(), qwd.view(), nullptr, got.view());
    synchronize(Device::cuda());
    EXPECT_LE(rel_error(got, ref), kRelTolHalfOut);
    for (const char* off : {"NIBBLE_SM90_PERSISTENT", "NIBBLE_SM90_MULTICAST"}) {
      SCOPED_TRACE(std::string(off) + "=0");
      const ScopedEnv variant(off, "0");
      Tensor other = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
      other.fill_bytes(0xFF);
      linear(qad.view(), qwd.view(), nullptr, other.view());
      synchronize(Device::cuda());
      EXPECT_TRUE(same_bytes(other, got));
    }
    // The raw sums, bit for bit.
    const Tensor a = test::random_int(DType::s8, m, k, rng);
    const Tensor w = test::random_int(DType::s8, n, k, rng);
    Tensor ref32 = Tensor::empty(DType::s32, {m, n});
    gemm_s32(a.view(), w.view(), ref32.view());
    EXPECT_TRUE(same_bytes(gpu_s32(a, w.to(Device::cuda()), m, n), ref32));
  }
}

TEST(CudaW8A8, SplitKIsDeterministic) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;  // fresh seed, printed on failure
  const int64_t n = 512, k = 8192;  // few tiles, long K: split-K is chosen
  const LinearFormat f = parse_linear_format("w8a8");
  QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
  const QuantizedWeight qwd = qw.to(Device::cuda());
  for (int64_t m : {5, 100}) {
    QuantizedActivation qa(ActScheme::s8_per_token, m, k);
    quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
    const QuantizedActivation qad = qa.to(Device::cuda());
    for (const std::string& kernel : w8a8_kernels()) {
      SCOPED_TRACE(kernel + " M=" + std::to_string(m));
      const ScopedEnv force("NIBBLE_W8A8_KERNEL", kernel);
      Tensor d1 = Tensor::empty(DType::f32, {m, n}, Device::cuda()), d2 = d1.to(Device::cuda());
      linear(qad.view(), qwd.view(), nullptr, d1.view());
      for (int i = 0; i < 5; ++i) linear(qad.view(), qwd.view(), nullptr, d2.view());
      synchronize(Device::cuda());
      EXPECT_TRUE(same_bytes(d1, d2));
      EXPECT_NE(explain(f, m, n, k, Device::cuda()).find("split-K"), std::string::npos);
    }
  }
}

#if NIBBLE_WITH_CUDA
TEST(CudaW8A8, CapturedGraphReplaysTheSameResult) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  const int64_t n = 4096, k = 4096;
  const LinearFormat f = parse_linear_format("w8a8");
  QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
  const QuantizedWeight qwd = qw.to(Device::cuda());
  for (int64_t m : {1, 256}) {  // split-K on the sm80 kernel; the wgmma kernel on Hopper
    SCOPED_TRACE("M=" + std::to_string(m));
    QuantizedActivation qa(f.act, m, k);
    quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
    const QuantizedActivation qad = qa.to(Device::cuda());
    Tensor eager = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
    Tensor replay = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
    expect_graph_replay_matches(
        [&](cudaStream_t stream, Tensor& out) {
          linear(qad.view(), qwd.view(), nullptr, out.view(), stream);
        },
        eager, replay);
  }
}
#endif

}  // namespace
}  // namespace nibble
