// Reference quantizers and dequantizers: the normative definition of each format
// (docs/formats.md). Round half to even everywhere; scales are rounded to their storage dtype
// before the integers are computed, so dequantization uses exactly the stored numbers.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/parallel.h"
#include "cpu/reference.h"
#include "cpu/view_access.h"
#include "nibble/formats.h"
#include "nibble/numeric.h"

namespace nibble::cpu {

namespace {

// The next representable value above x >= 0 in dtype t (f32, f16 or bf16).
float next_up(float x, DType t) {
  switch (t) {
    case DType::f16: return f16_bits_to_f32(static_cast<uint16_t>(f32_to_f16_bits(x) + 1));
    case DType::bf16: return bf16_bits_to_f32(static_cast<uint16_t>(f32_to_bf16_bits(x) + 1));
    default: return std::nextafter(x, std::numeric_limits<float>::infinity());
  }
}

}  // namespace

// Rounds the scale `range / span` to dtype t, then nudges it up until `span` steps cover
// `range`: rounding a scale down would push the extreme values past the integer range.
float stored_scale(float range, float span, DType t, int64_t row) {
  float s = round_to_dtype(range / span, t);
  while (s * span < range) s = next_up(s, t);
  if (!std::isfinite(s))
    detail::fail(ErrorCode::out_of_range,
                 "nibble::quantize_weight: argument 'w' row " + std::to_string(row) +
                     " has a range too large for " + to_string(t) + " scales");
  return s;
}

int quantize_int(float x, float scale, int lo, int hi) {
  if (scale == 0.0f) return 0;
  const float q = round_half_even(x / scale);
  return static_cast<int>(std::clamp(q, static_cast<float>(lo), static_cast<float>(hi)));
}

void quantize_weight(const TensorView& w, const QuantizedWeightView& out) {
  const WeightFormat& f = out.format;
  const int64_t n_rows = out.n, k_cols = out.k;
  const int64_t g = f.per_channel() ? k_cols : f.group_size;
  const int64_t groups = k_cols / g;
  // Rows are independent: ranges of them on host threads (an 8B model has 7e9 weights).
  detail::parallel_rows(n_rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(k_cols));
    for (int64_t n = r0; n < r1; ++n) {
      for (int64_t k = 0; k < k_cols; ++k) {
        row[static_cast<size_t>(k)] = get_float(w, n, k);
        if (!std::isfinite(row[static_cast<size_t>(k)]))
          detail::fail(ErrorCode::invalid_argument,
                       "nibble::quantize_weight: argument 'w' must be finite, got a NaN or "
                       "infinity at (" + std::to_string(n) + ", " + std::to_string(k) + ")");
      }
      if (f.scheme == WeightScheme::s4_two_level) {
        // Level 1: per-channel int8 in the protective range [-119, 119], so that level 2's
        // rounding (at most 8 = 16/2 steps) keeps every reconstructed w8 within int8.
        float amax = 0.0f;
        for (float v : row) amax = std::max(amax, std::fabs(v));
        const float s_ch = stored_scale(amax, 119.0f, f.scale_dtype, n);
        set_float(out.scales, n, 0, s_ch);
        std::vector<int> w8(static_cast<size_t>(k_cols));
        for (int64_t k = 0; k < k_cols; ++k)
          w8[static_cast<size_t>(k)] = quantize_int(row[static_cast<size_t>(k)], s_ch, -119, 119);
        // Level 2: per group, uint4 with integer scale gs ∈ [1, 16] and zero gz ∈ [0, 15].
        for (int64_t gi = 0; gi < groups; ++gi) {
          int lo = 0, hi = 0;
          for (int64_t k = gi * g; k < (gi + 1) * g; ++k) {
            lo = std::min(lo, w8[static_cast<size_t>(k)]);
            hi = std::max(hi, w8[static_cast<size_t>(k)]);
          }
          const int gs = std::max(1, (hi - lo + 14) / 15);  // ceil((hi - lo) / 15)
          const int gz = std::clamp(static_cast<int>(round_half_even(static_cast<float>(-lo) /
                                                                      static_cast<float>(gs))),
                                    0, 15);
          set_int(out.group_scales, n, gi, gs);
          set_int(out.zeros, n, gi, gz);
          for (int64_t k = gi * g; k < (gi + 1) * g; ++k) {
            const float r = round_half_even(static_cast<float>(w8[static_cast<size_t>(k)]) /
                                            static_cast<float>(gs));
            set_int(out.q, n, k, std::clamp(static_cast<int>(r) + gz, 0, 15));
          }
        }
        continue;
      }
      for (int64_t gi = 0; gi < groups; ++gi) {
        const int64_t k0 = gi * g, k1 = k0 + g;
        float lo = 0.0f, hi = 0.0f, amax = 0.0f;
        for (int64_t k = k0; k < k1; ++k) {
          const float v = row[static_cast<size_t>(k)];
          amax = std::max(amax, std::fabs(v));
          if (k == k0 && f.scheme == WeightScheme::u4_fzp) lo = hi = v;
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
        const int64_t sc = f.per_channel() ? 0 : gi;  // column of this group's scale
        switch (f.scheme) {
          case WeightScheme::s4_sym:
          case WeightScheme::s8_sym: {
            const int qmax = weight_qmax(f.scheme);
            const float s = stored_scale(amax, static_cast<float>(qmax), f.scale_dtype, n);
            set_float(out.scales, n, sc, s);
            for (int64_t k = k0; k < k1; ++k)
              set_int(out.q, n, k,
                      quantize_int(row[static_cast<size_t>(k)], s, weight_qmin(f.scheme), qmax));
            break;
          }
          case WeightScheme::u4_asym: {
            // The range includes 0 so that the integer zero point z = round(-lo/s) is in [0, 15].
            const float s = stored_scale(hi - lo, 15.0f, f.scale_dtype, n);
            const int z =
                s == 0.0f ? 0 : std::clamp(static_cast<int>(round_half_even(-lo / s)), 0, 15);
            set_float(out.scales, n, sc, s);
            set_int(out.zeros, n, sc, z);
            for (int64_t k = k0; k < k1; ++k) {
              const int q = quantize_int(row[static_cast<size_t>(k)], s, -1000, 1000) + z;
              set_int(out.q, n, k, std::clamp(q, 0, 15));
            }
            break;
          }
          case WeightScheme::u4_fzp: {
            // tinygemm / torchao FLOAT zero-point domain: zero is the real value at q = 8.
            const float s = stored_scale(hi - lo, 15.0f, f.scale_dtype, n);
            const float zero = round_to_dtype(lo + 8.0f * s, f.scale_dtype);
            set_float(out.scales, n, sc, s);
            set_float(out.zeros, n, sc, zero);
            for (int64_t k = k0; k < k1; ++k) {
              const int q = s == 0.0f ? 8 : quantize_int(row[static_cast<size_t>(k)] - zero, s,
                                                         -1000, 1000) + 8;
              set_int(out.q, n, k, std::clamp(q, 0, 15));
            }
            break;
          }
          case WeightScheme::s4_two_level: break;  // handled above
        }
      }
    }
  });
}

void dequantize_weight_row(const QuantizedWeightView& w, int64_t n, std::vector<int32_t>& q,
                           std::vector<float>& row) {
  load_weight_int_row(w, n, q);
  row.resize(static_cast<size_t>(w.k));
  const WeightFormat& f = w.format;
  const bool per_row = f.per_channel() || f.scheme == WeightScheme::s4_two_level;
  const int64_t g = per_row ? w.k : f.group_size;
  for (int64_t k0 = 0; k0 < w.k; k0 += g) {  // one group: its scale and zero read once
    const int64_t gi = per_row ? 0 : k0 / g;
    const float s = get_float(w.scales, n, gi);
    switch (f.scheme) {
      case WeightScheme::s4_sym:
      case WeightScheme::s8_sym:
      case WeightScheme::s4_two_level:  // q holds w8 = g_s · (q − g_z)
        for (int64_t k = k0; k < k0 + g; ++k)
          row[size_t(k)] = s * static_cast<float>(q[size_t(k)]);
        break;
      case WeightScheme::u4_asym: {
        const int32_t z = get_int(w.zeros, n, gi);
        for (int64_t k = k0; k < k0 + g; ++k)
          row[size_t(k)] = s * static_cast<float>(q[size_t(k)] - z);
        break;
      }
      case WeightScheme::u4_fzp: {  // the float zero is the real value at q = 8
        const float zero = get_float(w.zeros, n, gi);
        for (int64_t k = k0; k < k0 + g; ++k)
          row[size_t(k)] = s * static_cast<float>(q[size_t(k)] - 8) + zero;
        break;
      }
    }
  }
}

void dequantize_weight(const QuantizedWeightView& w, const TensorView& out) {
  std::vector<int32_t> q;
  std::vector<float> row;
  for (int64_t n = 0; n < w.n; ++n) {
    dequantize_weight_row(w, n, q, row);
    for (int64_t k = 0; k < w.k; ++k) set_float(out, n, k, row[size_t(k)]);
  }
}

int rms_fixed_point_bits(int64_t k) {
  int ceil_log2 = 0;
  while ((int64_t{1} << ceil_log2) < k) ++ceil_log2;
  return 62 - ceil_log2;
}

float rms_mean_square(const float* row, int64_t k) {
  float amax = 0.0f;
  for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(row[i]));
  if (amax == 0.0f) return 0.0f;
  // amax < 2^e, so every x² < 2^(2e) and every term below is at most 2^bits; K of them sum to
  // at most 2^62. The sum of integers is exact, so its order does not matter.
  int e = 0;
  std::frexp(amax, &e);
  const int bits = rms_fixed_point_bits(k);
  uint64_t sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    const double sq = static_cast<double>(row[i]) * static_cast<double>(row[i]);  // exact
    sum += static_cast<uint64_t>(std::nearbyint(std::ldexp(sq, bits - 2 * e)));
  }
  // The mean multiplies by RN64(1/K) rather than dividing: one product, the same bits on a GPU
  // without a division subroutine.
  return static_cast<float>(std::ldexp(static_cast<double>(sum), 2 * e - bits) *
                            (1.0 / static_cast<double>(k)));
}

FusedActivation fuse_activation(const TensorView& x, const ActQuantFusion& fusion) {
  FusedActivation a;
  a.m = x.size(0);
  a.k = x.size(1);
  const bool norm = fusion.rms_weight.data != nullptr, smooth = fusion.smooth.data != nullptr;
  a.v.resize(static_cast<size_t>(a.m * a.k));
  if (norm) a.y.resize(a.v.size());
  std::vector<float> row(static_cast<size_t>(a.k));
  for (int64_t m = 0; m < a.m; ++m) {
    for (int64_t k = 0; k < a.k; ++k) row[static_cast<size_t>(k)] = get_float(x, m, k);
    float r = 0.0f;
    if (norm) r = 1.0f / std::sqrt(rms_mean_square(row.data(), a.k) + fusion.rms_eps);
    for (int64_t k = 0; k < a.k; ++k) {
      const size_t i = static_cast<size_t>(m * a.k + k);
      float y = row[static_cast<size_t>(k)];
      if (norm) {
        // Llama: the normalized value is rounded to x's dtype before the weight multiplies it,
        // and the product is rounded to x's dtype again (HF LlamaRMSNorm, vLLM's fused kernels).
        y = round_to_dtype(round_to_dtype(y * r, x.dtype) * get_float(fusion.rms_weight, k, 0),
                           x.dtype);
        a.y[i] = y;
      }
      a.v[i] = smooth ? y / get_float(fusion.smooth, k, 0) : y;
    }
  }
  return a;
}

void quantize_activation(const FusedActivation& a, const QuantizedActivationView& out) {
  const float qmax = out.scheme == ActScheme::s4_per_token     ? 7.0f
                     : out.scheme == ActScheme::e4m3_per_token ? 448.0f
                                                               : 127.0f;
  for (int64_t m = 0; m < a.m; ++m) {
    const float* v = a.v.data() + m * a.k;
    float amax = 0.0f;
    for (int64_t k = 0; k < a.k; ++k) amax = std::max(amax, std::fabs(v[k]));
    const float s = amax / qmax;
    set_float(out.scales, m, 0, s);
    for (int64_t k = 0; k < a.k; ++k) {
      if (out.scheme == ActScheme::e4m3_per_token)
        set_float(out.q, m, k, s == 0.0f ? 0.0f : v[k] / s);  // satfinite rounding in store
      else
        set_int(out.q, m, k,
                quantize_int(v[k], s, -static_cast<int>(qmax), static_cast<int>(qmax)));
    }
  }
}

void quantize_activation_static(const FusedActivation& a, float scale,
                                const QuantizedActivationView& out) {
  set_float(out.scales, 0, 0, scale);
  for (int64_t m = 0; m < a.m; ++m)
    for (int64_t k = 0; k < a.k; ++k)
      set_int(out.q, m, k, quantize_int(a.v[static_cast<size_t>(m * a.k + k)], scale, -127, 127));
}

void store_normed(const FusedActivation& a, const TensorView& normed) {
  for (int64_t m = 0; m < a.m; ++m)
    for (int64_t k = 0; k < a.k; ++k) set_float(normed, m, k, a.y[static_cast<size_t>(m * a.k + k)]);
}

void dequantize_activation(const QuantizedActivationView& a, const TensorView& out) {
  const bool per_tensor = a.scheme == ActScheme::s8_per_tensor;
  for (int64_t m = 0; m < a.q.size(0); ++m) {
    const float s = get_float(a.scales, per_tensor ? 0 : m, 0);
    for (int64_t k = 0; k < a.q.size(1); ++k) {
      const float q = a.scheme == ActScheme::e4m3_per_token
                          ? get_float(a.q, m, k)
                          : static_cast<float>(get_int(a.q, m, k));
      set_float(out, m, k, s * q);
    }
  }
}

void pack_int4(const TensorView& unpacked, const TensorView& packed) {
  for (int64_t r = 0; r < unpacked.size(0); ++r)
    for (int64_t c = 0; c < unpacked.size(1); ++c) set_int(packed, r, c, get_int(unpacked, r, c));
}

void unpack_int4(const TensorView& packed, const TensorView& unpacked) {
  for (int64_t r = 0; r < packed.size(0); ++r)
    for (int64_t c = 0; c < packed.size(1); ++c) set_int(unpacked, r, c, get_int(packed, r, c));
}

}  // namespace nibble::cpu
