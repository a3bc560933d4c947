// Checking cuBLAS calls as src/common/cuda_runtime_check.h checks CUDA runtime calls: a failure
// becomes nibble::Error(cuda_error) naming the call, the file and line, and cuBLAS's status.
#pragma once

#include <cublas_v2.h>

#include <string>

#include "nibble/status.h"

#define NIBBLE_CUBLAS_CHECK(call)                                                           \
  do {                                                                                      \
    const cublasStatus_t nibble_status_ = (call);                                           \
    if (nibble_status_ != CUBLAS_STATUS_SUCCESS)                                            \
      throw ::nibble::Error(::nibble::ErrorCode::cuda_error,                                \
                            std::string("nibble: cuBLAS call ") + #call + " failed at " +   \
                                __FILE__ + ":" + std::to_string(__LINE__) + ": " +          \
                                cublasGetStatusString(nibble_status_));                     \
  } while (0)
