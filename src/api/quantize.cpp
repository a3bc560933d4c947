// Public quantization entry points: validate, then run the CPU reference or the CUDA backend.
#include "nibble/quantize.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "api/validate.h"
#include "cpu/reference.h"
#include "nibble/formats.h"
#include "nibble/numeric.h"
#include "nibble/tensor.h"
#if NIBBLE_WITH_CUDA
#include "cuda/backend.h"
#endif

namespace nibble {

using detail::ArgCheck;

WeightStorage weight_storage(const WeightFormat& f, int64_t n, int64_t k) {
  return detail::checked_weight_storage(ArgCheck("weight_storage"), f, n, k, "");
}

namespace {

// Copies a contiguous rank-1 or rank-2 tensor into a validated view of the same dtype and
// shape whose rows may be strided (4-bit rows start on whole bytes: their strides are even).
void copy_rows(const TensorView& src, const TensorView& dst) {
  if (src.data == nullptr) return;
  const int64_t rows = src.rank == 2 ? src.size(0) : 1;
  const int64_t row_bytes =
      dtype_storage_bytes(src.dtype, src.rank == 2 ? src.size(1) : src.size(0));
  const int64_t pitch_bytes = src.rank == 2 ? dtype_storage_bytes(dst.dtype, dst.stride(0)) : 0;
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<uint8_t*>(dst.data) + r * pitch_bytes,
                static_cast<const uint8_t*>(src.data) + r * row_bytes,
                static_cast<size_t>(row_bytes));
}

void check_float_matrix(const ArgCheck& check, const TensorView& t, const char* arg) {
  check.tensor(t, arg, 2);
  check.dtype(t, arg, {DType::f32, DType::f16, DType::bf16});
  check.rows_packed(t, arg);
}

// Activations to quantize must be finite. On the CPU this is checked (a NaN would otherwise
// reach an integer conversion); the GPU kernels cannot report it, and a non-finite row there
// gives a non-finite scale, so the linear output of that row is NaN/inf, never silently finite.
void check_finite_on_cpu(const ArgCheck& check, const TensorView& x, const char* arg) {
  if (x.device.type != DeviceType::cpu) return;
  for (int64_t r = 0; r < x.size(0); ++r)
    for (int64_t c = 0; c < x.size(1); ++c)
      if (!std::isfinite(load_float(x.data, x.dtype, r * x.stride(0) + c)))
        check.fail(arg, "must be finite, got a NaN or infinity at (" + std::to_string(r) + ", " +
                            std::to_string(c) + ")");
}

void check_cpu(const ArgCheck& check, const TensorView& t, const char* arg) {
  check.condition(t.device.type == DeviceType::cpu, arg,
                  "must be on the CPU (this operation has no CUDA implementation yet), got " +
                      to_string(t.device),
                  ErrorCode::unsupported);
}

// Output activations: q (M, K) of the scheme's dtype, scales (M) or (1) f32, on x's device.
void check_activation_out(const ArgCheck& check, const TensorView& x,
                          const QuantizedActivationView& out) {
  check.condition(out.scheme != ActScheme::none, "out.scheme",
                  "must be a quantized activation scheme, got none");
  check.tensor(out.q, "out.q", 2);
  check.dtype(out.q, "out.q", {act_value_dtype(out.scheme)});
  check.shape(out.q, "out.q", {x.size(0), x.size(1)});
  check.rows_packed(out.q, "out.q");
  check.device(out.q, "out.q", x.device);
  check.tensor(out.scales, "out.scales", 1);
  check.dtype(out.scales, "out.scales", {DType::f32});
  check.shape(out.scales, "out.scales",
              {out.scheme == ActScheme::s8_per_tensor ? 1 : x.size(0)});
  check.device(out.scales, "out.scales", x.device);
}

}  // namespace

void quantize_weight(const TensorView& w, const QuantizedWeightView& out) {
  const ArgCheck check("quantize_weight");
  check_float_matrix(check, w, "w");
  check_cpu(check, w, "w");
  // `out` first, so that a wrong out.n or out.k is not reported as a wrong shape of w.
  detail::check_weight(check, out, w.device, "out");
  check.shape(w, "w", {out.n, out.k});
  // The reference finds values it cannot quantize (NaN, infinity, a scale that overflows its
  // dtype) row by row as it writes. Quantize into scratch buffers and copy them out only when
  // every row succeeded, so that a failing call leaves `out` untouched.
  const QuantizedWeight scratch(out.format, out.n, out.k);
  cpu::quantize_weight(w, scratch.view());
  const QuantizedWeightView src = scratch.view();
  copy_rows(src.q, out.q);
  copy_rows(src.scales, out.scales);
  copy_rows(src.zeros, out.zeros);
  copy_rows(src.group_scales, out.group_scales);
}

void dequantize_weight(const QuantizedWeightView& w, const TensorView& out) {
  const ArgCheck check("dequantize_weight");
  check.tensor(out, "out", 2);
  check.dtype(out, "out", {DType::f32});
  check_cpu(check, out, "out");
  check.shape(out, "out", {w.n, w.k});
  check.rows_packed(out, "out");
  detail::check_weight(check, w, out.device);
  cpu::dequantize_weight(w, out);
}

namespace {

// A fusion view is switched off by leaving it default-constructed; anything else must be valid.
bool present(const TensorView& t) { return t.data != nullptr || t.rank != 0; }

// Per-channel vectors (K) of the fusion: contiguous, on x's device.
void check_channel_vector(const ArgCheck& check, const TensorView& t, const char* arg,
                          std::initializer_list<DType> dtypes, const TensorView& x) {
  check.tensor(t, arg, 1);
  check.dtype(t, arg, dtypes);
  check.shape(t, arg, {x.size(1)});
  check.rows_packed(t, arg);
  check.device(t, arg, x.device);
}

void check_fusion(const ArgCheck& check, const TensorView& x, const ActQuantFusion& f) {
  if (present(f.rms_weight)) {
    if (x.dtype == DType::f32)
      check_channel_vector(check, f.rms_weight, "fusion.rms_weight", {DType::f32}, x);
    else
      check_channel_vector(check, f.rms_weight, "fusion.rms_weight", {x.dtype, DType::f32}, x);
    check.condition(std::isfinite(f.rms_eps) && f.rms_eps > 0.0f, "fusion.rms_eps",
                    "must be positive and finite, got " + std::to_string(f.rms_eps));
  }
  if (present(f.smooth))
    check_channel_vector(check, f.smooth, "fusion.smooth", {DType::f32, DType::f16, DType::bf16},
                         x);
  if (present(f.normed)) {
    check.condition(present(f.rms_weight), "fusion.normed",
                    "receives the RMSNorm output y and needs fusion.rms_weight");
    check.tensor(f.normed, "fusion.normed", 2);
    check.dtype(f.normed, "fusion.normed", {x.dtype});
    check.shape(f.normed, "fusion.normed", {x.size(0), x.size(1)});
    check.rows_packed(f.normed, "fusion.normed");
    check.device(f.normed, "fusion.normed", x.device);
  }
}

// The CPU checks the values it can see: the fusion's vectors, then the fused values v (a zero
// smooth[k], or a product that overflows x's dtype, would reach an integer conversion).
cpu::FusedActivation fuse_on_cpu(const ArgCheck& check, const TensorView& x,
                                 const ActQuantFusion& f) {
  for (int64_t k = 0; present(f.rms_weight) && k < x.size(1); ++k)
    if (!std::isfinite(load_float(f.rms_weight.data, f.rms_weight.dtype, k)))
      check.fail("fusion.rms_weight", "must be finite, got a NaN or infinity at " +
                                          std::to_string(k));
  for (int64_t k = 0; present(f.smooth) && k < x.size(1); ++k) {
    const float s = load_float(f.smooth.data, f.smooth.dtype, k);
    if (!(std::isfinite(s) && s > 0.0f))
      check.fail("fusion.smooth",
                 "must be positive and finite, got " + std::to_string(s) + " at " +
                     std::to_string(k));
  }
  cpu::FusedActivation a = cpu::fuse_activation(x, f);
  for (size_t i = 0; i < a.v.size(); ++i)
    if (!std::isfinite(a.v[i]))
      check.fail("x", "must give finite values after the fused RMSNorm and smooth divide, got " +
                          std::to_string(a.v[i]) + " at (" + std::to_string(int64_t(i) / a.k) +
                          ", " + std::to_string(int64_t(i) % a.k) + ")");
  return a;
}

}  // namespace

void quantize_activation(const TensorView& x, const QuantizedActivationView& out,
                         Stream stream) {
  quantize_activation(x, out, ActQuantFusion{}, stream);
}

void quantize_activation(const TensorView& x, const QuantizedActivationView& out,
                         const ActQuantFusion& fusion, Stream stream) {
  const ArgCheck check("quantize_activation");
  check_float_matrix(check, x, "x");
  check_activation_out(check, x, out);
  check.condition(out.scheme != ActScheme::s8_per_tensor, "out.scheme",
                  "is s8_per_tensor, a static scheme: use quantize_activation_static");
  check_fusion(check, x, fusion);
  detail::check_backend(check, x.device);
  check_finite_on_cpu(check, x, "x");
  if (x.device.type == DeviceType::cpu) {
    const cpu::FusedActivation a = fuse_on_cpu(check, x, fusion);
    cpu::quantize_activation(a, out);
    if (present(fusion.normed)) cpu::store_normed(a, fusion.normed);
    return;
  }
#if NIBBLE_WITH_CUDA
  cuda::quantize_activation(x, out, fusion, stream);
#else
  (void)stream;
#endif
}

void quantize_activation_static(const TensorView& x, float scale,
                                const QuantizedActivationView& out, Stream stream) {
  quantize_activation_static(x, scale, out, ActQuantFusion{}, stream);
}

void quantize_activation_static(const TensorView& x, float scale,
                                const QuantizedActivationView& out, const ActQuantFusion& fusion,
                                Stream stream) {
  const ArgCheck check("quantize_activation_static");
  check_float_matrix(check, x, "x");
  check.condition(std::isfinite(scale) && scale > 0.0f, "scale",
                  "must be a positive finite calibrated scale, got " + std::to_string(scale));
  check_activation_out(check, x, out);
  check.condition(out.scheme == ActScheme::s8_per_tensor, "out.scheme",
                  std::string("must be s8_per_tensor, got ") + to_string(out.scheme));
  check_fusion(check, x, fusion);
  detail::check_backend(check, x.device);
  check_finite_on_cpu(check, x, "x");
  if (x.device.type == DeviceType::cpu) {
    const cpu::FusedActivation a = fuse_on_cpu(check, x, fusion);
    cpu::quantize_activation_static(a, scale, out);
    if (present(fusion.normed)) cpu::store_normed(a, fusion.normed);
    return;
  }
#if NIBBLE_WITH_CUDA
  cuda::quantize_activation(x, out, fusion, stream, scale);
#else
  (void)stream;
#endif
}

void dequantize_activation(const QuantizedActivationView& a, const TensorView& out) {
  const ArgCheck check("dequantize_activation");
  check.tensor(out, "out", 2);
  check.dtype(out, "out", {DType::f32});
  check_cpu(check, out, "out");
  const int64_t m = detail::check_activation(check, a, out.device);
  check.shape(out, "out", {m, a.q.size(1)});
  check.rows_packed(out, "out");
  cpu::dequantize_activation(a, out);
}

namespace {
// Both int4 conversions take a CPU source and destination of the same (R, C) shape.
void check_int4_pair(const ArgCheck& check, const TensorView& src, const char* src_arg,
                     std::initializer_list<DType> src_dtypes, const TensorView& dst,
                     const char* dst_arg, DType dst_dtype) {
  check.tensor(src, src_arg, 2);
  check.dtype(src, src_arg, src_dtypes);
  check.rows_packed(src, src_arg);
  check_cpu(check, src, src_arg);
  check.tensor(dst, dst_arg, 2);
  check.dtype(dst, dst_arg, {dst_dtype});
  check.shape(dst, dst_arg, {src.size(0), src.size(1)});
  check.rows_packed(dst, dst_arg);
  check_cpu(check, dst, dst_arg);
}
}  // namespace

void pack_int4(const TensorView& unpacked, const TensorView& packed) {
  const ArgCheck check("pack_int4");
  check_int4_pair(check, unpacked, "unpacked", {DType::s8, DType::u8}, packed, "packed",
                  unpacked.dtype == DType::s8 ? DType::s4 : DType::u4);
  const int lo = unpacked.dtype == DType::s8 ? -8 : 0, hi = lo + 15;
  for (int64_t r = 0; r < unpacked.size(0); ++r)
    for (int64_t c = 0; c < unpacked.size(1); ++c) {
      const int v = load_int(unpacked.data, unpacked.dtype, r * unpacked.stride(0) + c);
      check.condition(v >= lo && v <= hi, "unpacked",
                      "must hold values in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "], got " + std::to_string(v) + " at (" + std::to_string(r) + ", " +
                          std::to_string(c) + ")");
    }
  cpu::pack_int4(unpacked, packed);
}

void unpack_int4(const TensorView& packed, const TensorView& unpacked) {
  const ArgCheck check("unpack_int4");
  check_int4_pair(check, packed, "packed", {DType::s4, DType::u4}, unpacked, "unpacked",
                  packed.dtype == DType::s4 ? DType::s8 : DType::u8);
  cpu::unpack_int4(packed, unpacked);
}

}  // namespace nibble
