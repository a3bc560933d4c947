// The runner's linear layers: f32 and bf16 products against float64, nibble formats against
// nibble's own dequantized weights (so the K padding to the group size is checked to change
// nothing), M-independence of every row, the thread pool, and the mode errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "llm/linear.h"
#include "nibble/nibble.h"

namespace nibble::llm {
namespace {

std::vector<float> randn(size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

std::vector<double> matmul(const std::vector<float>& x, const std::vector<float>& w, int64_t m,
                           int64_t n, int64_t k, bool bf16_inputs) {
  std::vector<double> y(static_cast<size_t>(m * n), 0.0);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double s = 0;
      for (int64_t i = 0; i < k; ++i) {
        float a = x[static_cast<size_t>(r * k + i)], b = w[static_cast<size_t>(c * k + i)];
        if (bf16_inputs) a = round_to_dtype(a, DType::bf16), b = round_to_dtype(b, DType::bf16);
        s += static_cast<double>(a) * b;
      }
      y[static_cast<size_t>(r * n + c)] = s;
    }
  return y;
}

TEST(LlmLinear, FloatModesMatchFloat64) {
  const int64_t m = 5, n = 37, k = 70;  // odd sizes: the tails of the 8-wide dot products
  const auto x = randn(static_cast<size_t>(m * k), 1),
             w = randn(static_cast<size_t>(n * k), 2, 0.05f);
  ThreadPool pool(2);
  std::vector<float> y(static_cast<size_t>(m * n));
  make_linear("f32", w, n, k, &pool)->forward(x.data(), m, y.data());
  EXPECT_LT(rel_err(y, matmul(x, w, m, n, k, false)), 1e-6);
  auto bf = make_linear("bf16", w, n, k, &pool);
  bf->forward(x.data(), m, y.data());
  EXPECT_LT(rel_err(y, matmul(x, w, m, n, k, true)), 1e-6);  // bf16 inputs, f32 sums
  EXPECT_EQ(bf->weight_bytes(), n * k * 2);
}

TEST(LlmLinear, NibbleFormatsEqualTheirDequantizedWeightsIncludingPaddedK) {
  // K = 576 (SmolLM2's hidden size) is not a multiple of 128: g128 formats pad W and x.
  const int64_t m = 3, n = 24, k = 576;
  const auto x = randn(static_cast<size_t>(m * k), 3),
             w = randn(static_cast<size_t>(n * k), 4, 0.05f);
  for (const char* mode : {"w4a16_g128", "w4a16_pc", "w8a16"}) {
    auto lin = make_linear(mode, w, n, k, nullptr);
    std::vector<float> y(static_cast<size_t>(m * n));
    lin->forward(x.data(), m, y.data());
    // The same weights quantized here, padded as documented, and dequantized by nibble.
    const LinearFormat f = parse_linear_format(mode);
    const int64_t g = f.weight.per_channel() ? 2 : f.weight.group_size, kp = (k + g - 1) / g * g;
    Tensor wp = Tensor::empty(DType::f32, {n, kp});
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < kp; ++i)
        wp.view().ptr<float>()[r * kp + i] = i < k ? w[static_cast<size_t>(r * k + i)] : 0.0f;
    QuantizedWeight qw(f.weight, n, kp);
    quantize_weight(wp.view(), qw.view());
    Tensor deq = Tensor::empty(DType::f32, {n, kp});
    dequantize_weight(qw.view(), deq.view());
    std::vector<float> wd(static_cast<size_t>(n * k));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < k; ++i)
        wd[static_cast<size_t>(r * k + i)] = deq.view().ptr<float>()[r * kp + i];
    std::vector<float> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = round_to_dtype(x[i], DType::bf16);
    EXPECT_LT(rel_err(y, matmul(xb, wd, m, n, k, false)), 1e-6) << mode;
  }
}

TEST(LlmLinear, QuantizedActivationFormatsAreCloseAndRowIndependent) {
  const int64_t m = 4, n = 40, k = 576;
  const auto x = randn(static_cast<size_t>(m * k), 5),
             w = randn(static_cast<size_t>(n * k), 6, 0.05f);
  const auto ref = matmul(x, w, m, n, k, false);
  ThreadPool pool(2);
  // Relative error of round-to-nearest on Gaussian weights and activations; measured about
  // 0.01 (8-bit), 0.12-0.14 (4-bit weights), 0.3 (4-bit both).
  for (const auto& [mode, tol] : {std::pair<const char*, double>{"w8a8", 0.03},
                                  {"w4a8_pc", 0.2},
                                  {"w4a8_g128", 0.2},
                                  {"w4a8_g64", 0.2},
                                  {"w4a4_g128", 0.45}}) {
    auto lin = make_linear(mode, w, n, k, &pool);
    std::vector<float> y(static_cast<size_t>(m * n)), row(static_cast<size_t>(n));
    lin->forward(x.data(), m, y.data());
    EXPECT_LT(rel_err(y, ref), tol) << mode;
    for (int64_t r = 0; r < m; ++r) {  // one row alone gives the same numbers
      lin->forward(x.data() + r * k, 1, row.data());
      for (int64_t c = 0; c < n; ++c)
        ASSERT_EQ(row[static_cast<size_t>(c)], y[static_cast<size_t>(r * n + c)]) << mode;
    }
  }
}

TEST(LlmLinear, UnknownModesAreRejected) {
  EXPECT_NO_THROW(check_weight_mode("w4a8_g128"));
  EXPECT_THROW(check_weight_mode("int4"), Error);
  EXPECT_THROW(check_weight_mode("w8a8_static"), Error);
  EXPECT_THROW(make_linear("f32", std::vector<float>(5), 2, 3, nullptr), Error);
}

TEST(LlmLinear, ThreadPoolCoversEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 5, 100}) {
    std::vector<int> hits(static_cast<size_t>(n), 0);
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
    });
    for (int h : hits) EXPECT_EQ(h, 1);
  }
  EXPECT_EQ(dot_f32(std::vector<float>{1, 2, 3}.data(), std::vector<float>{4, 5, 6}.data(), 3),
            32.0f);
}

}  // namespace
}  // namespace nibble::llm

namespace nibble::llm {
namespace {

// sim:FORMAT (the accuracy study's mode) computes the reference linear's numbers in another
// order: the same quantized weights and per-token activation codes, f32 products instead of
// integer sums then scales. Relative Frobenius difference of the outputs:
constexpr double kSimVsReferenceRelTol = 1e-5;

TEST(LlmLinear, SimulatedModesMatchTheReferenceLinear) {
  const int64_t m = 7, n = 40, k = 576;
  auto x = randn(static_cast<size_t>(m * k), 11);
  const auto w = randn(static_cast<size_t>(n * k), 12, 0.05f);
  x[3 * k + 17] = 3000.0f;  // a "massive activation", as real models have in a few channels
  for (const char* mode :
       {"w4a8_g128", "w8a8", "w4a16_g128", "w4a8_pc", "w4a4_g32", "w4afp8_g64"}) {
    SCOPED_TRACE(mode);
    auto ref = make_linear(mode, w, n, k, nullptr);
    auto sim = make_linear(std::string("sim:") + mode, w, n, k, nullptr);
    EXPECT_EQ(sim->mode(), std::string("sim:") + mode);
    EXPECT_EQ(sim->weight_bytes(), ref->weight_bytes());
    std::vector<float> a(static_cast<size_t>(m * n)), b(a.size());
    ref->forward(x.data(), m, a.data());
    sim->forward(x.data(), m, b.data());
    std::vector<double> ad(a.begin(), a.end());
    EXPECT_LT(rel_err(b, ad), kSimVsReferenceRelTol);
    // The same from pre-quantized weights (a checkpoint loaded as sim:FORMAT).
    auto sim_q = make_quantized_linear(std::string("sim:") + mode, *ref->quantized(), k, nullptr);
    sim_q->forward(x.data(), m, b.data());
    EXPECT_LT(rel_err(b, ad), kSimVsReferenceRelTol);
  }
}

}  // namespace
}  // namespace nibble::llm
