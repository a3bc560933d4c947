#include "cuda/generic/simt_linear_entry.h"

#include "cuda/generic/simt_linear.h"

namespace nibble::cuda {

namespace {
bool supports_all(const LinearProblem&, std::string*) { return true; }
}  // namespace

void launch_simt_for_call(const LinearProblem& p, const LinearCall& call, Stream stream) {
  const QuantizedWeightView& w = *call.w;
  SimtLinearArgs args;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.w_scheme = w.format.scheme;
  args.group_size = w.format.group_size;
  const bool whole_k = w.format.per_channel() || w.format.scheme == WeightScheme::s4_two_level;
  args.scale_span = whole_k ? p.k : w.format.group_size;
  args.w = operand(w.q);
  args.w_scales = operand(w.scales);
  args.w_zeros = operand(w.zeros);
  args.w_group_scales = operand(w.group_scales);
  if (call.x != nullptr) {
    args.mode = SimtMode::a16;
    args.a = operand(*call.x);
  } else {
    set_quantized_input(args, *call.a);
  }
  set_output(args, call.bias, *call.d);
  launch_simt_linear(args, stream);
}

void set_quantized_input(SimtLinearArgs& args, const QuantizedActivationView& a) {
  args.mode = a.scheme == ActScheme::e4m3_per_token ? SimtMode::fp8 : SimtMode::integer;
  args.m = a.q.size(0);
  args.a = operand(a.q);
  args.a_scales = operand(a.scales);
  args.a_per_tensor = a.scheme == ActScheme::s8_per_tensor;
}

void set_output(SimtLinearArgs& args, const TensorView* bias, const TensorView& d) {
  if (bias != nullptr) args.bias = operand(*bias);
  args.d = d.data;
  args.d_dtype = d.dtype;
  args.d_row_stride = d.stride(0);
}

LinearKernel simt_linear_kernel_entry() {
  return {"simt_linear (generic CUDA-core fallback, any format and shape)", supports_all,
          launch_simt_for_call};
}

}  // namespace nibble::cuda
