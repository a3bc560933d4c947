// Integer GEMM and quantized linear layers (src/cpu/gemm_ref.cpp through the public API).
//
// gemm_s32 is compared bit for bit with a naive int64 loop (test_util.h), on random, extreme and
// hand-computed data, odd shapes and strided operands. linear() is checked for every format of
// the catalogue three ways: against a float64 computation from the same quantized operands
// (named tolerances), bit-exactly on dyadic operands where every f32 operation is exact, and
// end to end against the unquantized product (the error the format itself allows).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "nibble/nibble.h"
#include "test_util.h"

namespace nibble {
namespace {

using test::float_at;
using test::int_at;
using test::put_float;
using test::put_int;
using test::Rng;

// ---- gemm_s32 -----------------------------------------------------------------------------------

struct IntPair {
  DType a, w;
};
constexpr IntPair kPairs[] = {
    {DType::s8, DType::s8}, {DType::s8, DType::s4}, {DType::s4, DType::s4}};

std::string pair_name(IntPair p) { return std::string(to_string(p.a)) + "x" + to_string(p.w); }

// d (any row stride) equals the int64 reference exactly.
::testing::AssertionResult equals_reference(const TensorView& d, const std::vector<int64_t>& ref) {
  const int64_t n_cols = d.size(1);
  for (int64_t m = 0; m < d.size(0); ++m)
    for (int64_t n = 0; n < n_cols; ++n)
      if (int_at(d, m, n) != ref[static_cast<size_t>(m * n_cols + n)])
        return ::testing::AssertionFailure()
               << "d(" << m << ", " << n << ") = " << int_at(d, m, n) << ", expected "
               << ref[static_cast<size_t>(m * n_cols + n)];
  return ::testing::AssertionSuccess();
}

Tensor matrix_from(DType dtype, int64_t rows, int64_t cols, const std::vector<int>& values) {
  Tensor t = Tensor::empty(dtype, {rows, cols});
  for (int64_t i = 0; i < rows * cols; ++i)
    put_int(t.view(), i / cols, i % cols, values[size_t(i)]);
  return t;
}

TEST(GemmS32, HandComputedGoldenValues) {
  // A (2, 4) · W (3, 4)ᵀ, worked out by hand.
  const std::vector<int> a = {1,  2, 3, 4,  //
                              -1, 0, 5, -8};
  const std::vector<int> w = {1,  1,  1,  1,  //
                              2,  -3, 0,  7,  //
                              -8, 7,  -1, 0};
  const std::vector<int64_t> d = {10, 24,  3,  //
                                  -4, -58, 3};
  for (IntPair p : kPairs) {
    SCOPED_TRACE(pair_name(p));
    const Tensor ta = matrix_from(p.a, 2, 4, a), tw = matrix_from(p.w, 3, 4, w);
    Tensor td = Tensor::empty(DType::s32, {2, 3});
    td.fill_bytes(0xCD);
    gemm_s32(ta.view(), tw.view(), td.view());
    EXPECT_TRUE(equals_reference(td.view(), d));
  }
  // int8 extremes: (−128)·(−128) + 127·(−128) + (−128)·127 + 127·127 = 1.
  const Tensor ta = matrix_from(DType::s8, 1, 4, {-128, 127, -128, 127});
  const Tensor tw = matrix_from(DType::s8, 1, 4, {-128, -128, 127, 127});
  Tensor td = Tensor::empty(DType::s32, {1, 1});
  gemm_s32(ta.view(), tw.view(), td.view());
  EXPECT_EQ(int_at(td.view(), 0, 0), 1);
}

TEST(GemmS32, RandomOddShapesAreBitExact) {
  Rng rng;
  for (IntPair p : kPairs)
    for (int64_t m : {1, 2, 3, 7, 15, 16, 17, 31, 64, 100})
      for (int64_t n : {1, 5, 8, 33})
        for (int64_t k : {2, 6, 64, 130, 512}) {
          SCOPED_TRACE(pair_name(p) + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                       " K=" + std::to_string(k));
          const Tensor a = test::random_int(p.a, m, k, rng), w = test::random_int(p.w, n, k, rng);
          Tensor d = Tensor::empty(DType::s32, {m, n});
          d.fill_bytes(0xCD);  // poison: an unwritten element fails the comparison
          gemm_s32(a.view(), w.view(), d.view());
          ASSERT_TRUE(equals_reference(d.view(), test::naive_gemm_i64(a.view(), w.view())));
        }
}

TEST(GemmS32, StridedOperandsAreBitExactAndGapsUntouched) {
  Rng rng;
  for (IntPair p : kPairs) {
    SCOPED_TRACE(pair_name(p));
    const int64_t m = 13, n = 9, k = 70;
    const Tensor a = test::random_int(p.a, m, k, rng), w = test::random_int(p.w, n, k, rng);
    // Gap bytes hold valid but wrong values: reading them changes the result.
    const test::Strided as = test::strided_copy(a, k + 6, 0x77);
    const test::Strided ws = test::strided_copy(w, k + 10, 0x77);
    test::Strided ds = test::strided_empty(DType::s32, m, n, n + 3, 0xCD);
    gemm_s32(as.view, ws.view, ds.view);
    EXPECT_TRUE(equals_reference(ds.view, test::naive_gemm_i64(a.view(), w.view())));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = n; c < n + 3; ++c)
        ASSERT_EQ(static_cast<const uint32_t*>(ds.storage.data())[r * (n + 3) + c], 0xCDCDCDCDu)
            << "gemm_s32 wrote outside d at (" << r << ", " << c << ")";
  }
}

// Every product at its extreme magnitude, at K = the documented maximum (the largest even K for
// 4-bit operands): the exact sums sit right next to the int32 bounds, so any wider-than-exact
// accumulation or a wrapped intermediate shows.
TEST(GemmS32, ExtremeValuesAtTheMaximumK) {
  struct Extreme {
    int a, w;
  };
  for (IntPair p : kPairs) {
    const bool four_bit = p.a == DType::s4 || p.w == DType::s4;
    const int64_t k_max = max_int32_accumulation_k(p.a, p.w);
    const int64_t k = four_bit ? k_max / 2 * 2 : k_max;
    // s4×s4 at K = 33554430 costs a second per shape; one row and column suffice there.
    const int64_t m = p.a == DType::s4 ? 1 : 2, n = p.w == DType::s4 && p.a == DType::s4 ? 1 : 3;
    const auto [a_lo, a_hi] = test::int_range(p.a);
    const auto [w_lo, w_hi] = test::int_range(p.w);
    const std::vector<Extreme> cases =
        p.a == DType::s4
            ? std::vector<Extreme>{{a_lo, w_lo}, {a_lo, w_hi}}
            : std::vector<Extreme>{{a_lo, w_lo}, {a_lo, w_hi}, {a_hi, w_lo}, {a_hi, w_hi}};
    for (const Extreme& e : cases) {
      SCOPED_TRACE(pair_name(p) + " K=" + std::to_string(k) + " a=" + std::to_string(e.a) +
                   " w=" + std::to_string(e.w));
      const Tensor a = test::filled_int(p.a, m, k, e.a), w = test::filled_int(p.w, n, k, e.w);
      Tensor d = Tensor::empty(DType::s32, {m, n});
      d.fill_bytes(0xCD);
      gemm_s32(a.view(), w.view(), d.view());
      const int64_t want = int64_t{e.a} * e.w * k;
      ASSERT_GE(want, std::numeric_limits<int32_t>::min());
      ASSERT_LE(want, std::numeric_limits<int32_t>::max());
      EXPECT_TRUE(equals_reference(d.view(), std::vector<int64_t>(size_t(m * n), want)));
    }
  }
}

// Mixed signs at the maximum K for s8×s8: the exact sum of a random ±128/±127 pattern, compared
// with the int64 loop.
TEST(GemmS32, RandomExtremeSignsAtTheMaximumK) {
  Rng rng;
  const int64_t k = max_int32_accumulation_k(DType::s8, DType::s8);
  Tensor a = Tensor::empty(DType::s8, {3, k}), w = Tensor::empty(DType::s8, {2, k});
  for (int64_t i = 0; i < 3 * k; ++i)
    put_int(a.view(), i / k, i % k, rng.uniform_int(0, 3) == 0 ? 127 : -128);
  for (int64_t i = 0; i < 2 * k; ++i)
    put_int(w.view(), i / k, i % k, rng.uniform_int(0, 3) == 0 ? 127 : -128);
  Tensor d = Tensor::empty(DType::s32, {3, 2});
  d.fill_bytes(0xCD);
  gemm_s32(a.view(), w.view(), d.view());
  EXPECT_TRUE(equals_reference(d.view(), test::naive_gemm_i64(a.view(), w.view())));
}

// ---- linear: operands ---------------------------------------------------------------------------

std::vector<LinearFormat> all_linear_formats() {
  std::vector<LinearFormat> out;
  for (WeightScheme s : {WeightScheme::s4_sym, WeightScheme::s8_sym, WeightScheme::u4_asym,
                         WeightScheme::u4_fzp, WeightScheme::s4_two_level})
    for (int g : {0, 32, 64, 128, 256})
      for (DType d : {DType::f32, DType::f16, DType::bf16})
        for (ActScheme a : {ActScheme::none, ActScheme::s8_per_token, ActScheme::s8_per_tensor,
                            ActScheme::s4_per_token, ActScheme::e4m3_per_token}) {
          const LinearFormat f{{s, g, d}, a};
          if (is_valid(f)) out.push_back(f);
        }
  return out;
}

// The operands of one linear call: quantized weights and either quantized activations or the
// float activations of an A16 format.
struct Operands {
  LinearFormat format;
  int64_t m, n, k;
  QuantizedWeight w;
  QuantizedActivation a;  // when format.act != none
  Tensor x;               // when format.act == none

  bool a16() const { return format.act == ActScheme::none; }
  // deq(A) and deq(W) in float64.
  std::vector<double> act_f64() const {
    return a16() ? test::matrix_f64(x.view()) : test::dequantize_activation_f64(a.view());
  }
  std::vector<double> weight_f64() const { return test::dequantize_weight_f64(w.view()); }
  void run(const TensorView* bias, const TensorView& d) const {
    if (a16())
      linear(x.view(), w.view(), bias, d);
    else
      linear(a.view(), w.view(), bias, d);
  }
};

// Quantizes float activations with the format's scheme (static: a scale calibrated on x).
void quantize_act(const LinearFormat& f, const Tensor& x, QuantizedActivation& qa) {
  if (f.act != ActScheme::s8_per_tensor) return quantize_activation(x.view(), qa.view());
  double amax = 0;
  for (double v : test::matrix_f64(x.view())) amax = std::max(amax, std::fabs(v));
  quantize_activation_static(x.view(), static_cast<float>(amax / 127), qa.view());
}

// Gaussian weights and activations (with an outlier channel), quantized by nibble.
Operands quantized_operands(const LinearFormat& f, int64_t m, int64_t n, int64_t k, DType x_dtype,
                            Rng& rng) {
  Operands ops{f, m, n, k, QuantizedWeight(f.weight, n, k), {}, {}};
  quantize_weight(test::random_normal(DType::f32, n, k, rng, 0.02).view(), ops.w.view());
  Tensor x = test::random_activations(x_dtype, m, k, rng);
  if (ops.a16()) {
    ops.x = std::move(x);
  } else {
    ops.a = QuantizedActivation(f.act, m, k);
    quantize_act(f, x, ops.a);
  }
  return ops;
}

double pow2(int64_t e) { return std::ldexp(1.0, static_cast<int>(e)); }

// Dyadic operands: integers anywhere in their range, scales 2^-1..2^-3, float zeros j/4,
// e4m3 and A16 activations i/8. Every product and partial sum of the reference is then a
// small multiple of a power of two, so f32 arithmetic is exact (the test checks this premise).
Operands dyadic_operands(const LinearFormat& f, int64_t m, int64_t n, int64_t k, DType x_dtype,
                         Rng& rng) {
  Operands ops{f, m, n, k, QuantizedWeight(f.weight, n, k), {}, {}};
  const QuantizedWeightView w = ops.w.view();
  const auto [q_lo, q_hi] = test::int_range(w.q.dtype);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      put_int(w.q, r, c, static_cast<int32_t>(rng.uniform_int(q_lo, q_hi)));
  const int64_t groups = f.weight.per_channel() ? 1 : k / f.weight.group_size;
  for (int64_t r = 0; r < n; ++r) {
    if (w.scales.rank == 1) put_float(w.scales, r, 0, pow2(-rng.uniform_int(1, 3)));
    for (int64_t gi = 0; gi < groups && w.scales.rank == 2; ++gi)
      put_float(w.scales, r, gi, pow2(-rng.uniform_int(1, 3)));
    for (int64_t gi = 0; gi < groups; ++gi) {
      if (f.weight.scheme == WeightScheme::u4_asym || f.weight.scheme == WeightScheme::s4_two_level)
        put_int(w.zeros, r, gi, static_cast<int32_t>(rng.uniform_int(0, 15)));
      if (f.weight.scheme == WeightScheme::u4_fzp)
        put_float(w.zeros, r, gi, static_cast<double>(rng.uniform_int(-16, 16)) / 4);
      // g_s ≤ 8 keeps w8 = g_s·(q − g_z) within ±120, inside int8 as the format requires.
      if (f.weight.scheme == WeightScheme::s4_two_level)
        put_int(w.group_scales, r, gi, static_cast<int32_t>(rng.uniform_int(1, 8)));
    }
  }
  if (ops.a16()) {
    ops.x = Tensor::empty(x_dtype, {m, k});
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c)
        put_float(ops.x.view(), r, c, static_cast<double>(rng.uniform_int(-32, 32)) / 8);
    return ops;
  }
  ops.a = QuantizedActivation(f.act, m, k);
  const QuantizedActivationView a = ops.a.view();
  const int qmax = f.act == ActScheme::s4_per_token ? 7 : 127;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c) {
      if (f.act == ActScheme::e4m3_per_token)
        put_float(a.q, r, c, static_cast<double>(rng.uniform_int(-15, 15)) / 8);
      else
        put_int(a.q, r, c, static_cast<int32_t>(rng.uniform_int(-qmax, qmax)));
    }
  for (int64_t r = 0; r < a.scales.size(0); ++r)
    put_float(a.scales, r, 0, pow2(-rng.uniform_int(1, 2)));
  return ops;
}

// The power of two that the product term (r, c, k) of dyadic operands is a multiple of:
// activation step (1 for integers, 1/8 for e4m3 and A16 values, times the row scale) times
// weight step (the scale, or a quarter for float zero points).
double term_quantum(const Operands& ops, int64_t r, int64_t c, int64_t k) {
  const LinearFormat& f = ops.format;
  double a_step = 1.0 / 8;
  if (!ops.a16()) {
    const double s_a = float_at(ops.a.scales.view(), f.act == ActScheme::s8_per_tensor ? 0 : r);
    a_step = f.act == ActScheme::e4m3_per_token ? s_a / 8 : s_a;
  }
  double w_step = f.weight.scheme == WeightScheme::s4_two_level
                      ? float_at(ops.w.scales.view(), c)
                      : float_at(ops.w.scales.view(), c, test::group_of(f.weight, k));
  if (f.weight.scheme == WeightScheme::u4_fzp) w_step = std::min(w_step, 0.25);
  return a_step * w_step;
}

// A bias vector (1, n) of dtype t with Gaussian or dyadic (j/4) values.
Tensor make_bias(DType t, int64_t n, Rng& rng, bool dyadic) {
  Tensor b = Tensor::empty(t, {1, n});
  for (int64_t i = 0; i < n; ++i)
    put_float(b.view(), 0, i,
              dyadic ? static_cast<double>(rng.uniform_int(-64, 64)) / 4 : rng.normal());
  return b;
}

std::string out_name(DType out, const Tensor* bias) {
  return std::string("out ") + to_string(out) +
         (bias ? std::string(" bias ") + to_string(bias->view().dtype) : " no bias");
}

// ---- linear: every format -----------------------------------------------------------------------

class LinearFormatTest : public ::testing::TestWithParam<LinearFormat> {};

// The output matches the float64 product of the dequantized operands (+ bias) within the named
// tolerance of its dtype, for f32/f16/bf16 outputs, every bias dtype, and every element is
// written (the output starts as NaN).
TEST_P(LinearFormatTest, MatchesFloat64OnTheQuantizedOperands) {
  const LinearFormat f = GetParam();
  Rng rng;
  const int64_t n = 40, k = 512;
  const DType x_dtypes[] = {DType::bf16, DType::f16, DType::f32};
  int variant = 0;
  for (int64_t m : {1, 3, 17, 64}) {
    const Operands ops = quantized_operands(f, m, n, k, x_dtypes[m % 3], rng);
    const std::vector<double> a = ops.act_f64(), w = ops.weight_f64();
    for (DType out : {DType::f32, DType::f16, DType::bf16}) {
      const DType bias_dtypes[] = {DType::f32, DType::f16, DType::bf16};
      const bool with_bias = variant % 4 != 3;
      Tensor bias = with_bias ? make_bias(bias_dtypes[variant % 3], n, rng, false) : Tensor();
      ++variant;
      const TensorView bias_view = with_bias ? test::as_vector(bias) : TensorView{};
      SCOPED_TRACE("M=" + std::to_string(m) + " " + out_name(out, with_bias ? &bias : nullptr));
      Tensor d = Tensor::empty(out, {m, n});
      d.fill_bytes(0xFF);  // NaN in f32, f16 and bf16
      ops.run(with_bias ? &bias_view : nullptr, d.view());
      EXPECT_TRUE(test::is_close(d.view(),
                                 test::linear_f64(a, w, m, n, k, with_bias ? &bias_view : nullptr),
                                 test::linear_tolerance(out)));
    }
  }
}

// On dyadic operands every f32 operation of the reference is exact (integer partial sums
// included), so the output must equal the exact result rounded once to the output dtype.
TEST_P(LinearFormatTest, IsExactOnDyadicOperands) {
  const LinearFormat f = GetParam();
  Rng rng;
  const int64_t m = 5, n = 12, k = 256;
  int variant = 0;
  for (DType x_dtype : {DType::f32, DType::f16, DType::bf16}) {
    if (x_dtype != DType::f32 && f.act != ActScheme::none) continue;
    const Operands ops = dyadic_operands(f, m, n, k, x_dtype, rng);
    const std::vector<double> a = ops.act_f64(), w = ops.weight_f64();
    for (DType out : {DType::f32, DType::f16, DType::bf16}) {
      const bool with_bias = variant++ % 2 == 0;
      Tensor bias = with_bias ? make_bias(out, n, rng, true) : Tensor();
      const TensorView bias_view = with_bias ? test::as_vector(bias) : TensorView{};
      const TensorView* bias_ptr = with_bias ? &bias_view : nullptr;
      SCOPED_TRACE(std::string("x ") + to_string(x_dtype) + " " +
                   out_name(out, with_bias ? &bias : nullptr));
      const std::vector<double> exact = test::linear_f64(a, w, m, n, k, bias_ptr);
      // The premise: every term, the bias and so every partial sum is a multiple of a quantum
      // q, and the sum of magnitudes stays within 2^24 q, so each f32 operation is exact.
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
          double quantum = with_bias ? 0.25 : 1.0;
          double total = with_bias ? std::fabs(float_at(bias_view, c)) : 0.0;
          for (int64_t kk = 0; kk < k; ++kk) {
            quantum = std::min(quantum, term_quantum(ops, r, c, kk));
            total += std::fabs(a[size_t(r * k + kk)] * w[size_t(c * k + kk)]);
          }
          ASSERT_LE(total, std::ldexp(quantum, 24)) << "test premise: exact f32 arithmetic";
          ASSERT_EQ(static_cast<double>(static_cast<float>(exact[size_t(r * n + c)])),
                    exact[size_t(r * n + c)]);
        }
      Tensor d = Tensor::empty(out, {m, n});
      d.fill_bytes(0xFF);
      ops.run(bias_ptr, d.view());
      Tensor want = Tensor::empty(out, {m, n});
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) put_float(want.view(), r, c, exact[size_t(r * n + c)]);
      EXPECT_EQ(test::bytes_of(d), test::bytes_of(want));
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c)
          ASSERT_EQ(float_at(d.view(), r, c), float_at(want.view(), r, c))
              << "(" << r << ", " << c << ")";
    }
  }
}

// End to end: linear(q(x), q(w)) against x·wᵀ of the unquantized operands. The tolerance bounds
// the format's own rounding noise, so a wrong scale, zero point or rounding rule shows here even
// when the operands are consistent with each other.
TEST_P(LinearFormatTest, QuantizationErrorAgainstTheUnquantizedProduct) {
  const LinearFormat f = GetParam();
  Rng rng;
  const int64_t m = 16, n = 64, k = 1024;
  // Plain Gaussian activations: with an outlier channel, int4 activations would round almost
  // every other channel to zero, and the bound would measure the outlier instead of the format.
  const Tensor x = test::random_normal(DType::f32, m, k, rng);
  const Tensor w = test::random_normal(DType::f32, n, k, rng, 0.02);
  Operands ops{f, m, n, k, QuantizedWeight(f.weight, n, k), {}, {}};
  quantize_weight(w.view(), ops.w.view());
  if (ops.a16()) {
    ops.x = Tensor::empty(DType::f32, {m, k});
    ops.x.copy_from(x);
  } else {
    ops.a = QuantizedActivation(f.act, m, k);
    quantize_act(f, x, ops.a);
  }
  Tensor d = Tensor::empty(DType::f32, {m, n});
  ops.run(nullptr, d.view());
  const std::vector<double> ref =
      test::linear_f64(test::matrix_f64(x.view()), test::matrix_f64(w.view()), m, n, k);
  const test::Comparison c = test::compare(test::matrix_f64(d.view()), ref);
  EXPECT_EQ(c.non_finite, 0);
  EXPECT_LE(c.rel_frob, test::quantization_noise_tolerance(f));
}

INSTANTIATE_TEST_SUITE_P(Catalogue, LinearFormatTest, ::testing::ValuesIn(all_linear_formats()),
                         [](const auto& p) { return to_string(p.param); });

// ---- linear: exact integer accumulation, golden values, strides ---------------------------------

// Per-channel integer formats accumulate the whole K in int32: with one-signed operands the
// partial sums exceed 2^24, where an f32 accumulator would round, and the output must be the
// exact integer rounded once to f32 and scaled by the (power-of-two) scales.
TEST(LinearExact, IntegerPartialSumsBeyond2To24AreExact) {
  Rng rng;
  // clang-format off
  const struct { const char* name; int64_t k; } cases[] = {
      {"w8a8", 4096}, {"w8a8_static", 4096}, {"w4a8_pc", 65536}, {"w4a8_pc_static", 65536},
      {"w4a8_g128_2level", 4096}, {"w4a8_g32_2level_static", 4096},
  };
  // clang-format on
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const LinearFormat f = parse_linear_format(c.name);
    const int64_t m = 2, n = 3, k = c.k;
    QuantizedWeight qw(f.weight, n, k);
    const QuantizedWeightView w = qw.view();
    const bool two_level = f.weight.scheme == WeightScheme::s4_two_level;
    for (int64_t r = 0; r < n; ++r) {
      put_float(w.scales, r, 0, pow2(-rng.uniform_int(0, 3)));
      for (int64_t col = 0; col < k; ++col)
        put_int(w.q, r, col,
                static_cast<int32_t>(two_level ? rng.uniform_int(8, 15)
                                     : f.weight.scheme == WeightScheme::s8_sym
                                         ? rng.uniform_int(64, 127)
                                         : rng.uniform_int(4, 7)));
      for (int64_t gi = 0; two_level && gi < k / f.weight.group_size; ++gi) {
        put_int(w.group_scales, r, gi, static_cast<int32_t>(rng.uniform_int(4, 8)));
        put_int(w.zeros, r, gi, 0);
      }
    }
    QuantizedActivation qa(f.act, m, k);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t col = 0; col < k; ++col)
        put_int(qa.q.view(), r, col, static_cast<int32_t>(rng.uniform_int(64, 127)));
    for (int64_t r = 0; r < qa.scales.view().size(0); ++r)
      put_float(qa.scales.view(), r, 0, pow2(-rng.uniform_int(0, 2)));
    Tensor d = Tensor::empty(DType::f32, {m, n});
    d.fill_bytes(0xFF);
    linear(qa.view(), w, nullptr, d.view());
    // Exact integer sums of q_a · w_int, then the scales.
    Tensor w_int = Tensor::empty(DType::s32, {n, k});
    for (int64_t r = 0; r < n; ++r)
      for (int64_t col = 0; col < k; ++col)
        put_int(w_int.view(), r, col,
                two_level
                    ? int_at(w.group_scales, r, col / f.weight.group_size) * int_at(w.q, r, col)
                    : int_at(w.q, r, col));
    const std::vector<int64_t> sums = test::naive_gemm_i64(qa.q.view(), w_int.view());
    for (int64_t r = 0; r < m; ++r)
      for (int64_t col = 0; col < n; ++col) {
        const int64_t s = sums[size_t(r * n + col)];
        ASSERT_GT(s, int64_t{1} << 24) << "test premise: the sum needs more than 24 bits";
        const double s_a = float_at(qa.scales.view(), f.act == ActScheme::s8_per_tensor ? 0 : r);
        const double want =
            static_cast<double>(static_cast<float>(s)) * float_at(w.scales, col) * s_a;
        ASSERT_EQ(float_at(d.view(), r, col), want)
            << "(" << r << ", " << col << ") exact sum " << s;
      }
  }
}

TEST(LinearExact, HandComputedGoldenValues) {
  // w8a8: qa = [[1, 2], [3, 4]], sa = [0.5, 2]; qw = [[1, −1], [2, 3]], sw = [1, 0.25];
  // bias = [1, −1]. D[m,n] = sa[m]·sw[n]·Σ qa·qw + bias[n].
  QuantizedActivation qa(ActScheme::s8_per_token, 2, 2);
  QuantizedWeight qw(parse_weight_format("w8_pc"), 2, 2);
  const int av[4] = {1, 2, 3, 4}, wv[4] = {1, -1, 2, 3};
  for (int i = 0; i < 4; ++i) {
    put_int(qa.q.view(), i / 2, i % 2, av[i]);
    put_int(qw.q.view(), i / 2, i % 2, wv[i]);
  }
  put_float(qa.scales.view(), 0, 0, 0.5);
  put_float(qa.scales.view(), 1, 0, 2.0);
  put_float(qw.scales.view(), 0, 0, 1.0);
  put_float(qw.scales.view(), 1, 0, 0.25);
  Tensor bias = Tensor::empty(DType::f32, {1, 2});
  put_float(bias.view(), 0, 0, 1.0);
  put_float(bias.view(), 0, 1, -1.0);
  const TensorView bv = test::as_vector(bias);
  Tensor d = Tensor::empty(DType::f32, {2, 2});
  linear(qa.view(), qw.view(), &bv, d.view());
  EXPECT_EQ(float_at(d.view(), 0, 0), 0.5);   // 0.5·1·(1 − 2) + 1
  EXPECT_EQ(float_at(d.view(), 0, 1), 0.0);   // 0.5·0.25·(2 + 6) − 1
  EXPECT_EQ(float_at(d.view(), 1, 0), -1.0);  // 2·1·(3 − 4) + 1
  EXPECT_EQ(float_at(d.view(), 1, 1), 8.0);   // 2·0.25·(6 + 12) − 1

  // w4a16_g32_asym: one row, two groups; group 0: s = 0.5, z = 3, q = 5 everywhere
  // (w = 1); group 1: s = 2, z = 8, q = 7 everywhere (w = −2). x = 1 everywhere:
  // D = 32·1 + 32·(−2) = −32.
  QuantizedWeight qa16(parse_weight_format("w4_g32_asym"), 1, 64);
  for (int col = 0; col < 64; ++col) put_int(qa16.q.view(), 0, col, col < 32 ? 5 : 7);
  put_float(qa16.scales.view(), 0, 0, 0.5);
  put_float(qa16.scales.view(), 0, 1, 2.0);
  put_int(qa16.zeros.view(), 0, 0, 3);
  put_int(qa16.zeros.view(), 0, 1, 8);
  Tensor x = Tensor::empty(DType::bf16, {1, 64});
  for (int col = 0; col < 64; ++col) put_float(x.view(), 0, col, 1.0);
  Tensor d16 = Tensor::empty(DType::bf16, {1, 1});
  linear(x.view(), qa16.view(), nullptr, d16.view());
  EXPECT_EQ(float_at(d16.view(), 0, 0), -32.0);
}

// Operands and outputs with row gaps give the same bytes as contiguous ones, and the gaps of
// the output are never written.
TEST(LinearStrided, StridedOperandsMatchContiguous) {
  Rng rng;
  for (const char* name : {"w4a8_g128", "w8a8_static", "w4a4_pc", "w4afp8_g32", "w4a16_g64_fzp",
                           "w8a16", "w4a8_g64_2level"}) {
    SCOPED_TRACE(name);
    const LinearFormat f = parse_linear_format(name);
    const int64_t m = 7, n = 11, k = 256;
    const Operands ops = quantized_operands(f, m, n, k, DType::bf16, rng);
    const Tensor bias = make_bias(DType::bf16, n, rng, false);
    const TensorView bv = test::as_vector(bias);
    Tensor ref = Tensor::empty(DType::f16, {m, n});
    ops.run(&bv, ref.view());

    test::Strided ds = test::strided_empty(DType::f16, m, n, n + 5, 0xFF);
    if (ops.a16()) {
      const test::Strided xs = test::strided_copy(ops.x, k + 8, 0x7F);
      linear(xs.view, ops.w.view(), &bv, ds.view);
    } else {
      const test::Strided qs = test::strided_copy(ops.a.q, k + 64, 0x77);
      linear(QuantizedActivationView{f.act, qs.view, ops.a.scales.view()}, ops.w.view(), &bv,
             ds.view);
    }
    for (int64_t r = 0; r < m; ++r) {
      const auto* row = static_cast<const uint16_t*>(ds.storage.data()) + r * (n + 5);
      ASSERT_EQ(std::memcmp(row, static_cast<const uint16_t*>(ref.data()) + r * n, size_t(n) * 2),
                0)
          << "row " << r;
      for (int64_t c = n; c < n + 5; ++c) ASSERT_EQ(row[c], 0xFFFF) << "gap written in row " << r;
    }
  }
}

}  // namespace
}  // namespace nibble
