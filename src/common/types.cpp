#include "nibble/types.h"

#include "common/check.h"
#include "nibble/status.h"

namespace nibble {

namespace {
struct DTypeInfo {
  DType dtype;
  const char* name;
  int bits;
};
// clang-format off
constexpr DTypeInfo kDTypes[] = {
    {DType::f32, "f32", 32}, {DType::f16, "f16", 16}, {DType::bf16, "bf16", 16},
    {DType::e4m3, "e4m3", 8}, {DType::s8, "s8", 8},   {DType::u8, "u8", 8},
    {DType::s4, "s4", 4},     {DType::u4, "u4", 4},   {DType::s32, "s32", 32},
    {DType::f64, "f64", 64},
};
// clang-format on
const DTypeInfo& info(DType t) {
  for (const auto& i : kDTypes)
    if (i.dtype == t) return i;
  detail::fail(ErrorCode::internal, "nibble: unknown DType value " +
                                        std::to_string(static_cast<int>(t)));
}
}  // namespace

int dtype_bits(DType t) { return info(t).bits; }
const char* to_string(DType t) { return info(t).name; }

DType parse_dtype(std::string_view name) {
  for (const auto& i : kDTypes)
    if (name == i.name) return i.dtype;
  detail::fail(ErrorCode::invalid_argument,
               "nibble::parse_dtype: unknown dtype '" + std::string(name) +
                   "', expected one of f32 f16 bf16 e4m3 s8 u8 s4 u4 s32 f64");
}

int64_t dtype_storage_bytes(DType t, int64_t count) { return (count * dtype_bits(t) + 7) / 8; }
bool is_float(DType t) {
  return t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::e4m3 ||
         t == DType::f64;
}
bool is_integer(DType t) { return !is_float(t); }

std::string to_string(Device d) {
  return d.type == DeviceType::cpu ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  if (shape.size() > static_cast<size_t>(kMaxRank))
    detail::fail(ErrorCode::invalid_argument,
                 "nibble::TensorView::contiguous: rank " + std::to_string(shape.size()) +
                     " exceeds the maximum of " + std::to_string(kMaxRank));
  v.rank = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) v.shape[static_cast<size_t>(i++)] = s;
  int64_t stride = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    v.strides[static_cast<size_t>(d)] = stride;
    stride *= v.shape[static_cast<size_t>(d)];
  }
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= size(i);
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (size(d) != 1 && stride(d) != expected) return false;
    expected *= size(d);
  }
  return true;
}

int64_t TensorView::nbytes() const { return dtype_storage_bytes(dtype, numel()); }

std::string TensorView::describe() const {
  return std::string(to_string(dtype)) + detail::shape_string(*this) + " " + to_string(device);
}

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::out_of_range: return "out_of_range";
    case ErrorCode::cuda_error: return "cuda_error";
    case ErrorCode::io_error: return "io_error";
    case ErrorCode::internal: return "internal";
  }
  return "unknown";
}

}  // namespace nibble
