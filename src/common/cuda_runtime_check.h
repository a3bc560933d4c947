// Host-side checking of CUDA runtime calls (compiled only with the CUDA backend). Every
// runtime call and every launch is checked; a failure becomes nibble::Error(cuda_error) that
// names the call, the file and line, and the runtime's message.
#pragma once

#if NIBBLE_WITH_CUDA
#include <cuda_runtime_api.h>

#include <string>

#include "nibble/status.h"

namespace nibble::detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

/// Makes `ordinal` current for the scope and restores the previous device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace nibble::detail

#define NIBBLE_CUDA_CHECK(call)                                                  \
  do {                                                                           \
    const cudaError_t nibble_err_ = (call);                                      \
    if (nibble_err_ != cudaSuccess)                                              \
      ::nibble::detail::throw_cuda_error(nibble_err_, #call, __FILE__, __LINE__); \
  } while (0)

/// After a kernel launch: catches bad configurations and earlier asynchronous faults.
#define NIBBLE_CUDA_CHECK_LAUNCH() NIBBLE_CUDA_CHECK(cudaGetLastError())

#endif  // NIBBLE_WITH_CUDA
