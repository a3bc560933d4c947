// LinearFusion on the CPU reference (include/nibble/gemm.h, docs/formats.md §6.2): the granule
// sums and the norm against their written definitions, a decode block's residual stream through
// fused linears against the same steps done one by one, and the argument errors. The GPU tests
// are in test_cuda_linear_fusion.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/residual_norm.h"
#include "nibble/nibble.h"
#include "test_util.h"

namespace nibble {
namespace {

using test::arg;
using test::throws_error;

// The butterfly of XOR shuffles, written as the GPU runs it: at each level every lane adds its
// partner's value, partner = lane XOR o.
double butterfly(std::vector<double> v) {
  for (size_t o = v.size() / 2; o > 0; o /= 2) {
    std::vector<double> next(v.size());
    for (size_t i = 0; i < v.size(); ++i) next[i] = v[i] + v[i ^ o];
    v = next;
  }
  return v[0];
}

TEST(LinearFusion, GranuleSumsAreTheShuffleTreeOfExactSquares) {
  test::Rng rng;
  for (int64_t n : {1, 15, 16, 17, 1000, 4096}) {
    std::vector<float> d(static_cast<size_t>(n));
    for (auto& v : d) v = static_cast<float>(rng.normal(1.0) * std::exp2(rng.uniform(-20, 20)));
    std::vector<double> s(static_cast<size_t>(sumsq_granules(n)));
    detail::granule_sums(d.data(), n, s.data());
    for (size_t b = 0; b < s.size(); ++b) {
      std::vector<double> sq(16, 0.0);
      for (size_t i = 0; i < 16; ++i)
        if (b * 16 + i < d.size()) sq[i] = double(d[b * 16 + i]) * double(d[b * 16 + i]);
      EXPECT_EQ(s[b], butterfly(sq)) << "n=" << n << " granule " << b;
    }
  }
}

TEST(LinearFusion, NormInverseFollowsItsDefinitionAndIsAccurate) {
  test::Rng rng;
  for (int64_t k : {16, 32, 100, 4096, 14336}) {
    std::vector<float> x(static_cast<size_t>(k));
    for (auto& v : x) v = static_cast<float>(rng.normal(3.0));
    x[static_cast<size_t>(k / 2)] = 900.0f;  // an outlier channel
    std::vector<double> s(static_cast<size_t>(sumsq_granules(k)));
    detail::granule_sums(x.data(), k, s.data());
    const float eps = 1e-5f;
    const float inv = detail::rms_inverse(s.data(), static_cast<int64_t>(s.size()), k, eps);
    // The definition, step by step.
    std::vector<double> lanes(32, 0.0);
    for (size_t b = 0; b < s.size(); ++b) lanes[b % 32] += s[b];
    const auto ms = static_cast<float>(butterfly(lanes) * (1.0 / static_cast<double>(k)));
    EXPECT_EQ(inv, 1.0f / std::sqrt(ms + eps));
    // Within an ulp or two of the exact value.
    long double exact = 0;
    for (float v : x) exact += static_cast<long double>(v) * v;
    const long double want = 1.0L / std::sqrt(exact / k + eps);
    EXPECT_NEAR(static_cast<double>(inv), static_cast<double>(want), 3e-7 * static_cast<double>(want));
  }
}

// One fused linear against its steps: y = RN(RN(x·inv)·w) on the host, quantize_activation(y),
// the plain linear to f32, then d + t and the granule sums of the new d.
TEST(LinearFusion, CpuLinearEqualsItsStepsBitForBit) {
  test::Rng rng;
  for (const char* fmt : {"w4a8_pc", "w4a8_g128", "w4a8_g128_2level"}) {
    const LinearFormat f = parse_linear_format(fmt);
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 200, 256}, {3, 72, 384},
                           {5, 1000, 128}}) {
      SCOPED_TRACE(std::string(fmt) + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                   " K=" + std::to_string(k));
      const QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
      const PackedWeight wp = pack_weight(qw.view(), Device::cpu());
      Tensor x = test::random_activations(DType::f32, m, k, rng);
      test::put_float(x.view(), m - 1, k - 3, -250.0);
      const Tensor w = test::random_rms_weight(DType::f32, k, rng);
      Tensor in_sums = Tensor::empty(DType::f64, {m, sumsq_granules(k)});
      for (int64_t r = 0; r < m; ++r)
        detail::granule_sums(static_cast<const float*>(x.data()) + r * k, k,
                             static_cast<double*>(in_sums.data()) + r * in_sums.view().stride(0));
      const Tensor d0 = test::random_normal(DType::f32, m, n, rng, 4.0);
      for (bool accumulate : {false, true}) {
        LinearFusion fusion;
        fusion.in_sumsq = in_sums.view();
        fusion.norm_weight = test::as_vector(w);
        fusion.norm_eps = 1e-5f;
        fusion.accumulate = accumulate;
        Tensor out_sums = Tensor::empty(DType::f64, {m, sumsq_granules(n)});
        out_sums.fill_bytes(0xFF);
        fusion.out_sumsq = out_sums.view();
        Tensor d = d0.to(Device::cpu());
        linear(x.view(), wp.view(), nullptr, d.view(), fusion);

        Tensor y = Tensor::empty(DType::f32, {m, k});
        for (int64_t r = 0; r < m; ++r) {
          const float inv = detail::rms_inverse(
              static_cast<const double*>(in_sums.data()) + r * in_sums.view().stride(0),
              sumsq_granules(k), k, 1e-5f);
          for (int64_t c = 0; c < k; ++c)
            test::put_float(y.view(), r, c,
                            detail::rms_apply(static_cast<float>(test::float_at(x.view(), r, c)),
                                              inv, static_cast<float>(test::float_at(w.view(), 0, c))));
        }
        Tensor t = Tensor::empty(DType::f32, {m, n});
        linear(y.view(), wp.view(), nullptr, t.view());
        for (int64_t r = 0; r < m; ++r) {
          std::vector<float> want(static_cast<size_t>(n));
          for (int64_t c = 0; c < n; ++c) {
            const auto tv = static_cast<float>(test::float_at(t.view(), r, c));
            want[static_cast<size_t>(c)] =
                accumulate ? static_cast<float>(test::float_at(d0.view(), r, c)) + tv : tv;
            ASSERT_EQ(static_cast<float>(test::float_at(d.view(), r, c)), want[static_cast<size_t>(c)]);
          }
          std::vector<double> sums(static_cast<size_t>(sumsq_granules(n)));
          detail::granule_sums(want.data(), n, sums.data());
          ASSERT_EQ(std::memcmp(sums.data(),
                                static_cast<const double*>(out_sums.data()) +
                                    r * out_sums.view().stride(0),
                                sums.size() * sizeof(double)),
                    0);
        }
      }
    }
  }
}

TEST(LinearFusion, RejectsBadArgumentsBeforeWriting) {
  test::Rng rng;
  const int64_t m = 2, n = 40, k = 128;
  const QuantizedWeight qw = test::random_quantized_weight(parse_weight_format("w4_pc"), n, k, rng);
  const PackedWeight wp = pack_weight(qw.view(), Device::cpu());
  const Tensor x = test::random_activations(DType::f32, m, k, rng);
  Tensor d = Tensor::empty(DType::f32, {m, n});
  d.fill_bytes(0x5A);
  const Tensor d_before = d.to(Device::cpu());
  Tensor in_sums = Tensor::empty(DType::f64, {m, 8});
  Tensor out_sums = Tensor::empty(DType::f64, {m, 3});
  const Tensor w = test::random_rms_weight(DType::f32, k, rng);
  const auto run = [&](const LinearFusion& f, const TensorView& dv) {
    return [&, f, dv] { linear(x.view(), wp.view(), nullptr, dv, f); };
  };
  const ErrorCode kInvalid = ErrorCode::invalid_argument;
  LinearFusion ok;
  ok.in_sumsq = in_sums.view();
  ok.norm_weight = test::as_vector(w);
  ok.out_sumsq = out_sums.view();
  ok.accumulate = true;

  LinearFusion f = ok;
  f.out_sumsq = Tensor::empty(DType::f64, {m, 2}).view();  // ceil(40/16) = 3 granules
  EXPECT_TRUE(throws_error(run(f, d.view()), kInvalid, {"nibble::linear: ", arg("fusion.out_sumsq")}));
  f = ok;
  Tensor sums_f32 = Tensor::empty(DType::f32, {m, 8});
  f.in_sumsq = sums_f32.view();
  EXPECT_TRUE(throws_error(run(f, d.view()), kInvalid, {arg("fusion.in_sumsq"), "f64"}));
  f = ok;
  f.in_sumsq = {};
  EXPECT_TRUE(throws_error(run(f, d.view()), kInvalid,
                           {arg("fusion.norm_weight"), "without fusion.in_sumsq"}));
  f = ok;
  f.norm_eps = 0.0f;
  EXPECT_TRUE(throws_error(run(f, d.view()), kInvalid, {arg("fusion.norm_eps"), "positive"}));
  f = ok;
  const Tensor w_short = test::random_rms_weight(DType::f32, k - 1, rng);
  f.norm_weight = test::as_vector(w_short);
  EXPECT_TRUE(throws_error(run(f, d.view()), kInvalid, {arg("fusion.norm_weight")}));
  Tensor d_bf16 = Tensor::empty(DType::bf16, {m, n});
  EXPECT_TRUE(throws_error(run(ok, d_bf16.view()), kInvalid, {arg("d"), "must be f32"}));
  f = ok;
  f.out_sumsq = TensorView::contiguous(in_sums.data(), DType::f64, {m, 3});
  EXPECT_TRUE(throws_error(run(f, d.view()), kInvalid, {arg("fusion.out_sumsq"), "overlap"}));
  // Weight-only layouts have no per-token quantization to fuse with.
  const QuantizedWeight q16 = test::random_quantized_weight(parse_weight_format("w4_g128"), n, k, rng);
  const PackedWeight w16 = pack_weight(q16.view(), packed_layout(parse_linear_format("w4a16_g128")),
                                       Device::cpu());
  EXPECT_TRUE(throws_error([&] { linear(x.view(), w16.view(), nullptr, d.view(), ok); }, kInvalid,
                           {arg("fusion"), "w4_mma_k128"}));
  EXPECT_EQ(test::bytes_of(d), test::bytes_of(d_before));
}

}  // namespace
}  // namespace nibble
