// nibble — element types and tensor views.
//
// The C++ core never sees torch or Python types: every entry point takes `TensorView`s, which are
// plain (pointer, dtype, shape, strides, device) records that the caller owns. Strides are in
// elements. 4-bit tensors (s4/u4) store two elements per byte, element 2i in the low nibble of
// byte i, so their last dimension must be contiguous and even (see docs/formats.md).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

// cudaStream_t without including CUDA headers: the runtime defines it as `CUstream_st*`.
struct CUstream_st;

namespace nibble {

/// A CUDA stream (`cudaStream_t`); nullptr is the default stream. Ignored by the CPU backend.
using Stream = CUstream_st*;

/// Element types. Sub-byte types pack two values per byte.
enum class DType : uint8_t {
  f32,   ///< IEEE binary32
  f16,   ///< IEEE binary16
  bf16,  ///< bfloat16 (binary32 with 16 mantissa bits dropped)
  e4m3,  ///< OCP FP8 E4M3 "FN": bias 7, no infinities, max ±448, NaN = S.1111.111
  s8,    ///< two's-complement int8
  u8,    ///< uint8
  s4,    ///< two's-complement int4 in [-8, 7], two per byte, element 2i in the low nibble
  u4,    ///< uint4 in [0, 15], two per byte, element 2i in the low nibble
  s32,   ///< two's-complement int32
  f64,   ///< IEEE binary64 (LinearFusion's row sums of squares)
};

/// Bits per element (4, 8, 16, 32 or 64).
int dtype_bits(DType t);
/// Canonical lower-case name: "f32", "bf16", "e4m3", "s4", ...
const char* to_string(DType t);
/// Inverse of to_string; throws nibble::Error for an unknown name.
DType parse_dtype(std::string_view name);
/// Bytes needed by `count` elements (rounded up for 4-bit types).
int64_t dtype_storage_bytes(DType t, int64_t count);
bool is_float(DType t);    ///< f32, f16, bf16, e4m3, f64
bool is_integer(DType t);  ///< s8, u8, s4, u4, s32

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  ///< CUDA ordinal; 0 for the CPU

  static Device cpu() { return {DeviceType::cpu, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::cuda, index}; }
  bool operator==(const Device&) const = default;
};
std::string to_string(Device d);  ///< "cpu" or "cuda:0"

/// A non-owning view of a strided tensor of rank 0..kMaxRank.
struct TensorView {
  static constexpr int kMaxRank = 4;

  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> strides{};  ///< in elements
  Device device{};

  /// A row-major (C-contiguous) view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu());

  int64_t size(int dim) const { return shape[static_cast<size_t>(dim)]; }
  int64_t stride(int dim) const { return strides[static_cast<size_t>(dim)]; }
  int64_t numel() const;
  bool is_contiguous() const;  ///< row-major with no gaps
  int64_t nbytes() const;      ///< bytes covered by a contiguous view
  std::string describe() const;  ///< e.g. "s8[16, 4096] cpu"

  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// Host storage types for the 16- and 8-bit float formats. They are bit containers: arithmetic
// goes through f32 with the conversions in numeric.h.
struct f16_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};
struct e4m3_t {
  uint8_t bits;
};
static_assert(sizeof(f16_t) == 2 && sizeof(bf16_t) == 2 && sizeof(e4m3_t) == 1);

}  // namespace nibble
