// The CUDA backend behind the public API: kernel-specific preconditions, selection, launch.
#include "cuda/backend.h"

#include <string>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "common/env.h"
#include "cuda/dispatch/int8_mma.h"
#include "cuda/dispatch/registry.h"
#include "cuda/generic/act_quant.h"
#include "cuda/generic/residual_norm.h"
#include "cuda/generic/simt_linear.h"
#include "cuda/generic/simt_linear_entry.h"
#include "cuda/launch/sm80_w4a8_gemm.h"
#include "cuda/launch/sm80_weight_only_gemm.h"
#include "cuda/launch/sm90_w4a8_gemm.h"
#include "cuda/launch/sm90_weight_only_gemm.h"
#include "cuda/launch/pdl_launch.h"
#include "cuda/launch/split_k_workspace.h"
#include "nibble/device.h"

namespace nibble::cuda {

void quantize_activation(const TensorView& x, const QuantizedActivationView& out,
                         const ActQuantFusion& fusion, Stream stream, float static_scale) {
  detail::DeviceGuard guard(x.device.index);
  const ActQuantArgs args = act_quant_args(x, out, fusion, static_scale);
  const DeviceInfo dev = cuda_device_info(x.device.index);
  launch_act_quant(args, plan_act_quant(args, dev), stream,
                   overlapping_launch_allowed(dev.cc_major));
}

void gemm_s32(const TensorView& a, const TensorView& w, const TensorView& d, Stream stream) {
  detail::DeviceGuard guard(a.device.index);
  // s8 × s8 on tensor cores when the rows allow 16-byte copies; everything else (s4 operands,
  // odd strides) on the SIMT kernel. Both are bit-exact.
  if (int8_mma_handles_s32(a, w)) return launch_int8_mma_s32(a, w, d, stream);
  SimtLinearArgs args;
  args.out_s32 = true;
  args.m = a.size(0);
  args.n = w.size(0);
  args.k = a.size(1);
  args.scale_span = args.k;
  args.a = operand(a);
  args.w = operand(w);
  args.w_scheme = w.dtype == DType::s8 ? WeightScheme::s8_sym : WeightScheme::s4_sym;
  set_output(args, nullptr, d);  // d is s32 (validated)
  launch_simt_linear(args, stream);
}

namespace {
// Logical-weight linear: select from the registry and launch (exactly one of a, x is set).
void run_registry(const QuantizedActivationView* a, const TensorView* x,
                  const QuantizedWeightView& w, const TensorView* bias, const TensorView& d,
                  Stream stream) {
  const TensorView& in = a != nullptr ? a->q : *x;
  detail::DeviceGuard guard(in.device.index);
  const ActScheme act = a != nullptr ? a->scheme : ActScheme::none;
  LinearProblem p = make_problem({w.format, act}, in.size(0), w.n, w.k, in.device.index);
  p.aligned16 = rows_aligned16(in) && rows_aligned16(w.q) && w.scales.is_contiguous() &&
                reinterpret_cast<uintptr_t>(w.scales.data) % 16 == 0;
  LinearCall call;
  call.a = a;
  call.x = x;
  call.w = &w;
  call.bias = bias;
  call.d = &d;
  select_linear(p).launch(p, call, stream);
}
}  // namespace

void linear(const QuantizedActivationView& a, const QuantizedWeightView& w,
            const TensorView* bias, const TensorView& d, Stream stream) {
  run_registry(&a, nullptr, w, bias, d, stream);
}

void linear(const TensorView& x, const QuantizedWeightView& w, const TensorView* bias,
            const TensorView& d, Stream stream) {
  run_registry(nullptr, &x, w, bias, d, stream);
}

namespace {

sm80::W4A8Epilogue epilogue_of(const WeightFormat& w) {
  return w.scheme == WeightScheme::s4_two_level ? sm80::W4A8Epilogue::two_level
         : w.per_channel()                      ? sm80::W4A8Epilogue::per_channel
                                                : sm80::W4A8Epilogue::group;
}

// The launch of a packed-weight W4A8 call: shapes, weights with their scales and group data,
// bias and output; the caller sets the activations' scales (or x for fused quantization).
W4A8Launch w4a8_launch(const TensorView& a, const PackedWeightView& w, const TensorView* bias,
                       const TensorView& d) {
  W4A8Launch l;
  l.device = a.device.index;
  l.m = a.size(0);
  l.n = w.n;
  l.k = w.k;
  l.n_pad = w.n_pad;
  l.k_pad = w.k_pad;
  l.a = a.data;
  l.lda = a.stride(0);
  l.w = w.q.data;
  l.w_scales = static_cast<const float*>(w.scales.data);
  l.w_params = w.group_params.data;
  l.group = w.format.group_size;
  l.epilogue = epilogue_of(w.format);
  if (bias != nullptr) {
    l.bias = bias->data;
    l.bias_dtype = bias->dtype;
  }
  l.d = d.data;
  l.ldd = d.stride(0);
  l.d_dtype = d.dtype;
  return l;
}

void require_sm80(int device) {
  const DeviceInfo info = cuda_device_info(device);
  if (info.cc_major < 8)
    nibble::detail::fail(ErrorCode::unsupported,
                         "nibble: the int4 tensor-core kernels need compute capability 8.0 or "
                         "newer, device " + std::to_string(device) + " is " + info.name +
                             " (sm_" + std::to_string(info.cc_major) +
                             std::to_string(info.cc_minor) + ")");
}

}  // namespace

namespace {
// W4A-FP8 on packed weights: the tensor-core kernel w4afp8_kernel picks (dispatch/int8_mma.h:
// the thin mma.sync tiles at small M, the wgmma kernel above, per channel or G = 128), else the
// generic SIMT kernel reading the packed layout (the same formula: f32 products and per-group
// f32 sums). NIBBLE_W4AFP8_KERNEL forces one (tests run each on Hopper).
void linear_packed_w4afp8(const QuantizedActivationView& a, const PackedWeightView& w,
                          const TensorView* bias, const TensorView& d, Stream stream) {
  const W4AFp8Kernel kernel = w4afp8_kernel(a.q.device.index, a.q.size(0), epilogue_of(w.format),
                                            w.format.group_size);
  if (kernel != W4AFp8Kernel::simt_linear) {
    W4A8Launch l = w4a8_launch(a.q, w, bias, d);
    l.a_e4m3 = true;
    l.a_scales = static_cast<const float*>(a.scales.data);
    if (kernel == W4AFp8Kernel::sm80_w4afp8_gemm) return launch_sm80_w4a8(l, stream);
    return launch_sm90_w4a8(l, stream);
  }
  SimtLinearArgs args;
  set_quantized_input(args, a);
  args.n = w.n;
  args.k = w.k;
  args.w_scheme = w.format.scheme;
  args.group_size = w.format.group_size;
  args.scale_span = w.format.per_channel() ? w.k : w.format.group_size;
  args.w = {w.q.data, DType::u8, 0};
  args.w_packed_k_pad = w.k_pad;
  args.w_scales = {w.scales.data, DType::f32, w.format.per_channel() ? 1 : w.n_pad};
  set_output(args, bias, d);
  launch_simt_linear(args, stream);
}
}  // namespace

void linear_packed(const QuantizedActivationView& a, const PackedWeightView& w,
                   const TensorView* bias, const TensorView& d, Stream stream) {
  detail::DeviceGuard guard(a.q.device.index);
  require_sm80(a.q.device.index);
  if (a.scheme == ActScheme::e4m3_per_token) return linear_packed_w4afp8(a, w, bias, d, stream);
  W4A8Launch l = w4a8_launch(a.q, w, bias, d);
  l.a_scales = static_cast<const float*>(a.scales.data);
  l.a_per_tensor = a.scheme == ActScheme::s8_per_tensor;
  launch_int8_mma(l, stream);
}

namespace {
sm80::WeightOnlyDequant dequant_of(const WeightFormat& w) {
  using sm80::WeightOnlyDequant;
  if (w.per_channel()) return WeightOnlyDequant::per_channel;
  switch (w.scheme) {
    case WeightScheme::u4_asym: return WeightOnlyDequant::group_zero;
    case WeightScheme::u4_fzp: return WeightOnlyDequant::group_fzp;
    default: return WeightOnlyDequant::group_scale;
  }
}
}  // namespace

namespace {
// W4A8 packed weights with float activations: either the activation kernel quantizes x into
// the stream's activation workspace and the int8-activation kernels run (two launches), or,
// where sm80_w4a8_gemm's m16 tile can hold its rows of its K range resident (fused_quant_fits:
// M ≤ 4, M · K range ≤ 16 KB), the quantization runs inside the GEMM (one launch: each CTA finds
// the rows' max |x|, with a cluster split-K tile's CTAs sharing theirs, and quantizes its K
// range once). Both give the codes and scales of quantize_activation.
// Which one runs: a plain linear(x, packed) takes the two launches, as every measurement since
// the overlapping (PDL) launch found the in-GEMM quantization slower at M = 1 (each of the many
// split-K CTAs re-reads and re-reduces x: 1.05–1.28x the two launches' time on the H200, five
// runs, docs/kernels.md). A linear with a LinearFusion (the runner's residual stream) fuses
// where it fits, as there the GEMM also does the RMSNorm and the residual store that would
// otherwise be launches of their own. NIBBLE_FUSED_ACT_QUANT overrides both: 1 fuses wherever
// it fits, 0 never (A/B measurements).
enum class FusedActQuant { plain_two_launches, everywhere, never };
FusedActQuant fused_act_quant_setting() {  // read on every call: tests and benches switch it
  switch (nibble::detail::env_choice("NIBBLE_FUSED_ACT_QUANT", {"0", "1"})) {
    case 0: return FusedActQuant::never;
    case 1: return FusedActQuant::everywhere;
    default: return FusedActQuant::plain_two_launches;
  }
}
// Whether the in-GEMM quantization is allowed for a linear with (`fusion`) or without a
// LinearFusion.
bool fused_act_quant_enabled(bool fusion) {
  const FusedActQuant s = fused_act_quant_setting();
  return s == FusedActQuant::everywhere || (fusion && s == FusedActQuant::plain_two_launches);
}

// sm80_w4a8_gemm's plan for a packed W4A8 problem at M.
W4A8Plan sm80_plan(int device, int64_t m, int64_t n_pad, int64_t k, int64_t k_pad,
                   const WeightFormat& w) {
  const DeviceInfo info = cuda_device_info(device);
  return plan_sm80_w4a8(m, n_pad, k, k_pad, epilogue_of(w), w.group_size, info.sm_count,
                        info.cc_major >= 9);
}

// Whether linear(x, packed) without a LinearFusion quantizes x inside sm80_w4a8_gemm for this
// packed W4A8 problem.
bool fused_act_quant_runs(int device, int64_t m, int64_t n_pad, int64_t k, int64_t k_pad,
                          const WeightFormat& w) {
  return fused_act_quant_enabled(false) &&
         fused_quant_fits(sm80_plan(device, m, n_pad, k, k_pad, w), m);
}

// The int8 codes of x (M, K) in a workspace region at `base`: rows padded to 16 bytes, then the
// M f32 scales (int8_bytes(m, k) bytes).
int64_t int8_pitch(int64_t k) { return (k + 15) / 16 * 16; }
size_t int8_bytes(int64_t m, int64_t k) {
  return size_t(m) * size_t(int8_pitch(k)) + size_t(m) * sizeof(float);
}
QuantizedActivationView int8_region(uint8_t* base, int64_t m, int64_t k, Device device) {
  const int64_t ldq = int8_pitch(k);
  QuantizedActivationView a;
  a.scheme = ActScheme::s8_per_token;
  a.q = TensorView::contiguous(base, DType::s8, {m, k}, device);
  a.q.strides[0] = ldq;
  a.scales = TensorView::contiguous(base + size_t(m) * size_t(ldq), DType::f32, {m}, device);
  return a;
}

// The launch of sm80_w4a8_gemm with x as the A source, quantized in the kernel.
W4A8Launch fused_quant_launch(const TensorView& x, const PackedWeightView& w,
                              const TensorView* bias, const TensorView& d) {
  W4A8Launch l = w4a8_launch(x, w, bias, d);
  l.a = nullptr;
  l.x = x.data;
  l.ldx = x.stride(0);
  l.x_dtype = x.dtype;
  return l;
}

// x quantized inside the GEMM (`fused`: fused_act_quant_runs), or by the activation kernel
// into `int8` (int8_bytes of workspace) and then the int8-activation kernels.
bool fused_act_quant_runs(const TensorView& x, const PackedWeightView& w) {
  return fused_act_quant_runs(x.device.index, x.size(0), w.n_pad, w.k, w.k_pad, w.format);
}
void linear_packed_w4a8_float_in(const TensorView& x, const PackedWeightView& w,
                                 const TensorView* bias, const TensorView& d, bool fused,
                                 uint8_t* int8, Stream stream) {
  const int64_t m = x.size(0), k = x.size(1);
  if (fused) return launch_sm80_w4a8(fused_quant_launch(x, w, bias, d), stream);
  const QuantizedActivationView a = int8_region(int8, m, k, x.device);
  cuda::quantize_activation(x, a, ActQuantFusion{}, stream);
  linear_packed(a, w, bias, d, stream);
}

void linear_packed_w4a8_float_in(const TensorView& x, const PackedWeightView& w,
                                 const TensorView* bias, const TensorView& d, Stream stream) {
  const bool fused = fused_act_quant_runs(x, w);
  uint8_t* int8 = fused ? nullptr
                        : static_cast<uint8_t*>(activation_workspace(
                              x.device.index, stream, int8_bytes(x.size(0), x.size(1))));
  linear_packed_w4a8_float_in(x, w, bias, d, fused, int8, stream);
}
}  // namespace

void linear_packed(const TensorView& x, const PackedWeightView& w, const TensorView* bias,
                   const TensorView& d, const LinearFusion& f, Stream stream) {
  const bool norm = f.in_sumsq.data != nullptr;
  const bool out = f.accumulate || f.out_sumsq.data != nullptr;
  if (!norm && !out) return linear_packed(x, w, bias, d, stream);  // nothing to fuse
  detail::DeviceGuard guard(x.device.index);
  require_sm80(x.device.index);
  // One plan answers both: whether the GEMM quantizes x, and whether it runs the fusions inside
  // (residual_fusion_fits, f32 x and d).
  const int64_t m = x.size(0), k = x.size(1);
  const int device = x.device.index;
  const W4A8Plan plan = sm80_plan(device, m, w.n_pad, w.k, w.k_pad, w.format);
  const bool fused = fused_act_quant_enabled(true) && fused_quant_fits(plan, m);
  if (fused && x.dtype == DType::f32 && d.dtype == DType::f32 &&
      residual_fusion_fits(plan, m, cuda_device_info(device).cc_major)) {
    W4A8Launch l = fused_quant_launch(x, w, bias, d);
    if (norm) {
      l.in_sumsq = static_cast<const double*>(f.in_sumsq.data);
      l.in_sumsq_ld = f.in_sumsq.stride(0);
      l.norm_weight = static_cast<const float*>(f.norm_weight.data);
      l.norm_eps = f.norm_eps;
    }
    l.accumulate = f.accumulate;
    if (f.out_sumsq.data != nullptr) {
      l.out_sumsq = static_cast<double*>(f.out_sumsq.data);
      l.out_sumsq_ld = f.out_sumsq.stride(0);
    }
    return launch_sm80_w4a8(l, stream);
  }
  // The fusions around the unfused path, in one workspace: y (the normalized x, f32), t (the
  // linear's f32 result), then the int8 codes if x is quantized by the activation kernel.
  // Whether the GEMM quantizes its input depends on the shapes only: y's answer is x's.
  const auto align = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t y_bytes = norm ? align(size_t(m) * size_t(k) * 4) : 0;
  const size_t t_bytes = out ? align(size_t(m) * size_t(w.n) * 4) : 0;
  auto* base = static_cast<uint8_t*>(activation_workspace(
      x.device.index, stream, y_bytes + t_bytes + (fused ? 0 : int8_bytes(m, k))));
  TensorView in = x;
  if (norm) {
    auto* y = reinterpret_cast<float*>(base);
    launch_rms_from_sums(m, k, operand(x), static_cast<const double*>(f.in_sumsq.data),
                         f.in_sumsq.stride(0), static_cast<const float*>(f.norm_weight.data),
                         f.norm_eps, y, k, stream);
    in = TensorView::contiguous(y, DType::f32, {m, k}, x.device);
  }
  TensorView result = d;
  if (out) result = TensorView::contiguous(base + y_bytes, DType::f32, {m, w.n}, x.device);
  linear_packed_w4a8_float_in(in, w, bias, result, fused, base + y_bytes + t_bytes, stream);
  if (out)
    launch_residual_store(m, w.n, static_cast<const float*>(result.data), w.n,
                          static_cast<float*>(d.data), d.stride(0), f.accumulate,
                          static_cast<double*>(f.out_sumsq.data),
                          f.out_sumsq.data != nullptr ? f.out_sumsq.stride(0) : 0, stream);
}

void linear_packed(const TensorView& x, const PackedWeightView& w, const TensorView* bias,
                   const TensorView& d, Stream stream) {
  detail::DeviceGuard guard(x.device.index);
  require_sm80(x.device.index);
  if (w.layout == WeightLayout::w4_mma_k128) return linear_packed_w4a8_float_in(x, w, bias, d, stream);
  WeightOnlyLaunch l;
  l.device = x.device.index;
  l.x_dtype = x.dtype;
  l.bits = layout_weight_bits(w.layout);
  l.dequant = dequant_of(w.format);
  l.group = w.format.group_size;
  l.m = x.size(0);
  l.n = w.n;
  l.k = w.k;
  l.n_pad = w.n_pad;
  l.k_pad = w.k_pad;
  l.x = x.data;
  l.ldx = x.stride(0);
  l.w = w.q.data;
  l.w_scales = static_cast<const float*>(w.scales.data);
  l.w_zeros = static_cast<const float*>(w.zeros.data);
  if (bias != nullptr) {
    l.bias = bias->data;
    l.bias_dtype = bias->dtype;
  }
  l.d = d.data;
  l.ldd = d.stride(0);
  l.d_dtype = d.dtype;
  if (use_sm90_weight_only(l.device, l.m)) return launch_sm90_weight_only(l, stream);
  launch_sm80_weight_only(l, stream);
}

void gemm_s32_packed(const TensorView& a, const PackedWeightView& w, const TensorView& d,
                     Stream stream) {
  detail::DeviceGuard guard(a.device.index);
  require_sm80(a.device.index);
  W4A8Launch l = w4a8_launch(a, w, nullptr, d);
  l.epilogue = sm80::W4A8Epilogue::s32;
  launch_int8_mma(l, stream);
}

std::string explain(const LinearFormat& format, int64_t m, int64_t n, int64_t k, int device) {
  const LinearProblem logical = make_problem(format, m, n, k, device);
  std::string s = "logical weights: " + explain_linear(logical);
  // W8A8 and W4A4 kernels read the logical row-major weights: nothing to pack.
  const auto chosen = select_linear(logical).supports;  // the rows share their launcher
  if (chosen == w8a8_int8_mma_entry().supports)
    return s + ", " + describe_int8_mma(device, m, n, k, sm80::W4A8Epilogue::per_channel, 0, 8);
  if (chosen == w4a4_int8_mma_entry().supports)
    return s + ", " +
           describe_int8_mma(device, m, n, k,
                             format.weight.per_channel() ? sm80::W4A8Epilogue::per_channel
                                                         : sm80::W4A8Epilogue::group,
                             format.weight.group_size, 4, true) +
           "; " + w4a4_granularity_note(device);
  if (!has_packed_layout(format)) return s + "; no packed layout for this format yet";
  const DeviceInfo info = cuda_device_info(device);
  if (info.cc_major < 8) return s + "; packed weights need sm_80+";
  const std::string packed = "; packed weights (pack_weight, layout " +
                             std::string(to_string(packed_layout(format))) + "): runs ";
  // Every packed layout pads N to 8-channel blocks and K to 128-wide blocks.
  const int64_t n_pad = (n + 7) / 8 * 8, k_pad = (k + 127) / 128 * 128;
  if (format.act == ActScheme::none) {
    if (k % 8 != 0) return s + "; packed weight-only layouts need K % 8 == 0";
    const int weight_bits = layout_weight_bits(packed_layout(format));
    if (use_sm90_weight_only(device, m))
      return s + packed + describe(plan_sm90_weight_only(m, n_pad, k_pad, weight_bits, device)) +
             " on " + std::to_string(info.sm_count) + " SMs (Hopper: M >= " +
             std::to_string(kSm90WeightOnlyMinTokens) + ")";
    return s + packed + describe(plan_sm80_weight_only(m, n_pad, k_pad, weight_bits, device)) +
           " on " + std::to_string(info.sm_count) + " SMs";
  }
  if (k % 32 != 0) return s + "; packed W4A8 weights need K % 32 == 0";
  if (format.act == ActScheme::e4m3_per_token) {
    const WeightFormat& wf = format.weight;
    switch (w4afp8_kernel(device, m, epilogue_of(wf), wf.group_size)) {
      case W4AFp8Kernel::sm90_w4afp8_gemm:
        return s + packed +
               describe(plan_sm90_w4a8(m, n_pad, k_pad, epilogue_of(wf), device, 4, true)) +
               " on " + std::to_string(info.sm_count) +
               " SMs (fp8 e4m3 wgmma, f32 sums per K block)";
      case W4AFp8Kernel::sm80_w4afp8_gemm:
        return s + packed +
               describe(plan_sm80_w4a8(m, n_pad, k, k_pad, epilogue_of(wf), wf.group_size,
                                       info.sm_count, info.cc_major >= 9, 4, false, true)) +
               " on " + std::to_string(info.sm_count) +
               (info.cc_major >= 9
                    ? " SMs (the decode tiles: f16 mma.sync on operands converted once, as "
                      "sm_90 has no fp8 mma.sync; M <= 16)"
                    : " SMs (the decode tiles: fp8 e4m3 mma.sync)");
      case W4AFp8Kernel::simt_linear: break;
    }
    return s + packed +
           "simt_linear on the packed layout (the fp8 tensor-core kernels need per-channel or "
           "g128 weights, and sm_89+ code built for this GPU)";
  }
  s += packed + describe_int8_mma(device, m, n, k, epilogue_of(format.weight),
                                  format.weight.group_size, 4);
  if (format.act != ActScheme::s8_per_token) return s;
  const std::string fits = "M <= " + std::to_string(kFusedQuantMaxTokens) +
                           " and M x the K range per CTA <= 16 KB)";
  std::string two_launches = "act_quant quantizes them first (two launches: ";
  switch (fused_act_quant_setting()) {
    case FusedActQuant::plain_two_launches:
      two_launches += "measured faster than quantizing inside the GEMM; a LinearFusion, or "
                      "NIBBLE_FUSED_ACT_QUANT=1, fuses it where " + fits;
      break;
    case FusedActQuant::everywhere: two_launches += "the fused path needs " + fits; break;
    case FusedActQuant::never: two_launches += "NIBBLE_FUSED_ACT_QUANT=0)"; break;
  }
  return s + "; with float activations (linear(x, packed)) " +
         (fused_act_quant_runs(device, m, n_pad, k, k_pad, format.weight)
              ? std::string("the per-token quantization is fused into sm80_w4a8_gemm's 16-row "
                            "tile (one launch: the rows of each CTA's K range quantized once "
                            "into shared memory)")
              : two_launches);
}

}  // namespace nibble::cuda
