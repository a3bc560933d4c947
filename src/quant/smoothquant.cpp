// SmoothQuant's smoothing factors and the two weight-side operations (quant_algorithms.h). The
// model-level folding (into RMSNorm weights, V rows and up rows) is src/llm/quantize_model.cpp.
#include <algorithm>
#include <cmath>
#include <string>

#include "cpu/view_access.h"
#include "quant/quant_internal.h"

namespace nibble {

namespace {

void check_f32_matrix(const detail::ArgCheck& check, const TensorView& w, int64_t k) {
  check.tensor(w, "w", 2);
  check.dtype(w, "w", {DType::f32});
  check.rows_packed(w, "w");
  check.device(w, "w", Device::cpu());
  check.condition(
      w.size(1) == k, "w",
      "must have one column per factor (" + std::to_string(k) + "), got " + w.describe());
}

}  // namespace

std::vector<float> smoothquant_scales(std::span<const float> act_absmax,
                                      std::span<const float> weight_absmax, double alpha) {
  const detail::ArgCheck check("smoothquant_scales");
  check.condition(alpha >= 0.0 && alpha <= 1.0, "alpha",
                  "must be in [0, 1], got " + std::to_string(alpha));
  check.condition(!act_absmax.empty(), "act_absmax", "must not be empty");
  check.condition(act_absmax.size() == weight_absmax.size(), "weight_absmax",
                  "must have as many channels as act_absmax (" + std::to_string(act_absmax.size()) +
                      "), got " + std::to_string(weight_absmax.size()));
  std::vector<float> s(act_absmax.size(), 1.0f);
  for (size_t j = 0; j < s.size(); ++j) {
    const double a = act_absmax[j], w = weight_absmax[j];
    check.condition(
        std::isfinite(a) && a >= 0.0, "act_absmax",
        "must hold finite values >= 0, got " + std::to_string(a) + " at " + std::to_string(j));
    check.condition(
        std::isfinite(w) && w >= 0.0, "weight_absmax",
        "must hold finite values >= 0, got " + std::to_string(w) + " at " + std::to_string(j));
    if (a == 0.0 || w == 0.0) continue;
    s[j] = static_cast<float>(std::max(1e-5, std::pow(a, alpha) / std::pow(w, 1.0 - alpha)));
  }
  return s;
}

void column_absmax(const TensorView& w, std::span<float> absmax) {
  const detail::ArgCheck check("column_absmax");
  check_f32_matrix(check, w, static_cast<int64_t>(absmax.size()));
  for (int64_t n = 0; n < w.size(0); ++n)
    for (int64_t j = 0; j < w.size(1); ++j)
      absmax[static_cast<size_t>(j)] =
          std::fmax(absmax[static_cast<size_t>(j)], std::fabs(cpu::get_float(w, n, j)));
}

void scale_weight_columns(const TensorView& w, std::span<const float> s) {
  const detail::ArgCheck check("scale_weight_columns");
  check_f32_matrix(check, w, static_cast<int64_t>(s.size()));
  for (size_t j = 0; j < s.size(); ++j)
    check.condition(
        std::isfinite(s[j]) && s[j] > 0.0f, "s",
        "must hold finite factors > 0, got " + std::to_string(s[j]) + " at " + std::to_string(j));
  for (int64_t n = 0; n < w.size(0); ++n)
    for (int64_t j = 0; j < w.size(1); ++j)
      cpu::set_float(w, n, j, cpu::get_float(w, n, j) * s[static_cast<size_t>(j)]);
}

}  // namespace nibble
