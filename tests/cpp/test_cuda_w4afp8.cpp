// GPU tests of W4A-FP8 (int4 weights × per-token e4m3 activations) on packed weights: the
// Hopper kernel sm90_w4afp8_gemm and the decode tiles sm80_w4afp8_gemm (mma.sync on sm_89+ code;
// both per channel and g128), and the generic SIMT kernel reading the packed layout (every other
// case), each forced with NIBBLE_W4AFP8_KERNEL, against the CPU reference on the same quantized
// operands.
//
// Tolerance: the reference sums f32 products in order; the tensor cores add fp8 products with
// fewer bits than f32 keeps, so f32 outputs get kRelTolFp8F32Out instead of kRelTolF32Out.
// Measured on the H100 (2026-11-23, random Gaussian data, M 1..300, K 1024..14336): g128 (each
// 128-wide K block's sums folded into f32 on the CUDA cores) up to 6e-5; per channel (all of K
// in the tensor cores' accumulators) up to 4.7e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "nibble/nibble.h"

namespace nibble {
namespace {

constexpr double kRelTolFp8F32Out = 2e-3;

const std::vector<int64_t> kOddM = {1, 2, 3, 7, 15, 16, 17, 31, 64, 100, 127, 128, 255, 1000};

// sm80_w4afp8_gemm's e4m3 mma.sync: sm_89+ code built for this GPU.
bool sm80_fp8_kernel_here() {
  const DeviceInfo info = cuda_device_info(0);
  const std::string archs = build_info().cuda_archs;
  if (info.cc_major == 8 && info.cc_minor == 9) return archs.find("89") != std::string::npos;
  return sm90a_kernels_here();
}

// The kernels a call of `format` can run here: the SIMT fallback always, the tensor-core
// kernels where they take the format.
std::vector<std::string> fp8_kernels(const LinearFormat& f) {
  std::vector<std::string> k = {"simt_linear"};
  const bool mma_format = f.weight.per_channel() || f.weight.group_size == 128;
  if (sm90a_kernels_here() && mma_format) k.push_back("sm90_w4afp8_gemm");
  if (sm80_fp8_kernel_here() && mma_format) k.push_back("sm80_w4afp8_gemm");
  return k;
}

double tolerance(DType out) { return out == DType::f32 ? kRelTolFp8F32Out : kRelTolHalfOut; }

// Runs the packed-weight linear on the GPU (activations qad already there) with `kernel`
// forced and compares with `ref`.
void expect_matches(const QuantizedActivation& qad, const PackedWeight& wd, const Tensor* bias_d,
                    const Tensor& ref, const std::string& kernel) {
  const TensorView rv = ref.view();
  const int64_t m = rv.size(0), n = rv.size(1);
  const ScopedEnv force("NIBBLE_W4AFP8_KERNEL", kernel);
  Tensor got = Tensor::empty(rv.dtype, {m, n}, Device::cuda());
  got.fill_bytes(0xFF);  // NaN in every float dtype: every element must be written
  const TensorView bias_v = bias_d != nullptr ? test::as_vector(*bias_d) : TensorView{};
  linear(qad.view(), wd.view(), bias_d != nullptr ? &bias_v : nullptr, got.view());
  synchronize(Device::cuda());
  ASSERT_LE(rel_error(got, ref), tolerance(rv.dtype));
}

// Random weights of `f` packed on the GPU, and a random bf16 bias on both sides.
struct Operands {
  QuantizedWeight qw;
  PackedWeight wd;
  Tensor bias, bias_d;
};
Operands random_operands(const LinearFormat& f, int64_t n, int64_t k, test::Rng& rng) {
  QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
  PackedWeight wd = pack_weight(qw.view(), packed_layout(f), Device::cuda());
  Tensor bias = test::random_normal(DType::bf16, 1, n, rng);
  Tensor bias_d = bias.to(Device::cuda());
  return {std::move(qw), std::move(wd), std::move(bias), std::move(bias_d)};
}

class CudaW4AFp8Linear : public ::testing::TestWithParam<LinearCase> {};

TEST_P(CudaW4AFp8Linear, MatchesReferenceOnOddShapes) {
  NIBBLE_REQUIRE_GPU();
  const LinearFormat f = parse_linear_format(GetParam().format);
  const DType out = GetParam().out;
  test::Rng rng;  // fresh seed, printed on failure
  // K = 352 is not a multiple of the layout's 128 (zero-filled K tail); N = 20 takes the
  // unaligned store paths; K = 4096 has 32 K blocks of running sums.
  const std::pair<int64_t, int64_t> nk[] = {{136, 512}, {1000, 1536}, {72, 352}, {20, 256},
                                            {264, 4096}};
  for (auto [n, k] : nk) {
    if (!f.weight.per_channel() && k % f.weight.group_size != 0) continue;
    QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
    const PackedWeight wd = pack_weight(qw.view(), packed_layout(f), Device::cuda());
    const Tensor bias = test::random_normal(DType::bf16, 1, n, rng);
    const Tensor bias_d = bias.to(Device::cuda());
    const TensorView bias_v = test::as_vector(bias);
    for (int64_t m : kOddM) {
      if (k == 4096 && m > 128) continue;  // the long-K shape keeps the CPU reference short
      QuantizedActivation qa(f.act, m, k);
      quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
      Tensor ref = Tensor::empty(out, {m, n});
      linear(qa.view(), qw.view(), &bias_v, ref.view());
      const QuantizedActivation qad = qa.to(Device::cuda());
      for (const std::string& kernel : fp8_kernels(f)) {
        SCOPED_TRACE(kernel + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                     " K=" + std::to_string(k));
        expect_matches(qad, wd, &bias_d, ref, kernel);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, CudaW4AFp8Linear,
    ::testing::Values(LinearCase{"w4afp8_pc", DType::bf16}, LinearCase{"w4afp8_pc", DType::f32},
                      LinearCase{"w4afp8_g128", DType::bf16}, LinearCase{"w4afp8_g128", DType::f32},
                      LinearCase{"w4afp8_g64", DType::f16}, LinearCase{"w4afp8_g32", DType::f32}),
    [](const auto& p) { return std::string(p.param.format) + "_" + to_string(p.param.out); });

// Every int4 value, −8 included (round-to-nearest quantization never makes it), against every
// e4m3 magnitude the activations can hold, subnormals and ±448 included: the kernel's weights are
// the e4m3 codes of v·2⁻⁹, themselves partly subnormal, so this checks the tensor cores take
// them exactly.
TEST(CudaW4AFp8, EveryWeightValueAndExtremeActivationsMatchTheReference) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  const int64_t n = 128, k = 512;
  for (const char* name : {"w4afp8_pc", "w4afp8_g128"}) {
    SCOPED_TRACE(name);
    const LinearFormat f = parse_linear_format(name);
    QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
    qw.q = test::random_int(DType::s4, n, k, rng);  // uniform over [−8, 7]
    for (int64_t c = 0; c < k; ++c) test::put_int(qw.q.view(), c % n, c, -8);  // −8 in every row
    const PackedWeight wd = pack_weight(qw.view(), packed_layout(f), Device::cuda());
    for (int64_t m : {1, 64, 100}) {
      // Activations: random e4m3 bit patterns over every finite code (NaN 0x7F/0xFF excluded),
      // with per-token scales spanning 2^-8 .. 2^8.
      QuantizedActivation qa(f.act, m, k);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < k; ++c) {
          uint8_t code = static_cast<uint8_t>(rng.uniform_int(0, 253));
          if ((code & 0x7F) == 0x7F) code = 0x7E;
          static_cast<uint8_t*>(qa.q.data())[r * k + c] = code;
        }
        test::put_float(qa.scales.view(), r, 0, std::ldexp(1.0, int(rng.uniform_int(-8, 8))));
      }
      const QuantizedActivation qad = qa.to(Device::cuda());
      for (DType out : {DType::f32, DType::bf16}) {
        Tensor ref = Tensor::empty(out, {m, n});
        linear(qa.view(), qw.view(), nullptr, ref.view());
        for (const std::string& kernel : fp8_kernels(f)) {
          SCOPED_TRACE(kernel + " M=" + std::to_string(m) + " out " + to_string(out));
          expect_matches(qad, wd, nullptr, ref, kernel);
        }
      }
    }
  }
}

// Few tiles and a long K: the Hopper kernel splits K and the last CTA of a tile adds the
// splits' f32 partials (the raw tile holds f32, not int32, for both fp8 formats).
TEST(CudaW4AFp8, SplitKMatchesTheReference) {
  NIBBLE_REQUIRE_GPU();
  if (!sm90a_kernels_here()) GTEST_SKIP() << "sm90_w4afp8_gemm needs an sm_90a build on sm_90";
  test::Rng rng;
  const int64_t n = 256, k = 8192;
  for (const char* name : {"w4afp8_pc", "w4afp8_g128"}) {
    const LinearFormat f = parse_linear_format(name);
    const Operands o = random_operands(f, n, k, rng);
    const TensorView bias_v = test::as_vector(o.bias);
    for (int64_t m : {1, 17, 64}) {
      SCOPED_TRACE(std::string(name) + " M=" + std::to_string(m));
      EXPECT_NE(explain(f, m, n, k, Device::cuda()).find("split-K"), std::string::npos)
          << explain(f, m, n, k, Device::cuda());
      QuantizedActivation qa(f.act, m, k);
      quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
      const QuantizedActivation qad = qa.to(Device::cuda());
      for (DType out : {DType::f32, DType::bf16}) {
        Tensor ref = Tensor::empty(out, {m, n});
        linear(qa.view(), o.qw.view(), &bias_v, ref.view());
        expect_matches(qad, o.wd, &o.bias_d, ref, "sm90_w4afp8_gemm");
      }
    }
  }
}

// The decode tiles split K on few tiles too (on sm_90 the splits of a tile are one cluster and
// add their f32 partials over distributed shared memory); explain() names the kernel at M ≤ 16.
TEST(CudaW4AFp8, DecodeTilesSplitKMatchTheReference) {
  NIBBLE_REQUIRE_GPU();
  if (!sm80_fp8_kernel_here()) GTEST_SKIP() << "sm80_w4afp8_gemm needs sm_89+ code for this GPU";
  test::Rng rng;
  const std::pair<int64_t, int64_t> nk[] = {{256, 8192}, {4104, 4096}, {24, 14336}};
  for (auto [n, k] : nk) {
    for (const char* name : {"w4afp8_pc", "w4afp8_g128"}) {
      const LinearFormat f = parse_linear_format(name);
      const Operands o = random_operands(f, n, k, rng);
      const TensorView bias_v = test::as_vector(o.bias);
      for (int64_t m : {1, 5, 16, 17, 32}) {
        SCOPED_TRACE(std::string(name) + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                     " K=" + std::to_string(k));
        if (m <= 16) {
          const std::string why = explain(f, m, n, k, Device::cuda());
          EXPECT_NE(why.find("sm80_w4afp8_gemm"), std::string::npos) << why;
        }
        QuantizedActivation qa(f.act, m, k);
        quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
        const QuantizedActivation qad = qa.to(Device::cuda());
        for (DType out : {DType::f32, DType::bf16, DType::f16}) {
          Tensor ref = Tensor::empty(out, {m, n});
          linear(qa.view(), o.qw.view(), &bias_v, ref.view());
          expect_matches(qad, o.wd, &o.bias_d, ref, "sm80_w4afp8_gemm");
        }
      }
    }
  }
}

// NIBBLE_W4AFP8_KERNEL names a kernel that can run the call, or the call fails before any
// launch with an error naming the variable.
TEST(CudaW4AFp8, ForcingAKernelThatCannotRunIsAnError) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  const int64_t m = 3, n = 64, k = 256;
  for (const char* name : {"w4afp8_g64", "w4afp8_pc"}) {
    const LinearFormat f = parse_linear_format(name);
    const Operands o = random_operands(f, n, k, rng);
    QuantizedActivation qa(f.act, m, k);
    quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
    const QuantizedActivation qad = qa.to(Device::cuda());
    Tensor d = Tensor::empty(DType::bf16, {m, n}, Device::cuda());
    std::vector<std::string> refused = {"no_such_kernel"};
    if (!f.weight.per_channel()) refused = {"no_such_kernel", "sm80_w4afp8_gemm", "sm90_w4afp8_gemm"};
    for (const std::string& kernel : refused) {
      SCOPED_TRACE(std::string(name) + " " + kernel);
      const ScopedEnv force("NIBBLE_W4AFP8_KERNEL", kernel);
      try {
        linear(qad.view(), o.wd.view(), nullptr, d.view());
        FAIL() << "expected an invalid_argument error";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("NIBBLE_W4AFP8_KERNEL=" + kernel), std::string::npos)
            << e.what();
      }
    }
  }
}

// Grids of more tiles than SMs run persistent CTAs (sm90_w4a8_gemm's tile loop; see
// CudaW4A8.Sm90PersistentTilesMatchOneTilePerCta): the same bytes as one CTA per tile, and the
// reference's tolerance. The last token and channel tiles lie partly past M and N.
TEST(CudaW4AFp8, PersistentTilesMatchOneTilePerCta) {
  NIBBLE_REQUIRE_GPU();
  if (!sm90a_kernels_here()) GTEST_SKIP() << "sm90_w4afp8_gemm needs an sm_90a build on sm_90";
  test::Rng rng;
  const int64_t shapes[][3] = {{1000, 9000, 256}, {300, 17000, 384}};
  for (const auto& s : shapes) {
    const int64_t m = s[0], n = s[1], k = s[2];
    for (const char* name : {"w4afp8_pc", "w4afp8_g128"}) {
      SCOPED_TRACE(std::string(name) + " M=" + std::to_string(m) + " N=" + std::to_string(n));
      const LinearFormat f = parse_linear_format(name);
      const std::string why = explain(f, m, n, k, Device::cuda());
      ASSERT_NE(why.find("persistent CTAs"), std::string::npos) << why;
      QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
      const PackedWeight wd = pack_weight(qw.view(), packed_layout(f), Device::cuda());
      const Tensor bias = test::random_normal(DType::bf16, 1, n, rng);
      const Tensor bias_d = bias.to(Device::cuda());
      const TensorView bias_v = test::as_vector(bias), bias_dv = test::as_vector(bias_d);
      QuantizedActivation qa(f.act, m, k);
      quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
      const QuantizedActivation qad = qa.to(Device::cuda());
      Tensor ref = Tensor::empty(DType::f32, {m, n});
      linear(qa.view(), qw.view(), &bias_v, ref.view());
      expect_matches(qad, wd, &bias_d, ref, "sm90_w4afp8_gemm");
      Tensor got[2];
      for (int one_tile_per_cta = 0; one_tile_per_cta < 2; ++one_tile_per_cta) {
        const ScopedEnv persistent("NIBBLE_SM90_PERSISTENT", one_tile_per_cta ? "0" : "1");
        got[one_tile_per_cta] = Tensor::empty(DType::f32, {m, n}, Device::cuda());
        got[one_tile_per_cta].fill_bytes(0xFF);
        linear(qad.view(), wd.view(), &bias_dv, got[one_tile_per_cta].view());
      }
      synchronize(Device::cuda());
      EXPECT_TRUE(same_bytes(got[0], got[1]));
    }
  }
}

TEST(CudaW4AFp8, ExplainNamesTheKernelThatRuns) {
  NIBBLE_REQUIRE_GPU();
  const std::string pc = explain(parse_linear_format("w4afp8_pc"), 512, 4096, 4096, Device::cuda());
  const std::string g64 = explain(parse_linear_format("w4afp8_g64"), 512, 4096, 4096, Device::cuda());
  EXPECT_NE(pc.find(sm90a_kernels_here() ? "sm90_w4afp8_gemm" : "simt_linear on the packed"),
            std::string::npos)
      << pc;
  EXPECT_NE(g64.find("simt_linear on the packed"), std::string::npos) << g64;
}

}  // namespace
}  // namespace nibble
