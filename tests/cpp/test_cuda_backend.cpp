// GPU tests of the CUDA backend against the CPU reference. Each test skips, saying why, when no
// CUDA device is usable (CPU-only build, no driver, no GPU); on the device machine they run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "nibble/nibble.h"

namespace nibble {
namespace {

TEST(CudaDevice, PropertiesAreReadFromTheDevice) {
  NIBBLE_REQUIRE_GPU();
  const DeviceInfo d = cuda_device_info(0);
  EXPECT_GT(d.sm_count, 0);
  EXPECT_GT(d.l2_bytes, 0);
  EXPECT_GE(d.cc_major, 8) << "nibble targets sm_80 and newer";
  std::printf("device: %s sm_%d%d, %d SMs, L2 %lld MiB\n", d.name.c_str(), d.cc_major, d.cc_minor,
              d.sm_count, static_cast<long long>(d.l2_bytes >> 20));
}

TEST(CudaQuantize, PerTokenIsBitExactWithReference) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;  // fresh seed, printed on failure
  for (ActScheme scheme : {ActScheme::s8_per_token, ActScheme::s4_per_token, ActScheme::e4m3_per_token})
    for (DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (int64_t m : {1, 3, 17, 100})
        for (int64_t k : {32, 130, 4096}) {
          SCOPED_TRACE(std::string(to_string(scheme)) + " " + to_string(dtype) + " M=" +
                       std::to_string(m) + " K=" + std::to_string(k));
          Tensor x = test::random_activations(dtype, m, k, rng);
          if (m > 1) std::memset(x.data(), 0, dtype_storage_bytes(dtype, k));  // a zero row
          QuantizedActivation ref(scheme, m, k);
          quantize_activation(x.view(), ref.view());
          QuantizedActivation got(scheme, m, k, Device::cuda());
          got.q.fill_bytes(0xA5);
          got.scales.fill_bytes(0xA5);
          const Tensor xd = x.to(Device::cuda());
          quantize_activation(xd.view(), got.view());
          synchronize(Device::cuda());
          EXPECT_TRUE(same_bytes(got.q, ref.q));
          EXPECT_TRUE(same_bytes(got.scales, ref.scales));
        }
}

TEST(CudaQuantize, StaticPerTensorIsBitExactWithReference) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;  // fresh seed, printed on failure
  Tensor x = test::random_activations(DType::bf16, 37, 1000, rng);
  QuantizedActivation ref(ActScheme::s8_per_tensor, 37, 1000);
  quantize_activation_static(x.view(), 0.09f, ref.view());
  QuantizedActivation got(ActScheme::s8_per_tensor, 37, 1000, Device::cuda());
  got.q.fill_bytes(0x5A);
  const Tensor xd = x.to(Device::cuda());
  quantize_activation_static(xd.view(), 0.09f, got.view());
  synchronize(Device::cuda());
  EXPECT_TRUE(same_bytes(got.q, ref.q));
  EXPECT_TRUE(same_bytes(got.scales, ref.scales));
}

TEST(CudaGemm, S32IsBitExactWithReferenceOnOddShapes) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;  // fresh seed, printed on failure
  const std::pair<DType, DType> pairs[] = {{DType::s8, DType::s8}, {DType::s8, DType::s4}, {DType::s4, DType::s4}};
  for (auto [adt, wdt] : pairs)
    for (int64_t m : {1, 2, 3, 7, 15, 16, 17, 31, 64, 100, 127, 128, 255})
      for (int64_t n : {8, 72, 264})
        for (int64_t k : {64, 320}) {
          SCOPED_TRACE(std::string(to_string(adt)) + "x" + to_string(wdt) + " M=" + std::to_string(m) +
                       " N=" + std::to_string(n) + " K=" + std::to_string(k));
          const Tensor a = test::random_int(adt, m, k, rng), w = test::random_int(wdt, n, k, rng);
          Tensor ref = Tensor::empty(DType::s32, {m, n});
          gemm_s32(a.view(), w.view(), ref.view());
          Tensor got = Tensor::empty(DType::s32, {m, n}, Device::cuda());
          got.fill_bytes(0xCD);  // poison: every element must be written
          const Tensor ad = a.to(Device::cuda()), wd = w.to(Device::cuda());
          gemm_s32(ad.view(), wd.view(), got.view());
          synchronize(Device::cuda());
          ASSERT_TRUE(same_bytes(got, ref));
        }
}

TEST(CudaGemm, S32ExtremeValuesAtLargeK) {
  NIBBLE_REQUIRE_GPU();
  // Every product at its largest magnitude: the sum sits right at the int32 bound for K.
  const int64_t m = 3, n = 5, k = 1 << 16;
  Tensor a = Tensor::empty(DType::s8, {m, k}), w = Tensor::empty(DType::s4, {n, k});
  a.fill_bytes(0x80);  // -128
  w.fill_bytes(0x88);  // -8, -8
  Tensor ref = Tensor::empty(DType::s32, {m, n});
  gemm_s32(a.view(), w.view(), ref.view());
  EXPECT_EQ(ref.view().ptr<int32_t>()[0], 1024 * k);
  Tensor got = Tensor::empty(DType::s32, {m, n}, Device::cuda());
  got.fill_bytes(0xCD);
  const Tensor ad = a.to(Device::cuda()), wd = w.to(Device::cuda());
  gemm_s32(ad.view(), wd.view(), got.view());
  synchronize(Device::cuda());
  EXPECT_TRUE(same_bytes(got, ref));
}

// Every format of the catalogue: the GPU linear against the CPU reference on the same
// quantized operands.
class CudaLinearFormat : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaLinearFormat, MatchesReference) {
  NIBBLE_REQUIRE_GPU();
  const LinearFormat f = parse_linear_format(GetParam());
  test::Rng rng;  // fresh seed, printed on failure
  for (int64_t m : {1, 3, 17, 64})
    for (DType out : {DType::f32, DType::bf16}) {
      const int64_t n = 136, k = 512;
      SCOPED_TRACE("M=" + std::to_string(m) + " out " + to_string(out));
      QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
      const Tensor x = test::random_activations(DType::bf16, m, k, rng);
      const Tensor bias = test::random_normal(DType::f32, 1, n, rng);
      const TensorView bias_view = test::as_vector(bias);
      Tensor ref = Tensor::empty(out, {m, n});
      Tensor got = Tensor::empty(out, {m, n}, Device::cuda());
      got.fill_bytes(0xFF);  // NaN in every float dtype: unwritten elements fail the check
      const QuantizedWeight qwd = qw.to(Device::cuda());
      const Tensor bias_d = bias.to(Device::cuda());
      const TensorView bias_dv = test::as_vector(bias_d);
      if (f.act == ActScheme::none) {
        linear(x.view(), qw.view(), &bias_view, ref.view());
        const Tensor xd = x.to(Device::cuda());
        linear(xd.view(), qwd.view(), &bias_dv, got.view());
      } else {
        QuantizedActivation qa(f.act, m, k);
        if (f.act == ActScheme::s8_per_tensor) quantize_activation_static(x.view(), 0.5f, qa.view());
        else quantize_activation(x.view(), qa.view());
        linear(qa.view(), qw.view(), &bias_view, ref.view());
        const QuantizedActivation qad = qa.to(Device::cuda());
        linear(qad.view(), qwd.view(), &bias_dv, got.view());
      }
      synchronize(Device::cuda());
      EXPECT_LE(rel_error(got, ref), out == DType::f32 ? kRelTolF32Out : kRelTolHalfOut);
    }
}

INSTANTIATE_TEST_SUITE_P(Catalogue, CudaLinearFormat,
                         ::testing::Values("w4a8_pc", "w4a8_g128", "w4a8_g32", "w4a8_g128_2level",
                                           "w4a8_pc_static", "w4afp8_pc", "w4afp8_g128", "w8a8",
                                           "w8a8_static", "w4a16_pc", "w4a16_g128", "w4a16_g64_asym",
                                           "w4a16_g128_fzp", "w4a16_g128_sf16", "w8a16", "w4a4_pc",
                                           "w4a4_g128"),
                         [](const auto& p) { return std::string(p.param); });

TEST(CudaValidation, MixedDevicesAreRejectedBeforeAnyWrite) {
  NIBBLE_REQUIRE_GPU();
  const Tensor a = Tensor::empty(DType::s8, {4, 64}).to(Device::cuda());
  Tensor w = Tensor::empty(DType::s8, {8, 64});
  w.fill_bytes(1);
  Tensor d = Tensor::empty(DType::s32, {4, 8}, Device::cuda());
  d.fill_bytes(0x77);
  try {
    gemm_s32(a.view(), w.view(), d.view());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("'w'"), std::string::npos) << e.what();
  }
  const Tensor h = d.to(Device::cpu());
  for (int64_t i = 0; i < h.nbytes(); ++i) ASSERT_EQ(static_cast<const uint8_t*>(h.data())[i], 0x77);
}

TEST(CudaDispatch, ExplainNamesTheKernel) {
  NIBBLE_REQUIRE_GPU();
  const std::string s = explain(parse_linear_format("w4a8_g128"), 16, 4096, 4096, Device::cuda());
  EXPECT_NE(s.find("runs "), std::string::npos) << s;
  std::printf("%s\n", s.c_str());
}

}  // namespace
}  // namespace nibble
