// The CUDA backend behind the public API: kernel-specific preconditions, selection, launch.
#include "cuda/backend.h"

#include "common/cuda_runtime_check.h"
#include "cuda/dispatch/registry.h"
#include "cuda/generic/act_quant.h"
#include "cuda/generic/simt_linear.h"

namespace nibble::cuda {

namespace {

float act_qmax(ActScheme s) {
  return s == ActScheme::s4_per_token ? 7.0f : s == ActScheme::e4m3_per_token ? 448.0f : 127.0f;
}

ActQuantArgs act_quant_args(const TensorView& x, const QuantizedActivationView& out) {
  ActQuantArgs args;
  args.m = x.size(0);
  args.k = x.size(1);
  args.x = operand(x);
  args.q = out.q.data;
  args.q_dtype = out.q.dtype;
  args.q_row_stride = out.q.stride(0);
  args.scales = static_cast<float*>(out.scales.data);
  args.qmax = act_qmax(out.scheme);
  return args;
}

}  // namespace

void quantize_activation(const TensorView& x, const QuantizedActivationView& out, Stream stream) {
  detail::DeviceGuard guard(x.device.index);
  launch_act_quant(act_quant_args(x, out), stream);
}

void quantize_activation_static(const TensorView& x, float scale,
                                const QuantizedActivationView& out, Stream stream) {
  detail::DeviceGuard guard(x.device.index);
  ActQuantArgs args = act_quant_args(x, out);
  args.static_scale = scale;
  launch_act_quant(args, stream);
}

void gemm_s32(const TensorView& a, const TensorView& w, const TensorView& d, Stream stream) {
  detail::DeviceGuard guard(a.device.index);
  SimtLinearArgs args;
  args.out_s32 = true;
  args.m = a.size(0);
  args.n = w.size(0);
  args.k = a.size(1);
  args.scale_span = args.k;
  args.a = operand(a);
  args.w = operand(w);
  args.w_scheme = w.dtype == DType::s8 ? WeightScheme::s8_sym : WeightScheme::s4_sym;
  args.d = d.data;
  args.d_dtype = DType::s32;
  args.d_row_stride = d.stride(0);
  launch_simt_linear(args, stream);
}

void linear(const QuantizedActivationView& a, const QuantizedWeightView& w,
            const TensorView* bias, const TensorView& d, Stream stream) {
  detail::DeviceGuard guard(a.q.device.index);
  const LinearProblem p =
      make_problem({w.format, a.scheme}, a.q.size(0), w.n, w.k, a.q.device.index);
  LinearCall call;
  call.a = &a;
  call.w = &w;
  call.bias = bias;
  call.d = &d;
  select_linear(p).launch(p, call, stream);
}

void linear(const TensorView& x, const QuantizedWeightView& w, const TensorView* bias,
            const TensorView& d, Stream stream) {
  detail::DeviceGuard guard(x.device.index);
  const LinearProblem p =
      make_problem({w.format, ActScheme::none}, x.size(0), w.n, w.k, x.device.index);
  LinearCall call;
  call.x = &x;
  call.w = &w;
  call.bias = bias;
  call.d = &d;
  select_linear(p).launch(p, call, stream);
}

std::string explain(const LinearFormat& format, int64_t m, int64_t n, int64_t k, int device) {
  return explain_linear(make_problem(format, m, n, k, device));
}

}  // namespace nibble::cuda
