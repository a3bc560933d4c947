// Public entry points for packed weights: validate, then run the tensor-core kernels (CUDA) or
// the reference on the unpacked values (CPU).
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "api/validate.h"
#include "common/residual_norm.h"
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

// A packed view in one of `layouts`, consistent in itself, on `device`.
void check_packed(const ArgCheck& check, const PackedWeightView& w, Device device,
                  bool needs_scales, std::initializer_list<WeightLayout> layouts) {
  bool known = false;
  std::string names;
  for (WeightLayout l : layouts) {
    known = known || w.layout == l;
    names += std::string(names.empty() ? "" : " or ") + to_string(l);
  }
  check.condition(known && w.version == layout_version(w.layout), "w",
                  "must be packed in layout " + names + " at its current version (use "
                  "pack_weight with packed_layout(format)), got " + to_string(w.layout) + " v" +
                      std::to_string(w.version));
  const WeightScheme s = w.format.scheme;
  const bool scheme_ok =
      w.layout == WeightLayout::w4_mma_k128
          ? s == WeightScheme::s4_sym || s == WeightScheme::s4_two_level
      : w.layout == WeightLayout::w8_mma16_k128
          ? s == WeightScheme::s8_sym
          : s == WeightScheme::s4_sym || s == WeightScheme::u4_asym || s == WeightScheme::u4_fzp;
  check.condition(scheme_ok, "w.format",
                  std::string("must be a scheme that layout ") + to_string(w.layout) +
                      " holds, got " + to_string(s));
  check.condition(w.n > 0 && w.k > 0 && w.n_pad == (w.n + 7) / 8 * 8 &&
                      w.k_pad == (w.k + 127) / 128 * 128,
                  "w", "has inconsistent sizes n=" + std::to_string(w.n) + " k=" +
                           std::to_string(w.k) + " n_pad=" + std::to_string(w.n_pad) +
                           " k_pad=" + std::to_string(w.k_pad));
  check.tensor(w.q, "w.q", 1);
  check.dtype(w.q, "w.q", {DType::u8});
  check.shape(w.q, "w.q", {w.n_pad * w.k_pad * layout_weight_bits(w.layout) / 8});
  check.contiguous(w.q, "w.q");
  check.device(w.q, "w.q", device);
  if (!needs_scales) return;
  check.condition(w.has_scales, "w", "is a raw s4 matrix without scales; linear needs pack_weight");
  const bool two_level = s == WeightScheme::s4_two_level;
  const bool per_row = w.format.per_channel() || two_level;
  const int64_t groups = w.format.per_channel() ? 0 : (w.k_pad + w.format.group_size - 1) /
                                                          w.format.group_size;
  auto check_table = [&](const TensorView& t, const char* arg, DType dtype, int64_t cols) {
    check.tensor(t, arg, per_row && dtype == DType::f32 ? 1 : 2);
    check.dtype(t, arg, {dtype});
    if (per_row && dtype == DType::f32) check.shape(t, arg, {cols});
    else check.shape(t, arg, {groups, cols});
    check.contiguous(t, arg);
    check.device(t, arg, device);
  };
  check_table(w.scales, "w.scales", DType::f32, w.n_pad);
  if (two_level) check_table(w.group_params, "w.group_params", DType::u8, 2 * w.n_pad);
  if (w.layout != WeightLayout::w4_mma_k128 &&
      (s == WeightScheme::u4_asym || s == WeightScheme::u4_fzp))
    check_table(w.zeros, "w.zeros", DType::f32, w.n_pad);
}

void check_output(const ArgCheck& check, const TensorView* bias, const TensorView& d, int64_t m,
                  int64_t n, Device device) {
  check.tensor(d, "d", 2);
  check.dtype(d, "d", {DType::f32, DType::f16, DType::bf16});
  check.shape(d, "d", {m, n});
  check.rows_packed(d, "d");
  check.device(d, "d", device);
  if (bias != nullptr) {
    check.tensor(*bias, "bias", 1);
    check.dtype(*bias, "bias", {DType::f32, DType::f16, DType::bf16});
    check.shape(*bias, "bias", {n});
    check.contiguous(*bias, "bias");
    check.device(*bias, "bias", device);
  }
}

// The int8 mma.sync kernels step K by 32.
void check_mma_k(const ArgCheck& check, const PackedWeightView& w) {
  check.condition(w.k % 32 == 0, "w.k", "must be a multiple of 32 for the mma.sync kernels, got " +
                                            std::to_string(w.k));
}

// The int32 span (K, or the group size for f32 group scales) of a W4A8 call must not overflow.
void check_w4a8_k_limit(const ArgCheck& check, const PackedWeightView& w) {
  const bool whole_k = w.format.per_channel() || w.format.scheme == WeightScheme::s4_two_level;
  const DType w_int = w.format.scheme == WeightScheme::s4_two_level ? DType::s8 : DType::s4;
  const int64_t span = whole_k ? w.k : w.format.group_size;
  const int64_t limit = max_int32_accumulation_k(DType::s8, w_int);
  check.condition(span <= limit, "k",
                  std::string(whole_k ? "K" : "the group size") + " must be at most " +
                      std::to_string(limit) + " so that the int32 accumulator cannot overflow, got " +
                      std::to_string(span),
                  ErrorCode::out_of_range);
}

void check_cuda_alignment(const ArgCheck& check, const TensorView& a, const char* arg) {
  check.aligned(a, arg, 16);
  const int64_t pitch = a.stride(0) * dtype_bits(a.dtype) / 8;
  check.condition(pitch % 16 == 0, arg,
                  "must have a row pitch that is a multiple of 16 bytes for cp.async, got " +
                      std::to_string(pitch) + " bytes");
}

}  // namespace

void linear(const QuantizedActivationView& a, const PackedWeightView& w, const TensorView* bias,
            const TensorView& d, Stream stream) {
  const ArgCheck check("linear");
  const Device device = a.q.device;
  const int64_t m = detail::check_activation(check, a, device);
  const bool fp8 = a.scheme == ActScheme::e4m3_per_token;
  check.condition(a.scheme == ActScheme::s8_per_token || a.scheme == ActScheme::s8_per_tensor || fp8,
                  "a.scheme", std::string("must be s8_per_token, s8_per_tensor or e4m3_per_token "
                                          "for packed int4 weights, got ") + to_string(a.scheme));
  check_packed(check, w, device, true, {WeightLayout::w4_mma_k128});
  if (fp8)
    check.condition(w.format.scheme == WeightScheme::s4_sym, "w.format",
                    std::string("must be s4_sym with e4m3 activations (the w4afp8 formats), got ") +
                        to_string(w.format.scheme));
  check_mma_k(check, w);
  check.condition(a.q.size(1) == w.k, "a.q",
                  "must have K = " + std::to_string(w.k) + " columns like the weights, got " +
                      std::to_string(a.q.size(1)));
  check_output(check, bias, d, m, w.n, device);
  if (!fp8) check_w4a8_k_limit(check, w);  // fp8 sums are f32: no integer overflow
  detail::check_backend(check, device);
  if (device.type == DeviceType::cpu) {
    const QuantizedWeight logical = unpack_weight(w);
    return cpu::linear(a, logical.view(), bias, d);
  }
  check_cuda_alignment(check, a.q, "a.q");
#if NIBBLE_WITH_CUDA
  cuda::linear_packed(a, w, bias, d, stream);
#else
  (void)stream;
#endif
}

namespace {

// A fusion view is switched off by leaving it default-constructed.
bool present(const TensorView& t) { return t.data != nullptr || t.rank != 0; }

// Whether the bytes of two row-major (rows, cols) views with contiguous rows overlap.
bool overlaps(const TensorView& a, const TensorView& b) {
  const auto span = [](const TensorView& t) {
    const auto* p = static_cast<const char*>(t.data);
    const int64_t bytes = ((t.size(0) - 1) * t.stride(0) + t.size(1)) * dtype_bits(t.dtype) / 8;
    return std::pair{p, p + bytes};
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

void check_linear_fusion(const ArgCheck& check, const TensorView& x, const PackedWeightView& w,
                         const TensorView& d, const LinearFusion& f) {
  const int64_t m = x.size(0);
  check.condition(w.layout == WeightLayout::w4_mma_k128, "fusion",
                  std::string("needs packed W4A8 weights (layout w4_mma_k128), got layout ") +
                      to_string(w.layout));
  if (f.accumulate || present(f.out_sumsq))
    check.condition(d.dtype == DType::f32, "d",
                    std::string("must be f32 with fusion.accumulate or fusion.out_sumsq (the "
                                "residual stream), got ") + to_string(d.dtype));
  auto sums = [&](const TensorView& t, const char* arg, int64_t cols) {
    check.tensor(t, arg, 2);
    check.dtype(t, arg, {DType::f64});
    check.shape(t, arg, {m, sumsq_granules(cols)});
    check.rows_packed(t, arg);
    check.device(t, arg, x.device);
  };
  if (present(f.out_sumsq)) sums(f.out_sumsq, "fusion.out_sumsq", w.n);
  if (!present(f.in_sumsq)) {
    check.condition(!present(f.norm_weight), "fusion.norm_weight",
                    "is given without fusion.in_sumsq: the norm needs the rows' sums of squares");
    return;
  }
  sums(f.in_sumsq, "fusion.in_sumsq", w.k);
  check.tensor(f.norm_weight, "fusion.norm_weight", 1);
  check.dtype(f.norm_weight, "fusion.norm_weight", {DType::f32});
  check.shape(f.norm_weight, "fusion.norm_weight", {w.k});
  check.contiguous(f.norm_weight, "fusion.norm_weight");
  check.device(f.norm_weight, "fusion.norm_weight", x.device);
  check.condition(std::isfinite(f.norm_eps) && f.norm_eps > 0.0f, "fusion.norm_eps",
                  "must be positive and finite, got " + std::to_string(f.norm_eps));
  if (present(f.out_sumsq))
    check.condition(!overlaps(f.in_sumsq, f.out_sumsq), "fusion.out_sumsq",
                    "must not overlap fusion.in_sumsq (a launch reads one while it writes the "
                    "other)");
}

// The reference of linear(x, packed W4A8) with LinearFusion (docs/formats.md §6.2; an empty one
// for the plain call): normalize x, quantize it per token, the linear (in f32 when the output
// side is fused), then the add and the granule sums.
void linear_quantizing_on_cpu(const TensorView& x, const QuantizedWeight& logical,
                         const TensorView* bias, const TensorView& d, const LinearFusion& f) {
  const int64_t m = x.size(0), k = x.size(1), n = logical.view().n;
  std::vector<float> y;
  TensorView in = x;
  if (present(f.in_sumsq)) {
    y.resize(static_cast<size_t>(m * k));
    for (int64_t r = 0; r < m; ++r) {
      const auto* s = static_cast<const double*>(f.in_sumsq.data) + r * f.in_sumsq.stride(0);
      const float inv = detail::rms_inverse(s, f.in_sumsq.size(1), k, f.norm_eps);
      for (int64_t c = 0; c < k; ++c)
        y[static_cast<size_t>(r * k + c)] =
            detail::rms_apply(cpu::get_float(x, r, c), inv, cpu::get_float(f.norm_weight, c, 0));
    }
    in = TensorView::contiguous(y.data(), DType::f32, {m, k});
  }
  QuantizedActivation a(ActScheme::s8_per_token, m, k);
  quantize_activation(in, a.view());
  if (!f.accumulate && !present(f.out_sumsq)) return cpu::linear(a.view(), logical.view(), bias, d);
  std::vector<float> result(static_cast<size_t>(m * n));
  cpu::linear(a.view(), logical.view(), bias,
              TensorView::contiguous(result.data(), DType::f32, {m, n}));
  for (int64_t r = 0; r < m; ++r) {
    float* row = static_cast<float*>(d.data) + r * d.stride(0);
    for (int64_t c = 0; c < n; ++c) {
      const float v = result[static_cast<size_t>(r * n + c)];
      row[c] = f.accumulate ? row[c] + v : v;
    }
    if (present(f.out_sumsq))
      detail::granule_sums(row, n,
                           static_cast<double*>(f.out_sumsq.data) + r * f.out_sumsq.stride(0));
  }
}

void linear_float_in(const TensorView& x, const PackedWeightView& w, const TensorView* bias,
                     const TensorView& d, const LinearFusion* fusion, Stream stream) {
  const ArgCheck check("linear");
  check.tensor(x, "x", 2);
  const Device device = x.device;
  check_packed(check, w, device, true,
               {WeightLayout::w4_mma16_k128, WeightLayout::w8_mma16_k128,
                WeightLayout::w4_mma_k128});
  check.condition(x.size(1) == w.k, "x",
                  "must have K = " + std::to_string(w.k) + " columns like the weights, got " +
                      std::to_string(x.size(1)));
  check.rows_packed(x, "x");
  check_output(check, bias, d, x.size(0), w.n, device);
  if (fusion != nullptr) check_linear_fusion(check, x, w, d, *fusion);
  // W4A8 weights with float activations: per-token dynamic int8 quantization first (fused into
  // the GEMM on the GPU for small M), so the result equals quantize_activation + linear.
  const bool quantizing = w.layout == WeightLayout::w4_mma_k128;
  if (quantizing) {
    check_mma_k(check, w);
    check_w4a8_k_limit(check, w);
  }
  detail::check_backend(check, device);
  if (device.type == DeviceType::cpu) {
    check.dtype(x, "x", {DType::f32, DType::f16, DType::bf16});
    const QuantizedWeight logical = unpack_weight(w);
    if (!quantizing) return cpu::linear(x, logical.view(), bias, d);
    return linear_quantizing_on_cpu(x, logical, bias, d, fusion != nullptr ? *fusion : LinearFusion{});
  }
  // The 16-bit tensor cores take the activations as they are: 16-bit floats, 16-byte rows. W4A8
  // quantizes them first (inside the GEMM for 16-bit x at small M): f32 is accepted there too.
  if (quantizing) check.dtype(x, "x", {DType::bf16, DType::f16, DType::f32});
  else check.dtype(x, "x", {DType::bf16, DType::f16});
  check.condition(w.k % 8 == 0, "w.k",
                  "must be a multiple of 8 (16-byte rows of x) for the CUDA kernels, got " +
                      std::to_string(w.k));
  check_cuda_alignment(check, x, "x");
#if NIBBLE_WITH_CUDA
  if (fusion != nullptr) return cuda::linear_packed(x, w, bias, d, *fusion, stream);
  cuda::linear_packed(x, w, bias, d, stream);
#else
  (void)stream;
#endif
}

}  // namespace

void linear(const TensorView& x, const PackedWeightView& w, const TensorView* bias,
            const TensorView& d, Stream stream) {
  linear_float_in(x, w, bias, d, nullptr, stream);
}

void linear(const TensorView& x, const PackedWeightView& w, const TensorView* bias,
            const TensorView& d, const LinearFusion& fusion, Stream stream) {
  linear_float_in(x, w, bias, d, &fusion, stream);
}

void gemm_s32(const TensorView& a, const PackedWeightView& w, const TensorView& d, Stream stream) {
  const ArgCheck check("gemm_s32");
  check.tensor(a, "a", 2);
  check.dtype(a, "a", {DType::s8});
  check.rows_packed(a, "a");
  check_packed(check, w, a.device, false, {WeightLayout::w4_mma_k128});
  check_mma_k(check, w);
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
