// The CUDA backend as the API layer sees it: host functions, no CUDA headers. Arguments are
// validated by src/api/ before these are called; these select a kernel (src/cuda/dispatch/),
// check kernel-specific preconditions, launch on `stream` and check the launch.
#pragma once

#include <string>

#include "nibble/formats.h"
#include "nibble/gemm.h"
#include "nibble/layout.h"
#include "nibble/quantize.h"
#include "nibble/types.h"

namespace nibble::cuda {

/// Activation quantization with its fusions: per token when static_scale is 0, else static
/// per tensor with that scale.
void quantize_activation(const TensorView& x, const QuantizedActivationView& out,
                         const ActQuantFusion& fusion, Stream stream, float static_scale = 0.0f);
void gemm_s32(const TensorView& a, const TensorView& w, const TensorView& d, Stream stream);
void linear(const QuantizedActivationView& a, const QuantizedWeightView& w,
            const TensorView* bias, const TensorView& d, Stream stream);
void linear(const TensorView& x, const QuantizedWeightView& w, const TensorView* bias,
            const TensorView& d, Stream stream);
void linear_packed(const QuantizedActivationView& a, const PackedWeightView& w,
                   const TensorView* bias, const TensorView& d, Stream stream);
void linear_packed(const TensorView& x, const PackedWeightView& w, const TensorView* bias,
                   const TensorView& d, Stream stream);
/// With LinearFusion (validated by the caller: layout w4_mma_k128, d f32 where the output side
/// is used, views on x's device).
void linear_packed(const TensorView& x, const PackedWeightView& w, const TensorView* bias,
                   const TensorView& d, const LinearFusion& fusion, Stream stream);
void gemm_s32_packed(const TensorView& a, const PackedWeightView& w, const TensorView& d,
                     Stream stream);
std::string explain(const LinearFormat& format, int64_t m, int64_t n, int64_t k, int device);

}  // namespace nibble::cuda
