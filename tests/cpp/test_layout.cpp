// The w4_mma_k128 packed layout: index() is a bijection onto the packed bytes, packing keeps
// every value, and the CPU path through packed weights equals the logical-weight reference.
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

}  // namespace
}  // namespace nibble
