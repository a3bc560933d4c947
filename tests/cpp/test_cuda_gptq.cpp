// GPTQ on a CUDA device (cuBLAS Dsyrk / Dgemm, cuSOLVER potrf / potri) against the CPU path,
// which is the reference. Both run in f64 with different summation orders, so they are compared
// with tolerances: the Hessian elementwise, the integer codes allowing a few flips at rounding
// ties, the proxy loss and the layer output error relatively. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda_test_util.h"
#include "nibble/quant_algorithms.h"

namespace nibble {
namespace {

// f32 rounding of the CPU Hessian's chunk sums (≤ 512 rows) against the device's f64 sums.
constexpr double kHessianRelTol = 1e-5;
// Codes that differ between the paths: a weight whose updated value sits within f64 noise of a
// rounding boundary may round either way, and the error then propagates to later columns.
constexpr double kMaxCodeMismatch = 0.01;
constexpr double kLossRelTol = 1e-3;

Tensor activations(int64_t m, int64_t k, test::Rng& rng) {
  Tensor x = Tensor::empty(DType::f32, {m, k});
  std::vector<double> a(static_cast<size_t>(8 * k));
  for (auto& v : a) v = rng.normal();
  for (int64_t r = 0; r < m; ++r) {
    double z[8];
    for (double& v : z) v = rng.normal();
    for (int64_t c = 0; c < k; ++c) {
      double s = 0.1 * rng.normal();
      for (int t = 0; t < 8; ++t) s += z[t] * a[static_cast<size_t>(t * k + c)];
      x.view().ptr<float>()[r * k + c] = static_cast<float>(s);
    }
  }
  return x;
}

TEST(CudaGptq, HessianMatchesCpu) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  const int64_t m = 700, k = 192;
  const Tensor x = activations(m, k, rng);
  GptqHessian cpu(k), gpu(k);
  cpu.add(x.view());
  gpu.add(x.to(Device::cuda()).view());
  EXPECT_EQ(gpu.samples(), m);
  const auto a = cpu.matrix(), b = gpu.matrix();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += a[i] * a[i];
  EXPECT_LT(std::sqrt(num / den), kHessianRelTol);
}

TEST(CudaGptq, MatchesCpuGptq) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  const int64_t m = 512, k = 384, n = 96;
  const Tensor x = activations(m, k, rng);
  GptqHessian h(k);
  h.add(x.view());
  const Tensor w = test::random_normal(DType::f32, n, k, rng, 0.05);
  for (const char* name : {"w4_g128", "w4_g32", "w4_pc", "w8_pc"})
    for (bool act_order : {false, true}) {
      SCOPED_TRACE(std::string(name) + (act_order ? " act_order" : ""));
      const WeightFormat f = parse_weight_format(name);
      QuantizedWeight qc(f, n, k), qg(f, n, k);
      GptqOptions opt;
      opt.act_order = act_order;
      opt.block_size = 128;
      const GptqResult rc = quantize_weight_gptq(w.view(), h, qc.view(), opt);
      opt.device = Device::cuda();
      const GptqResult rg = quantize_weight_gptq(w.view(), h, qg.view(), opt);
      int64_t differ = 0;
      for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c)
          differ += test::int_at(qc.view().q, r, c) != test::int_at(qg.view().q, r, c);
      EXPECT_LE(static_cast<double>(differ), kMaxCodeMismatch * static_cast<double>(n * k));
      EXPECT_NEAR(rg.loss, rc.loss, kLossRelTol * rc.loss);
    }
}

}  // namespace
}  // namespace nibble
