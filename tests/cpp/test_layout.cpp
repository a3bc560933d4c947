// The packed layouts (w4_mma_k128, w4_mma16_k128, w8_mma16_k128): index() is a bijection onto
// the packed bytes, packing keeps every value and unpack_weight inverts it, and the CPU path
// through packed weights equals the logical-weight reference.
#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>

#include "cuda_test_util.h"
#include "nibble/nibble.h"

namespace nibble {
namespace {

TEST(LayoutW4MmaK128, IndexIsABijectionOverThePaddedMatrix) {
  const int64_t n_pad = 24, k_pad = 384;
  std::set<std::pair<int64_t, int>> seen;
  for (int64_t n = 0; n < n_pad; ++n)
    for (int64_t k = 0; k < k_pad; ++k) {
      const NibbleIndex at = w4_mma_k128_index(n, k, k_pad);
      ASSERT_GE(at.byte, 0);
      ASSERT_LT(at.byte, n_pad * k_pad / 2);
      ASSERT_TRUE(at.shift == 0 || at.shift == 4);
      ASSERT_TRUE(seen.insert({at.byte, at.shift}).second) << "(" << n << ", " << k << ") collides";
    }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), n_pad * k_pad);
}

TEST(LayoutW4MmaK128, LaneBytesHoldTheMmaFragments) {
  // Golden positions from the layout description: lane 4g+c, word j, byte b.
  EXPECT_EQ(w4_mma_k128_index(0, 0, 128).byte, 0);
  EXPECT_EQ(w4_mma_k128_index(0, 16, 128).shift, 4);       // high nibble: k 16..31 of step 0
  EXPECT_EQ(w4_mma_k128_index(1, 0, 128).byte, 4 * 16);    // n = 1 → lane 4
  EXPECT_EQ(w4_mma_k128_index(0, 4, 128).byte, 1 * 16);    // k = 4 → lane 1 (c = 1)
  EXPECT_EQ(w4_mma_k128_index(0, 33, 128).byte, 4 + 1);    // k32 step 1 → word 1, byte 1
  EXPECT_EQ(w4_mma_k128_index(8, 0, 256).byte, 2 * 512);   // next n8 block after 2 K blocks
  EXPECT_EQ(w4_mma_k128_index(0, 128, 256).byte, 512);     // next K block
}

class LayoutPackFormat : public ::testing::TestWithParam<const char*> {};

TEST_P(LayoutPackFormat, PackKeepsEveryValueAndTheCpuResult) {
  const LinearFormat f = parse_linear_format(GetParam());
  test::Rng rng;  // fresh seed, printed on failure
  // N not a multiple of 8; K not a multiple of 128 where the group allows (K = 352 for per
  // channel and g32; g128 needs K = 640, a multiple of 128).
  const int64_t m = 5, n = 21, k = f.weight.group_size == 128 ? 640 : 352;
  QuantizedWeight qw(f.weight, n, k);
  quantize_weight(test::random_normal(DType::f32, n, k, rng, 0.05).view(), qw.view());
  const PackedWeight packed = pack_weight(qw.view());
  const PackedWeightView pv = packed.view();
  EXPECT_EQ(pv.n_pad, 24);
  EXPECT_EQ(pv.k_pad, (k + 127) / 128 * 128);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      ASSERT_EQ(packed_weight_value(pv, r, c),
                load_int(qw.q.data(), qw.q.view().dtype, r * k + c)) << r << ", " << c;
  QuantizedActivation qa(f.act, m, k);
  quantize_activation(test::random_activations(DType::bf16, m, k, rng).view(), qa.view());
  Tensor ref = Tensor::empty(DType::f32, {m, n}), got = Tensor::empty(DType::f32, {m, n});
  linear(qa.view(), qw.view(), nullptr, ref.view());
  got.fill_bytes(0xFF);
  linear(qa.view(), pv, nullptr, got.view());
  EXPECT_TRUE(same_bytes(got, ref));
}

INSTANTIATE_TEST_SUITE_P(Formats, LayoutPackFormat,
                         ::testing::Values("w4a8_pc", "w4a8_g128", "w4a8_g32", "w4a8_g128_2level",
                                           "w4a8_g32_2level", "w4a8_pc_sbf16"),
                         [](const auto& p) { return std::string(p.param); });

TEST(LayoutW4MmaK128, RejectsFormatsWithoutAPackedLayout) {
  QuantizedWeight qw(parse_weight_format("w4_g128_asym"), 8, 128);
  try {
    pack_weight(qw.view());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("'w.format'"), std::string::npos) << e.what();
  }
}

TEST(LayoutW4MmaK128, PackedS4MatrixRoundTripsAndGemmMatchesLogical) {
  test::Rng rng;
  const Tensor w = test::random_int(DType::s4, 13, 160, rng);
  const PackedWeight p = pack_s4_matrix(w.view());
  for (int64_t r = 0; r < 13; ++r)
    for (int64_t c = 0; c < 160; ++c)
      ASSERT_EQ(packed_weight_value(p.view(), r, c), load_int(w.data(), DType::s4, r * 160 + c));
  const Tensor a = test::random_int(DType::s8, 3, 160, rng);
  Tensor ref = Tensor::empty(DType::s32, {3, 13}), got = Tensor::empty(DType::s32, {3, 13});
  gemm_s32(a.view(), w.view(), ref.view());
  gemm_s32(a.view(), p.view(), got.view());
  EXPECT_TRUE(same_bytes(got, ref));
}

class LayoutMma16 : public ::testing::TestWithParam<WeightLayout> {};

TEST_P(LayoutMma16, IndexIsABijectionOverThePaddedMatrix) {
  const WeightLayout layout = GetParam();
  const int bits = layout_weight_bits(layout);
  const int64_t n_pad = 24, k_pad = 384;
  std::set<std::pair<int64_t, int>> seen;
  for (int64_t n = 0; n < n_pad; ++n)
    for (int64_t k = 0; k < k_pad; ++k) {
      const NibbleIndex at = packed_weight_index(layout, n, k, k_pad);
      ASSERT_GE(at.byte, 0);
      ASSERT_LT(at.byte, n_pad * k_pad * bits / 8);
      ASSERT_TRUE(at.shift == 0 || (bits == 4 && at.shift == 4));
      ASSERT_TRUE(seen.insert({at.byte, at.shift}).second) << "(" << n << ", " << k << ") collides";
    }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), n_pad * k_pad);
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutMma16,
                         ::testing::Values(WeightLayout::w4_mma16_k128, WeightLayout::w8_mma16_k128),
                         [](const auto& p) { return std::string(to_string(p.param)); });

TEST(LayoutMma16, LaneBytesHoldTheMmaFragments) {
  // m16n8k16 B fragment of lane 4g+c: b[0] = k 2c, 2c+1 and b[1] = k 8+2c, 8+2c+1 of column g.
  // w4: (word >> 4i) & 0x000F000F is the pair (k, k+1) of register i&1 of k16 step (i>>1)&1.
  const auto w4 = [](int64_t n, int64_t k) {
    return packed_weight_index(WeightLayout::w4_mma16_k128, n, k, 128);
  };
  EXPECT_EQ(w4(0, 0).byte, 0);            // nibble 0
  EXPECT_EQ(w4(0, 0).shift, 0);
  EXPECT_EQ(w4(0, 8).shift, 4);           // nibble 1: b[1] of step 0
  EXPECT_EQ(w4(0, 16).byte, 1);           // nibble 2: step 1
  EXPECT_EQ(w4(0, 1).byte, 2);            // nibble 4: the pair's second k, 16 bits up
  EXPECT_EQ(w4(0, 2).byte, 16);           // k = 2 → lane 1 (c = 1)
  EXPECT_EQ(w4(1, 0).byte, 4 * 16);       // n = 1 → lane 4
  EXPECT_EQ(w4(0, 32).byte, 4);           // k32 step 1 → word 1
  const auto w8 = [](int64_t n, int64_t k) {
    return packed_weight_index(WeightLayout::w8_mma16_k128, n, k, 256);
  };
  EXPECT_EQ(w8(0, 1).byte, 1);
  EXPECT_EQ(w8(0, 8).byte, 2);
  EXPECT_EQ(w8(0, 16).byte, 4);           // k16 step 1 → word 1
  EXPECT_EQ(w8(0, 2).byte, 32);           // lane 1
  EXPECT_EQ(w8(0, 128).byte, 1024);       // next K block
}

class LayoutPackWeightOnly : public ::testing::TestWithParam<const char*> {};

TEST_P(LayoutPackWeightOnly, PackKeepsEveryValueAndUnpackInvertsIt) {
  const LinearFormat f = parse_linear_format(GetParam());
  ASSERT_TRUE(has_packed_layout(f));
  const WeightLayout layout = packed_layout(f);
  test::Rng rng;  // fresh seed, printed on failure
  // K a multiple of the group but, where the group allows, not of the layout's 128.
  const int g = f.weight.group_size;
  const int64_t m = 5, n = 21, k = g == 256 ? 768 : g == 128 ? 640 : g == 64 ? 320 : 352;
  QuantizedWeight qw(f.weight, n, k);
  quantize_weight(test::random_normal(DType::f32, n, k, rng, 0.05).view(), qw.view());
  const PackedWeight packed = pack_weight(qw.view(), layout);
  const PackedWeightView pv = packed.view();
  EXPECT_EQ(pv.layout, layout);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c)
      ASSERT_EQ(packed_weight_value(pv, r, c),
                load_int(qw.q.data(), qw.q.view().dtype, r * k + c)) << r << ", " << c;
  const QuantizedWeight back = unpack_weight(pv);
  EXPECT_TRUE(same_bytes(back.q, qw.q));
  EXPECT_TRUE(same_bytes(back.scales, qw.scales));
  if (qw.zeros.defined()) {
    EXPECT_TRUE(same_bytes(back.zeros, qw.zeros));
  }
  const Tensor x = test::random_activations(DType::bf16, m, k, rng);
  Tensor ref = Tensor::empty(DType::f32, {m, n}), got = Tensor::empty(DType::f32, {m, n});
  linear(x.view(), qw.view(), nullptr, ref.view());
  got.fill_bytes(0xFF);
  linear(x.view(), pv, nullptr, got.view());
  EXPECT_TRUE(same_bytes(got, ref));
}

INSTANTIATE_TEST_SUITE_P(Formats, LayoutPackWeightOnly,
                         ::testing::Values("w4a16_pc", "w4a16_g128", "w4a16_g32_asym",
                                           "w4a16_g128_asym", "w4a16_g64_fzp", "w4a16_g256_fzp",
                                           "w8a16", "w8a16_g128"),
                         [](const auto& p) { return std::string(p.param); });

TEST(LayoutMma16, PackedLayoutOfEachFormat) {
  EXPECT_EQ(packed_layout(parse_linear_format("w4a8_g128")), WeightLayout::w4_mma_k128);
  EXPECT_EQ(packed_layout(parse_linear_format("w4a16_g128_asym")), WeightLayout::w4_mma16_k128);
  EXPECT_EQ(packed_layout(parse_linear_format("w8a16")), WeightLayout::w8_mma16_k128);
  EXPECT_EQ(packed_layout(parse_linear_format("w4afp8_g128")), WeightLayout::w4_mma_k128);
  EXPECT_EQ(packed_layout(parse_linear_format("w4afp8_g32")), WeightLayout::w4_mma_k128);
  EXPECT_FALSE(has_packed_layout(parse_linear_format("w8a8")));
  EXPECT_EQ(parse_weight_layout("w8_mma16_k128"), WeightLayout::w8_mma16_k128);
  EXPECT_THROW(parse_weight_layout("w4"), Error);
  try {
    packed_layout(parse_linear_format("w4a4_pc"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
  }
  // A weight layout that does not hold the scheme is refused, naming the argument.
  QuantizedWeight qw(parse_weight_format("w4_g128_asym"), 8, 128);
  try {
    pack_weight(qw.view(), WeightLayout::w8_mma16_k128);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("'w.format'"), std::string::npos) << e.what();
  }
}

TEST(LayoutMma16, LinearRejectsAWeightPackedForTheOtherKernels) {
  // Quantized activations with a weight packed for the weight-only kernels.
  test::Rng rng;
  const LinearFormat f = parse_linear_format("w4a16_g128");
  QuantizedWeight qw(f.weight, 16, 128);
  quantize_weight(test::random_normal(DType::f32, 16, 128, rng).view(), qw.view());
  const PackedWeight w16 = pack_weight(qw.view(), packed_layout(f));  // layout w4_mma16_k128
  QuantizedActivation qa(ActScheme::s8_per_token, 2, 128);
  quantize_activation(test::random_activations(DType::bf16, 2, 128, rng).view(), qa.view());
  Tensor d = Tensor::empty(DType::f32, {2, 16});
  try {
    linear(qa.view(), w16.view(), nullptr, d.view());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("w4_mma_k128"), std::string::npos) << e.what();
  }
}

// Float activations with W4A8 weights are quantized per token first: the same result as
// quantize_activation followed by the quantized-activation linear.
TEST_P(LayoutPackFormat, FloatActivationsAreQuantizedPerTokenFirst) {
  const LinearFormat f = parse_linear_format(GetParam());
  if (f.act != ActScheme::s8_per_token) GTEST_SKIP() << "float-in W4A8 is dynamic per token";
  test::Rng rng;  // fresh seed, printed on failure
  const int64_t m = 7, n = 21, k = f.weight.group_size == 128 ? 640 : 352;
  QuantizedWeight qw(f.weight, n, k);
  quantize_weight(test::random_normal(DType::f32, n, k, rng, 0.05).view(), qw.view());
  const PackedWeight packed = pack_weight(qw.view());
  for (DType xt : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(to_string(xt));
    const Tensor x = test::random_activations(xt, m, k, rng);
    QuantizedActivation qa(ActScheme::s8_per_token, m, k);
    quantize_activation(x.view(), qa.view());
    Tensor ref = Tensor::empty(DType::bf16, {m, n}), got = Tensor::empty(DType::bf16, {m, n});
    linear(qa.view(), packed.view(), nullptr, ref.view());
    got.fill_bytes(0xFF);
    linear(x.view(), packed.view(), nullptr, got.view());
    EXPECT_TRUE(same_bytes(got, ref));
  }
}

}  // namespace
}  // namespace nibble
