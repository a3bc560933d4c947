// Static activation calibration (quant_algorithms.h): per-channel max |x| and a histogram of
// |x| whose bins are the f32 values with the mantissa cut to 6 bits.
#include <cmath>
#include <cstring>
#include <string>

#include "quant/quant_internal.h"

namespace nibble {

namespace {

// |x| as f32 bits without the sign: the bin is its top 14 bits (8 exponent + 6 mantissa), so
// bin b covers [v(b << 17), v((b + 1) << 17)) and the bins are in increasing order of |x|.
constexpr int kBinShift = 17;
constexpr size_t kBins = size_t{1} << (31 - kBinShift);

uint32_t abs_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u & 0x7FFFFFFFu;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

ActivationObserver::ActivationObserver(int64_t k) : k_(k) {
  if (k <= 0)
    detail::fail(ErrorCode::invalid_argument,
                 "nibble::ActivationObserver: argument 'k' must be > 0, got " + std::to_string(k));
  channel_absmax_.assign(static_cast<size_t>(k), 0.0f);
  histogram_.assign(kBins, 0);
}

void ActivationObserver::observe(const TensorView& x) {
  const detail::ArgCheck check("ActivationObserver::observe");
  check.tensor(x, "x", 2);
  check.dtype(x, "x", {DType::f32});
  check.contiguous(x, "x");
  check.device(x, "x", Device::cpu());
  check.condition(x.size(1) == k_, "x",
                  "must have K = " + std::to_string(k_) + " columns, got " + x.describe());
  const float* p = x.ptr<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i]))
      check.fail("x", "must be finite, got a NaN or infinity at row " + std::to_string(i / k_));
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(p[i]);
    float& m = channel_absmax_[static_cast<size_t>(i % k_)];
    m = std::fmax(m, a);
    ++histogram_[abs_bits(a) >> kBinShift];
  }
  count_ += n;
}

float ActivationObserver::absmax() const {
  float m = 0.0f;
  for (float v : channel_absmax_) m = std::fmax(m, v);
  return m;
}

float ActivationObserver::percentile_absmax(double p) const {
  if (!(p > 0.0 && p <= 100.0))
    detail::fail(ErrorCode::invalid_argument,
                 "nibble::ActivationObserver::percentile_absmax: argument 'p' must be in (0, 100], "
                 "got " +
                     std::to_string(p));
  const float amax = absmax();
  if (p == 100.0 || count_ == 0) return amax;
  const auto need = static_cast<int64_t>(std::ceil(p / 100.0 * static_cast<double>(count_)));
  int64_t seen = 0;
  for (size_t b = 0; b < kBins; ++b) {
    seen += histogram_[b];
    if (seen >= need) {
      // Every value of bin 0 is below the smallest normal f32: call it 0.
      const float edge = b == 0 ? 0.0f : from_bits(static_cast<uint32_t>((b + 1) << kBinShift));
      return std::fmin(edge, amax);
    }
  }
  return amax;
}

float static_activation_scale(const ActivationObserver& obs, ActCalibration method,
                              double percentile) {
  const detail::ArgCheck check("static_activation_scale");
  check.condition(obs.count() > 0, "obs", "has observed nothing");
  check.condition(percentile > 0.0 && percentile <= 100.0, "percentile",
                  "must be in (0, 100], got " + std::to_string(percentile));
  const float clip =
      method == ActCalibration::minmax ? obs.absmax() : obs.percentile_absmax(percentile);
  check.condition(clip > 0.0f, "obs", "saw only zeros: a scale of 0 cannot quantize");
  return clip / 127.0f;
}

}  // namespace nibble
