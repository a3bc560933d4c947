// nibble — error reporting.
//
// Every public entry point validates all of its arguments before it touches an output, and
// reports a problem by throwing `nibble::Error`, whose message names the function, the argument
// and what was expected. `nibble::capture` turns that into a `Status` for callers that do not use
// exceptions (the CLI and the Python binding use it at their boundaries).
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace nibble {

enum class ErrorCode : int {
  ok = 0,
  invalid_argument,  ///< a shape, dtype, stride, alignment, pointer or value is wrong
  unsupported,       ///< valid request that this build or device cannot run
  out_of_range,      ///< a size above a documented limit (e.g. K beyond the int32 bound)
  cuda_error,        ///< the CUDA runtime or a kernel launch failed
  io_error,          ///< a file could not be read or written
  internal,          ///< a bug in nibble
};

const char* to_string(ErrorCode code);

struct Status {
  ErrorCode code = ErrorCode::ok;
  std::string message;

  bool ok() const { return code == ErrorCode::ok; }
  static Status success() { return {}; }
};

class Error : public std::exception {
 public:
  Error(ErrorCode code, std::string message) : status_{code, std::move(message)} {}
  ErrorCode code() const noexcept { return status_.code; }
  const Status& status() const noexcept { return status_; }
  const char* what() const noexcept override { return status_.message.c_str(); }

 private:
  Status status_;
};

/// Runs `fn()`, returning its failure as a Status instead of throwing.
template <class Fn>
Status capture(Fn&& fn) {
  try {
    std::forward<Fn>(fn)();
    return Status::success();
  } catch (const Error& e) {
    return e.status();
  }
}

}  // namespace nibble
