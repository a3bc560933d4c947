// Activation quantization with RMSNorm and SmoothQuant's divide fused in front (ActQuantFusion,
// src/cpu/quantize_ref.cpp through the public API): the fused result equals the unfused
// composition computed step by step, RMSNorm's mean of squares is exact in any order and
// accurate, the normalized rows match the definition written independently in test_util.h,
// golden values, zero rows, strided and in-place buffers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/rounded_math.h"
#include "cpu/reference.h"
#include "nibble/nibble.h"
#include "test_util.h"

namespace nibble {
namespace {

using test::as_vector;
using test::float_at;
using test::int_at;
using test::Rng;

const ActScheme kAllSchemes[] = {ActScheme::s8_per_token, ActScheme::s4_per_token,
                                 ActScheme::e4m3_per_token, ActScheme::s8_per_tensor};
constexpr float kStaticScale = 0.03f;  // clips the outlier channel of random_activations
constexpr float kEps = 1e-6f;

// Runs the quantizer of `scheme` (dynamic, or static with kStaticScale).
void quantize(const TensorView& x, const QuantizedActivationView& out,
              const ActQuantFusion& fusion = {}) {
  if (out.scheme == ActScheme::s8_per_tensor)
    quantize_activation_static(x, kStaticScale, out, fusion);
  else
    quantize_activation(x, out, fusion);
}

::testing::AssertionResult same_activation(const QuantizedActivation& got,
                                           const QuantizedActivation& want) {
  if (test::bytes_of(got.q) != test::bytes_of(want.q))
    return ::testing::AssertionFailure() << "q differs";
  if (test::bytes_of(got.scales) != test::bytes_of(want.scales))
    return ::testing::AssertionFailure() << "scales differ";
  return ::testing::AssertionSuccess();
}

// v / smooth per column in f32: the SmoothQuant divide done by hand.
std::vector<float> divided(const std::vector<float>& v, int64_t k_cols, const TensorView& smooth) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = v[i] / static_cast<float>(float_at(smooth, static_cast<int64_t>(i) % k_cols));
  return out;
}

std::vector<float> values_of(const TensorView& x) {
  std::vector<float> v(static_cast<size_t>(x.size(0) * x.size(1)));
  for (int64_t m = 0; m < x.size(0); ++m)
    for (int64_t k = 0; k < x.size(1); ++k)
      v[size_t(m * x.size(1) + k)] = static_cast<float>(float_at(x, m, k));
  return v;
}

// ---- the fused result is the composition of its steps -------------------------------------------

class QuantizeFusionScheme : public ::testing::TestWithParam<ActScheme> {};

// quantize(x, smooth) == quantize(x / smooth as an f32 matrix), bit for bit.
TEST_P(QuantizeFusionScheme, SmoothDivideEqualsQuantizingTheDividedMatrix) {
  const ActScheme scheme = GetParam();
  Rng rng;
  for (DType in : {DType::f32, DType::f16, DType::bf16})
    for (DType sd : {DType::f32, DType::f16, DType::bf16}) {
      SCOPED_TRACE(std::string("x ") + to_string(in) + ", smooth " + to_string(sd));
      const int64_t m = 7, k = 130;
      const Tensor x = test::random_activations(in, m, k, rng);
      const Tensor smooth = test::random_smooth(sd, k, rng);
      ActQuantFusion f;
      f.smooth = as_vector(smooth);
      QuantizedActivation fused(scheme, m, k), step(scheme, m, k);
      fused.q.fill_bytes(0xEE);
      quantize(x.view(), fused.view(), f);
      const Tensor v = test::matrix_of(DType::f32, m, k, divided(values_of(x.view()), k, f.smooth));
      quantize(v.view(), step.view());
      EXPECT_TRUE(same_activation(fused, step));
    }
}

// With RMSNorm: `normed` holds y as the definition says, quantize(x, norm) == quantize(y), and
// quantize(x, norm, smooth) == quantize(y / smooth).
TEST_P(QuantizeFusionScheme, NormThenQuantizeEqualsQuantizingTheNormedRows) {
  const ActScheme scheme = GetParam();
  Rng rng;
  for (DType in : {DType::f32, DType::f16, DType::bf16})
    for (bool f32_weight : {false, true})
      for (int64_t k : {1, 2, 34, 1000}) {
        if (k % 2 != 0 && scheme == ActScheme::s4_per_token) continue;  // s4 rows are even
        SCOPED_TRACE(std::string("x ") + to_string(in) + (f32_weight ? ", f32 weight" : "") +
                     " K=" + std::to_string(k));
        const int64_t m = 9;
        Tensor x = test::random_activations(in, m, k, rng);
        for (int64_t c = 0; c < k; ++c) test::put_float(x.view(), 2, c, 0.0);  // a zero row
        const Tensor w = test::random_rms_weight(f32_weight ? DType::f32 : in, k, rng);
        const Tensor smooth = test::random_smooth(DType::f32, k, rng);
        Tensor normed = Tensor::empty(in, {m, k});
        normed.fill_bytes(0xEE);
        ActQuantFusion f;
        f.rms_weight = as_vector(w);
        f.rms_eps = kEps;
        f.normed = normed.view();
        QuantizedActivation fused(scheme, m, k);
        quantize(x.view(), fused.view(), f);

        const std::vector<float> y = test::rmsnorm_reference(x.view(), as_vector(w), kEps);
        ASSERT_EQ(values_of(normed.view()), y) << "normed output";
        QuantizedActivation step(scheme, m, k);
        quantize(normed.view(), step.view());
        EXPECT_TRUE(same_activation(fused, step)) << "norm";

        f.smooth = as_vector(smooth);
        f.normed = {};
        quantize(x.view(), fused.view(), f);
        const Tensor v = test::matrix_of(DType::f32, m, k, divided(y, k, f.smooth));
        quantize(v.view(), step.view());
        EXPECT_TRUE(same_activation(fused, step)) << "norm + smooth";
      }
}

INSTANTIATE_TEST_SUITE_P(Schemes, QuantizeFusionScheme, ::testing::ValuesIn(kAllSchemes),
                         [](const auto& p) { return std::string(to_string(p.param)); });

// ---- RMSNorm ----------------------------------------------------------------------------------

// The mean of squares does not depend on the order of the row (it is an integer sum), and it
// is within its documented error of the exact mean (long double reference).
TEST(QuantizeFusionRmsNorm, MeanSquareIsOrderFreeAndWithinItsBound) {
  Rng rng;
  for (int64_t k : {1, 2, 7, 4096, 14336, 65536})
    for (int trial = 0; trial < 4; ++trial) {
      SCOPED_TRACE("K=" + std::to_string(k) + " trial " + std::to_string(trial));
      std::vector<float> row(static_cast<size_t>(k));
      // Trial 0 Gaussian, 1 with a 1e4× outlier, 2 spanning 2^±40, 3 tiny (f32 subnormals).
      for (auto& v : row) {
        v = static_cast<float>(rng.normal());
        if (trial == 2) v = std::ldexp(v, static_cast<int>(rng.uniform_int(-40, 40)));
        if (trial == 3) v *= 1e-40f;
      }
      if (trial == 1) row[size_t(rng.uniform_int(0, k - 1))] = 1e4f;
      const float ms = cpu::rms_mean_square(row.data(), k);
      EXPECT_EQ(ms, test::rms_mean_square(row));
      std::vector<float> shuffled = row;
      std::shuffle(shuffled.begin(), shuffled.end(), rng.engine());
      std::reverse(row.begin(), row.end());
      EXPECT_EQ(cpu::rms_mean_square(shuffled.data(), k), ms);
      EXPECT_EQ(cpu::rms_mean_square(row.data(), k), ms);
      long double exact = 0;
      for (float v : row) exact += static_cast<long double>(v) * v;
      exact /= k;
      // Fixed-point error 2^(2·ceil(log2 K) − 61), plus half an f32 ulp, plus f32 subnormals.
      int l = 0;
      while ((int64_t{1} << l) < k) ++l;
      const long double bound = std::ldexp(1.0L, 2 * l - 61) * exact + std::ldexp(exact, -24) +
                                std::ldexp(1.0L, -149);
      EXPECT_LE(std::fabs(static_cast<long double>(ms) - exact), bound)
          << "ms " << ms << " exact " << static_cast<double>(exact);
    }
}

// y is within two roundings to x's dtype of the float64 RMSNorm: x·r rounded (relative error u,
// or half the smallest subnormal where it lands below the normal range), then times w, rounded
// again. The first rounding's absolute error is scaled by |w| (up to ~3 here), so the
// subnormal term is (1 + |w|)·tiny/2 (f16 failed the flat `tiny` once, seed 781327862:
// 7.2e-8 against 6.4e-8).
TEST(QuantizeFusionRmsNorm, NormedRowsAreCloseToFloat64) {
  Rng rng;
  for (DType in : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(to_string(in));
    const int64_t m = 5, k = 4096;
    const Tensor x = test::random_activations(in, m, k, rng);
    const Tensor w = test::random_rms_weight(in, k, rng);
    Tensor normed = Tensor::empty(in, {m, k});
    QuantizedActivation qa(ActScheme::s8_per_token, m, k);
    ActQuantFusion f;
    f.rms_weight = as_vector(w);
    f.rms_eps = kEps;
    f.normed = normed.view();
    quantize_activation(x.view(), qa.view(), f);
    const double u = in == DType::f32 ? 0x1p-24 : in == DType::f16 ? 0x1p-11 : 0x1p-8;
    const double tiny = in == DType::f16 ? 0x1p-24 : 0x1p-133;  // smallest subnormal
    for (int64_t r = 0; r < m; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < k; ++c) ss += float_at(x.view(), r, c) * float_at(x.view(), r, c);
      const double inv = 1.0 / std::sqrt(ss / k + kEps);
      for (int64_t c = 0; c < k; ++c) {
        const double wc = float_at(w.view(), 0, c);
        const double want = float_at(x.view(), r, c) * inv * wc;
        ASSERT_LE(std::fabs(float_at(normed.view(), r, c) - want),
                  (2 * u + 4 * FLT_EPSILON) * std::fabs(want) + 0.5 * tiny * (1 + std::fabs(wc)))
            << "(" << r << ", " << c << ")";
      }
    }
  }
}

// Hand-computed: x = 2 everywhere, so r = 1/sqrt(4 + 1e-6) ≈ 0.5 and x·r rounds to 1 in bf16;
// y = w; v = y / smooth.
TEST(QuantizeFusionRmsNorm, GoldenValues) {
  Tensor x = Tensor::empty(DType::bf16, {1, 4});
  for (int c = 0; c < 4; ++c) test::put_float(x.view(), 0, c, 2.0);
  Tensor w = Tensor::empty(DType::bf16, {1, 4});
  const float wv[4] = {1.0f, 2.0f, -0.5f, 0.0f};
  for (int c = 0; c < 4; ++c) test::put_float(w.view(), 0, c, wv[c]);
  Tensor smooth = Tensor::empty(DType::f32, {1, 4});
  const float sv[4] = {1.0f, 4.0f, 0.5f, 1.0f};
  std::memcpy(smooth.data(), sv, sizeof(sv));
  Tensor normed = Tensor::empty(DType::bf16, {1, 4});
  ActQuantFusion f;
  f.rms_weight = as_vector(w);
  f.normed = normed.view();
  QuantizedActivation qa(ActScheme::s8_per_token, 1, 4);
  quantize_activation(x.view(), qa.view(), f);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(float_at(normed.view(), 0, c), wv[c]) << c;
  EXPECT_EQ(float_at(qa.scales.view(), 0), static_cast<double>(2.0f / 127.0f));
  const int want[4] = {64, 127, -32, 0};  // 63.5 → 64 (even), −31.75 → −32
  for (int c = 0; c < 4; ++c) EXPECT_EQ(int_at(qa.q.view(), 0, c), want[c]) << c;

  f.smooth = as_vector(smooth);  // v = 1, 0.5, −1, 0
  quantize_activation(x.view(), qa.view(), f);
  EXPECT_EQ(float_at(qa.scales.view(), 0), static_cast<double>(1.0f / 127.0f));
  const int want_smooth[4] = {127, 64, -127, 0};  // 63.5 → 64
  for (int c = 0; c < 4; ++c) EXPECT_EQ(int_at(qa.q.view(), 0, c), want_smooth[c]) << c;

  QuantizedActivation st(ActScheme::s8_per_tensor, 1, 4);
  quantize_activation_static(x.view(), 0.25f, st.view(), f);  // v / 0.25 = 4, 2, −4, 0
  const int want_static[4] = {4, 2, -4, 0};
  for (int c = 0; c < 4; ++c) EXPECT_EQ(int_at(st.q.view(), 0, c), want_static[c]) << c;
}

// A zero row normalizes to zeros (eps > 0 keeps r finite) and quantizes to s = 0, q = 0.
TEST(QuantizeFusionRmsNorm, ZeroRowGivesZeros) {
  Tensor x = Tensor::empty(DType::f16, {2, 64});
  x.fill_bytes(0);
  Rng rng;
  const Tensor w = test::random_rms_weight(DType::f16, 64, rng);
  Tensor normed = Tensor::empty(DType::f16, {2, 64});
  normed.fill_bytes(0xEE);
  ActQuantFusion f;
  f.rms_weight = as_vector(w);
  f.normed = normed.view();
  for (ActScheme scheme : {ActScheme::s8_per_token, ActScheme::s4_per_token,
                           ActScheme::e4m3_per_token}) {
    QuantizedActivation qa(scheme, 2, 64);
    qa.q.fill_bytes(0xEE);
    quantize_activation(x.view(), qa.view(), f);
    EXPECT_EQ(float_at(qa.scales.view(), 0), 0.0);
    for (int64_t c = 0; c < 64; ++c) {
      EXPECT_EQ(float_at(normed.view(), 1, c), 0.0);
      EXPECT_EQ(scheme == ActScheme::e4m3_per_token ? float_at(qa.q.view(), 1, c)
                                                    : int_at(qa.q.view(), 1, c),
                0.0);
    }
  }
}

// Strided x, q and normed give the bytes of contiguous ones without touching the gaps, and
// normed may be x itself.
TEST(QuantizeFusionRmsNorm, StridedAndInPlaceBuffers) {
  Rng rng;
  const int64_t m = 5, k = 96;
  for (ActScheme scheme : kAllSchemes) {
    SCOPED_TRACE(to_string(scheme));
    const Tensor x = test::random_activations(DType::bf16, m, k, rng);
    const Tensor w = test::random_rms_weight(DType::f32, k, rng);
    const Tensor smooth = test::random_smooth(DType::bf16, k, rng);
    ActQuantFusion f;
    f.rms_weight = as_vector(w);
    f.smooth = as_vector(smooth);
    Tensor normed = Tensor::empty(DType::bf16, {m, k});
    f.normed = normed.view();
    QuantizedActivation ref(scheme, m, k);
    quantize(x.view(), ref.view(), f);

    const test::Strided xs = test::strided_copy(x, k + 10, 0x7E);
    test::Strided qs = test::strided_empty(ref.q.view().dtype, m, k, k + 32, 0x5A);
    test::Strided ns = test::strided_empty(DType::bf16, m, k, k + 6, 0x5A);
    QuantizedActivation strided_out(scheme, m, k);
    f.normed = ns.view;
    quantize(xs.view, {scheme, qs.view, strided_out.scales.view()}, f);
    EXPECT_EQ(test::bytes_of(strided_out.scales), test::bytes_of(ref.scales));
    const int64_t row = dtype_storage_bytes(qs.view.dtype, k);
    const int64_t pitch = dtype_storage_bytes(qs.view.dtype, k + 32);
    for (int64_t r = 0; r < m; ++r) {
      const auto* got = static_cast<const uint8_t*>(qs.storage.data()) + r * pitch;
      const auto* want = static_cast<const uint8_t*>(ref.q.data()) + r * row;
      ASSERT_EQ(std::memcmp(got, want, static_cast<size_t>(row)), 0) << "row " << r;
      for (int64_t b = row; b < pitch; ++b) ASSERT_EQ(got[b], 0x5A) << "gap written, row " << r;
    }
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < k; ++c)
        ASSERT_EQ(float_at(ns.view, r, c), float_at(normed.view(), r, c));
      for (int64_t c = k; c < k + 6; ++c)
        ASSERT_EQ(static_cast<const uint16_t*>(ns.storage.data())[r * (k + 6) + c], 0x5A5A);
    }

    // In place: x's rows become y; the quantized values are the same.
    Tensor inplace = x.to(Device::cpu());
    f.normed = inplace.view();
    QuantizedActivation in_out(scheme, m, k);
    quantize(inplace.view(), in_out.view(), f);
    EXPECT_TRUE(same_activation(in_out, ref));
    EXPECT_EQ(test::bytes_of(inplace), test::bytes_of(normed));
  }
}

// ---- the GPU kernel's division and square root (common/rounded_math.h) ------------------------

// The call-free sequences the activation kernel uses give the IEEE f32 bits: a sample of the
// host checks described in rounded_math.h, with hardware seeds stood in for by the exact value
// perturbed by up to 2^-8 (the f64 sequences) or ±2 ulp (the f32 one).
TEST(QuantizeFusionRoundedMath, DivisionAndSquareRootMatchIeee) {
  Rng rng;
  auto& e = rng.engine();
  const auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  const auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  const auto seed = [&](double exact) { return exact * (1.0 + rng.uniform(-1.0, 1.0) * 0x1p-8); };
  for (int i = 0; i < 2000000; ++i) {
    // divide_rn: any finite a, b (subnormals included) with a finite quotient.
    const float a = from_bits(static_cast<uint32_t>(e())), b = from_bits(static_cast<uint32_t>(e()));
    if (std::isfinite(a) && std::isfinite(b) && b != 0 && std::isfinite(a / b)) {
      ASSERT_EQ(bits(detail::divide_rn(a, b, seed(1.0 / b))), bits(a / b)) << a << " / " << b;
    }
    // sqrt_rn and the reciprocal of a positive t.
    const float t = from_bits(static_cast<uint32_t>(e()) & 0x7FFFFFFFu);
    if (std::isfinite(t) && t > 0) {
      ASSERT_EQ(bits(detail::sqrt_rn(t, seed(1.0 / std::sqrt(double(t))))), bits(std::sqrt(t)))
          << t;
      if (std::isfinite(1.0f / t)) {
        ASSERT_EQ(bits(detail::divide_rn(1.0f, t, seed(1.0 / t))), bits(1.0f / t)) << t;
      }
    }
    // divide_rn_f32_seed in its range, seeds off by up to 2 ulp.
    const float fa = std::ldexp(1.0f + float(rng.uniform(0, 1)), int(rng.uniform_int(-60, 60)));
    const float fb = std::ldexp(1.0f + float(rng.uniform(0, 1)), int(rng.uniform_int(-60, 60)));
    ASSERT_TRUE(detail::in_f32_division_range(fa, fb));
    const float y0 = from_bits(bits(1.0f / fb) + static_cast<uint32_t>(rng.uniform_int(-2, 2)));
    ASSERT_EQ(bits(detail::divide_rn_f32_seed(fa, fb, y0)), bits(fa / fb)) << fa << " / " << fb;
    // divide_by_reciprocal: s ∈ [2^-22, 2), |v / s| ≤ 448 (and near half-integers).
    const float s = std::ldexp(1.0f + float(rng.uniform(0, 1)), int(rng.uniform_int(-22, 0)));
    const float q = i % 2 ? float(rng.uniform_int(0, 448)) + 0.5f : float(rng.uniform(-448, 448));
    const float v = from_bits(bits(q * s) + static_cast<uint32_t>(rng.uniform_int(-1, 1)));
    ASSERT_EQ(bits(detail::divide_by_reciprocal(v, s, 1.0f / s)), bits(v / s)) << v << " / " << s;
  }
  // Exact ties in the subnormal range: a / b = (2k + 1) · 2^-150.
  for (int i = 0; i < 200000; ++i) {
    const float b = std::ldexp(1.0f + float(rng.uniform(0, 1)), int(rng.uniform_int(-20, 20)));
    const float a = static_cast<float>((2.0 * double(rng.uniform_int(0, 1 << 22)) + 1) * 0x1p-150 * b);
    if (a / b != 0 && std::fabs(a / b) < 0x1p-126) {
      ASSERT_EQ(bits(detail::divide_rn(a, b, seed(1.0 / b))), bits(a / b)) << a << " / " << b;
    }
  }
  // amax / qmax through the f64 reciprocal (exhaustive on the host once; a sample here).
  for (float qmax : {7.0f, 127.0f, 448.0f})
    for (int i = 0; i < 1000000; ++i) {
      const float amax = from_bits(static_cast<uint32_t>(e()) % 0x7F800000u);
      ASSERT_EQ(bits(static_cast<float>(double(amax) * (1.0 / double(qmax)))), bits(amax / qmax));
    }
}

}  // namespace
}  // namespace nibble
