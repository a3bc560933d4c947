// nibble — the format catalogue.
//
// A *logical format* says what numbers a quantized tensor holds and how to turn them back into
// real numbers. It is independent of any kernel's packed layout (those are private, see
// docs/layouts.md). The CPU reference in src/cpu/ is the normative definition of every format;
// docs/formats.md has the bit tables. One GEMM convention throughout:
//
//     D[M,N] = A[M,K] · W[N,K]ᵀ (+ bias[N])      A = activations (row-major), W like nn.Linear
//
// Canonical format strings (used by C++, Python, files, tests and bench JSON):
//
//   weights                      linear (weights × activations)
//   w4_pc        int4 sym/chan   w4a8_pc  w4a8_g128  w4a8_g128_2level  w4afp8_pc  w4afp8_g128
//   w4_g128      int4 sym/group  w4a16_pc  w4a16_g128  w4a16_g128_asym  w4a16_g128_fzp
//   w4_g128_asym uint4 + int zp  w8a8  w8a16  w4a4_pc  w4a4_g128
//   w4_g128_fzp  uint4 + float zp     (_static after a8 formats: per-tensor static activations,
//   w4_g128_2level two-level int      e.g. w8a8_static; _sf32/_sf16/_sbf16: scale dtype when it
//   w8_pc        int8 sym/chan        is not the default)
//
// The group size in a string may be 32, 64, 128 or 256.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "nibble/types.h"

namespace nibble {

/// How weights W[N,K] are quantized. `s` is a float scale, `q` the stored integer.
enum class WeightScheme : uint8_t {
  s4_sym,     ///< int4 q ∈ [-8, 7]:                w = s·q
  u4_asym,    ///< uint4 q ∈ [0, 15], int zero z:   w = s·(q − z), z ∈ [0, 15] stored as u8
  u4_fzp,     ///< uint4 q, float zero z (tinygemm): w = s·(q − 8) + z
  s8_sym,     ///< int8 q ∈ [-128, 127]:             w = s·q
  s4_two_level,  ///< QServe progressive: w = s_ch[n] · w8, w8 = g_s·(q − g_z) ∈ [-128, 127],
                 ///< q uint4, g_s ∈ [1, 255] and g_z ∈ [0, 15] per group, both u8.
};

/// A weight format: scheme, granularity and the dtype of the float scales (and float zeros).
struct WeightFormat {
  WeightScheme scheme = WeightScheme::s4_sym;
  int group_size = 0;               ///< 0: per output channel; else 32, 64, 128 or 256 along K
  DType scale_dtype = DType::f32;   ///< f32, f16 or bf16

  bool per_channel() const { return group_size == 0; }
  bool operator==(const WeightFormat&) const = default;
};

/// How activations A[M,K] are quantized (or not).
enum class ActScheme : uint8_t {
  none,            ///< f32/f16/bf16 used as they are (the "A16" formats)
  s8_per_token,    ///< dynamic symmetric int8, f32 scale per row: a = s[m]·q, q ∈ [-127, 127]
  s8_per_tensor,   ///< static symmetric int8, one calibrated f32 scale for the whole tensor
  s4_per_token,    ///< dynamic symmetric int4, f32 scale per row, q ∈ [-7, 7] (stored as s4)
  e4m3_per_token,  ///< dynamic fp8 e4m3, f32 scale per row: a = s[m]·q, |q| ≤ 448
};

/// A weight format paired with an activation scheme: what a quantized linear layer computes.
struct LinearFormat {
  WeightFormat weight;
  ActScheme act = ActScheme::s8_per_token;
  bool operator==(const LinearFormat&) const = default;
};

const char* to_string(WeightScheme s);
const char* to_string(ActScheme s);
std::string to_string(const WeightFormat& f);  ///< e.g. "w4_g128_asym"
std::string to_string(const LinearFormat& f);  ///< e.g. "w4a8_g128_2level"
/// Parse canonical strings; throw nibble::Error(invalid_argument) naming what is wrong.
WeightFormat parse_weight_format(std::string_view s);
LinearFormat parse_linear_format(std::string_view s);

/// The default scale dtype of a weight format: f32 per channel, bf16 per group.
DType default_scale_dtype(WeightScheme s, int group_size);

/// Storage dtype of the quantized weight values: s4, u4 or s8.
DType weight_value_dtype(WeightScheme s);
/// Range of the stored weight integers (for s4_two_level: of the uint4 q).
int weight_qmin(WeightScheme s);
int weight_qmax(WeightScheme s);
/// Storage dtype of quantized activations (s8, s4 or e4m3); f32 for ActScheme::none.
DType act_value_dtype(ActScheme s);

/// Stored bits per weight element including scales and zero points, for a K-long row.
double effective_bits_per_weight(const WeightFormat& f, int64_t k);

/// Whether the catalogue defines this weights × activations pair (docs/formats.md, table 3).
bool is_valid(const LinearFormat& f);

/// Largest K for which an int32 accumulation of a·w over K products cannot overflow, for
/// integer operand dtypes a, w ∈ {s8, s4, u4} (|a|max·|w|max·K ≤ 2³¹−1).
int64_t max_int32_accumulation_k(DType a, DType w);

/// Group sizes accepted by group-wise formats.
bool is_valid_group_size(int g);

}  // namespace nibble
