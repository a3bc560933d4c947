// Shared helpers of the C++ test suite, for CPU and GPU tests alike:
//
//   * every tolerance of the suite, named, in one place (section 1);
//   * `Rng`: a random engine with a fresh seed that is printed with any failure (section 2);
//   * element access and float decoders written here from the format definitions, so that the
//     references below do not share code with src/ (section 3);
//   * random and structured operands as nibble::Tensor (section 4);
//   * references: a naive int64 GEMM and float64 dequantization / linear (section 5);
//   * comparison metrics (relative Frobenius error, scale-invariant max-abs) and checks that a
//     call throws the documented nibble::Error without touching its outputs (section 6).
//
// Reproducing a failure: the trace of a failing test prints "random seed S"; run the test again
// with the environment variable NIBBLE_TEST_SEED=S and every Rng of that test uses seed S.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <random>
#include <source_location>
#include <string>
#include <vector>

#include "nibble/nibble.h"

namespace nibble::test {

// ---- 1. Tolerances ------------------------------------------------------------------------------

/// Bounds that hold in exact arithmetic can be exceeded by the f32 arithmetic of the quantizers
/// and dequantizers (a division, a product, a sum): allow this many f32 epsilons of the largest
/// magnitude involved (the group's max |w|, or max |x| of the row).
inline constexpr double kF32Slack = 8.0 * FLT_EPSILON;

/// A float output compared with a float64 reference computed from the same operands.
/// Both numbers are scale-invariant: `rel_frob` bounds ‖got − ref‖_F / ‖ref‖_F and `max_abs`
/// bounds max |got − ref| / max |ref|.
struct Tolerance {
  double rel_frob;
  double max_abs;
};

/// linear() against the float64 reference on the same quantized operands. The reference
/// accumulates in f32 (integer partial sums exactly), so f32 outputs differ only by f32
/// rounding of scales, group sums and, for A16/fp8, of the products and the K-long sum.
inline constexpr Tolerance kLinearTolF32 = {1e-5, 2e-5};  // measured 6e-7 and 1.7e-6 (A16)
/// f16 outputs: the final rounding dominates; it is at most half a step, 2^-11 relative at the
/// bottom of a binade (measured max-abs 4.8e-4).
inline constexpr Tolerance kLinearTolF16 = {1e-3, 1e-3};
/// bf16 outputs: likewise at most 2^-8 = 3.9e-3 relative (measured max-abs 3.8e-3).
inline constexpr Tolerance kLinearTolBF16 = {5e-3, 5e-3};

inline Tolerance linear_tolerance(DType out) {
  switch (out) {
    case DType::f16:
      return kLinearTolF16;
    case DType::bf16:
      return kLinearTolBF16;
    default:
      return kLinearTolF32;
  }
}

/// End-to-end quantization error: linear(q(x), q(w)) against x·wᵀ in float64, relative
/// Frobenius, for Gaussian weights and activations (M=16, N=64, K=1024). These bound the
/// *format*, not the arithmetic: a scale off by a factor of two or a lost zero point exceeds
/// them, while the rounding noise of the format stays inside (largest of 15 seeds × every
/// format of the class, in parentheses).
inline constexpr double kQuantNoiseW8A16 = 0.012;  ///< int8 weights, float activations (0.0086)
inline constexpr double kQuantNoiseW8A8 = 0.02;    ///< int8 weights and activations (0.0141)
inline constexpr double kQuantNoiseW4 = 0.2;       ///< int4 weights, 8-bit or float acts (0.154)
inline constexpr double kQuantNoiseW4A4 = 0.3;     ///< int4 weights, int4 activations (0.222)

inline double quantization_noise_tolerance(const LinearFormat& f) {
  const bool w8 = f.weight.scheme == WeightScheme::s8_sym;
  if (f.act == ActScheme::s4_per_token) return kQuantNoiseW4A4;
  if (w8) return f.act == ActScheme::none ? kQuantNoiseW8A16 : kQuantNoiseW8A8;
  return kQuantNoiseW4;
}

// ---- 2. Seeds -----------------------------------------------------------------------------------

/// A std::mt19937 seeded from std::random_device (or from NIBBLE_TEST_SEED when set). While it
/// lives, every failure of the test prints its seed. Create one per test.
class Rng {
 public:
  explicit Rng(std::source_location where = std::source_location::current())
      : Rng(initial_seed(), where) {}
  explicit Rng(uint32_t seed, std::source_location where = std::source_location::current())
      : seed_(seed),
        trace_(where.file_name(), static_cast<int>(where.line()),
               "random seed " + std::to_string(seed) +
                   " (rerun with NIBBLE_TEST_SEED=" + std::to_string(seed) + " to reproduce)"),
        engine_(seed) {}

  uint32_t seed() const { return seed_; }
  std::mt19937& engine() { return engine_; }

  double normal(double sigma = 1.0) {
    return std::normal_distribution<double>(0.0, sigma)(engine_);
  }
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(engine_);
  }
  int64_t uniform_int(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }

 private:
  static uint32_t initial_seed() {
    if (const char* s = std::getenv("NIBBLE_TEST_SEED"); s != nullptr && *s != '\0')
      return static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
    return std::random_device{}();
  }

  uint32_t seed_;
  ::testing::ScopedTrace trace_;
  std::mt19937 engine_;
};

// ---- 3. Element access and decoders (independent of src/) ---------------------------------------

/// f16 bits → value, from the IEEE binary16 definition (bias 15, 10 mantissa bits).
inline double decode_f16(uint16_t h) {
  const int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
  double v;
  if (exp == 0)
    v = std::ldexp(mant, -24);
  else if (exp == 31)
    v = mant != 0 ? std::numeric_limits<double>::quiet_NaN()
                  : std::numeric_limits<double>::infinity();
  else
    v = std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -v : v;
}

/// bf16 bits → value: by definition the upper half of a binary32.
inline double decode_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// OCP e4m3 ("FN") bits → value: bias 7, 3 mantissa bits, S.1111.111 is NaN, no infinities.
inline double decode_e4m3(uint8_t b) {
  const int exp = (b >> 3) & 0xF, mant = b & 0x7;
  if (exp == 15 && mant == 7) return std::numeric_limits<double>::quiet_NaN();
  const double v = exp == 0 ? std::ldexp(mant, -9) : std::ldexp(8 + mant, exp - 10);
  return (b & 0x80) ? -v : v;
}

/// Element offset of (r, c) in a rank-1 (c ignored) or rank-2 strided view.
inline int64_t offset_of(const TensorView& t, int64_t r, int64_t c) {
  return t.rank == 1 ? r * t.stride(0) : r * t.stride(0) + c * t.stride(1);
}

/// Integer element (r, c) of an s8/u8/s4/u4/s32 view; 4-bit: element 2i in the low nibble.
inline int32_t int_at(const TensorView& t, int64_t r, int64_t c = 0) {
  const auto* bytes = static_cast<const uint8_t*>(t.data);
  const int64_t i = offset_of(t, r, c);
  switch (t.dtype) {
    case DType::s8:
      return static_cast<int8_t>(bytes[i]);
    case DType::u8:
      return bytes[i];
    case DType::s32: {
      int32_t v;
      std::memcpy(&v, bytes + 4 * i, 4);
      return v;
    }
    case DType::s4:
    case DType::u4: {
      const int nib = (bytes[i / 2] >> (4 * (i % 2))) & 0xF;
      return t.dtype == DType::s4 && nib >= 8 ? nib - 16 : nib;
    }
    default:
      ADD_FAILURE() << "int_at: not an integer dtype";
      return 0;
  }
}

/// Writes an integer element (r, c); the value must fit the dtype.
inline void put_int(const TensorView& t, int64_t r, int64_t c, int32_t v) {
  auto* bytes = static_cast<uint8_t*>(t.data);
  const int64_t i = offset_of(t, r, c);
  switch (t.dtype) {
    case DType::s8:
    case DType::u8:
      bytes[i] = static_cast<uint8_t>(v);
      return;
    case DType::s32:
      std::memcpy(bytes + 4 * i, &v, 4);
      return;
    case DType::s4:
    case DType::u4: {
      const int shift = 4 * static_cast<int>(i % 2);
      bytes[i / 2] = static_cast<uint8_t>((bytes[i / 2] & ~(0xF << shift)) | ((v & 0xF) << shift));
      return;
    }
    default:
      ADD_FAILURE() << "put_int: not an integer dtype";
  }
}

/// Float element (r, c) of an f32/f16/bf16/e4m3 view, decoded here (not by nibble).
inline double float_at(const TensorView& t, int64_t r, int64_t c = 0) {
  const auto* bytes = static_cast<const uint8_t*>(t.data);
  const int64_t i = offset_of(t, r, c);
  switch (t.dtype) {
    case DType::f32: {
      float f;
      std::memcpy(&f, bytes + 4 * i, 4);
      return f;
    }
    case DType::f16:
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, bytes + 2 * i, 2);
      return t.dtype == DType::f16 ? decode_f16(h) : decode_bf16(h);
    }
    case DType::e4m3:
      return decode_e4m3(bytes[i]);
    default:
      ADD_FAILURE() << "float_at: not a float dtype";
      return 0.0;
  }
}

/// Writes x rounded to the view's float dtype (with nibble's RNE conversions, tested in
/// test_numeric.cpp).
inline void put_float(const TensorView& t, int64_t r, int64_t c, double x) {
  store_float(t.data, t.dtype, offset_of(t, r, c), static_cast<float>(x));
}

/// A rank-2 matrix as float64, row-major (integer or float dtype).
inline std::vector<double> matrix_f64(const TensorView& t) {
  std::vector<double> out(static_cast<size_t>(t.size(0) * t.size(1)));
  for (int64_t r = 0; r < t.size(0); ++r)
    for (int64_t c = 0; c < t.size(1); ++c)
      out[static_cast<size_t>(r * t.size(1) + c)] =
          is_float(t.dtype) ? float_at(t, r, c) : static_cast<double>(int_at(t, r, c));
  return out;
}

// ---- 4. Operands --------------------------------------------------------------------------------

/// Gaussian (rows, cols) of a float dtype, values rounded to the dtype.
inline Tensor random_normal(DType dtype, int64_t rows, int64_t cols, Rng& rng, double sigma = 1.0) {
  Tensor t = Tensor::empty(dtype, {rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) put_float(t.view(), r, c, rng.normal(sigma));
  return t;
}

/// A weight of `format` quantized (round to nearest) from Gaussian values of deviation `sigma`.
inline QuantizedWeight random_quantized_weight(const WeightFormat& format, int64_t n, int64_t k,
                                               Rng& rng, double sigma = 0.02) {
  QuantizedWeight qw(format, n, k);
  quantize_weight(random_normal(DType::f32, n, k, rng, sigma).view(), qw.view());
  return qw;
}

/// Gaussian activations with one outlier channel (30×), as in LLM activations.
inline Tensor random_activations(DType dtype, int64_t rows, int64_t cols, Rng& rng) {
  Tensor t = Tensor::empty(dtype, {rows, cols});
  const int64_t outlier = rng.uniform_int(0, cols - 1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      put_float(t.view(), r, c, rng.normal() * (c == outlier ? 30.0 : 1.0));
  return t;
}

/// Uniform integers in [lo, hi] of an integer dtype.
inline Tensor random_int(DType dtype, int64_t rows, int64_t cols, Rng& rng, int lo, int hi) {
  Tensor t = Tensor::empty(dtype, {rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      put_int(t.view(), r, c, static_cast<int32_t>(rng.uniform_int(lo, hi)));
  return t;
}

/// Integer range of a dtype: s8 [-128, 127], u8 [0, 255], s4 [-8, 7], u4 [0, 15].
inline std::pair<int, int> int_range(DType dtype) {
  switch (dtype) {
    case DType::s8:
      return {-128, 127};
    case DType::u8:
      return {0, 255};
    case DType::s4:
      return {-8, 7};
    case DType::u4:
      return {0, 15};
    default:
      return {std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()};
  }
}

/// Uniform integers over the whole range of the dtype (extremes included).
inline Tensor random_int(DType dtype, int64_t rows, int64_t cols, Rng& rng) {
  const auto [lo, hi] = int_range(dtype);
  return random_int(dtype, rows, cols, rng, lo, hi);
}

/// (rows, cols) with every element equal to v (byte-filled for 8- and 4-bit dtypes, which
/// keeps tensors of millions of elements cheap).
inline Tensor filled_int(DType dtype, int64_t rows, int64_t cols, int32_t v) {
  Tensor t = Tensor::empty(dtype, {rows, cols});
  if (dtype_bits(dtype) == 8) {
    t.fill_bytes(static_cast<uint8_t>(v));
  } else if (dtype_bits(dtype) == 4) {
    t.fill_bytes(static_cast<uint8_t>((v & 0xF) | ((v & 0xF) << 4)));
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) put_int(t.view(), r, c, v);
  }
  return t;
}

/// A (1, n) tensor seen as the rank-1 (n) vector a bias is.
inline TensorView as_vector(const Tensor& t) {
  TensorView v = t.view();
  v.rank = 1;
  v.shape = {t.view().numel(), 0, 0, 0};
  v.strides = {1, 0, 0, 0};
  return v;
}

/// A (1, K) SmoothQuant divisor: positive, log-uniform in [1/8, 8], rounded to the dtype.
inline Tensor random_smooth(DType dtype, int64_t k, Rng& rng) {
  Tensor t = Tensor::empty(dtype, {1, k});
  for (int64_t c = 0; c < k; ++c) put_float(t.view(), 0, c, std::exp2(rng.uniform(-3.0, 3.0)));
  return t;
}

/// A (1, K) RMSNorm weight: Gaussian around 1 (a few negative), rounded to the dtype.
inline Tensor random_rms_weight(DType dtype, int64_t k, Rng& rng) {
  Tensor t = Tensor::empty(dtype, {1, k});
  for (int64_t c = 0; c < k; ++c) put_float(t.view(), 0, c, 1.0 + rng.normal(0.5));
  return t;
}

/// A matrix whose rows are `pitch` elements apart (pitch ≥ cols): `view` is (rows, cols) with
/// row stride `pitch`; the gap between rows holds `poison` bytes so that reading or writing
/// outside the view is visible.
struct Strided {
  Tensor storage;  ///< (rows, pitch) contiguous
  TensorView view;
};

inline Strided strided_copy(const Tensor& src, int64_t pitch, uint8_t poison) {
  const TensorView& s = src.view();
  Strided out{Tensor::empty(s.dtype, {s.size(0), pitch}), {}};
  out.storage.fill_bytes(poison);
  out.view = out.storage.view();
  out.view.shape[1] = s.size(1);
  const int64_t row_bytes = dtype_storage_bytes(s.dtype, s.size(1));
  const int64_t pitch_bytes = dtype_storage_bytes(s.dtype, pitch);
  for (int64_t r = 0; r < s.size(0); ++r)
    std::memcpy(static_cast<uint8_t*>(out.storage.data()) + r * pitch_bytes,
                static_cast<const uint8_t*>(src.data()) + r * row_bytes,
                static_cast<size_t>(row_bytes));
  return out;
}

/// An uninitialised strided (rows, cols) buffer, every byte (gaps included) set to `poison`.
inline Strided strided_empty(DType dtype, int64_t rows, int64_t cols, int64_t pitch,
                             uint8_t poison) {
  Strided out{Tensor::empty(dtype, {rows, pitch}), {}};
  out.storage.fill_bytes(poison);
  out.view = out.storage.view();
  out.view.shape[1] = cols;
  return out;
}

/// The raw bytes of a host tensor.
inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  const auto* p = static_cast<const uint8_t*>(h.data());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

// ---- 5. References ------------------------------------------------------------------------------

/// D (M, N) = A (M, K) · W (N, K)ᵀ exactly, in int64, for integer views of any row stride.
inline std::vector<int64_t> naive_gemm_i64(const TensorView& a, const TensorView& w) {
  const int64_t m_rows = a.size(0), n_cols = w.size(0), k_len = a.size(1);
  std::vector<int64_t> d(static_cast<size_t>(m_rows * n_cols), 0);
  std::vector<int64_t> w_row(static_cast<size_t>(k_len));
  for (int64_t n = 0; n < n_cols; ++n) {
    for (int64_t k = 0; k < k_len; ++k) w_row[static_cast<size_t>(k)] = int_at(w, n, k);
    for (int64_t m = 0; m < m_rows; ++m) {
      int64_t acc = 0;
      for (int64_t k = 0; k < k_len; ++k) acc += int64_t{int_at(a, m, k)} * w_row[size_t(k)];
      d[static_cast<size_t>(m * n_cols + n)] = acc;
    }
  }
  return d;
}

/// Group index of column k (0 for per-channel formats).
inline int64_t group_of(const WeightFormat& f, int64_t k) {
  return f.group_size == 0 ? 0 : k / f.group_size;
}

/// Element (n, k) of deq(W) in float64, from the formulas of formats.h.
inline double dequantized_weight(const QuantizedWeightView& w, int64_t n, int64_t k) {
  const int64_t g = group_of(w.format, k);
  const double q = int_at(w.q, n, k);
  switch (w.format.scheme) {
    case WeightScheme::s4_sym:
    case WeightScheme::s8_sym:
      return float_at(w.scales, n, g) * q;
    case WeightScheme::u4_asym:
      return float_at(w.scales, n, g) * (q - int_at(w.zeros, n, g));
    case WeightScheme::u4_fzp:
      return float_at(w.scales, n, g) * (q - 8) + float_at(w.zeros, n, g);
    case WeightScheme::s4_two_level:
      return float_at(w.scales, n) * int_at(w.group_scales, n, g) * (q - int_at(w.zeros, n, g));
  }
  return std::numeric_limits<double>::quiet_NaN();
}

/// deq(W) (N, K) in float64, row-major.
inline std::vector<double> dequantize_weight_f64(const QuantizedWeightView& w) {
  std::vector<double> out(static_cast<size_t>(w.n * w.k));
  for (int64_t n = 0; n < w.n; ++n)
    for (int64_t k = 0; k < w.k; ++k)
      out[static_cast<size_t>(n * w.k + k)] = dequantized_weight(w, n, k);
  return out;
}

/// deq(A) (M, K) in float64: s[m] · q (s[0] for per-tensor scales).
inline std::vector<double> dequantize_activation_f64(const QuantizedActivationView& a) {
  const int64_t m_rows = a.q.size(0), k_len = a.q.size(1);
  std::vector<double> out(static_cast<size_t>(m_rows * k_len));
  for (int64_t m = 0; m < m_rows; ++m) {
    const double s = float_at(a.scales, a.scheme == ActScheme::s8_per_tensor ? 0 : m);
    for (int64_t k = 0; k < k_len; ++k) {
      const double q = a.q.dtype == DType::e4m3 ? float_at(a.q, m, k) : int_at(a.q, m, k);
      out[static_cast<size_t>(m * k_len + k)] = s * q;
    }
  }
  return out;
}

/// D (M, N) = A (M, K) · W (N, K)ᵀ (+ bias) in float64.
inline std::vector<double> linear_f64(const std::vector<double>& a, const std::vector<double>& w,
                                      int64_t m_rows, int64_t n_cols, int64_t k_len,
                                      const TensorView* bias = nullptr) {
  std::vector<double> d(static_cast<size_t>(m_rows * n_cols));
  for (int64_t m = 0; m < m_rows; ++m)
    for (int64_t n = 0; n < n_cols; ++n) {
      double acc = bias != nullptr ? float_at(*bias, n) : 0.0;
      for (int64_t k = 0; k < k_len; ++k)
        acc += a[static_cast<size_t>(m * k_len + k)] * w[static_cast<size_t>(n * k_len + k)];
      d[static_cast<size_t>(m * n_cols + n)] = acc;
    }
  return d;
}

/// RMSNorm's mean of squares of one row, from docs/formats.md §6.1 (written here, not shared
/// with src/): with max|x| < 2^e and bits = 62 − ceil(log2 K), the terms rne(x² · 2^(bits−2e))
/// are summed as integers and ms = f32(f64(sum) · 2^(2e−bits) · RN64(1/K)); 0 for a zero row.
inline float rms_mean_square(const std::vector<float>& row) {
  const int64_t k = static_cast<int64_t>(row.size());
  float amax = 0;
  for (float v : row) amax = std::max(amax, std::fabs(v));
  if (amax == 0) return 0;
  int e = 0;
  std::frexp(amax, &e);
  int ceil_log2 = 0;
  while ((int64_t{1} << ceil_log2) < k) ++ceil_log2;
  const int bits = 62 - ceil_log2;
  uint64_t sum = 0;
  for (float v : row)
    sum += static_cast<uint64_t>(std::nearbyint(std::ldexp(double(v) * double(v), bits - 2 * e)));
  return static_cast<float>(std::ldexp(static_cast<double>(sum), 2 * e - bits) * (1.0 / double(k)));
}

/// The normalized rows y (M, K) of RMSNorm (docs/formats.md §6.1), row-major, as f32 values of
/// x's dtype: r = 1/sqrt(ms + eps) in f32, y = round_T(round_T(x·r)·w).
inline std::vector<float> rmsnorm_reference(const TensorView& x, const TensorView& w, float eps) {
  const int64_t m_rows = x.size(0), k_cols = x.size(1);
  std::vector<float> y(static_cast<size_t>(m_rows * k_cols)), row(static_cast<size_t>(k_cols));
  for (int64_t m = 0; m < m_rows; ++m) {
    for (int64_t k = 0; k < k_cols; ++k) row[size_t(k)] = static_cast<float>(float_at(x, m, k));
    const float r = 1.0f / std::sqrt(rms_mean_square(row) + eps);
    for (int64_t k = 0; k < k_cols; ++k) {
      const float n = round_to_dtype(row[size_t(k)] * r, x.dtype);
      y[size_t(m * k_cols + k)] =
          round_to_dtype(n * static_cast<float>(float_at(w, k)), x.dtype);
    }
  }
  return y;
}

/// A float matrix (M, K) of `dtype` holding `values` (row-major), each rounded to the dtype.
inline Tensor matrix_of(DType dtype, int64_t m_rows, int64_t k_cols,
                        const std::vector<float>& values) {
  Tensor t = Tensor::empty(dtype, {m_rows, k_cols});
  for (int64_t m = 0; m < m_rows; ++m)
    for (int64_t k = 0; k < k_cols; ++k)
      put_float(t.view(), m, k, values[static_cast<size_t>(m * k_cols + k)]);
  return t;
}

// ---- 6. Comparisons and error checks ------------------------------------------------------------

struct Comparison {
  double rel_frob = 0;     ///< ‖got − ref‖_F / ‖ref‖_F
  double max_abs = 0;      ///< max |got − ref| / max |ref|
  int64_t non_finite = 0;  ///< elements of got that are NaN or ±inf (e.g. never written)
};

/// An empty reference, or got of another size, compares as infinitely far (nothing compared
/// must not pass).
inline Comparison compare(const std::vector<double>& got, const std::vector<double>& ref) {
  Comparison c;
  if (ref.empty() || got.size() != ref.size()) {
    c.rel_frob = c.max_abs = std::numeric_limits<double>::infinity();
    return c;
  }
  double num = 0, den = 0, ref_max = 0, diff_max = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++c.non_finite;
      continue;
    }
    const double e = got[i] - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
    diff_max = std::max(diff_max, std::fabs(e));
    ref_max = std::max(ref_max, std::fabs(ref[i]));
  }
  // A zero reference is compared absolutely.
  c.rel_frob = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  c.max_abs = ref_max > 0 ? diff_max / ref_max : diff_max;
  return c;
}

/// got (a host view, float or integer) against a float64 reference within `tol`.
inline ::testing::AssertionResult is_close(const TensorView& got, const std::vector<double>& ref,
                                           Tolerance tol) {
  const Comparison c = compare(matrix_f64(got), ref);
  if (c.non_finite == 0 && c.rel_frob <= tol.rel_frob && c.max_abs <= tol.max_abs)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "relative Frobenius error " << c.rel_frob << " (limit " << tol.rel_frob
         << "), max-abs error / max |ref| " << c.max_abs << " (limit " << tol.max_abs << "), "
         << c.non_finite << " non-finite elements";
}

/// The same for a tensor on any device (copied to the host first).
inline ::testing::AssertionResult is_close(const Tensor& got, const std::vector<double>& ref,
                                           Tolerance tol) {
  const Tensor host = got.to(Device::cpu());
  return is_close(host.view(), ref, tol);
}

/// Snapshots tensors (outputs of a call that must fail) after filling them with `poison`;
/// `unchanged()` then says whether any byte was written.
class Poisoned {
 public:
  Poisoned(std::initializer_list<Tensor*> tensors, uint8_t poison = 0xA5) {
    for (Tensor* t : tensors) {
      if (!t->defined()) continue;
      t->fill_bytes(poison);
      tensors_.push_back(t);
      before_.push_back(bytes_of(*t));
    }
  }
  ::testing::AssertionResult unchanged() const {
    for (size_t i = 0; i < tensors_.size(); ++i)
      if (bytes_of(*tensors_[i]) != before_[i])
        return ::testing::AssertionFailure() << "output " << tensors_[i]->view().describe()
                                             << " was modified by a call that failed";
    return ::testing::AssertionSuccess();
  }

 private:
  std::vector<const Tensor*> tensors_;
  std::vector<std::vector<uint8_t>> before_;
};

/// "argument 'name'", the way nibble's messages name an argument.
inline std::string arg(const std::string& name) { return "argument '" + name + "'"; }

/// Whether fn() throws nibble::Error with `code` and a message containing every fragment.
template <class Fn>
::testing::AssertionResult throws_error(Fn&& fn, ErrorCode code,
                                        std::initializer_list<std::string> fragments) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (e.code() != code)
      return ::testing::AssertionFailure() << "error code " << to_string(e.code()) << ", expected "
                                           << to_string(code) << ": " << msg;
    for (const std::string& f : fragments)
      if (msg.find(f) == std::string::npos)
        return ::testing::AssertionFailure() << "message lacks \"" << f << "\": " << msg;
    return ::testing::AssertionSuccess() << msg;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a non-nibble exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "no exception, expected " << to_string(code);
}

/// Whether this process can only take the CPU-only error paths for CUDA devices: true in a
/// CPU-only build, and in a CUDA build without a usable device.
inline bool cuda_requests_are_unsupported() { return cuda_device_count() == 0; }

}  // namespace nibble::test

namespace nibble {

// GoogleTest prints parameters with these (found by argument-dependent lookup): test names and
// failure messages then show canonical format strings instead of the bytes of a struct.
inline void PrintTo(const WeightFormat& f, std::ostream* os) { *os << to_string(f); }
inline void PrintTo(const LinearFormat& f, std::ostream* os) { *os << to_string(f); }
inline void PrintTo(ActScheme s, std::ostream* os) { *os << to_string(s); }
inline void PrintTo(WeightScheme s, std::ostream* os) { *os << to_string(s); }
inline void PrintTo(DType t, std::ostream* os) { *os << to_string(t); }

}  // namespace nibble
