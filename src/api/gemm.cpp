// Public GEMM entry points: validate every argument, then run the CPU reference or hand the
// call to the CUDA backend, which selects a kernel.
#include "nibble/gemm.h"

#include <string>

#include "api/validate.h"
#include "cpu/reference.h"
#include "nibble/formats.h"
#if NIBBLE_WITH_CUDA
#include "cuda/backend.h"
#endif

namespace nibble {

using detail::ArgCheck;

namespace {

void check_output(const ArgCheck& check, const TensorView& d, int64_t m, int64_t n,
                  std::initializer_list<DType> dtypes, Device device) {
  check.tensor(d, "d", 2);
  check.dtype(d, "d", dtypes);
  check.shape(d, "d", {m, n});
  check.rows_packed(d, "d");
  check.device(d, "d", device);
}

void check_bias(const ArgCheck& check, const TensorView* bias, int64_t n, Device device) {
  if (bias == nullptr) return;
  check.tensor(*bias, "bias", 1);
  check.dtype(*bias, "bias", {DType::f32, DType::f16, DType::bf16});
  check.shape(*bias, "bias", {n});
  check.device(*bias, "bias", device);
}

void check_k_limit(const ArgCheck& check, DType a, DType w, int64_t span, const char* what) {
  const int64_t limit = max_int32_accumulation_k(a, w);
  check.condition(span <= limit, "k",
                  std::string(what) + " must be at most " + std::to_string(limit) + " for " +
                      to_string(a) + "×" + to_string(w) +
                      " so that the int32 accumulator cannot overflow, got " +
                      std::to_string(span),
                  ErrorCode::out_of_range);
}

}  // namespace

void gemm_s32(const TensorView& a, const TensorView& w, const TensorView& d, Stream stream) {
  const ArgCheck check("gemm_s32");
  check.tensor(a, "a", 2);
  check.dtype(a, "a", {DType::s8, DType::s4});
  check.rows_packed(a, "a");
  check.tensor(w, "w", 2);
  check.dtype(w, "w", {DType::s8, DType::s4});
  check.rows_packed(w, "w");
  check.condition(!(a.dtype == DType::s4 && w.dtype == DType::s8), "a",
                  "is s4 with s8 weights; supported pairs are s8×s8, s8×s4 and s4×s4");
  check.device(w, "w", a.device);
  check.condition(w.size(1) == a.size(1), "w",
                  "must have K = " + std::to_string(a.size(1)) + " columns like a, got " +
                      std::to_string(w.size(1)));
  check_output(check, d, a.size(0), w.size(0), {DType::s32}, a.device);
  check_k_limit(check, a.dtype, w.dtype, a.size(1), "K");
  detail::check_backend(check, a.device);
  if (a.device.type == DeviceType::cpu) return cpu::gemm_s32(a, w, d);
#if NIBBLE_WITH_CUDA
  cuda::gemm_s32(a, w, d, stream);
#else
  (void)stream;
#endif
}

void linear(const QuantizedActivationView& a, const QuantizedWeightView& w,
            const TensorView* bias, const TensorView& d, Stream stream) {
  const ArgCheck check("linear");
  const Device device = a.q.device;
  const int64_t m = detail::check_activation(check, a, device);
  detail::check_weight(check, w, device);
  const LinearFormat format{w.format, a.scheme};
  check.condition(is_valid(format), "w.format",
                  std::string("with ") + to_string(a.scheme) + " activations is not a format " +
                      "in the catalogue (docs/formats.md), got weights " + to_string(w.format));
  check.condition(a.q.size(1) == w.k, "a.q",
                  "must have K = " + std::to_string(w.k) + " columns like the weights, got " +
                      std::to_string(a.q.size(1)));
  check_output(check, d, m, w.n, {DType::f32, DType::f16, DType::bf16}, device);
  check_bias(check, bias, w.n, device);
  if (a.scheme != ActScheme::e4m3_per_token) {
    const bool whole_k = w.format.per_channel() || w.format.scheme == WeightScheme::s4_two_level;
    const DType w_int = w.format.scheme == WeightScheme::s8_sym ||
                                w.format.scheme == WeightScheme::s4_two_level
                            ? DType::s8
                            : DType::s4;
    check_k_limit(check, a.q.dtype, w_int, whole_k ? w.k : w.format.group_size,
                  whole_k ? "K" : "the group size");
  }
  detail::check_backend(check, device);
  if (device.type == DeviceType::cpu) return cpu::linear(a, w, bias, d);
#if NIBBLE_WITH_CUDA
  cuda::linear(a, w, bias, d, stream);
#else
  (void)stream;
#endif
}

void linear(const TensorView& x, const QuantizedWeightView& w, const TensorView* bias,
            const TensorView& d, Stream stream) {
  const ArgCheck check("linear");
  check.tensor(x, "x", 2);
  check.dtype(x, "x", {DType::f32, DType::f16, DType::bf16});
  check.rows_packed(x, "x");
  detail::check_weight(check, w, x.device);
  check.condition(is_valid(LinearFormat{w.format, ActScheme::none}), "w.format",
                  "with unquantized activations is not a format in the catalogue, got " +
                      to_string(w.format));
  check.condition(x.size(1) == w.k, "x",
                  "must have K = " + std::to_string(w.k) + " columns like the weights, got " +
                      std::to_string(x.size(1)));
  check_output(check, d, x.size(0), w.n, {DType::f32, DType::f16, DType::bf16}, x.device);
  check_bias(check, bias, w.n, x.device);
  detail::check_backend(check, x.device);
  if (x.device.type == DeviceType::cpu) return cpu::linear(x, w, bias, d);
#if NIBBLE_WITH_CUDA
  cuda::linear(x, w, bias, d, stream);
#else
  (void)stream;
#endif
}

std::string explain(const LinearFormat& format, int64_t m, int64_t n, int64_t k, Device device) {
  const ArgCheck check("explain");
  check.condition(is_valid(format), "format", "must be in the catalogue, got " + to_string(format));
  check.condition(m > 0 && n > 0 && k > 0, "m, n, k", "must be positive");
  const std::string what = to_string(format) + " M=" + std::to_string(m) + " N=" +
                           std::to_string(n) + " K=" + std::to_string(k);
  if (device.type == DeviceType::cpu)
    return what + " on cpu: CPU reference (src/cpu/gemm_ref.cpp), the normative definition";
#if NIBBLE_WITH_CUDA
  detail::check_backend(check, device);
  return what + " on " + to_string(device) + ": " + cuda::explain(format, m, n, k, device.index);
#else
  check.fail("device", "is a CUDA device, but this build of nibble has no CUDA backend",
             ErrorCode::unsupported);
#endif
}

}  // namespace nibble
