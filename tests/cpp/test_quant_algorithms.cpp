// The quantization algorithms of quant_algorithms.h (src/quant/): round to nearest with min-max
// and MSE clipping, GPTQ, SmoothQuant's factors, static activation calibration, and their errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "nibble/nibble.h"
#include "nibble/quant_algorithms.h"
#include "quant/quant_internal.h"
#include "test_util.h"

namespace nibble {
namespace {

using test::Rng;

bool same_bytes(const Tensor& a, const Tensor& b) { return test::bytes_of(a) == test::bytes_of(b); }

// Weights with a few outlier columns (as real layers have), f32 (N, K).
Tensor outlier_weights(int64_t n, int64_t k, Rng& rng) {
  Tensor w = test::random_normal(DType::f32, n, k, rng, 0.05);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; c += 37) w.view().ptr<float>()[r * k + c] *= 6.0f;
  return w;
}

// Activations (M, K) with strongly correlated channels of very different scales, as layer inputs
// are: x = (z·A + 0.1·noise)·diag(d), z of K/8 factors.
Tensor correlated_activations(int64_t m, int64_t k, Rng& rng) {
  const int64_t f = std::max<int64_t>(1, k / 8);
  std::vector<double> a(static_cast<size_t>(f * k));
  for (auto& v : a) v = rng.normal();
  Tensor x = Tensor::empty(DType::f32, {m, k});
  std::vector<double> z(static_cast<size_t>(f));
  for (int64_t r = 0; r < m; ++r) {
    for (auto& v : z) v = rng.normal();
    for (int64_t c = 0; c < k; ++c) {
      double s = 0.1 * rng.normal();
      for (int64_t t = 0; t < f; ++t)
        s += z[static_cast<size_t>(t)] * a[static_cast<size_t>(t * k + c)];
      x.view().ptr<float>()[r * k + c] = static_cast<float>(s * (0.2 + 3.0 * (c % 5 == 0)));
    }
  }
  return x;
}

// ‖x·wᵀ − x·deq(q)ᵀ‖_F in f64.
double output_error(const Tensor& x, const Tensor& w, const QuantizedWeight& q) {
  const std::vector<double> wd = test::dequantize_weight_f64(q.view());
  const int64_t m = x.view().size(0), k = x.view().size(1), n = w.view().size(0);
  double err = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double d = 0;
      for (int64_t t = 0; t < k; ++t)
        d += static_cast<double>(x.view().ptr<float>()[r * k + t]) *
             (static_cast<double>(w.view().ptr<float>()[c * k + t]) -
              wd[static_cast<size_t>(c * k + t)]);
      err += d * d;
    }
  return std::sqrt(err);
}

GptqHessian hessian_of(const Tensor& x) {
  GptqHessian h(x.view().size(1));
  h.add(x.view());
  return h;
}

TEST(QuantRtn, DefaultOptionsEqualQuantizeWeight) {
  Rng rng;
  for (const char* name : {"w4_g128", "w4_g32", "w4_pc", "w8_pc", "w8_g64", "w4_g64_sf16"}) {
    SCOPED_TRACE(name);
    const WeightFormat f = parse_weight_format(name);
    const Tensor w = outlier_weights(12, 256, rng);
    QuantizedWeight a(f, 12, 256), b(f, 12, 256);
    quantize_weight(w.view(), a.view());
    quantize_weight_rtn(w.view(), b.view());
    EXPECT_TRUE(same_bytes(a.q, b.q));
    EXPECT_TRUE(same_bytes(a.scales, b.scales));
  }
}

TEST(QuantRtn, RestrictedQmaxStaysInRange) {
  Rng rng;
  const Tensor w = outlier_weights(8, 128, rng);
  for (int qmax : {3, 1}) {
    QuantizedWeight q(parse_weight_format("w4_g32"), 8, 128);
    quantize_weight_rtn(w.view(), q.view(), {.qmax = qmax});
    int seen_max = 0;
    for (int64_t r = 0; r < 8; ++r)
      for (int64_t c = 0; c < 128; ++c) {
        const int v = test::int_at(q.view().q, r, c);
        EXPECT_LE(std::abs(v), qmax);
        seen_max = std::max(seen_max, std::abs(v));
      }
    EXPECT_EQ(seen_max, qmax);  // each group's largest weight reaches ±qmax
  }
}

TEST(QuantRtn, MseClippingNeverWorseThanMinmaxOnItsObjective) {
  Rng rng;
  for (const char* name : {"w4_g128", "w4_g32", "w4_pc", "w8_pc"})
    for (int qmax : {0, 3, 1}) {
      SCOPED_TRACE(std::string(name) + " qmax " + std::to_string(qmax));
      const WeightFormat f = parse_weight_format(name);
      if (qmax != 0 && f.scheme == WeightScheme::s8_sym) continue;
      const Tensor w = outlier_weights(16, 256, rng);
      QuantizedWeight mm(f, 16, 256), mse(f, 16, 256);
      quantize_weight_rtn(w.view(), mm.view(), {.qmax = qmax});
      quantize_weight_rtn(w.view(), mse.view(), {.qmax = qmax, .clip = ClipMethod::mse});
      const auto a = test::dequantize_weight_f64(mm.view()),
                 b = test::dequantize_weight_f64(mse.view());
      const int64_t g = f.per_channel() ? 256 : f.group_size;
      double total_mm = 0, total_mse = 0;
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t k0 = 0; k0 < 256; k0 += g) {  // every group, not just the total
          double e_mm = 0, e_mse = 0;
          for (int64_t c = k0; c < k0 + g; ++c) {
            const double v = w.view().ptr<float>()[r * 256 + c];
            e_mm += (v - a[static_cast<size_t>(r * 256 + c)]) *
                    (v - a[static_cast<size_t>(r * 256 + c)]);
            e_mse += (v - b[static_cast<size_t>(r * 256 + c)]) *
                     (v - b[static_cast<size_t>(r * 256 + c)]);
          }
          EXPECT_LE(e_mse, e_mm * (1 + 1e-12)) << "row " << r << " group at " << k0;
          total_mm += e_mm, total_mse += e_mse;
        }
      if (qmax != 0 || f.scheme == WeightScheme::s4_sym) {
        EXPECT_LT(total_mse, total_mm);
      }
    }
}

TEST(QuantGptq, IdentityHessianEqualsRoundToNearest) {
  Rng rng;
  const int64_t k = 128;
  Tensor x = Tensor::empty(DType::f32, {k, k});  // rows e_i: H = 2/K·I
  for (int64_t i = 0; i < k * k; ++i) x.view().ptr<float>()[i] = (i % (k + 1) == 0) ? 1.0f : 0.0f;
  const GptqHessian h = hessian_of(x);
  for (const char* name : {"w4_g32", "w4_g128", "w4_pc", "w8_pc"})
    for (bool act_order : {false, true})
      for (int qmax : {0, 3}) {
        SCOPED_TRACE(std::string(name) + (act_order ? " act_order" : "") + " qmax " +
                     std::to_string(qmax));
        const WeightFormat f = parse_weight_format(name);
        if (qmax != 0 && f.scheme == WeightScheme::s8_sym) continue;
        const Tensor w = outlier_weights(10, k, rng);
        QuantizedWeight rtn(f, 10, k), gptq(f, 10, k);
        GptqOptions opt;
        opt.qmax = qmax, opt.act_order = act_order, opt.block_size = 48;  // blocks across groups
        quantize_weight_rtn(w.view(), rtn.view(), opt);
        quantize_weight_gptq(w.view(), h, gptq.view(), opt);
        EXPECT_TRUE(same_bytes(rtn.q, gptq.q));
        EXPECT_TRUE(same_bytes(rtn.scales, gptq.scales));
      }
}

TEST(QuantGptq, ReducesTheLayerOutputErrorOfRoundToNearest) {
  Rng rng;
  const int64_t m = 384, k = 128, n = 24;
  const Tensor x = correlated_activations(m, k, rng);
  const GptqHessian h = hessian_of(x);
  for (const char* name : {"w4_g32", "w4_pc", "w8_pc"})
    for (int qmax : {0, 3})
      for (bool act_order : {false, true}) {
        SCOPED_TRACE(std::string(name) + " qmax " + std::to_string(qmax) +
                     (act_order ? " act_order" : ""));
        const WeightFormat f = parse_weight_format(name);
        if (qmax != 0 && f.scheme == WeightScheme::s8_sym) continue;
        const Tensor w = outlier_weights(n, k, rng);
        QuantizedWeight rtn(f, n, k), gptq(f, n, k);
        GptqOptions opt;
        opt.qmax = qmax, opt.act_order = act_order, opt.block_size = 32;
        quantize_weight_rtn(w.view(), rtn.view(), opt);
        const GptqResult r = quantize_weight_gptq(w.view(), h, gptq.view(), opt);
        const double e_rtn = output_error(x, w, rtn), e_gptq = output_error(x, w, gptq);
        EXPECT_LT(e_gptq, 0.8 * e_rtn) << "GPTQ " << e_gptq << " vs RTN " << e_rtn;
        EXPECT_GT(r.loss, 0.0);
        EXPECT_EQ(r.dead_columns, 0);
      }
}

TEST(QuantGptq, ActOrderPermutationRoundTrips) {
  // Permuting the input channels (columns of W and of x) permutes GPTQ's result the same way:
  // the quantization order follows diag(H), and the codes come back in the caller's order.
  Rng rng;
  const int64_t m = 256, k = 64, n = 8;
  const Tensor x = correlated_activations(m, k, rng);
  const Tensor w = outlier_weights(n, k, rng);
  std::vector<int64_t> p(static_cast<size_t>(k));
  std::iota(p.begin(), p.end(), int64_t{0});
  std::shuffle(p.begin(), p.end(), rng.engine());
  Tensor xp = Tensor::empty(DType::f32, {m, k}), wp = Tensor::empty(DType::f32, {n, k});
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c)
      xp.view().ptr<float>()[r * k + c] = x.view().ptr<float>()[r * k + p[static_cast<size_t>(c)]];
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      wp.view().ptr<float>()[r * k + c] = w.view().ptr<float>()[r * k + p[static_cast<size_t>(c)]];
  const WeightFormat f = parse_weight_format("w4_pc");  // per-row scales: order-free
  QuantizedWeight a(f, n, k), b(f, n, k);
  GptqOptions opt;
  opt.act_order = true;
  quantize_weight_gptq(w.view(), hessian_of(x), a.view(), opt);
  quantize_weight_gptq(wp.view(), hessian_of(xp), b.view(), opt);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      ASSERT_EQ(test::int_at(b.view().q, r, c),
                test::int_at(a.view().q, r, p[static_cast<size_t>(c)]))
          << "(" << r << ", " << c << ")";
  EXPECT_TRUE(same_bytes(a.scales, b.scales));
}

TEST(QuantGptq, DeadColumnsAreZeroed) {
  Rng rng;
  const int64_t m = 64, k = 32;
  Tensor x = correlated_activations(m, k, rng);
  for (int64_t r = 0; r < m; ++r) x.view().ptr<float>()[r * k + 5] = 0.0f;
  const Tensor w = outlier_weights(4, k, rng);
  QuantizedWeight q(parse_weight_format("w4_g32"), 4, k);
  const GptqResult r = quantize_weight_gptq(w.view(), hessian_of(x), q.view());
  EXPECT_EQ(r.dead_columns, 1);
  for (int64_t row = 0; row < 4; ++row) EXPECT_EQ(test::int_at(q.view().q, row, 5), 0);
}

TEST(QuantGptq, UpperCholeskyOfInverse) {
  Rng rng;
  const int64_t k = 40;
  const GptqHessian h = hessian_of(correlated_activations(200, k, rng));
  const std::vector<double> hm = h.matrix();
  std::vector<double> u;
  ASSERT_TRUE(quant::upper_cholesky_of_inverse(hm, k, u));
  // Uᵀ·U·H = I and U upper triangular with a positive diagonal.
  double worst = 0;
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j) {
      if (j < i) {
        ASSERT_EQ(u[static_cast<size_t>(i * k + j)], 0.0);
      }
      double s = 0;
      for (int64_t t = 0; t < k; ++t) {
        double uu = 0;  // (UᵀU)[i][t]
        for (int64_t r = 0; r < k; ++r)
          uu += u[static_cast<size_t>(r * k + i)] * u[static_cast<size_t>(r * k + t)];
        s += uu * hm[static_cast<size_t>(t * k + j)];
      }
      worst = std::max(worst, std::fabs(s - (i == j ? 1.0 : 0.0)));
    }
  EXPECT_LT(worst, 1e-9);
  std::vector<double> bad(static_cast<size_t>(k * k), 0.0);
  EXPECT_FALSE(quant::upper_cholesky_of_inverse(bad, k, u));
}

TEST(QuantSmoothQuant, FactorsFollowTheFormula) {
  const std::vector<float> act = {4.0f, 1.0f, 0.0f, 9.0f}, wmax = {1.0f, 4.0f, 2.0f, 0.0f};
  const auto s = smoothquant_scales(act, wmax, 0.5);
  EXPECT_FLOAT_EQ(s[0], 2.0f);  // sqrt(4) / sqrt(1)
  EXPECT_FLOAT_EQ(s[1], 0.5f);  // sqrt(1) / sqrt(4)
  EXPECT_FLOAT_EQ(s[2], 1.0f);  // a channel never active
  EXPECT_FLOAT_EQ(s[3], 1.0f);  // a channel no weight reads
  const auto s1 = smoothquant_scales(act, wmax, 1.0);
  EXPECT_FLOAT_EQ(s1[0], 4.0f);  // α = 1: all of the range moves to the weights
}

TEST(QuantSmoothQuant, LeavesTheFloatProductUnchanged) {
  Rng rng;
  const int64_t m = 16, k = 96, n = 20;
  const Tensor x = correlated_activations(m, k, rng);
  Tensor w = outlier_weights(n, k, rng);
  ActivationObserver obs(k);
  obs.observe(x.view());
  std::vector<float> wmax(static_cast<size_t>(k), 0.0f);
  column_absmax(w.view(), wmax);
  const auto s = smoothquant_scales(obs.channel_absmax(), wmax, 0.5);
  std::vector<double> ref(static_cast<size_t>(m * n)), got(ref.size());
  const float* xp = x.view().ptr<float>();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double a = 0;
      for (int64_t t = 0; t < k; ++t)
        a += static_cast<double>(xp[r * k + t]) * w.view().ptr<float>()[c * k + t];
      ref[static_cast<size_t>(r * n + c)] = a;
    }
  scale_weight_columns(w.view(), s);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double a = 0;
      for (int64_t t = 0; t < k; ++t)
        a += static_cast<double>(xp[r * k + t] / s[static_cast<size_t>(t)]) *
             w.view().ptr<float>()[c * k + t];
      got[static_cast<size_t>(r * n + c)] = a;
    }
  EXPECT_LT(test::compare(got, ref).rel_frob, 1e-6);
  // The smoothed activations' channel ranges are flatter: max/min of the channel maxima drops.
  float lo = INFINITY, hi = 0, slo = INFINITY, shi = 0;
  for (int64_t j = 0; j < k; ++j) {
    const float a = obs.channel_absmax()[static_cast<size_t>(j)];
    lo = std::min(lo, a), hi = std::max(hi, a);
    slo = std::min(slo, a / s[static_cast<size_t>(j)]),
    shi = std::max(shi, a / s[static_cast<size_t>(j)]);
  }
  EXPECT_LT(shi / slo, hi / lo);
}

TEST(QuantCalibration, MinmaxAndPercentileOnKnownData) {
  // |x| = 1, 2, ..., 1000 over two channels, signs alternating.
  const int64_t m = 500, k = 2;
  Tensor x = Tensor::empty(DType::f32, {m, k});
  for (int64_t i = 0; i < m * k; ++i)
    x.view().ptr<float>()[i] = static_cast<float>((i % 3 == 0 ? -1 : 1) * (i + 1));
  ActivationObserver obs(k);
  obs.observe(x.view());
  EXPECT_EQ(obs.count(), 1000);
  EXPECT_EQ(obs.absmax(), 1000.0f);
  EXPECT_EQ(obs.channel_absmax()[0], 999.0f);
  EXPECT_EQ(obs.channel_absmax()[1], 1000.0f);
  EXPECT_EQ(static_activation_scale(obs, ActCalibration::minmax), 1000.0f / 127.0f);
  for (double p : {50.0, 90.0, 99.0, 99.9}) {
    const double exact = p * 10.0;  // 1000·p/100 values are ≤ this
    const float got = obs.percentile_absmax(p);
    EXPECT_GE(got, exact) << p;
    EXPECT_LE(got, exact * (1.0 + 1.0 / 64.0) + 1.0) << p;
  }
  EXPECT_EQ(obs.percentile_absmax(100.0), 1000.0f);
  EXPECT_FLOAT_EQ(static_activation_scale(obs, ActCalibration::percentile, 50.0),
                  obs.percentile_absmax(50.0) / 127.0f);
}

TEST(QuantErrors, BadArgumentsNameTheArgument) {
  using test::arg;
  using test::throws_error;
  Rng rng;
  const Tensor w = outlier_weights(4, 64, rng);
  QuantizedWeight q4(parse_weight_format("w4_g32"), 4, 64);
  QuantizedWeight asym(parse_weight_format("w4_g32_asym"), 4, 64);
  const auto inv = ErrorCode::invalid_argument;
  EXPECT_TRUE(throws_error([&] { quantize_weight_rtn(w.view(), q4.view(), {.qmax = 8}); }, inv,
                           {"quantize_weight_rtn", arg("opt.qmax"), "[1, 7]"}));
  EXPECT_TRUE(throws_error([&] { quantize_weight_rtn(w.view(), asym.view()); }, inv,
                           {arg("out.format"), "symmetric", "u4_asym"}));
  EXPECT_TRUE(throws_error(
      [&] { quantize_weight_rtn(w.view(), q4.view(), {.clip = ClipMethod::mse, .clip_steps = 0}); },
      inv, {arg("opt.clip_steps")}));
  Tensor nan = outlier_weights(4, 64, rng);
  nan.view().ptr<float>()[70] = NAN;
  EXPECT_TRUE(throws_error([&] { quantize_weight_rtn(nan.view(), q4.view()); }, inv,
                           {arg("w"), "finite", "(1, 6)"}));
  GptqHessian h32(32), h64(64);
  EXPECT_TRUE(throws_error([&] { quantize_weight_gptq(w.view(), h32, q4.view()); }, inv,
                           {"quantize_weight_gptq", arg("h"), "K = 64"}));
  EXPECT_TRUE(throws_error([&] { quantize_weight_gptq(w.view(), h64, q4.view()); }, inv,
                           {arg("h"), "no calibration rows"}));
  h64.add(correlated_activations(80, 64, rng).view());
  GptqOptions bad;
  bad.damp = -1;
  EXPECT_TRUE(throws_error([&] { quantize_weight_gptq(w.view(), h64, q4.view(), bad); }, inv,
                           {arg("opt.damp")}));
  bad = {};
  bad.block_size = 0;
  EXPECT_TRUE(throws_error([&] { quantize_weight_gptq(w.view(), h64, q4.view(), bad); }, inv,
                           {arg("opt.block_size")}));
  if (test::cuda_requests_are_unsupported()) {
    bad = {};
    bad.device = Device::cuda();
    EXPECT_TRUE(throws_error([&] { quantize_weight_gptq(w.view(), h64, q4.view(), bad); },
                             ErrorCode::unsupported, {"quantize_weight_gptq", "CUDA"}));
  }
  EXPECT_TRUE(
      throws_error([&] { h32.add(w.view()); }, inv, {"GptqHessian::add", arg("x"), "K = 32"}));
  EXPECT_TRUE(throws_error([] { GptqHessian bad_k(0); }, inv, {arg("k")}));
  const std::vector<float> a = {1, 2}, b = {1};
  EXPECT_TRUE(throws_error([&] { smoothquant_scales(a, a, 1.5); }, inv, {arg("alpha")}));
  EXPECT_TRUE(throws_error([&] { smoothquant_scales(a, b, 0.5); }, inv, {arg("weight_absmax")}));
  Tensor wc = outlier_weights(2, 2, rng);
  const std::vector<float> zero = {1.0f, 0.0f};
  EXPECT_TRUE(throws_error([&] { scale_weight_columns(wc.view(), zero); }, inv, {arg("s"), "> 0"}));
  EXPECT_TRUE(throws_error([&] { scale_weight_columns(w.view(), zero); }, inv,
                           {arg("w"), "one column per factor"}));
  ActivationObserver obs(64);
  EXPECT_TRUE(throws_error([&] { static_activation_scale(obs, ActCalibration::minmax); }, inv,
                           {"static_activation_scale", arg("obs"), "observed nothing"}));
  EXPECT_TRUE(throws_error([&] { obs.observe(wc.view()); }, inv,
                           {"ActivationObserver::observe", arg("x"), "K = 64"}));
  EXPECT_TRUE(throws_error([&] { obs.percentile_absmax(0.0); }, inv, {arg("p")}));
}

// ---- W4A4 mixed granularity ------------------------------------------------------------------

TEST(QuantGranularity, RhoOfTheGpusAndTheTimeModel) {
  EXPECT_EQ(tensor_core_ratio(8, 0), 64);
  EXPECT_EQ(tensor_core_ratio(8, 6), 16);
  EXPECT_EQ(tensor_core_ratio(8, 9), 8);
  EXPECT_EQ(tensor_core_ratio(9, 0), 32);
  EXPECT_EQ(tensor_core_ratio(7, 5), 0);
  EXPECT_DOUBLE_EQ(w4a4_group_time_factor(32), 1.5);  // H100: measured 1.46–1.59 at M ≥ 1024
  EXPECT_DOUBLE_EQ(w4a4_group_time_factor(8), 1.125);
}

std::vector<GranularityLayer> planner_layers() {
  // gain / added MAC: b > d > a > c; e gains nothing.
  return {{"a", 64, 64, 0.50, 0.30},  {"b", 32, 64, 0.60, 0.20},  {"c", 128, 128, 0.40, 0.35},
          {"d", 32, 32, 0.20, 0.10},  {"e", 64, 64, 0.10, 0.15}};
}

TEST(QuantGranularity, PlannerSpendsTheBudgetOnTheBestGainPerCost) {
  const auto layers = planner_layers();
  double macs = 0;
  for (const auto& l : layers) macs += double(l.n) * double(l.k);
  // ρ = 64: a g128 layer costs 2× its per-channel time. Budget: exactly b and d's extra time.
  const double budget = (32.0 * 64 + 32.0 * 32) / macs;
  const GranularityPlan p = plan_w4a4_granularity(layers, 64, budget);
  ASSERT_EQ(p.layers.size(), layers.size());
  const bool want[] = {false, true, false, true, false};
  for (size_t i = 0; i < layers.size(); ++i) {
    EXPECT_EQ(p.layers[i].name, layers[i].name);
    EXPECT_EQ(p.layers[i].group, want[i]) << layers[i].name;
  }
  EXPECT_NEAR(p.time_vs_per_channel, 1 + budget, 1e-12);
  EXPECT_NEAR(p.error, 0.50 + 0.20 + 0.40 + 0.10 + 0.10, 1e-12);
  EXPECT_NE(p.describe().find("b: w4a4_g128"), std::string::npos) << p.describe();
  EXPECT_NE(p.describe().find("rho = 64"), std::string::npos);
}

TEST(QuantGranularity, LowerRhoBuysMoreGroupLayersForTheSameBudget) {
  const auto layers = planner_layers();
  auto count = [&](int rho, double budget) {
    int n = 0;
    for (const auto& c : plan_w4a4_granularity(layers, rho, budget).layers) n += c.group ? 1 : 0;
    return n;
  };
  for (double budget : {0.02, 0.05, 0.1, 0.2})
    EXPECT_GE(count(8, budget), count(64, budget)) << budget;
  EXPECT_EQ(count(64, 0.0), 0);
  // An unlimited budget takes every layer that g128 improves, and never e.
  const GranularityPlan all = plan_w4a4_granularity(layers, 8, 100.0);
  for (const auto& c : all.layers) EXPECT_EQ(c.group, c.name != "e") << c.name;
  EXPECT_LE(all.time_vs_per_channel, w4a4_group_time_factor(8));
  EXPECT_THROW(plan_w4a4_granularity(layers, 0, 0.1), Error);
  EXPECT_THROW(plan_w4a4_granularity(layers, 32, -0.1), Error);
  auto bad = layers;
  bad[2].n = 0;
  EXPECT_THROW(plan_w4a4_granularity(bad, 32, 0.1), Error);
  bad = layers;
  bad[1].error_group = std::nan("");
  EXPECT_THROW(plan_w4a4_granularity(bad, 32, 0.1), Error);
  EXPECT_TRUE(plan_w4a4_granularity({}, 32, 0.1).layers.empty());
}

TEST(QuantGranularity, WeightErrorIsTheDequantizedErrorWeightedByInputMoments) {
  Rng rng;
  const int64_t n = 24, k = 256;
  const Tensor w = outlier_weights(n, k, rng);
  const WeightFormat pc = parse_linear_format("w4a4_pc").weight;
  const WeightFormat g128 = parse_linear_format("w4a4_g128").weight;
  const double e_pc = weight_quantization_error(w.view(), pc);
  const double e_g = weight_quantization_error(w.view(), g128);
  EXPECT_GT(e_pc, e_g);  // outlier columns hurt a whole row's scale, not only their group's
  EXPECT_GT(e_g, 0.0);
  // By hand: dequantize and weigh each column's squared error by its input mean square.
  std::vector<float> ms(static_cast<size_t>(k));
  for (auto& v : ms) v = static_cast<float>(rng.uniform(0.1, 1.1));
  QuantizedWeight q(pc, n, k);
  quantize_weight(w.view(), q.view());
  Tensor deq = Tensor::empty(DType::f32, {n, k});
  dequantize_weight(q.view(), deq.view());
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n * k; ++i) {
    const double x = w.view().ptr<float>()[i], e = x - deq.view().ptr<float>()[i];
    err += ms[size_t(i % k)] * e * e;
    ref += ms[size_t(i % k)] * x * x;
  }
  EXPECT_NEAR(weight_quantization_error(w.view(), pc, ms), err / ref, 1e-12 * err / ref);
  ms.pop_back();
  EXPECT_THROW(weight_quantization_error(w.view(), pc, ms), Error);
}

}  // namespace
}  // namespace nibble
