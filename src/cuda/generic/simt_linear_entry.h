// Registry row of the generic SIMT kernel (see cuda/dispatch/registry.h).
#pragma once

#include "cuda/dispatch/registry.h"

namespace nibble::cuda {

LinearKernel simt_linear_kernel_entry();
/// Fills the SIMT kernel's arguments for a validated call (shared with gemm_s32).
void launch_simt_for_call(const LinearProblem& p, const LinearCall& call, Stream stream);

}  // namespace nibble::cuda
