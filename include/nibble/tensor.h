// nibble — owning tensors for the host and the CUDA device.
//
// The API itself takes views (types.h); these small RAII holders are for programs and tests
// that need storage: `Tensor` owns one contiguous allocation on the CPU or on a CUDA device and
// hands out a `TensorView` of it. `QuantizedWeight` / `QuantizedActivation` own every buffer a
// quantized tensor needs.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "nibble/quantize.h"
#include "nibble/types.h"

namespace nibble {

class Tensor {
 public:
  Tensor() = default;
  /// Uninitialised contiguous storage. CUDA storage throws `unsupported` in a CPU-only build.
  Tensor(DType dtype, std::vector<int64_t> shape, Device device = Device::cpu());
  static Tensor empty(DType dtype, std::initializer_list<int64_t> shape,
                      Device device = Device::cpu()) {
    return Tensor(dtype, std::vector<int64_t>(shape), device);
  }

  const TensorView& view() const { return view_; }
  void* data() const { return view_.data; }
  int64_t nbytes() const { return view_.nbytes(); }
  bool defined() const { return view_.data != nullptr; }

  /// Copies to another device (or the same one); synchronous.
  Tensor to(Device device) const;
  /// Copies all bytes from `src`, which must have the same dtype and shape; synchronous.
  void copy_from(const Tensor& src);
  /// Sets every byte to `byte` (used to poison outputs in tests); synchronous.
  void fill_bytes(uint8_t byte);

 private:
  std::shared_ptr<void> storage_;
  TensorView view_;
};

/// Owns the buffers of a quantized weight in `format` (see weight_storage()).
struct QuantizedWeight {
  QuantizedWeight() = default;
  QuantizedWeight(const WeightFormat& format, int64_t n, int64_t k,
                  Device device = Device::cpu());
  QuantizedWeightView view() const;
  QuantizedWeight to(Device device) const;

  WeightFormat format;
  int64_t n = 0, k = 0;
  Tensor q, scales, zeros, group_scales;
};

/// Owns quantized activations (M, K) and their scales.
struct QuantizedActivation {
  QuantizedActivation() = default;
  QuantizedActivation(ActScheme scheme, int64_t m, int64_t k, Device device = Device::cpu());
  QuantizedActivationView view() const;
  QuantizedActivation to(Device device) const;

  ActScheme scheme = ActScheme::s8_per_token;
  Tensor q, scales;
};

}  // namespace nibble
