// Validation of the composite arguments (quantized weights and activations) shared by the
// public entry points. Everything here throws nibble::Error before any output is touched.
#pragma once

#include <cstdint>
#include <string>

#include "common/check.h"
#include "nibble/quantize.h"

namespace nibble::detail {

/// weight_storage(f, n, k), with failures reported by `check` (so they name the calling
/// function) and argument names prefixed by `prefix` ("w." for the fields of argument w).
WeightStorage checked_weight_storage(const ArgCheck& check, const WeightFormat& f, int64_t n,
                                     int64_t k, const std::string& prefix);
/// A quantized weight view matches weight_storage(format, n, k), with every buffer on `device`.
/// `name` is the argument in messages: "w" names its buffers 'w.q', 'w.scales', ...
void check_weight(const ArgCheck& check, const QuantizedWeightView& w, Device device,
                  const std::string& name = "w");
/// Quantized activations (M, K) of `scheme` on `device`; returns M.
int64_t check_activation(const ArgCheck& check, const QuantizedActivationView& a, Device device);
/// One buffer against its spec; `arg` names it in messages.
void check_buffer(const ArgCheck& check, const TensorView& t, const char* arg,
                  const BufferSpec& spec, Device device);
/// The CUDA backend exists in this build and `device` is a usable CUDA device.
void check_backend(const ArgCheck& check, Device device);

}  // namespace nibble::detail
