// nibble._C — Python arguments to the views of the C++ API, and C++ results back to Python.
//
// Nothing here computes. An array argument (any object with __dlpack__ or the buffer protocol:
// numpy, torch, cupy) becomes a TensorView of the same memory, shape, strides and device; a tuple
// of arrays becomes a quantized-tensor view. The C++ API validates everything else (shapes,
// dtypes, strides, devices) and throws nibble::Error naming the argument.
//
// Element types. DLPack float32/float16/bfloat16/float8_e4m3fn/int8/uint8/int32 map to nibble's
// f32/f16/bf16/e4m3/s8/u8/s32. An argument may also be a pair (array, "dtype") that declares a
// nibble dtype the array library lacks, carried in an integer array of the same storage width:
//   s4, u4      uint8/int8 array (..., C/2), two values per byte (element 2i in the low nibble);
//               the view has C columns, and every stride but the last is doubled (in nibbles)
//   e4m3        uint8/int8 array         bf16, f16   uint16/int16 array
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "nibble/nibble.h"

namespace nibble::python {

namespace nb = nanobind;

/// The conversions of one call: the function name for messages, and the imported arrays, which
/// must outlive the C++ call that reads their views.
class Call {
 public:
  explicit Call(const char* function) : function_(function) {}

  /// An input array (read-only arrays accepted) or (array, dtype); None → an empty view.
  TensorView input(nb::handle obj, const std::string& arg);
  /// An output array (must be writable) or (array, dtype).
  TensorView output(nb::handle obj, const std::string& arg);

  /// (format, n, k, q, scales, zeros, group_scales): a quantized weight; unused buffers None.
  QuantizedWeightView weight(nb::handle obj, const std::string& arg, bool writable);
  /// (scheme, q, scales): quantized activations.
  QuantizedActivationView activation(nb::handle obj, const std::string& arg, bool writable);
  /// (layout, version, format, has_scales, n, k, n_pad, k_pad, q, scales, group_params).
  PackedWeightView packed(nb::handle obj, const std::string& arg);

  [[noreturn]] void fail(const std::string& arg, const std::string& what) const;

 private:
  TensorView view(nb::handle obj, const std::string& arg, bool writable);

  const char* function_;
  std::vector<nb::ndarray<nb::ro>> inputs_;
  std::vector<nb::ndarray<>> outputs_;
};

/// Enum values from their canonical names (the C++ API has only to_string for these).
ActScheme act_scheme_from_string(std::string_view name);
WeightLayout weight_layout_from_string(std::string_view name);
/// "cpu" / "cuda" and an ordinal.
Device device_from(std::string_view type, int index);
/// A CUDA stream handle as Python holds it (an int, 0 = the legacy default stream).
inline Stream stream_from(uintptr_t handle) { return reinterpret_cast<Stream>(handle); }

/// A host Tensor as a numpy array that owns (shares) its storage. 4-bit tensors come back as
/// uint8 (..., C/2), bf16 as uint16, e4m3 as uint8: the same bytes.
nb::object to_numpy(const Tensor& t);

/// Registers the exception classes and the translator of nibble::Error.
void register_errors(nb::module_& m);

}  // namespace nibble::python
