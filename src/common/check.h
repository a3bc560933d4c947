// Argument validation shared by every entry point. Each check throws nibble::Error with a
// message of the form "nibble::<function>: argument '<name>' <what was expected>, got <what>".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "nibble/status.h"
#include "nibble/types.h"

namespace nibble::detail {

[[noreturn]] void fail(ErrorCode code, const std::string& message);

/// Validates the arguments of one public function, named in every message.
class ArgCheck {
 public:
  explicit ArgCheck(const char* function) : function_(function) {}

  [[noreturn]] void fail(const char* arg, const std::string& expected,
                         ErrorCode code = ErrorCode::invalid_argument) const;

  /// A defined tensor: non-null data, positive sizes, rank as given.
  void tensor(const TensorView& t, const char* arg, int rank) const;
  void dtype(const TensorView& t, const char* arg, std::initializer_list<DType> allowed) const;
  void shape(const TensorView& t, const char* arg, std::initializer_list<int64_t> dims) const;
  void contiguous(const TensorView& t, const char* arg) const;
  /// Last dimension contiguous and, for 4-bit dtypes, even: the rows are packed byte arrays.
  void rows_packed(const TensorView& t, const char* arg) const;
  void device(const TensorView& t, const char* arg, Device expected) const;
  void aligned(const TensorView& t, const char* arg, int bytes) const;
  void condition(bool ok, const char* arg, const std::string& expected,
                 ErrorCode code = ErrorCode::invalid_argument) const;

  const char* function() const { return function_; }

 private:
  const char* function_;
};

std::string dtype_list(std::initializer_list<DType> dtypes);
std::string shape_string(const TensorView& t);

}  // namespace nibble::detail
