// The int4 → 8-bit register decodings of the tensor-core kernels (src/cuda/common/
// int4_decode.cuh), run on the CPU: the same inline functions the kernels call, with the
// host emulation of prmt. Every nibble value in every byte position, and random words, against
// the format's definition: u = v + 8, v ∈ [−8, 7]; the 16·v decoding (high_nibble) gives 16·v
// as an int8; the e4m3 decoding gives v·2⁻⁹ exactly,
// read back with the independent decoder of test_util.h; the f16 bit patterns of W4A-FP8's f16
// route are 1024 + u and 1024 + 16u, from which the kernel's lo − 1032 and hi / 16 − 72 are v.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/common/int4_decode.cuh"
#include "test_util.h"

namespace nibble {
namespace {

using cuda::byte_perm;
using cuda::decode_high_nibbles;
using cuda::decode_high_nibbles_16v;
using cuda::decode_high_nibbles_e4m3;
using cuda::decode_low_nibbles;
using cuda::decode_low_nibbles_16v;
using cuda::decode_low_nibbles_e4m3;
using cuda::kE4m3WeightScale;
using cuda::kS4SymOffset4;
using cuda::s4_f16_magic_pair;

uint32_t byte_of(uint32_t word, int b) { return (word >> (8 * b)) & 0xFFu; }

// Checks the four low-nibble and four high-nibble values of `word` in both decodings.
void expect_word_decodes(uint32_t word) {
  const uint32_t lo8 = decode_low_nibbles(word, 1u, kS4SymOffset4);
  const uint32_t hi8 = decode_high_nibbles(word, 1u, kS4SymOffset4);
  const uint32_t lo_e = decode_low_nibbles_e4m3(word);
  const uint32_t hi_e = decode_high_nibbles_e4m3(word);
  const uint32_t lo16 = decode_low_nibbles_16v(word);
  const uint32_t hi16 = decode_high_nibbles_16v(word);
  for (int b = 0; b < 4; ++b) {
    const int v_lo = static_cast<int>(byte_of(word, b) & 0xF) - 8;
    const int v_hi = static_cast<int>(byte_of(word, b) >> 4) - 8;
    EXPECT_EQ(static_cast<int8_t>(byte_of(lo8, b)), v_lo) << std::hex << "word 0x" << word;
    EXPECT_EQ(static_cast<int8_t>(byte_of(hi8, b)), v_hi) << std::hex << "word 0x" << word;
    EXPECT_EQ(static_cast<int8_t>(byte_of(lo16, b)), 16 * v_lo) << std::hex << "word 0x" << word;
    EXPECT_EQ(static_cast<int8_t>(byte_of(hi16, b)), 16 * v_hi) << std::hex << "word 0x" << word;
    EXPECT_EQ(test::decode_e4m3(static_cast<uint8_t>(byte_of(lo_e, b))) * kE4m3WeightScale,
              static_cast<float>(v_lo))
        << std::hex << "word 0x" << word << " byte " << b;
    EXPECT_EQ(test::decode_e4m3(static_cast<uint8_t>(byte_of(hi_e, b))) * kE4m3WeightScale,
              static_cast<float>(v_hi))
        << std::hex << "word 0x" << word << " byte " << b;
  }
  // The f16 route: bytes 0, 1 (selector 0x4140) and 2, 3 (0x4342), the lower byte in the low half.
  for (int pair = 0; pair < 2; ++pair) {
    uint32_t lo = 0, hi = 0;
    s4_f16_magic_pair(byte_perm(word, 0u, pair == 0 ? 0x4140u : 0x4342u), lo, hi);
    for (int half = 0; half < 2; ++half) {
      const uint32_t byte = byte_of(word, 2 * pair + half);
      const double l = test::decode_f16(static_cast<uint16_t>(lo >> (16 * half)));
      const double h = test::decode_f16(static_cast<uint16_t>(hi >> (16 * half)));
      EXPECT_EQ(l, 1024.0 + (byte & 0xF)) << std::hex << "word 0x" << word;
      EXPECT_EQ(h, 1024.0 + 16.0 * (byte >> 4)) << std::hex << "word 0x" << word;
      EXPECT_EQ(l - 1032.0, static_cast<double>(static_cast<int>(byte & 0xF) - 8));
      EXPECT_EQ(h / 16.0 - 72.0, static_cast<double>(static_cast<int>(byte >> 4) - 8));
    }
  }
}

TEST(Int4Decode, EveryNibbleInEveryPositionDecodesToItsValue) {
  for (int pos = 0; pos < 8; ++pos)
    for (uint32_t u = 0; u < 16; ++u)
      for (uint32_t fill : {0x00000000u, 0x88888888u, 0xFFFFFFFFu, 0x77777777u})
        expect_word_decodes((fill & ~(0xFu << (4 * pos))) | (u << (4 * pos)));
}

TEST(Int4Decode, RandomWordsDecodeToTheirValues) {
  test::Rng rng;
  for (int i = 0; i < 20000; ++i) expect_word_decodes(static_cast<uint32_t>(rng.engine()()));
}

float float_of_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

// sm90_w4a8_gemm's group format folds a block's sums of 16·v weights (16·Σ) with s/16 where
// sixteenth_is_exact(s): the fma must then be bit-identical to the offset_xor fold of Σ with s.
// Where the predicate says no, s/16 must really be inexact or subnormal (|s| < 2^-122, s ≠ 0).
TEST(Int4Decode, SixteenthOfAGroupScaleFoldsLikeTheScale) {
  test::Rng rng;
  std::vector<float> scales = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, FLT_MAX, FLT_MIN,
                               std::ldexp(1.0f, -122), std::ldexp(1.0f, -123),
                               std::nextafter(std::ldexp(1.0f, -122), 0.0f),
                               std::ldexp(1.5f, -122), std::ldexp(1.0f, -149), 1.0f / 7};
  for (int i = 0; i < 4000; ++i) scales.push_back(float_of_bits(static_cast<uint32_t>(rng.engine()())));
  for (int i = 0; i < 2000; ++i)  // bf16-like scales of every binade
    scales.push_back(float_of_bits(static_cast<uint32_t>(rng.engine()()) & 0xFFFF0000u));
  for (const float s : scales) {
    const bool exact = cuda::sixteenth_is_exact(s);
    const uint32_t magnitude = bits_of(s) & 0x7FFFFFFFu;
    EXPECT_EQ(exact, magnitude == 0 || magnitude >= bits_of(std::ldexp(1.0f, -122)))
        << std::hex << "scale bits 0x" << bits_of(s);
    if (!exact) continue;
    for (int j = 0; j < 8; ++j) {
      const int32_t sum = static_cast<int32_t>(rng.engine()() % (2 * 131072 + 1)) - 131072;
      const float running = float_of_bits(static_cast<uint32_t>(rng.engine()()));
      const float offset_xor = std::fma(s, static_cast<float>(sum), running);
      const float high_nibble = std::fma(s * 0.0625f, static_cast<float>(16 * sum), running);
      if (std::isnan(offset_xor)) {
        EXPECT_TRUE(std::isnan(high_nibble));
      } else {
        EXPECT_EQ(bits_of(high_nibble), bits_of(offset_xor))
            << std::hex << "scale bits 0x" << bits_of(s) << std::dec << ", sum " << sum;
      }
    }
  }
}

// The host evaluation of lop3 (the kernels run the PTX instruction) against C expressions, on
// random words: the two tables the kernels use and a few others.
TEST(Int4Decode, HostLop3FollowsItsTruthTable) {
  test::Rng rng;  // fresh seed, printed on failure
  for (int i = 0; i < 1000; ++i) {
    const uint32_t a = rng.engine()(), b = rng.engine()(), c = rng.engine()();
    EXPECT_EQ(cuda::and_xor(a, b, c), (a & b) ^ c);
    EXPECT_EQ(cuda::and_or(a, b, c), (a & b) | c);
    EXPECT_EQ(cuda::lop3<0xF0>(a, b, c), a);
    EXPECT_EQ(cuda::lop3<0x96>(a, b, c), a ^ b ^ c);
    EXPECT_EQ(cuda::lop3<0xE8>(a, b, c), (a & b) | (a & c) | (b & c));  // majority
    EXPECT_EQ(cuda::lop3<0xCA>(a, b, c), (a & b) | (~a & c));            // select
    EXPECT_EQ(cuda::lop3<0x00>(a, b, c), 0u);
  }
}

TEST(Int4Decode, HostBytePermuteFollowsPrmt) {
  // Copy mode: bytes of {b, a}; sign-replicate mode: bit 7 of the chosen byte, 8 times.
  EXPECT_EQ(byte_perm(0x33221100u, 0x77665544u, 0x7531u), 0x77553311u);
  EXPECT_EQ(byte_perm(0x80017F00u, 0u, 0xBA98u), 0xFF000000u);
  EXPECT_EQ(byte_perm(0x00800000u, 0u, 0x3A10u), 0x00FF0000u);
}

}  // namespace
}  // namespace nibble
