// Public entry points for packed weights: validate, then run the tensor-core kernels (CUDA) or
// the reference on the unpacked values (CPU).
#include <string>

#include "api/validate.h"
#include "cpu/reference.h"
#include "cpu/view_access.h"
#include "nibble/gemm.h"
#include "nibble/layout.h"
#include "nibble/tensor.h"
#if NIBBLE_WITH_CUDA
#include "cuda/backend.h"
#endif

namespace nibble {

using detail::ArgCheck;

namespace {

void check_packed(const ArgCheck& check, const PackedWeightView& w, Device device,
                  bool needs_scales) {
  check.condition(w.layout == WeightLayout::w4_mma_k128 && w.version == kW4MmaK128Version, "w",
                  "must be packed in layout w4_mma_k128 version " +
                      std::to_string(kW4MmaK128Version) + " (use pack_weight), got " +
                      to_string(w.layout) + " v" + std::to_string(w.version));
  check.condition(w.format.scheme == WeightScheme::s4_sym ||
                      w.format.scheme == WeightScheme::s4_two_level,
                  "w.format", std::string("must be s4_sym or s4_two_level, got ") +
                                  to_string(w.format.scheme));
  check.condition(w.n > 0 && w.k > 0 && w.n_pad == (w.n + 7) / 8 * 8 &&
                      w.k_pad == (w.k + 127) / 128 * 128,
                  "w", "has inconsistent sizes n=" + std::to_string(w.n) + " k=" +
                           std::to_string(w.k) + " n_pad=" + std::to_string(w.n_pad) +
                           " k_pad=" + std::to_string(w.k_pad));
  check.condition(w.k % 32 == 0, "w.k", "must be a multiple of 32 for the mma.sync kernels, got " +
                                            std::to_string(w.k));
  check.tensor(w.q, "w.q", 1);
  check.dtype(w.q, "w.q", {DType::u8});
  check.shape(w.q, "w.q", {w.n_pad * w.k_pad / 2});
  check.contiguous(w.q, "w.q");
  check.device(w.q, "w.q", device);
  if (!needs_scales) return;
  check.condition(w.has_scales, "w", "is a raw s4 matrix without scales; linear needs pack_weight");
  const bool two_level = w.format.scheme == WeightScheme::s4_two_level;
  const int64_t groups = w.format.per_channel() ? 0 : (w.k_pad + w.format.group_size - 1) /
                                                          w.format.group_size;
  check.tensor(w.scales, "w.scales", w.format.per_channel() || two_level ? 1 : 2);
  check.dtype(w.scales, "w.scales", {DType::f32});
  if (w.format.per_channel() || two_level) check.shape(w.scales, "w.scales", {w.n_pad});
  else check.shape(w.scales, "w.scales", {groups, w.n_pad});
  check.contiguous(w.scales, "w.scales");
  check.device(w.scales, "w.scales", device);
  if (two_level) {
    check.tensor(w.group_params, "w.group_params", 2);
    check.dtype(w.group_params, "w.group_params", {DType::u8});
    check.shape(w.group_params, "w.group_params", {groups, 2 * w.n_pad});
    check.contiguous(w.group_params, "w.group_params");
    check.device(w.group_params, "w.group_params", device);
  }
}

void check_cuda_alignment(const ArgCheck& check, const TensorView& a, const char* arg) {
  check.aligned(a, arg, 16);
  check.condition(a.stride(0) % 16 == 0, arg,
                  "must have a row pitch that is a multiple of 16 bytes for cp.async, got " +
                      std::to_string(a.stride(0)));
}

// The logical weight a packed view holds, for the CPU path (reference on unpacked values).
QuantizedWeight unpack_on_host(const PackedWeightView& w) {
  QuantizedWeight q(w.format, w.n, w.k);
  const QuantizedWeightView v = q.view();
  const bool two_level = w.format.scheme == WeightScheme::s4_two_level;
  const auto* scales = static_cast<const float*>(w.scales.data);
  for (int64_t n = 0; n < w.n; ++n) {
    for (int64_t k = 0; k < w.k; ++k) cpu::set_int(v.q, n, k, packed_weight_value(w, n, k));
    if (w.format.per_channel() || two_level) cpu::set_float(v.scales, n, 0, scales[n]);
  }
  if (!w.format.per_channel()) {
    const auto* params = static_cast<const uint8_t*>(w.group_params.data);
    for (int64_t gi = 0; gi < w.k / w.format.group_size; ++gi)
      for (int64_t n = 0; n < w.n; ++n) {
        if (!two_level) {
          cpu::set_float(v.scales, n, gi, scales[gi * w.n_pad + n]);
          continue;
        }
        const int gs = params[(gi * w.n_pad + n) * 2], offset = params[(gi * w.n_pad + n) * 2 + 1];
        cpu::set_int(v.group_scales, n, gi, gs);
        cpu::set_int(v.zeros, n, gi, (128 - offset) / gs);
      }
  }
  return q;
}

}  // namespace

void linear(const QuantizedActivationView& a, const PackedWeightView& w, const TensorView* bias,
            const TensorView& d, Stream stream) {
  const ArgCheck check("linear");
  const Device device = a.q.device;
  const int64_t m = detail::check_activation(check, a, device);
  check.condition(a.scheme == ActScheme::s8_per_token || a.scheme == ActScheme::s8_per_tensor,
                  "a.scheme", std::string("must be s8_per_token or s8_per_tensor for packed int4 "
                                          "weights, got ") + to_string(a.scheme));
  check_packed(check, w, device, true);
  check.condition(a.q.size(1) == w.k, "a.q",
                  "must have K = " + std::to_string(w.k) + " columns like the weights, got " +
                      std::to_string(a.q.size(1)));
  check.tensor(d, "d", 2);
  check.dtype(d, "d", {DType::f32, DType::f16, DType::bf16});
  check.shape(d, "d", {m, w.n});
  check.rows_packed(d, "d");
  check.device(d, "d", device);
  if (bias != nullptr) {
    check.tensor(*bias, "bias", 1);
    check.dtype(*bias, "bias", {DType::f32, DType::f16, DType::bf16});
    check.shape(*bias, "bias", {w.n});
    check.contiguous(*bias, "bias");
    check.device(*bias, "bias", device);
  }
  const bool whole_k = w.format.per_channel() || w.format.scheme == WeightScheme::s4_two_level;
  const DType w_int = w.format.scheme == WeightScheme::s4_two_level ? DType::s8 : DType::s4;
  const int64_t span = whole_k ? w.k : w.format.group_size;
  const int64_t limit = max_int32_accumulation_k(DType::s8, w_int);
  check.condition(span <= limit, "k",
                  std::string(whole_k ? "K" : "the group size") + " must be at most " +
                      std::to_string(limit) + " so that the int32 accumulator cannot overflow, got " +
                      std::to_string(span),
                  ErrorCode::out_of_range);
  detail::check_backend(check, device);
  if (device.type == DeviceType::cpu) {
    const QuantizedWeight logical = unpack_on_host(w);
    return cpu::linear(a, logical.view(), bias, d);
  }
  check_cuda_alignment(check, a.q, "a.q");
#if NIBBLE_WITH_CUDA
  cuda::linear_packed(a, w, bias, d, stream);
#else
  (void)stream;
#endif
}

void gemm_s32(const TensorView& a, const PackedWeightView& w, const TensorView& d, Stream stream) {
  const ArgCheck check("gemm_s32");
  check.tensor(a, "a", 2);
  check.dtype(a, "a", {DType::s8});
  check.rows_packed(a, "a");
  check_packed(check, w, a.device, false);
  check.condition(w.format.scheme == WeightScheme::s4_sym, "w.format",
                  std::string("must be s4_sym for a raw s8×s4 GEMM, got ") +
                      to_string(w.format.scheme));
  check.condition(a.size(1) == w.k, "a", "must have K = " + std::to_string(w.k) +
                                             " columns like the weights, got " +
                                             std::to_string(a.size(1)));
  check.tensor(d, "d", 2);
  check.dtype(d, "d", {DType::s32});
  check.shape(d, "d", {a.size(0), w.n});
  check.rows_packed(d, "d");
  check.device(d, "d", a.device);
  const int64_t limit = max_int32_accumulation_k(DType::s8, DType::s4);
  check.condition(w.k <= limit, "k",
                  "K must be at most " + std::to_string(limit) +
                      " for s8×s4 so that the int32 accumulator cannot overflow, got " +
                      std::to_string(w.k),
                  ErrorCode::out_of_range);
  detail::check_backend(check, a.device);
  if (a.device.type == DeviceType::cpu) {
    Tensor logical = Tensor::empty(DType::s4, {w.n, w.k});
    for (int64_t n = 0; n < w.n; ++n)
      for (int64_t k = 0; k < w.k; ++k)
        store_int(logical.data(), DType::s4, n * w.k + k, packed_weight_value(w, n, k));
    return cpu::gemm_s32(a, logical.view(), d);
  }
  check_cuda_alignment(check, a, "a");
#if NIBBLE_WITH_CUDA
  cuda::gemm_s32_packed(a, w, d, stream);
#else
  (void)stream;
#endif
}

}  // namespace nibble
