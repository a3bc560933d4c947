// GPU tests of the W4A4 tensor-core GEMM (sm80_w4a4_gemm: native int4 MMA on sm_80/86/89, two
// int8 MMAs per int4 step on sm_90, which has no int4 tensor cores), reading the logical
// row-major packed int4 operands, against the CPU reference on the same quantized operands:
// the raw s4 × s4 → s32 GEMM and the per-channel w4a4 linear.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "nibble/nibble.h"

namespace nibble {
namespace {

// Every tile bucket and its edges.
const std::vector<int64_t> kOddM = {1, 2, 3, 7, 15, 16, 17, 31, 33, 64, 100, 127, 128, 255, 1000};

TEST(CudaW4A4, S32IsBitExactOnOddShapes) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;  // fresh seed, printed on failure
  // K = 96 and 320 end inside a 256-value K block; N = 13 leaves a partial channel tile.
  const std::pair<int64_t, int64_t> nk[] = {{8, 32}, {13, 96}, {72, 320}, {264, 4096}, {1000, 544}};
  for (auto [n, k] : nk) {
    const Tensor w = test::random_int(DType::s4, n, k, rng);
    const Tensor wd = w.to(Device::cuda());
    for (int64_t m : kOddM) {
      SCOPED_TRACE("M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" + std::to_string(k));
      const Tensor a = test::random_int(DType::s4, m, k, rng);
      Tensor ref = Tensor::empty(DType::s32, {m, n});
      gemm_s32(a.view(), w.view(), ref.view());
      ASSERT_TRUE(same_bytes(gpu_s32(a, wd, m, n), ref));
    }
  }
}

TEST(CudaW4A4, S32ExtremeValuesAtTheEmulationBound) {
  NIBBLE_REQUIRE_GPU();
  // The largest multiple of 32 within the int8 emulation's bound (131071): products at their
  // extremes (−8·−8, −8·7, 7·7), on every GPU.
  const int64_t k = max_int32_accumulation_k(DType::s8, DType::s8) / 32 * 32;
  const int64_t m = 3, n = 16;
  for (auto [a_byte, w_byte] : std::vector<std::pair<uint8_t, uint8_t>>{
           {0x88, 0x88}, {0x88, 0x77}, {0x77, 0x77}, {0x78, 0x87}}) {
    SCOPED_TRACE("a byte " + std::to_string(a_byte) + " w byte " + std::to_string(w_byte));
    Tensor a = Tensor::empty(DType::s4, {m, k}), w = Tensor::empty(DType::s4, {n, k});
    a.fill_bytes(a_byte);
    w.fill_bytes(w_byte);
    Tensor ref = Tensor::empty(DType::s32, {m, n});
    gemm_s32(a.view(), w.view(), ref.view());
    EXPECT_TRUE(same_bytes(gpu_s32(a, w.to(Device::cuda()), m, n), ref));
  }
}

class CudaW4A4Linear : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaW4A4Linear, MatchesReferenceOnOddShapes) {
  NIBBLE_REQUIRE_GPU();
  const LinearFormat f = parse_linear_format(GetParam());
  test::Rng rng;  // fresh seed, printed on failure
  // K = 352 ends inside a K block (per channel; g128 needs K % 128, and K = 384 is not a
  // multiple of 256, so g128 runs the fallback there: the same results either way).
  const std::pair<int64_t, int64_t> nk[] = {{136, 512}, {1000, 1536}, {72, 352}, {20, 256},
                                            {40, 384}};
  for (auto [n, k] : nk) {
    if (!f.weight.per_channel() && k % f.weight.group_size != 0) continue;
    QuantizedWeight qw(f.weight, n, k);
    quantize_weight(test::random_normal(DType::f32, n, k, rng, 0.02).view(), qw.view());
    const QuantizedWeight qwd = qw.to(Device::cuda());
    const Tensor bias = test::random_normal(DType::bf16, 1, n, rng);
    const Tensor bias_d = bias.to(Device::cuda());
    const TensorView bias_v = test::as_vector(bias), bias_dv = test::as_vector(bias_d);
    for (int64_t m : kOddM) {
      for (DType out : {DType::bf16, DType::f32}) {
        SCOPED_TRACE("M=" + std::to_string(m) + " N=" + std::to_string(n) + " K=" +
                     std::to_string(k) + " out " + to_string(out));
        QuantizedActivation qa(f.act, m, k);
        quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
        Tensor ref = Tensor::empty(out, {m, n});
        linear(qa.view(), qw.view(), &bias_v, ref.view());
        Tensor got = Tensor::empty(out, {m, n}, Device::cuda());
        got.fill_bytes(0xFF);  // NaN in every float dtype
        linear(qa.to(Device::cuda()).view(), qwd.view(), &bias_dv, got.view());
        synchronize(Device::cuda());
        ASSERT_LE(rel_error(got, ref), out == DType::f32 ? kRelTolF32Out : kRelTolHalfOut);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaW4A4Linear,
                         ::testing::Values("w4a4_pc", "w4a4_g128", "w4a4_g128_sf32"),
                         [](const auto& p) { return std::string(p.param); });

TEST(CudaW4A4, DispatchPicksTheTensorCoreKernelAndSaysWhich) {
  NIBBLE_REQUIRE_GPU();
  const DeviceInfo info = cuda_device_info(0);
  for (const char* name : {"w4a4_pc", "w4a4_g128"}) {
    const std::string why = explain(parse_linear_format(name), 16, 4096, 4096, Device::cuda());
    SCOPED_TRACE(why);
    EXPECT_NE(why.find("runs sm80_w4a4_gemm"), std::string::npos);
    EXPECT_NE(why.find(info.cc_major >= 9 ? "two int8 MMAs" : "native int4 MMA"),
              std::string::npos);
    EXPECT_NE(why.find("rho = "), std::string::npos);
  }
  // g128 with K % 256 != 0 runs the fallback (with the same results, tested above).
  EXPECT_NE(explain(parse_linear_format("w4a4_g128"), 16, 4096, 384, Device::cuda())
                .find("runs simt_linear"),
            std::string::npos);
}

}  // namespace
}  // namespace nibble
