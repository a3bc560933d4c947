// Round to nearest with min-max or MSE-optimal clipping (quant_algorithms.h), and the argument
// checks and scale rule that GPTQ shares.
#include <cmath>
#include <string>

#include "api/validate.h"
#include "cpu/reference.h"
#include "cpu/view_access.h"
#include "nibble/formats.h"
#include "quant/quant_internal.h"

namespace nibble {

namespace quant {

int check_weight_quantizer(const detail::ArgCheck& check, const TensorView& w,
                           const QuantizedWeightView& out, const WeightQuantOptions& opt) {
  check.tensor(w, "w", 2);
  check.dtype(w, "w", {DType::f32, DType::f16, DType::bf16});
  check.rows_packed(w, "w");
  check.device(w, "w", Device::cpu());
  detail::check_weight(check, out, Device::cpu(), "out");
  check.shape(w, "w", {out.n, out.k});
  const WeightScheme s = out.format.scheme;
  check.condition(
      s == WeightScheme::s4_sym || s == WeightScheme::s8_sym, "out.format",
      std::string("must be a symmetric weight format (s4_sym or s8_sym), got ") + to_string(s));
  const int format_qmax = weight_qmax(s);
  check.condition(opt.qmax >= 0 && opt.qmax <= format_qmax, "opt.qmax",
                  "must be in [1, " + std::to_string(format_qmax) + "] (or 0: the format's), got " +
                      std::to_string(opt.qmax));
  if (opt.clip == ClipMethod::mse) {
    check.condition(opt.clip_steps >= 1 && opt.clip_steps <= 1000, "opt.clip_steps",
                    "must be in [1, 1000], got " + std::to_string(opt.clip_steps));
    check.condition(opt.clip_min_ratio > 0.0 && opt.clip_min_ratio < 1.0, "opt.clip_min_ratio",
                    "must be in (0, 1), got " + std::to_string(opt.clip_min_ratio));
  }
  for (int64_t n = 0; n < w.size(0); ++n)
    for (int64_t k = 0; k < w.size(1); ++k)
      if (!std::isfinite(cpu::get_float(w, n, k)))
        check.fail("w", "must be finite, got a NaN or infinity at (" + std::to_string(n) + ", " +
                            std::to_string(k) + ")");
  return opt.qmax == 0 ? format_qmax : opt.qmax;
}

double quantization_sse(const float* w, int64_t count, float s, int qmax) {
  double sse = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double d =
        static_cast<double>(w[i]) -
        static_cast<double>(s * static_cast<float>(cpu::quantize_int(w[i], s, -qmax, qmax)));
    sse += d * d;
  }
  return sse;
}

float choose_scale(const float* w, int64_t count, int qmax, DType t, const WeightQuantOptions& opt,
                   int64_t row) {
  float amax = 0.0f;
  for (int64_t i = 0; i < count; ++i) amax = std::fmax(amax, std::fabs(w[i]));
  const auto span = static_cast<float>(qmax);
  const float s_minmax = cpu::stored_scale(amax, span, t, row);
  if (opt.clip == ClipMethod::minmax || amax == 0.0f) return s_minmax;
  // The grid search: r = 1 first, and a later ratio only replaces it when strictly better.
  float best_s = s_minmax;
  double best = quantization_sse(w, count, s_minmax, qmax);
  for (int t_step = 1; t_step <= opt.clip_steps; ++t_step) {
    const double r = 1.0 - t_step * (1.0 - opt.clip_min_ratio) / opt.clip_steps;
    const float s = cpu::stored_scale(static_cast<float>(r * amax), span, t, row);
    if (s == best_s) continue;
    const double e = quantization_sse(w, count, s, qmax);
    if (e < best) best = e, best_s = s;
  }
  return best_s;
}

}  // namespace quant

void quantize_weight_rtn(const TensorView& w, const QuantizedWeightView& out,
                         const WeightQuantOptions& opt) {
  const detail::ArgCheck check("quantize_weight_rtn");
  const int qmax = quant::check_weight_quantizer(check, w, out, opt);
  const WeightFormat& f = out.format;
  const int64_t g = f.per_channel() ? out.k : f.group_size;
  std::vector<float> row(static_cast<size_t>(out.k));
  for (int64_t n = 0; n < out.n; ++n) {
    for (int64_t k = 0; k < out.k; ++k) row[static_cast<size_t>(k)] = cpu::get_float(w, n, k);
    for (int64_t k0 = 0; k0 < out.k; k0 += g) {
      const float* grp = row.data() + k0;
      const float s = quant::choose_scale(grp, g, qmax, f.scale_dtype, opt, n);
      cpu::set_float(out.scales, n, f.per_channel() ? 0 : k0 / g, s);
      for (int64_t i = 0; i < g; ++i)
        cpu::set_int(out.q, n, k0 + i, cpu::quantize_int(grp[i], s, -qmax, qmax));
    }
  }
}

}  // namespace nibble
