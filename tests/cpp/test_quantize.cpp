// Quantizers and dequantizers (src/cpu/quantize_ref.cpp through the public API): the round-trip
// error bound of every weight format and scale dtype, the tightness of the scales (a scale twice
// too large would still meet a bound stated in units of the scale), zero points, two-level
// invariants, per-token and static activation quantization, and int4 packing.
#include <gtest/gtest.h>

#include <cfloat>
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
using test::kF32Slack;
using test::Rng;

// ---- weights: structured random inputs ----------------------------------------------------------

// What one segment (a group, or the whole row for per-channel formats) holds. Each kind targets
// a case of the quantizers: zero points for one-signed groups, s = 0 for constant or zero
// groups, f16 subnormal scales for tiny values, an outlier that sets the scale of its group.
enum class Segment {
  gaussian,
  outlier_element,
  all_positive,
  all_negative,
  constant,
  zero,
  single_nonzero,
  tiny,
  large,
  kCount
};

constexpr int kSegmentKinds = static_cast<int>(Segment::kCount);

void fill_segment(const TensorView& w, int64_t n, int64_t k0, int64_t len, Segment kind, Rng& rng) {
  const double c = (rng.uniform_int(0, 1) ? 1 : -1) * rng.uniform(0.001, 0.05);
  const int64_t pick = k0 + rng.uniform_int(0, len - 1);
  for (int64_t k = k0; k < k0 + len; ++k) {
    double v = 0;
    switch (kind) {
      case Segment::gaussian:
        v = rng.normal(0.02);
        break;
      case Segment::outlier_element:
        v = rng.normal(0.02) * (k == pick ? 50.0 : 1.0);
        break;
      case Segment::all_positive:
        v = rng.uniform(0.001, 0.05);
        break;
      case Segment::all_negative:
        v = -rng.uniform(0.001, 0.05);
        break;
      case Segment::constant:
        v = c;
        break;
      case Segment::zero:
        v = 0;
        break;
      case Segment::single_nonzero:
        v = k == pick ? c : 0.0;
        break;
      case Segment::tiny:
        v = rng.normal(1e-6);
        break;
      case Segment::large:
        v = rng.normal(100.0);
        break;
      case Segment::kCount:
        break;
    }
    test::put_float(w, n, k, v);
  }
}

// (N, K) weights: row 0 all zero, row 1 an outlier channel (100× the others), the other rows cut
// into segments of every kind in turn.
Tensor structured_weights(DType dtype, int64_t n_rows, int64_t k_cols, int64_t segment, Rng& rng) {
  Tensor w = Tensor::empty(dtype, {n_rows, k_cols});
  int kind = 0;
  for (int64_t n = 0; n < n_rows; ++n)
    for (int64_t k0 = 0; k0 < k_cols; k0 += segment) {
      if (n == 0)
        fill_segment(w.view(), n, k0, segment, Segment::zero, rng);
      else if (n == 1)
        fill_segment(w.view(), n, k0, segment, Segment::gaussian, rng);
      else
        fill_segment(w.view(), n, k0, segment, static_cast<Segment>(kind++ % kSegmentKinds), rng);
    }
  for (int64_t k = 0; k < k_cols; ++k)
    test::put_float(w.view(), 1, k, float_at(w.view(), 1, k) * 100.0);
  return w;
}

// ---- weights: the checks ------------------------------------------------------------------------

struct DtypeGrid {
  int mant_bits;
  int emin;
};
DtypeGrid grid_of(DType t) {
  switch (t) {
    case DType::f16:
      return {10, -14};
    case DType::bf16:
      return {7, -126};
    default:
      return {23, -126};
  }
}

// Half the spacing of dtype t's grid at |z| (the rounding error of a value stored as z).
double half_ulp(double z, DType t) {
  const DtypeGrid g = grid_of(t);
  int e2 = 0;
  if (z != 0) std::frexp(z, &e2);
  const int e = z == 0 ? g.emin : std::max(e2 - 1, g.emin);
  return std::ldexp(1.0, e - g.mant_bits - 1);
}

// A stored scale s for a range that needs `need` per step: never smaller (no clipping) and at
// most two steps of the scale dtype above (round to nearest, then at most one nudge up).
::testing::AssertionResult scale_is_tight(double s, double need, DType t) {
  const DtypeGrid g = grid_of(t);
  const double hi =
      need * (1 + std::ldexp(1.0, 1 - g.mant_bits)) + 2 * std::ldexp(1.0, g.emin - g.mant_bits);
  if (s >= need * (1 - 2 * FLT_EPSILON) && s <= hi && (s == 0) == (need == 0))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "scale " << s << " for a range needing " << need
                                       << " per step (" << to_string(t) << ")";
}

struct SegmentStats {
  double amax = 0, lo = 0, hi = 0;  // lo/hi: the true min and max of the values
};

SegmentStats stats_of(const TensorView& w, int64_t n, int64_t k0, int64_t len) {
  SegmentStats s;
  s.lo = s.hi = float_at(w, n, k0);
  for (int64_t k = k0; k < k0 + len; ++k) {
    const double v = float_at(w, n, k);
    s.amax = std::max(s.amax, std::fabs(v));
    s.lo = std::min(s.lo, v);
    s.hi = std::max(s.hi, v);
  }
  return s;
}

// Checks everything the format promises about quantize_weight(w) = qw, and that
// dequantize_weight writes every element of its output with deq(q) (computed independently).
void check_weight_round_trip(const TensorView& w, const QuantizedWeight& qw) {
  const WeightFormat& f = qw.format;
  const QuantizedWeightView v = qw.view();
  const int64_t n_rows = qw.n, k_cols = qw.k;
  const int64_t g = f.per_channel() ? k_cols : f.group_size;
  const DType sd = f.scale_dtype;

  // The library's dequantization, into a strided output whose gaps must stay untouched.
  test::Strided deq = test::strided_empty(DType::f32, n_rows, k_cols, k_cols + 8, 0xFF);
  dequantize_weight(v, deq.view);
  for (int64_t n = 0; n < n_rows; ++n)
    for (int64_t k = k_cols; k < k_cols + 8; ++k)
      ASSERT_EQ(static_cast<const uint32_t*>(deq.storage.data())[n * (k_cols + 8) + k], 0xFFFFFFFFu)
          << "dequantize_weight wrote outside its output at (" << n << ", " << k << ")";

  for (int64_t n = 0; n < n_rows; ++n) {
    const SegmentStats row = stats_of(w, n, 0, k_cols);
    double s_ch = 0;
    if (f.scheme == WeightScheme::s4_two_level) {
      s_ch = float_at(v.scales, n);
      ASSERT_TRUE(scale_is_tight(s_ch, row.amax / 119, sd)) << "row " << n << " channel scale";
    }
    for (int64_t gi = 0; gi < k_cols / g; ++gi) {
      SCOPED_TRACE("row " + std::to_string(n) + " group " + std::to_string(gi));
      const SegmentStats seg = stats_of(w, n, gi * g, g);
      double bound = 0, magnitude = seg.amax;
      switch (f.scheme) {
        case WeightScheme::s4_sym:
        case WeightScheme::s8_sym: {
          const double s = float_at(v.scales, n, gi);
          ASSERT_TRUE(scale_is_tight(s, seg.amax / weight_qmax(f.scheme), sd));
          bound = s / 2;
          break;
        }
        case WeightScheme::u4_asym: {
          // The range is widened to include 0 so that the integer zero point exists.
          const double s = float_at(v.scales, n, gi);
          const int z = int_at(v.zeros, n, gi);
          ASSERT_TRUE(scale_is_tight(s, (std::max(seg.hi, 0.0) - std::min(seg.lo, 0.0)) / 15, sd));
          ASSERT_GE(z, 0);
          ASSERT_LE(z, 15);
          if (seg.lo > 0) {
            EXPECT_EQ(z, 0) << "all-positive group";
          }
          if (seg.hi < 0) {
            EXPECT_EQ(z, 15) << "all-negative group";
          }
          bound = s / 2;
          break;
        }
        case WeightScheme::u4_fzp: {
          const double s = float_at(v.scales, n, gi), zero = float_at(v.zeros, n, gi);
          ASSERT_TRUE(scale_is_tight(s, (seg.hi - seg.lo) / 15, sd));
          bound = s / 2 + half_ulp(zero, sd);
          magnitude = std::max(magnitude, std::fabs(zero));
          break;
        }
        case WeightScheme::s4_two_level: {
          const int gs = int_at(v.group_scales, n, gi), gz = int_at(v.zeros, n, gi);
          ASSERT_GE(gs, 1);
          ASSERT_LE(gs, 255);
          // The protective range [-119, 119] spans 238 = 15 · 15.9 steps: g_s ≤ 16.
          ASSERT_LE(gs, 16);
          ASSERT_GE(gz, 0);
          ASSERT_LE(gz, 15);
          for (int64_t k = gi * g; k < (gi + 1) * g; ++k) {
            const int w8 = gs * (int_at(v.q, n, k) - gz);
            ASSERT_GE(w8, -128) << "k " << k;
            ASSERT_LE(w8, 127) << "k " << k;
          }
          bound = s_ch / 2 + s_ch * gs / 2;
          magnitude = row.amax;
          break;
        }
      }
      const double slack = kF32Slack * magnitude;
      for (int64_t k = gi * g; k < (gi + 1) * g; ++k) {
        const double x = float_at(w, n, k);
        const double mine = test::dequantized_weight(v, n, k);
        const double lib = float_at(deq.view, n, k);
        ASSERT_LE(std::fabs(x - mine), bound + slack)
            << "k " << k << ": w = " << x << ", deq(q(w)) = " << mine << ", bound " << bound;
        ASSERT_LE(std::fabs(lib - mine), slack) << "dequantize_weight at k " << k;
        if (seg.amax == 0) {
          ASSERT_EQ(mine, 0.0) << "a zero group must dequantize to exact zeros";
          ASSERT_EQ(lib, 0.0) << "a zero group must dequantize to exact zeros";
        }
      }
    }
  }
}

std::vector<WeightFormat> all_weight_formats() {
  std::vector<WeightFormat> out;
  for (WeightScheme s : {WeightScheme::s4_sym, WeightScheme::s8_sym, WeightScheme::u4_asym,
                         WeightScheme::u4_fzp, WeightScheme::s4_two_level})
    for (int g : {0, 32, 64, 128, 256})
      for (DType d : {DType::f32, DType::f16, DType::bf16})
        if (g != 0 || s == WeightScheme::s4_sym || s == WeightScheme::s8_sym)
          out.push_back({s, g, d});
  return out;
}

class QuantizeWeightFormat : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(QuantizeWeightFormat, RoundTripWithinHalfAStepForEveryInputDtype) {
  const WeightFormat f = GetParam();
  Rng rng;
  const int64_t n = 24, k = 512;
  for (DType in : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string("input ") + to_string(in));
    const Tensor w = structured_weights(in, n, k, f.per_channel() ? k : f.group_size, rng);
    QuantizedWeight qw(f, n, k);
    for (Tensor* t : {&qw.q, &qw.scales, &qw.zeros, &qw.group_scales})
      if (t->defined()) t->fill_bytes(0xEE);
    quantize_weight(w.view(), qw.view());
    check_weight_round_trip(w.view(), qw);
  }
}

// Per-channel rows and groups with a single kind across the whole row: the scale of a row of
// one sign, of constants and of tiny values is then the per-channel scale itself.
TEST_P(QuantizeWeightFormat, RoundTripWithWholeRowsOfOneKind) {
  const WeightFormat f = GetParam();
  Rng rng;
  const int64_t k = 256;
  Tensor w = Tensor::empty(DType::f32, {kSegmentKinds, k});
  for (int kind = 0; kind < kSegmentKinds; ++kind)
    fill_segment(w.view(), kind, 0, k, static_cast<Segment>(kind), rng);
  QuantizedWeight qw(f, kSegmentKinds, k);
  quantize_weight(w.view(), qw.view());
  check_weight_round_trip(w.view(), qw);
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizeWeightFormat, ::testing::ValuesIn(all_weight_formats()),
                         [](const auto& p) { return to_string(p.param); });

// Quantizing into buffers with row gaps (and reading a strided input) gives the same bytes as
// contiguous buffers, and never writes into the gaps.
TEST(QuantizeWeight, StridedBuffersMatchContiguousOnes) {
  Rng rng;
  const int64_t n = 9, k = 256;
  for (const char* name :
       {"w4_g64", "w4_g128_asym", "w4_g32_fzp_sf16", "w4_g128_2level", "w8_pc"}) {
    SCOPED_TRACE(name);
    const WeightFormat f = parse_weight_format(name);
    const Tensor w = structured_weights(DType::bf16, n, k, f.per_channel() ? k : f.group_size, rng);
    QuantizedWeight ref(f, n, k);
    quantize_weight(w.view(), ref.view());

    const test::Strided w_strided = test::strided_copy(w, k + 6, 0xFF);  // NaN bf16 gaps
    std::vector<test::Strided> bufs;
    std::vector<Tensor> vectors;  // rank-1 scales have no rows to pad: poisoned fresh tensors
    QuantizedWeightView out{f, n, k, {}, {}, {}, {}};
    TensorView* views[] = {&out.q, &out.scales, &out.zeros, &out.group_scales};
    const Tensor* refs[] = {&ref.q, &ref.scales, &ref.zeros, &ref.group_scales};
    vectors.reserve(4);
    for (int i = 0; i < 4; ++i) {
      if (!refs[i]->defined()) continue;
      if (refs[i]->view().rank == 1) {
        vectors.push_back(Tensor::empty(refs[i]->view().dtype, {refs[i]->view().size(0)}));
        std::memset(vectors.back().data(), 0xC3, static_cast<size_t>(vectors.back().nbytes()));
        *views[i] = vectors.back().view();
        continue;
      }
      const TensorView& r = refs[i]->view();
      bufs.push_back(test::strided_empty(r.dtype, r.size(0), r.size(1), r.size(1) + 4, 0xC3));
      *views[i] = bufs.back().view;
    }
    quantize_weight(w_strided.view, out);
    size_t b = 0, v = 0;
    for (int i = 0; i < 4; ++i) {
      if (!refs[i]->defined()) continue;
      if (refs[i]->view().rank == 1) {
        const Tensor& got = vectors[v++];
        ASSERT_EQ(std::memcmp(got.data(), refs[i]->data(), static_cast<size_t>(got.nbytes())), 0)
            << "buffer " << i;
        continue;
      }
      const test::Strided& s = bufs[b++];
      const TensorView& r = refs[i]->view();
      const int64_t row_bytes = dtype_storage_bytes(r.dtype, r.size(1));
      const int64_t pitch_bytes = dtype_storage_bytes(r.dtype, r.size(1) + 4);
      for (int64_t row = 0; row < r.size(0); ++row) {
        const auto* got = static_cast<const uint8_t*>(s.storage.data()) + row * pitch_bytes;
        const auto* want = static_cast<const uint8_t*>(refs[i]->data()) + row * row_bytes;
        ASSERT_EQ(std::memcmp(got, want, static_cast<size_t>(row_bytes)), 0) << "buffer " << i;
        for (int64_t byte = row_bytes; byte < pitch_bytes; ++byte)
          ASSERT_EQ(got[byte], 0xC3) << "buffer " << i << " gap written in row " << row;
      }
    }
  }
}

// Golden values: small rows whose quantization is worked out by hand.
TEST(QuantizeWeight, HandComputedGoldenValues) {
  {
    // w4_pc: amax 7 → s = 1 exactly; q = round-half-even(w).
    Tensor w = Tensor::empty(DType::f32, {1, 8});
    const float vals[8] = {7.0f, -7.0f, 0.5f, 1.5f, 2.5f, -3.5f, 0.0f, 4.4f};
    std::memcpy(w.data(), vals, sizeof(vals));
    QuantizedWeight qw(parse_weight_format("w4_pc"), 1, 8);
    quantize_weight(w.view(), qw.view());
    EXPECT_EQ(float_at(qw.scales.view(), 0), 1.0);
    const int want[8] = {7, -7, 0, 2, 2, -4, 0, 4};
    for (int k = 0; k < 8; ++k) EXPECT_EQ(int_at(qw.q.view(), 0, k), want[k]) << k;
  }
  {
    // w4_g32_asym_sf32, one group of 0..31 · 0.5: range [0, 15.5] → s = 15.5/15, z = 0.
    Tensor w = Tensor::empty(DType::f32, {1, 32});
    for (int k = 0; k < 32; ++k) static_cast<float*>(w.data())[k] = -0.5f * static_cast<float>(k);
    QuantizedWeight qw(parse_weight_format("w4_g32_asym_sf32"), 1, 32);
    quantize_weight(w.view(), qw.view());
    EXPECT_FLOAT_EQ(static_cast<float>(float_at(qw.scales.view(), 0, 0)), 15.5f / 15.0f);
    EXPECT_EQ(int_at(qw.zeros.view(), 0, 0), 15);  // all ≤ 0: the zero point is the top
    EXPECT_EQ(int_at(qw.q.view(), 0, 0), 15);      // w = 0 ↦ q = z
    EXPECT_EQ(int_at(qw.q.view(), 0, 31), 0);      // w = −15.5 ↦ q = 0
  }
  {
    // w4_g32_2level: row amax 119 → s_ch = 1, w8 = w; group [-30, 30] → g_s = 4, g_z = 8.
    Tensor w = Tensor::empty(DType::f32, {1, 64});
    for (int k = 0; k < 64; ++k) static_cast<float*>(w.data())[k] = 0.0f;
    static_cast<float*>(w.data())[0] = -30.0f;
    static_cast<float*>(w.data())[1] = 30.0f;
    static_cast<float*>(w.data())[2] = 6.0f;  // 6/4 = 1.5 → 2 (even) → q = 10
    static_cast<float*>(w.data())[40] = 119.0f;
    QuantizedWeight qw(parse_weight_format("w4_g32_2level"), 1, 64);
    quantize_weight(w.view(), qw.view());
    EXPECT_EQ(float_at(qw.scales.view(), 0), 1.0);
    EXPECT_EQ(int_at(qw.group_scales.view(), 0, 0), 4);
    EXPECT_EQ(int_at(qw.zeros.view(), 0, 0), 8);  // round(30 / 4) = round(7.5) = 8
    EXPECT_EQ(int_at(qw.q.view(), 0, 0), 0);      // round(−7.5) + 8 = 0
    EXPECT_EQ(int_at(qw.q.view(), 0, 1), 15);     // round(7.5) + 8 = 16, clamped
    EXPECT_EQ(int_at(qw.q.view(), 0, 2), 10);
    EXPECT_EQ(int_at(qw.group_scales.view(), 0, 1), 8);  // [0, 119]: ceil(119 / 15) = 8
    EXPECT_EQ(int_at(qw.zeros.view(), 0, 1), 0);
  }
}

// ---- activations --------------------------------------------------------------------------------

double act_qmax(ActScheme s) {
  return s == ActScheme::s4_per_token ? 7 : s == ActScheme::e4m3_per_token ? 448 : 127;
}

// Rows with structure: 0 zero, 1 a single non-zero, 2 constant, 3 tiny, 4 huge; the rest
// Gaussian with an outlier channel.
Tensor structured_activations(DType dtype, int64_t m_rows, int64_t k_cols, Rng& rng) {
  Tensor x = test::random_activations(dtype, m_rows, k_cols, rng);
  const double c = rng.uniform(0.5, 2.0);
  const int64_t pick = rng.uniform_int(0, k_cols - 1);
  for (int64_t k = 0; k < k_cols; ++k) {
    if (m_rows > 1) test::put_float(x.view(), 0, k, 0.0);
    if (m_rows > 2) test::put_float(x.view(), 1, k, k == pick ? -c : 0.0);
    if (m_rows > 3) test::put_float(x.view(), 2, k, c);
    if (m_rows > 4) test::put_float(x.view(), 3, k, rng.normal(1e-3));
    if (m_rows > 5) test::put_float(x.view(), 4, k, rng.normal(1e3));
  }
  return x;
}

class QuantizeActivationScheme : public ::testing::TestWithParam<ActScheme> {};

TEST_P(QuantizeActivationScheme, PerTokenScalesAndBounds) {
  const ActScheme scheme = GetParam();
  const bool fp8 = scheme == ActScheme::e4m3_per_token;
  const double qmax = act_qmax(scheme);
  Rng rng;
  for (DType in : {DType::f32, DType::f16, DType::bf16})
    for (auto [m_rows, k_cols] : {std::pair<int64_t, int64_t>{1, 2}, {7, 64}, {17, 1000}}) {
      SCOPED_TRACE(std::string(to_string(in)) + " M=" + std::to_string(m_rows) +
                   " K=" + std::to_string(k_cols));
      const Tensor x = structured_activations(in, m_rows, k_cols, rng);
      QuantizedActivation qa(scheme, m_rows, k_cols);
      qa.q.fill_bytes(0xFF);
      qa.scales.fill_bytes(0xFF);
      quantize_activation(x.view(), qa.view());
      for (int64_t m = 0; m < m_rows; ++m) {
        SCOPED_TRACE("row " + std::to_string(m));
        double amax = 0;
        for (int64_t k = 0; k < k_cols; ++k)
          amax = std::max(amax, std::fabs(float_at(x.view(), m, k)));
        // s = amax / qmax, computed in f32 (amax is an f32 value exactly).
        const float s_want = static_cast<float>(amax) / static_cast<float>(qmax);
        const double s = float_at(qa.scales.view(), m);
        ASSERT_EQ(s, static_cast<double>(s_want));
        for (int64_t k = 0; k < k_cols; ++k) {
          const double v = float_at(x.view(), m, k);
          const double q = fp8 ? float_at(qa.q.view(), m, k) : int_at(qa.q.view(), m, k);
          ASSERT_TRUE(std::isfinite(q)) << "k " << k;
          ASSERT_LE(std::fabs(q), qmax) << "k " << k;
          if (amax == 0) {
            ASSERT_EQ(q, 0.0) << "a zero row quantizes to zeros";
            continue;
          }
          // Integer schemes: half a step. e4m3: half a unit in the last of 3 mantissa bits
          // (2^-4 relative), or half the subnormal spacing 2^-9 in units of s.
          const double bound = fp8 ? std::fabs(v) * 0x1p-4 + s * 0x1p-10 : s / 2;
          ASSERT_LE(std::fabs(v - s * q), bound + kF32Slack * amax)
              << "k " << k << ": x = " << v << ", s = " << s << ", q = " << q;
          if (std::fabs(v) == amax) {
            ASSERT_EQ(std::fabs(q), qmax) << "the largest |x| maps to qmax";
          }
        }
        if (amax == 0) {
          EXPECT_EQ(s, 0.0) << "a zero row has scale 0";
        }
      }
      // dequantize_activation is s·q rounded once to f32, for every element.
      Tensor out = Tensor::empty(DType::f32, {m_rows, k_cols});
      out.fill_bytes(0xFF);
      dequantize_activation(qa.view(), out.view());
      const std::vector<double> want = test::dequantize_activation_f64(qa.view());
      for (int64_t i = 0; i < m_rows * k_cols; ++i)
        ASSERT_EQ(static_cast<const float*>(out.data())[i], static_cast<float>(want[size_t(i)]))
            << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Schemes, QuantizeActivationScheme,
                         ::testing::Values(ActScheme::s8_per_token, ActScheme::s4_per_token,
                                           ActScheme::e4m3_per_token),
                         [](const auto& p) { return std::string(to_string(p.param)); });

TEST(QuantizeActivation, GoldenValues) {
  Tensor x = Tensor::empty(DType::f32, {2, 4});
  const float vals[8] = {127.0f, -63.5f, 0.5f, 1.5f, 0.0f, 0.0f, 0.0f, 0.0f};
  std::memcpy(x.data(), vals, sizeof(vals));
  QuantizedActivation qa(ActScheme::s8_per_token, 2, 4);
  quantize_activation(x.view(), qa.view());
  EXPECT_EQ(float_at(qa.scales.view(), 0), 1.0);  // 127 / 127
  EXPECT_EQ(float_at(qa.scales.view(), 1), 0.0);
  const int want[4] = {127, -64, 0, 2};  // −63.5 → −64 and 0.5 → 0 and 1.5 → 2: ties to even
  for (int k = 0; k < 4; ++k) EXPECT_EQ(int_at(qa.q.view(), 0, k), want[k]) << k;
  for (int k = 0; k < 4; ++k) EXPECT_EQ(int_at(qa.q.view(), 1, k), 0) << k;

  QuantizedActivation q4(ActScheme::s4_per_token, 2, 4);
  quantize_activation(x.view(), q4.view());
  EXPECT_EQ(float_at(q4.scales.view(), 0), static_cast<double>(127.0f / 7.0f));
  EXPECT_EQ(int_at(q4.q.view(), 0, 0), 7);
  EXPECT_EQ(int_at(q4.q.view(), 0, 2), 0);  // 0.5 / (127/7) ≈ 0.03

  QuantizedActivation q8(ActScheme::e4m3_per_token, 2, 4);
  quantize_activation(x.view(), q8.view());
  EXPECT_EQ(float_at(q8.scales.view(), 0), static_cast<double>(127.0f / 448.0f));
  EXPECT_EQ(float_at(q8.q.view(), 0, 0), 448.0);
  EXPECT_EQ(float_at(q8.q.view(), 0, 1), -224.0);  // −63.5 · 448 / 127 = −224 exactly
}

TEST(QuantizeActivationStatic, ClampsToPlusMinus127AndKeepsTheScale) {
  Rng rng;
  for (DType in : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(to_string(in));
    const int64_t m_rows = 9, k_cols = 300;
    const Tensor x = structured_activations(in, m_rows, k_cols, rng);
    // A calibrated scale that clips the outlier channel but not the bulk.
    for (float scale : {0.05f, 1e-30f, 3.0f}) {
      SCOPED_TRACE("scale " + std::to_string(scale));
      QuantizedActivation qa(ActScheme::s8_per_tensor, m_rows, k_cols);
      qa.q.fill_bytes(0xFF);
      qa.scales.fill_bytes(0xFF);
      quantize_activation_static(x.view(), scale, qa.view());
      ASSERT_EQ(float_at(qa.scales.view(), 0), static_cast<double>(scale));
      for (int64_t m = 0; m < m_rows; ++m)
        for (int64_t k = 0; k < k_cols; ++k) {
          const double v = float_at(x.view(), m, k);
          const int q = int_at(qa.q.view(), m, k);
          ASSERT_GE(q, -127) << "static int8 is symmetric: −128 is never used";
          ASSERT_LE(q, 127);
          if (std::fabs(v) >= 127.0 * scale) {
            ASSERT_EQ(q, v > 0 ? 127 : -127) << "(" << m << ", " << k << ") x = " << v;
          } else {
            ASSERT_LE(std::fabs(v - scale * q), scale / 2 + kF32Slack * std::fabs(v))
                << "(" << m << ", " << k << ") x = " << v;
          }
          if (v == 0) {
            ASSERT_EQ(q, 0);
          }
        }
      Tensor out = Tensor::empty(DType::f32, {m_rows, k_cols});
      out.fill_bytes(0xFF);
      dequantize_activation(qa.view(), out.view());
      const std::vector<double> want = test::dequantize_activation_f64(qa.view());
      for (int64_t i = 0; i < m_rows * k_cols; ++i)
        ASSERT_EQ(static_cast<const float*>(out.data())[i], static_cast<float>(want[size_t(i)]));
    }
  }
}

TEST(QuantizeActivation, StridedInputAndOutputs) {
  Rng rng;
  const int64_t m_rows = 5, k_cols = 96;
  for (ActScheme scheme :
       {ActScheme::s8_per_token, ActScheme::s4_per_token, ActScheme::e4m3_per_token}) {
    SCOPED_TRACE(to_string(scheme));
    const Tensor x = test::random_activations(DType::f16, m_rows, k_cols, rng);
    QuantizedActivation ref(scheme, m_rows, k_cols);
    quantize_activation(x.view(), ref.view());
    const test::Strided xs = test::strided_copy(x, k_cols + 10, 0x7E);
    test::Strided qs = test::strided_empty(ref.q.view().dtype, m_rows, k_cols, k_cols + 32, 0x5A);
    Tensor scales = Tensor::empty(DType::f32, {m_rows});
    quantize_activation(xs.view, {scheme, qs.view, scales.view()});
    for (int64_t m = 0; m < m_rows; ++m) {
      const int64_t row = dtype_storage_bytes(qs.view.dtype, k_cols);
      const int64_t pitch = dtype_storage_bytes(qs.view.dtype, k_cols + 32);
      const auto* got = static_cast<const uint8_t*>(qs.storage.data()) + m * pitch;
      const auto* want = static_cast<const uint8_t*>(ref.q.data()) + m * row;
      ASSERT_EQ(std::memcmp(got, want, static_cast<size_t>(row)), 0) << "row " << m;
      for (int64_t b = row; b < pitch; ++b) ASSERT_EQ(got[b], 0x5A) << "gap written, row " << m;
    }
    EXPECT_EQ(test::bytes_of(scales), test::bytes_of(ref.scales));
  }
}

// ---- int4 packing -------------------------------------------------------------------------------

// Every byte value unpacks to its two nibbles (element 2i from the low nibble, sign-extended for
// s4) and packs back to itself: pack/unpack is a bijection on bytes.
TEST(PackInt4, EveryByteValueUnpacksToItsNibblesAndPacksBack) {
  for (DType packed_dtype : {DType::s4, DType::u4}) {
    SCOPED_TRACE(to_string(packed_dtype));
    const DType wide = packed_dtype == DType::s4 ? DType::s8 : DType::u8;
    Tensor packed = Tensor::empty(packed_dtype, {2, 256});  // row 0: bytes 0..127, row 1: 128..255
    for (int b = 0; b < 256; ++b) static_cast<uint8_t*>(packed.data())[b] = static_cast<uint8_t>(b);
    Tensor unpacked = Tensor::empty(wide, {2, 256});
    unpacked.fill_bytes(0xEE);
    unpack_int4(packed.view(), unpacked.view());
    for (int b = 0; b < 256; ++b) {
      const int lo = b & 0xF, hi = b >> 4;
      const int want_lo = packed_dtype == DType::s4 && lo >= 8 ? lo - 16 : lo;
      const int want_hi = packed_dtype == DType::s4 && hi >= 8 ? hi - 16 : hi;
      const int64_t r = b / 128, c = 2 * (b % 128);
      ASSERT_EQ(int_at(unpacked.view(), r, c), want_lo) << "byte " << b;
      ASSERT_EQ(int_at(unpacked.view(), r, c + 1), want_hi) << "byte " << b;
    }
    Tensor repacked = Tensor::empty(packed_dtype, {2, 256});
    repacked.fill_bytes(0x00);
    pack_int4(unpacked.view(), repacked.view());
    EXPECT_EQ(test::bytes_of(repacked), test::bytes_of(packed));
  }
}

TEST(PackInt4, GoldenBytes) {
  Tensor s = Tensor::empty(DType::s8, {1, 6});
  const int8_t sv[6] = {1, -1, 7, -8, 0, -2};
  std::memcpy(s.data(), sv, sizeof(sv));
  Tensor ps = Tensor::empty(DType::s4, {1, 6});
  pack_int4(s.view(), ps.view());
  EXPECT_EQ(test::bytes_of(ps), (std::vector<uint8_t>{0xF1, 0x87, 0xE0}));

  Tensor u = Tensor::empty(DType::u8, {1, 4});
  const uint8_t uv[4] = {3, 10, 15, 0};
  std::memcpy(u.data(), uv, sizeof(uv));
  Tensor pu = Tensor::empty(DType::u4, {1, 4});
  pack_int4(u.view(), pu.view());
  EXPECT_EQ(test::bytes_of(pu), (std::vector<uint8_t>{0xA3, 0x0F}));
}

TEST(PackInt4, RandomShapesAndStridesRoundTrip) {
  Rng rng;
  for (DType packed_dtype : {DType::s4, DType::u4})
    for (int64_t rows : {1, 3, 17})
      for (int64_t cols : {2, 6, 64, 130}) {
        SCOPED_TRACE(std::string(to_string(packed_dtype)) + " " + std::to_string(rows) + "x" +
                     std::to_string(cols));
        const DType wide = packed_dtype == DType::s4 ? DType::s8 : DType::u8;
        const auto [lo, hi] = test::int_range(packed_dtype);
        const Tensor src = test::random_int(wide, rows, cols, rng, lo, hi);
        // Contiguous, then strided on both sides.
        Tensor packed = Tensor::empty(packed_dtype, {rows, cols});
        pack_int4(src.view(), packed.view());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            ASSERT_EQ(int_at(packed.view(), r, c), int_at(src.view(), r, c));
        const test::Strided src_s = test::strided_copy(src, cols + 3, 0x40);  // 64: out of range
        test::Strided packed_s = test::strided_empty(packed_dtype, rows, cols, cols + 4, 0x99);
        pack_int4(src_s.view, packed_s.view);
        test::Strided back = test::strided_empty(wide, rows, cols, cols + 5, 0x99);
        unpack_int4(packed_s.view, back.view);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            ASSERT_EQ(int_at(packed_s.view, r, c), int_at(src.view(), r, c));
            ASSERT_EQ(int_at(back.view, r, c), int_at(src.view(), r, c));
          }
          const auto* pk = static_cast<const uint8_t*>(packed_s.storage.data());
          ASSERT_EQ(pk[r * (cols + 4) / 2 + cols / 2], 0x99) << "packed gap written";
          ASSERT_EQ(pk[r * (cols + 4) / 2 + cols / 2 + 1], 0x99) << "packed gap written";
          const auto* bk = static_cast<const uint8_t*>(back.storage.data());
          for (int64_t c = cols; c < cols + 5; ++c)
            ASSERT_EQ(bk[r * (cols + 5) + c], 0x99) << "unpacked gap written";
        }
      }
}

}  // namespace
}  // namespace nibble
