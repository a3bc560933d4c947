// Reference GEMMs: D[M,N] = A[M,K] · W[N,K]ᵀ (+ bias). Integer products accumulate exactly in
// int32 (callers guarantee K, or the group size, is within max_int32_accumulation_k), then the
// scales are applied in f32: see gemm.h for the formula of each format.
#include <cstdint>
#include <vector>

#include "cpu/reference.h"
#include "cpu/view_access.h"
#include "nibble/formats.h"

namespace nibble::cpu {

// The row loaders of view_access.h. Contiguous rows of the storage dtypes take a loop without
// the per-element dtype switch of get_int: this unpacking is most of the reference's time (the
// CPU runner's decode steps), and the values are the same.
void load_int_row(const TensorView& t, int64_t r, int64_t cols, std::vector<int32_t>& row) {
  row.resize(static_cast<size_t>(cols));
  int32_t* out = row.data();
  if (t.rank == 2 && t.stride(1) == 1) {
    const int64_t first = r * t.stride(0);  // element index of (r, 0)
    const auto* bytes = static_cast<const uint8_t*>(t.data);
    switch (t.dtype) {
      case DType::s8:
        for (int64_t c = 0; c < cols; ++c) out[c] = static_cast<const int8_t*>(t.data)[first + c];
        return;
      case DType::u8:
        for (int64_t c = 0; c < cols; ++c) out[c] = bytes[first + c];
        return;
      case DType::s4:
      case DType::u4:
        if (first % 2 == 0) {  // rows start on a byte (rows_packed: even strides)
          const uint8_t* p = bytes + first / 2;
          const int32_t sign = t.dtype == DType::s4 ? 8 : 0;  // nib ^ 8 − 8 sign-extends
          int64_t c = 0;
          for (; c + 1 < cols; c += 2) {  // a byte: the low nibble first
            const int32_t byte = p[c >> 1];
            out[c] = ((byte & 0xF) ^ sign) - sign;
            out[c + 1] = ((byte >> 4) ^ sign) - sign;
          }
          if (c < cols) out[c] = ((p[c >> 1] & 0xF) ^ sign) - sign;
          return;
        }
        break;
      default:
        break;
    }
  }
  for (int64_t c = 0; c < cols; ++c) out[c] = get_int(t, r, c);
}

void load_weight_int_row(const QuantizedWeightView& w, int64_t n, std::vector<int32_t>& row) {
  load_int_row(w.q, n, w.k, row);
  if (w.format.scheme != WeightScheme::s4_two_level) return;
  const int64_t g = w.format.group_size;
  for (int64_t k0 = 0; k0 < w.k; k0 += g) {  // w8 = g_s · (q − g_z)
    const int32_t gs = get_int(w.group_scales, n, k0 / g), gz = get_int(w.zeros, n, k0 / g);
    for (int64_t k = k0; k < k0 + g; ++k)
      row[static_cast<size_t>(k)] = gs * (row[static_cast<size_t>(k)] - gz);
  }
}

namespace {

int32_t dot_int(const int32_t* a, const int32_t* w, int64_t len) {
  int32_t acc = 0;
  for (int64_t k = 0; k < len; ++k) acc += a[k] * w[k];
  return acc;
}

void store_output(const TensorView& d, const TensorView* bias, int64_t m, int64_t n, float v) {
  if (bias != nullptr) v += get_float(*bias, n, 0);
  set_float(d, m, n, v);
}

}  // namespace

void gemm_s32(const TensorView& a, const TensorView& w, const TensorView& d) {
  const int64_t m_rows = a.size(0), n_cols = w.size(0), k_len = a.size(1);
  std::vector<std::vector<int32_t>> a_rows(static_cast<size_t>(m_rows));
  for (int64_t m = 0; m < m_rows; ++m) load_int_row(a, m, k_len, a_rows[static_cast<size_t>(m)]);
  std::vector<int32_t> w_row;
  for (int64_t n = 0; n < n_cols; ++n) {
    load_int_row(w, n, k_len, w_row);
    for (int64_t m = 0; m < m_rows; ++m)
      set_int(d, m, n, dot_int(a_rows[static_cast<size_t>(m)].data(), w_row.data(), k_len));
  }
}

void linear(const QuantizedActivationView& a, const QuantizedWeightView& w,
            const TensorView* bias, const TensorView& d) {
  const int64_t m_rows = a.q.size(0), k_len = w.k;
  const bool per_tensor = a.scheme == ActScheme::s8_per_tensor;
  const bool fp8 = a.scheme == ActScheme::e4m3_per_token;
  const int64_t g = w.format.per_channel() || w.format.scheme == WeightScheme::s4_two_level
                        ? k_len
                        : w.format.group_size;
  // Activations as int32 (integer schemes) or f32 (fp8), one row each.
  std::vector<std::vector<int32_t>> a_int(static_cast<size_t>(m_rows));
  std::vector<std::vector<float>> a_f32(static_cast<size_t>(m_rows));
  for (int64_t m = 0; m < m_rows; ++m) {
    if (!fp8) {
      load_int_row(a.q, m, k_len, a_int[static_cast<size_t>(m)]);
      continue;
    }
    auto& row = a_f32[static_cast<size_t>(m)];
    row.resize(static_cast<size_t>(k_len));
    for (int64_t k = 0; k < k_len; ++k) row[static_cast<size_t>(k)] = get_float(a.q, m, k);
  }
  std::vector<int32_t> w_row;
  for (int64_t n = 0; n < w.n; ++n) {
    load_weight_int_row(w, n, w_row);
    for (int64_t m = 0; m < m_rows; ++m) {
      float sum = 0.0f;  // Σ_g s_w[n,g] · partial_g, in f32
      for (int64_t k0 = 0; k0 < k_len; k0 += g) {
        const float s_w = get_float(w.scales, n, g == k_len ? 0 : k0 / g);
        float partial;
        if (fp8) {
          partial = 0.0f;
          const float* ar = a_f32[static_cast<size_t>(m)].data();
          for (int64_t k = k0; k < k0 + g; ++k)
            partial += ar[k] * static_cast<float>(w_row[static_cast<size_t>(k)]);
        } else {
          partial = static_cast<float>(
              dot_int(a_int[static_cast<size_t>(m)].data() + k0, w_row.data() + k0, g));
        }
        sum += s_w * partial;
      }
      const float s_a = get_float(a.scales, per_tensor ? 0 : m, 0);
      store_output(d, bias, m, n, s_a * sum);
    }
  }
}

void linear(const TensorView& x, const QuantizedWeightView& w, const TensorView* bias,
            const TensorView& d) {
  const int64_t m_rows = x.size(0), k_len = w.k;
  std::vector<std::vector<float>> x_rows(static_cast<size_t>(m_rows));
  for (int64_t m = 0; m < m_rows; ++m) {
    auto& row = x_rows[static_cast<size_t>(m)];
    row.resize(static_cast<size_t>(k_len));
    for (int64_t k = 0; k < k_len; ++k) row[static_cast<size_t>(k)] = get_float(x, m, k);
  }
  std::vector<float> w_row;
  std::vector<int32_t> q_row;
  for (int64_t n = 0; n < w.n; ++n) {
    dequantize_weight_row(w, n, q_row, w_row);
    for (int64_t m = 0; m < m_rows; ++m) {
      const float* xr = x_rows[static_cast<size_t>(m)].data();
      float sum = 0.0f;
      for (int64_t k = 0; k < k_len; ++k) sum += xr[k] * w_row[static_cast<size_t>(k)];
      store_output(d, bias, m, n, sum);
    }
  }
}

}  // namespace nibble::cpu
