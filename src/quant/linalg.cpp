// The f64 linear algebra of GPTQ on the CPU: the upper Cholesky factor of H⁻¹.
#include <cmath>

#include "quant/quant_internal.h"

namespace nibble::quant {

// Like the runner's dot_f32 (src/llm/linear.cpp): compiled for AVX2 and for the baseline,
// picked at load time; the four partial sums fix the summation order.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define NIBBLE_QUANT_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define NIBBLE_QUANT_MULTIVERSION
#endif

NIBBLE_QUANT_MULTIVERSION
double dot_f64(const double* a, const double* b, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) acc[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) acc[i % 4] += a[i] * b[i];
  return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

bool upper_cholesky_of_inverse(const std::vector<double>& h, int64_t k, std::vector<double>& u) {
  const auto at = [k](int64_t r, int64_t c) { return static_cast<size_t>(r * k + c); };
  // H = V·Vᵀ, V upper triangular, from the last column back (the Cholesky factorisation of H
  // with rows and columns reversed): V_jj = sqrt(H_jj − Σ_{t>j} V_jt²),
  // V_ij = (H_ij − Σ_{t>j} V_it·V_jt) / V_jj for i < j. Rows of V are contiguous from t = j+1.
  std::vector<double> v(static_cast<size_t>(k * k), 0.0);
  for (int64_t j = k - 1; j >= 0; --j) {
    const int64_t tail = k - 1 - j;
    const double d = h[at(j, j)] - dot_f64(&v[at(j, j + 1)], &v[at(j, j + 1)], tail);
    if (!(d > 0.0)) return false;
    const double vjj = std::sqrt(d);
    v[at(j, j)] = vjj;
    for (int64_t i = 0; i < j; ++i)
      v[at(i, j)] = (h[at(i, j)] - dot_f64(&v[at(i, j + 1)], &v[at(j, j + 1)], tail)) / vjj;
  }
  // U = V⁻¹ (upper): V·U = I column by column, U_cc = 1/V_cc, and for i < c
  // U_ic = −(Σ_{t=i+1..c} V_it·U_tc) / V_ii. Column c of U is built as row c of ut (contiguous).
  std::vector<double> ut(static_cast<size_t>(k * k), 0.0);
  for (int64_t c = 0; c < k; ++c) {
    double* col = &ut[at(c, 0)];
    col[c] = 1.0 / v[at(c, c)];
    for (int64_t i = c - 1; i >= 0; --i)
      col[i] = -dot_f64(&v[at(i, i + 1)], col + i + 1, c - i) / v[at(i, i)];
  }
  u.assign(static_cast<size_t>(k * k), 0.0);
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = r; c < k; ++c) u[at(r, c)] = ut[at(c, r)];
  return true;
}

}  // namespace nibble::quant
