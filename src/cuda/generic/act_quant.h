// Launcher interface of the activation quantization kernel (act_quant.cu). Host-only types.
#pragma once

#include <cstdint>

#include "cuda/common/operand.h"
#include "nibble/types.h"

namespace nibble::cuda {

struct ActQuantArgs {
  int64_t m = 0, k = 0;
  Operand x;                ///< (M, K) f32 / f16 / bf16
  void* q = nullptr;        ///< (M, K) s8 / s4 / e4m3
  DType q_dtype = DType::s8;
  int64_t q_row_stride = 0;  ///< in elements
  float* scales = nullptr;   ///< (M) dynamic, or (1) static
  float qmax = 127.0f;       ///< 127 (s8), 7 (s4), 448 (e4m3)
  float static_scale = 0.0f; ///< > 0: static per-tensor quantization with this scale
};

void launch_act_quant(const ActQuantArgs& args, Stream stream);

}  // namespace nibble::cuda
