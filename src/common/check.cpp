#include "common/check.h"

#include <cstdint>
#include <sstream>

namespace nibble::detail {

void fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : " or ") + std::string(to_string(d));
  return s;
}

std::string shape_string(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

void ArgCheck::fail(const char* arg, const std::string& expected, ErrorCode code) const {
  detail::fail(code, std::string("nibble::") + function_ + ": argument '" + arg + "' " + expected);
}

void ArgCheck::condition(bool ok, const char* arg, const std::string& expected,
                         ErrorCode code) const {
  if (!ok) fail(arg, expected, code);
}

void ArgCheck::tensor(const TensorView& t, const char* arg, int rank) const {
  if (t.data == nullptr) fail(arg, "must be a tensor with data, got a null pointer");
  if (t.rank != rank)
    fail(arg, "must have rank " + std::to_string(rank) + ", got rank " + std::to_string(t.rank) +
                  " " + shape_string(t));
  for (int i = 0; i < rank; ++i)
    if (t.size(i) <= 0) fail(arg, "must have positive sizes, got " + shape_string(t));
}

void ArgCheck::dtype(const TensorView& t, const char* arg,
                     std::initializer_list<DType> allowed) const {
  for (DType d : allowed)
    if (t.dtype == d) return;
  fail(arg, "must have dtype " + dtype_list(allowed) + ", got " + to_string(t.dtype));
}

void ArgCheck::shape(const TensorView& t, const char* arg,
                     std::initializer_list<int64_t> dims) const {
  bool ok = t.rank == static_cast<int>(dims.size());
  int i = 0;
  for (int64_t d : dims) ok = ok && t.size(i++) == d;
  if (ok) return;
  std::string want = "[";
  i = 0;
  for (int64_t d : dims) want += (i++ ? ", " : "") + std::to_string(d);
  fail(arg, "must have shape " + want + "], got " + shape_string(t));
}

void ArgCheck::contiguous(const TensorView& t, const char* arg) const {
  if (!t.is_contiguous())
    fail(arg, "must be contiguous (row-major without gaps), got shape " + shape_string(t) +
                  " with other strides");
}

void ArgCheck::rows_packed(const TensorView& t, const char* arg) const {
  if (t.rank >= 1 && t.stride(t.rank - 1) != 1)
    fail(arg, "must have a contiguous last dimension (stride 1), got stride " +
                  std::to_string(t.stride(t.rank - 1)));
  if (dtype_bits(t.dtype) == 4) {
    if (t.size(t.rank - 1) % 2 != 0)
      fail(arg, "is a 4-bit tensor and needs an even last dimension, got " + shape_string(t));
    for (int i = 0; i + 1 < t.rank; ++i)
      if (t.stride(i) % 2 != 0)
        fail(arg, "is a 4-bit tensor and needs even strides (whole bytes), got stride " +
                      std::to_string(t.stride(i)) + " in dimension " + std::to_string(i));
  }
}

void ArgCheck::device(const TensorView& t, const char* arg, Device expected) const {
  if (!(t.device == expected))
    fail(arg, "must be on " + to_string(expected) + " like the other tensors, got " +
                  to_string(t.device));
}

void ArgCheck::aligned(const TensorView& t, const char* arg, int bytes) const {
  if (reinterpret_cast<uintptr_t>(t.data) % static_cast<uintptr_t>(bytes) != 0)
    fail(arg, "must be " + std::to_string(bytes) + "-byte aligned, got address " +
                  std::to_string(reinterpret_cast<uintptr_t>(t.data)));
}

}  // namespace nibble::detail
