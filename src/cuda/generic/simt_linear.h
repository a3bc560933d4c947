// Launcher interface of the generic SIMT GEMM (simt_linear.cu). Host-only types.
#pragma once

#include <cstdint>

#include "cuda/common/operand.h"
#include "nibble/formats.h"
#include "nibble/types.h"

namespace nibble::cuda {

enum class SimtMode : uint8_t { integer, fp8, a16 };

/// Everything the kernel reads, by value. Operands are (data, dtype, row stride in elements);
/// rank-1 operands use the element stride as their row stride.
struct SimtLinearArgs {
  SimtMode mode = SimtMode::integer;
  bool out_s32 = false;       ///< raw integer GEMM: store the int32 sum, no scales
  bool a_per_tensor = false;  ///< one activation scale for all rows
  int64_t m = 0, n = 0, k = 0;
  int64_t scale_span = 0;     ///< K elements that share one weight scale (K when per channel)
  int64_t group_size = 0;     ///< the weight format's group size (0 per channel)
  WeightScheme w_scheme = WeightScheme::s4_sym;
  /// > 0: `w` is a w4_mma_k128 packed weight (s4_sym, unsigned nibbles u = v + 8) with this
  /// K_pad, and `w_scales` its f32 table: (N_pad) per channel, (K_pad/G, N_pad) per group,
  /// row stride N_pad. The integer and fp8 modes read it.
  int64_t w_packed_k_pad = 0;
  Operand a, a_scales, w, w_scales, w_zeros, w_group_scales, bias;
  void* d = nullptr;
  DType d_dtype = DType::f32;
  int64_t d_row_stride = 0;
};

void launch_simt_linear(const SimtLinearArgs& args, Stream stream);

}  // namespace nibble::cuda
