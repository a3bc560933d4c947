// Registry row of the generic SIMT kernel (see cuda/dispatch/registry.h).
#pragma once

#include "cuda/dispatch/registry.h"
#include "cuda/generic/simt_linear.h"

namespace nibble::cuda {

LinearKernel simt_linear_kernel_entry();
/// Fills the SIMT kernel's arguments for a validated call (shared with gemm_s32).
void launch_simt_for_call(const LinearProblem& p, const LinearCall& call, Stream stream);
/// The SIMT arguments that come from quantized activations (mode, rows, values, scales), and
/// those that come from the bias and output: shared by the registry row and the packed-weight
/// W4A-FP8 fallback (cuda/backend.cpp).
void set_quantized_input(SimtLinearArgs& args, const QuantizedActivationView& a);
void set_output(SimtLinearArgs& args, const TensorView* bias, const TensorView& d);

}  // namespace nibble::cuda
