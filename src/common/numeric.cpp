// Host conversions between f32 and f16 / bf16 / e4m3, round to nearest even.
//
// The f16 conversion follows the well-known branch structure (F. Giesen, "half to float done
// quic"): normal values round by adding 0xFFF plus the lowest kept mantissa bit before the
// shift; subnormal results are produced by a float addition of a magic number that aligns the
// mantissa, so the FPU performs the round-to-nearest-even itself. This needs IEEE semantics:
// nibble is never built with fast-math.
#include "nibble/numeric.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "common/check.h"

namespace nibble {

namespace {
uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
}  // namespace

uint16_t f32_to_f16_bits(float x) {
  constexpr uint32_t kF32Inf = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;  // 2^16: rounds to inf or beyond
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u = bits_of(x);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t h;
  if (u >= kF16Overflow) {
    h = (u > kF32Inf) ? 0x7E00 : 0x7C00;  // NaN stays a (quiet) NaN, the rest overflow to inf
  } else if (u < (113u << 23)) {  // below 2^-14: the result is subnormal or zero
    h = static_cast<uint16_t>(bits_of(float_of(u) + float_of(kDenormMagic)) - kDenormMagic);
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFu;  // rebias exponent, round half up
    u += mant_odd;                                          // ... ties to even
    h = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(h | (sign >> 16));
}

float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return float_of(bits_of(v) | sign);
  }
  if (exp == 31) return float_of(sign | 0x7F800000u | (mant << 13));
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t f32_to_bf16_bits(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // qNaN
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float bf16_bits_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

// OCP e4m3 ("FN"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent 0 is subnormal
// (m · 2^-9); S.1111.111 is NaN; no infinities; largest finite 1.75 · 2^8 = 448.
uint8_t f32_to_e4m3_bits(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;  // satfinite: everything beyond the largest finite
  if (a < 0.015625f) {                  // below 2^-6: subnormal grid of 2^-9
    const int m = static_cast<int>(round_half_even(a * 512.0f));  // m == 8 is 2^-6, exp 1
    return static_cast<uint8_t>(sign | m);
  }
  int e;
  const float frac = std::frexp(a, &e);  // a = frac · 2^e, frac ∈ [0.5, 1)
  int exp = e - 1;                        // a = (2·frac) · 2^exp
  int m = static_cast<int>(round_half_even((2.0f * frac - 1.0f) * 8.0f));
  if (m == 8) {  // the mantissa rounded up into the next binade
    m = 0;
    ++exp;
  }
  // a < 448 so at most exp 8 with m ≤ 6 (448 itself is handled above).
  return static_cast<uint8_t>(sign | ((exp + 7) << 3) | m);
}

float e4m3_bits_to_f32(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xF;
  const int m = b & 0x7;
  if (exp == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  if (exp == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, exp - 7);
}

float round_to_dtype(float x, DType t) {
  switch (t) {
    case DType::f32: return x;
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(x));
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(x));
    case DType::e4m3: return e4m3_bits_to_f32(f32_to_e4m3_bits(x));
    default:
      detail::fail(ErrorCode::invalid_argument,
                   std::string("nibble::round_to_dtype: dtype must be a float type, got ") +
                       to_string(t));
  }
}

float load_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f16: return f16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::bf16: return bf16_bits_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::e4m3: return e4m3_bits_to_f32(static_cast<const uint8_t*>(base)[i]);
    case DType::f64: return static_cast<float>(static_cast<const double*>(base)[i]);
    default:
      detail::fail(ErrorCode::internal,
                   std::string("nibble::load_float: not a float dtype: ") + to_string(t));
  }
}

void store_float(void* base, DType t, int64_t i, float x) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = x; return;
    case DType::f16: static_cast<uint16_t*>(base)[i] = f32_to_f16_bits(x); return;
    case DType::bf16: static_cast<uint16_t*>(base)[i] = f32_to_bf16_bits(x); return;
    case DType::e4m3: static_cast<uint8_t*>(base)[i] = f32_to_e4m3_bits(x); return;
    case DType::f64: static_cast<double*>(base)[i] = x; return;
    default:
      detail::fail(ErrorCode::internal,
                   std::string("nibble::store_float: not a float dtype: ") + to_string(t));
  }
}

int32_t load_int(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::s8: return static_cast<const int8_t*>(base)[i];
    case DType::u8: return static_cast<const uint8_t*>(base)[i];
    case DType::s32: return static_cast<const int32_t*>(base)[i];
    case DType::s4:
    case DType::u4: {
      const uint8_t byte = static_cast<const uint8_t*>(base)[i >> 1];
      const int nib = (i & 1) ? (byte >> 4) : (byte & 0xF);
      return (t == DType::s4 && nib >= 8) ? nib - 16 : nib;
    }
    default:
      detail::fail(ErrorCode::internal,
                   std::string("nibble::load_int: not an integer dtype: ") + to_string(t));
  }
}

void store_int(void* base, DType t, int64_t i, int32_t v) {
  switch (t) {
    case DType::s8: static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v); return;
    case DType::u8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); return;
    case DType::s32: static_cast<int32_t*>(base)[i] = v; return;
    case DType::s4:
    case DType::u4: {
      uint8_t& byte = static_cast<uint8_t*>(base)[i >> 1];
      const uint8_t nib = static_cast<uint8_t>(v) & 0xF;
      byte = (i & 1) ? static_cast<uint8_t>((byte & 0x0F) | (nib << 4))
                     : static_cast<uint8_t>((byte & 0xF0) | nib);
      return;
    }
    default:
      detail::fail(ErrorCode::internal,
                   std::string("nibble::store_int: not an integer dtype: ") + to_string(t));
  }
}

}  // namespace nibble
