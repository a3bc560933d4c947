// Validation of the composite arguments (quantized weights and activations) shared by the
// public entry points. Everything here throws nibble::Error before any output is touched.
#pragma once

#include "common/check.h"
#include "nibble/quantize.h"

namespace nibble::detail {

/// A quantized weight view matches weight_storage(format, n, k), with every buffer on `device`.
void check_weight(const ArgCheck& check, const QuantizedWeightView& w, Device device);
/// Quantized activations (M, K) of `scheme` on `device`; returns M.
int64_t check_activation(const ArgCheck& check, const QuantizedActivationView& a, Device device);
/// One buffer against its spec; `arg` names it in messages.
void check_buffer(const ArgCheck& check, const TensorView& t, const char* arg,
                  const BufferSpec& spec, Device device);
/// The CUDA backend exists in this build and `device` is a usable CUDA device.
void check_backend(const ArgCheck& check, Device device);

}  // namespace nibble::detail
