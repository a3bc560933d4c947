// Conversions between f32 and f16 / bf16 / e4m3 (src/common/numeric.cpp): every bit pattern of
// the narrow formats, every rounding midpoint, overflow and saturation, and golden values. The
// expectations come from the format definitions (decoders and an exact float64 rounding in this
// file and test_util.h), not from nibble's own conversions.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "nibble/nibble.h"
#include "test_util.h"

namespace nibble {
namespace {

using test::decode_bf16;
using test::decode_e4m3;
using test::decode_f16;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float float_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t bits_from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// A binary floating-point format with `mant_bits` stored mantissa bits, smallest normal
// exponent `emin` and largest finite value `max_finite` (subnormals below 2^emin).
struct NarrowFormat {
  int mant_bits;
  int emin;
  double max_finite;
};
constexpr NarrowFormat kF16 = {10, -14, 65504.0};
constexpr NarrowFormat kBF16 = {7, -126, 3.3895313892515355e38};  // (2 − 2^-7) · 2^127
constexpr NarrowFormat kE4M3 = {3, -6, 448.0};

// |x| rounded to nearest, ties to even, onto the grid of `f`, computed exactly in float64 (an
// f32 value divided by a power of two is exact, and the quotient has at most 24 bits).
// Values beyond the largest finite value are returned as they round (the caller decides
// between overflow to infinity and saturation).
double round_magnitude(double x, NarrowFormat f) {
  const double a = std::fabs(x);
  if (a == 0.0) return 0.0;
  int e2;
  std::frexp(a, &e2);  // a = frac · 2^e2, frac ∈ [0.5, 1): floor(log2 a) = e2 − 1
  const int e = std::max(e2 - 1, f.emin);
  const double ulp = std::ldexp(1.0, e - f.mant_bits);
  return std::nearbyint(a / ulp) * ulp;
}

// f16 and bf16 overflow to infinity once the RNE result passes the largest finite value.
double expected_ieee(float x, NarrowFormat f) {
  if (std::isnan(x)) return x;
  double r = round_magnitude(x, f);
  if (r > f.max_finite) r = std::numeric_limits<double>::infinity();
  return std::signbit(x) ? -r : r;
}

// e4m3 satfinite: everything beyond ±448 (infinities included) saturates.
double expected_e4m3(float x) {
  const double r = std::min(round_magnitude(x, kE4M3), kE4M3.max_finite);
  return std::signbit(x) ? -r : r;
}

bool same_value(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

// Random f32 bit patterns cover every exponent; values near a format's range hit its rounding
// and overflow boundaries far more often.
float random_f32(test::Rng& rng, int exp_lo, int exp_hi) {
  if (rng.uniform_int(0, 1) == 0)
    return float_from_bits(static_cast<uint32_t>(rng.uniform_int(0, 0xFFFFFFFFll)));
  const float mant = static_cast<float>(rng.uniform(1.0, 2.0));
  const float v = std::ldexp(mant, static_cast<int>(rng.uniform_int(exp_lo, exp_hi)));
  return rng.uniform_int(0, 1) ? -v : v;
}

// ---- f16 ----------------------------------------------------------------------------------------

TEST(NumericF16, EveryBitPatternDecodesAsDefined) {
  for (uint32_t h = 0; h < 0x10000; ++h)
    ASSERT_TRUE(
        same_value(f16_bits_to_f32(static_cast<uint16_t>(h)), decode_f16(static_cast<uint16_t>(h))))
        << "f16 bits 0x" << std::hex << h;
}

TEST(NumericF16, EveryNonNaNBitPatternRoundTrips) {
  int nan_count = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = f16_bits_to_f32(bits);
    const uint16_t back = f32_to_f16_bits(f);
    if (std::isnan(f)) {
      ++nan_count;
      // A NaN stays a NaN: exponent all ones and a non-zero mantissa.
      ASSERT_EQ(back & 0x7C00, 0x7C00) << std::hex << h;
      ASSERT_NE(back & 0x03FF, 0) << std::hex << h;
      continue;
    }
    ASSERT_EQ(back, bits) << "f16 0x" << std::hex << h << " -> " << f << " -> 0x" << back;
  }
  EXPECT_EQ(nan_count, 2 * 1023);  // exponent 31 with mantissa 1..1023, both signs
}

// Between every two adjacent finite f16 values (subnormals included) the exact midpoint rounds
// to the one with an even mantissa, and one f32 step either side rounds to the nearer value.
TEST(NumericF16, EveryMidpointRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double lo = decode_f16(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7C00 ? 65536.0 : decode_f16(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // 12 significant bits: exact
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t s = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(f32_to_f16_bits(sign * mid), even | s) << "midpoint above 0x" << std::hex << h;
      ASSERT_EQ(f32_to_f16_bits(sign * std::nextafter(mid, 0.0f)), h | s) << std::hex << h;
      ASSERT_EQ(f32_to_f16_bits(sign * std::nextafter(mid, kInf)), (h + 1) | s) << std::hex << h;
    }
  }
}

TEST(NumericF16, RandomF32ValuesRoundLikeExactArithmetic) {
  test::Rng rng;
  for (int i = 0; i < 300000; ++i) {
    const float x = random_f32(rng, -27, 17);
    const double want = expected_ieee(x, kF16);
    const uint16_t got = f32_to_f16_bits(x);
    ASSERT_TRUE(same_value(decode_f16(got), want))
        << "x = " << x << " (bits 0x" << std::hex << bits_from_float(x) << ") -> 0x" << got;
  }
}

TEST(NumericF16, GoldenValues) {
  // clang-format off
  const struct { float x; uint16_t bits; } cases[] = {
      {0.0f, 0x0000},       {-0.0f, 0x8000},      {1.0f, 0x3C00},       {-2.0f, 0xC000},
      {0.5f, 0x3800},       {0.1f, 0x2E66},       {1.0f / 3, 0x3555},   {3.140625f, 0x4248},
      {65504.0f, 0x7BFF},   {-65504.0f, 0xFBFF},  {65519.996f, 0x7BFF}, {65520.0f, 0x7C00},
      {1e6f, 0x7C00},       {-1e6f, 0xFC00},      {kInf, 0x7C00},       {-kInf, 0xFC00},
      {FLT_MAX, 0x7C00},    {6.103515625e-05f, 0x0400},                 // 2^-14, smallest normal
      {5.9604645e-08f, 0x0001},                                         // 2^-24, smallest subnormal
      {std::ldexp(1.0f, -25), 0x0000},                                  // tie, to even (0)
      {std::nextafter(std::ldexp(1.0f, -25), 1.0f), 0x0001},            // just above the tie
      {8.9406967e-08f, 0x0002},                                         // 1.5 · 2^-24: tie, to 2
      {6.0975552e-05f, 0x03FF},                                         // largest subnormal
      {1e-10f, 0x0000},     {-1e-10f, 0x8000},    {FLT_MIN, 0x0000},
      {1.00048828125f, 0x3C00},                                         // 1 + 2^-11: tie, to even
      {1.00146484375f, 0x3C02},                                         // 1 + 3·2^-11: tie, to even
  };
  // clang-format on
  for (const auto& c : cases) EXPECT_EQ(f32_to_f16_bits(c.x), c.bits) << "x = " << c.x;
  EXPECT_EQ(f32_to_f16_bits(kNaN), 0x7E00);
  EXPECT_TRUE(std::isnan(f16_bits_to_f32(0x7E00)));
  EXPECT_TRUE(std::isnan(f16_bits_to_f32(0xFC01)));
  EXPECT_EQ(f16_bits_to_f32(0x7C00), kInf);
  EXPECT_EQ(f16_bits_to_f32(0x0001), std::ldexp(1.0f, -24));
}

// ---- bf16 ---------------------------------------------------------------------------------------

TEST(NumericBF16, EveryBitPatternDecodesAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = bf16_bits_to_f32(bits);
    ASSERT_TRUE(same_value(f, decode_bf16(bits))) << std::hex << h;
    const uint16_t back = f32_to_bf16_bits(f);
    if (std::isnan(f)) {
      // Quiet NaN with the sign kept.
      ASSERT_EQ(back & 0x7FC0, 0x7FC0) << std::hex << h;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
      continue;
    }
    ASSERT_EQ(back, bits) << std::hex << h;
  }
}

// The 16 dropped bits equal to 0x8000 are the exact tie: it rounds to the even bf16; one f32
// step either side rounds to the nearer one. Covers every finite bf16, overflow included.
TEST(NumericBF16, EveryTieRoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x7F80; ++h) {
    const uint32_t even = (h & 1) ? h + 1 : h;
    for (uint32_t s : {0u, 0x8000u}) {
      const uint32_t base = (h | s) << 16;
      ASSERT_EQ(f32_to_bf16_bits(float_from_bits(base | 0x8000)), even | s) << std::hex << h;
      ASSERT_EQ(f32_to_bf16_bits(float_from_bits(base | 0x7FFF)), h | s) << std::hex << h;
      ASSERT_EQ(f32_to_bf16_bits(float_from_bits(base | 0x8001)), (h + 1) | s) << std::hex << h;
    }
  }
}

TEST(NumericBF16, RandomF32ValuesRoundLikeExactArithmetic) {
  test::Rng rng;
  for (int i = 0; i < 300000; ++i) {
    const float x = random_f32(rng, -140, 127);
    const double want = expected_ieee(x, kBF16);
    const uint16_t got = f32_to_bf16_bits(x);
    ASSERT_TRUE(same_value(decode_bf16(got), want))
        << "x = " << x << " (bits 0x" << std::hex << bits_from_float(x) << ") -> 0x" << got;
  }
}

TEST(NumericBF16, GoldenValues) {
  // clang-format off
  const struct { float x; uint16_t bits; } cases[] = {
      {0.0f, 0x0000},          {-0.0f, 0x8000},       {1.0f, 0x3F80},      {-1.0f, 0xBF80},
      {0.1f, 0x3DCD},          {3.14159265f, 0x4049},
      {1.00390625f, 0x3F80},                                                  // 1 + 2^-8: tie, even
      {1.01171875f, 0x3F82},                                                  // 1 + 3·2^-8: tie
      {std::nextafter(1.00390625f, 2.0f), 0x3F81},                            // just above the tie
      {FLT_MAX, 0x7F80},       {-FLT_MAX, 0xFF80},    {kInf, 0x7F80},      {-kInf, 0xFF80},
      {3.3895314e38f, 0x7F7F},                                                // largest finite bf16
      {FLT_MIN, 0x0080},       {1e-45f, 0x0000},                              // f32 subnormals
  };
  // clang-format on
  for (const auto& c : cases) EXPECT_EQ(f32_to_bf16_bits(c.x), c.bits) << "x = " << c.x;
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(kNaN))));
  // A NaN whose payload sits only in the dropped bits must not become infinity.
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(float_from_bits(0x7F800001)))));
  EXPECT_TRUE(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(float_from_bits(0xFF800001)))));
}

// ---- e4m3 ---------------------------------------------------------------------------------------

TEST(NumericE4M3, EveryBitPatternDecodesAndRoundTrips) {
  for (uint32_t b = 0; b < 256; ++b) {
    const auto bits = static_cast<uint8_t>(b);
    const float f = e4m3_bits_to_f32(bits);
    ASSERT_TRUE(same_value(f, decode_e4m3(bits))) << std::hex << b;
    if ((b & 0x7F) == 0x7F) {  // S.1111.111: the only NaNs; e4m3 has no infinities
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      continue;
    }
    ASSERT_TRUE(std::isfinite(f)) << std::hex << b;
    ASSERT_EQ(f32_to_e4m3_bits(f), bits) << std::hex << b;
  }
  // Positive codes 0x00..0x7E are strictly increasing: the encoding is monotonic.
  for (uint32_t b = 0; b < 0x7E; ++b)
    ASSERT_LT(e4m3_bits_to_f32(static_cast<uint8_t>(b)),
              e4m3_bits_to_f32(static_cast<uint8_t>(b + 1)));
}

TEST(NumericE4M3, EveryMidpointRoundsToNearestEven) {
  for (uint32_t b = 0; b < 0x7E; ++b) {
    const double lo = decode_e4m3(static_cast<uint8_t>(b));
    const double hi = decode_e4m3(static_cast<uint8_t>(b + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);
    const uint8_t even = static_cast<uint8_t>((b & 1) ? b + 1 : b);
    for (float sign : {1.0f, -1.0f}) {
      const uint8_t s = sign < 0 ? 0x80 : 0;
      ASSERT_EQ(f32_to_e4m3_bits(sign * mid), even | s) << std::hex << b;
      ASSERT_EQ(f32_to_e4m3_bits(sign * std::nextafter(mid, 0.0f)), b | s) << std::hex << b;
      ASSERT_EQ(f32_to_e4m3_bits(sign * std::nextafter(mid, kInf)), (b + 1) | s) << std::hex << b;
    }
  }
}

TEST(NumericE4M3, SaturatesToPlusMinus448AndMapsNaNTo0x7F) {
  // satfinite: beyond the largest finite value (including what RNE would round up to 512 and
  // the infinities) the result is ±448, never NaN.
  for (float x : {448.0f, 449.0f, 463.9f, 464.0f, 480.0f, 512.0f, 1e6f, FLT_MAX, kInf}) {
    EXPECT_EQ(f32_to_e4m3_bits(x), 0x7E) << x;
    EXPECT_EQ(f32_to_e4m3_bits(-x), 0xFE) << -x;
  }
  EXPECT_EQ(f32_to_e4m3_bits(kNaN), 0x7F);
  EXPECT_EQ(f32_to_e4m3_bits(-kNaN), 0x7F);
  EXPECT_EQ(e4m3_bits_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_bits_to_f32(0xFE), -448.0f);
}

TEST(NumericE4M3, RandomF32ValuesRoundLikeExactArithmetic) {
  test::Rng rng;
  for (int i = 0; i < 300000; ++i) {
    const float x = random_f32(rng, -12, 10);
    const uint8_t got = f32_to_e4m3_bits(x);
    if (std::isnan(x)) {
      ASSERT_EQ(got, 0x7F);
      continue;
    }
    ASSERT_TRUE(same_value(decode_e4m3(got), expected_e4m3(x)))
        << "x = " << x << " (bits 0x" << std::hex << bits_from_float(x) << ") -> 0x" << +got;
  }
}

TEST(NumericE4M3, GoldenValues) {
  // clang-format off
  const struct { float x; uint8_t bits; } cases[] = {
      {0.0f, 0x00},        {-0.0f, 0x80},        {1.0f, 0x38},         {-1.0f, 0xB8},
      {1.125f, 0x39},      {1.0625f, 0x38},      {1.1875f, 0x3A},      // ties → 1 and 1.25
      {0.015625f, 0x08},   {0.013671875f, 0x07},                        // 2^-6; 7·2^-9 subnormal
      {0.001953125f, 0x01}, {0.0009765625f, 0x00},                      // 2^-9; 2^-10: tie → 0
      {0.0029296875f, 0x02},                                            // 1.5 · 2^-9: tie → 2
      {240.0f, 0x77},      {248.0f, 0x78},       {256.0f, 0x78},       // 248: tie → 256 (even)
      {416.0f, 0x7D},      {432.0f, 0x7E},       {-3.5f, 0xC6},        // 432: tie → 448 (even)
      {1e-20f, 0x00},      {-1e-20f, 0x80},
  };
  // clang-format on
  for (const auto& c : cases) EXPECT_EQ(f32_to_e4m3_bits(c.x), c.bits) << "x = " << c.x;
}

// ---- round_to_dtype, round_half_even, element access --------------------------------------------

TEST(NumericRounding, RoundToDtypeIsEncodeThenDecode) {
  test::Rng rng;
  for (int i = 0; i < 20000; ++i) {
    const float x = random_f32(rng, -20, 20);
    if (std::isnan(x)) continue;
    EXPECT_TRUE(same_value(round_to_dtype(x, DType::f32), x));
    ASSERT_TRUE(same_value(round_to_dtype(x, DType::f16), expected_ieee(x, kF16))) << x;
    ASSERT_TRUE(same_value(round_to_dtype(x, DType::bf16), expected_ieee(x, kBF16))) << x;
    ASSERT_TRUE(same_value(round_to_dtype(x, DType::e4m3), expected_e4m3(x))) << x;
  }
  for (DType t : {DType::s8, DType::u8, DType::s4, DType::u4, DType::s32})
    EXPECT_TRUE(test::throws_error([&] { round_to_dtype(1.0f, t); }, ErrorCode::invalid_argument,
                                   {"nibble::round_to_dtype", "float type", to_string(t)}));
}

TEST(NumericRounding, RoundHalfEven) {
  // clang-format off
  const struct { float x, want; } cases[] = {
      {0.5f, 0.0f}, {1.5f, 2.0f}, {2.5f, 2.0f}, {3.5f, 4.0f}, {-0.5f, -0.0f}, {-1.5f, -2.0f},
      {-2.5f, -2.0f}, {0.49999997f, 0.0f}, {2.5000002f, 3.0f}, {126.5f, 126.0f}, {127.5f, 128.0f},
      {-7.5f, -8.0f}, {-6.5f, -6.0f}, {8388609.0f, 8388609.0f},
  };
  // clang-format on
  for (const auto& c : cases) {
    EXPECT_EQ(round_half_even(c.x), c.want) << c.x;
    EXPECT_EQ(std::signbit(round_half_even(c.x)), std::signbit(c.want)) << c.x;
  }
}

TEST(NumericAccess, IntegerStoreAndLoadEveryDtypeAndNibble) {
  // Element 2i is the low nibble of byte i; s4 loads sign-extend, u4 loads do not.
  uint8_t bytes[2] = {0, 0};
  store_int(bytes, DType::s4, 0, -1);
  store_int(bytes, DType::s4, 1, 3);
  store_int(bytes, DType::s4, 2, -8);
  store_int(bytes, DType::s4, 3, 7);
  EXPECT_EQ(bytes[0], 0x3F);
  EXPECT_EQ(bytes[1], 0x78);
  EXPECT_EQ(load_int(bytes, DType::s4, 0), -1);
  EXPECT_EQ(load_int(bytes, DType::s4, 1), 3);
  EXPECT_EQ(load_int(bytes, DType::s4, 2), -8);
  EXPECT_EQ(load_int(bytes, DType::s4, 3), 7);
  EXPECT_EQ(load_int(bytes, DType::u4, 0), 15);
  EXPECT_EQ(load_int(bytes, DType::u4, 2), 8);
  // Writing one nibble keeps its neighbour.
  store_int(bytes, DType::u4, 1, 0xA);
  EXPECT_EQ(bytes[0], 0xAF);
  int8_t s8[2];
  store_int(s8, DType::s8, 1, -128);
  EXPECT_EQ(load_int(s8, DType::s8, 1), -128);
  uint8_t u8[1];
  store_int(u8, DType::u8, 0, 255);
  EXPECT_EQ(load_int(u8, DType::u8, 0), 255);
  int32_t s32[1];
  store_int(s32, DType::s32, 0, std::numeric_limits<int32_t>::min());
  EXPECT_EQ(load_int(s32, DType::s32, 0), std::numeric_limits<int32_t>::min());
}

TEST(NumericAccess, FloatStoreRoundsToTheDtype) {
  uint16_t h[1];
  store_float(h, DType::f16, 0, 0.1f);
  EXPECT_EQ(h[0], 0x2E66);
  EXPECT_EQ(load_float(h, DType::f16, 0), f16_bits_to_f32(0x2E66));
  store_float(h, DType::bf16, 0, 0.1f);
  EXPECT_EQ(h[0], 0x3DCD);
  uint8_t e[1];
  store_float(e, DType::e4m3, 0, 1000.0f);
  EXPECT_EQ(e[0], 0x7E);
  EXPECT_EQ(load_float(e, DType::e4m3, 0), 448.0f);
  float f[1];
  store_float(f, DType::f32, 0, 0.1f);
  EXPECT_EQ(load_float(f, DType::f32, 0), 0.1f);
}

}  // namespace
}  // namespace nibble
