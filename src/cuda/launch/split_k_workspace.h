// Workspace of the split-K GEMM kernels (sm80_w4a8_gemm, sm90_w4a8_gemm): 4-byte partial tiles
// and one arrival counter per output tile.
#pragma once

#include <cstddef>

#include "nibble/types.h"

namespace nibble::cuda {

struct SplitKWorkspace {
  void* partials = nullptr;
  int* counters = nullptr;
};

/// A grow-only workspace per (device, stream), shared by the kernel families that run on that
/// stream (their launches are ordered by it). Counters are zeroed once when allocated; the
/// kernels leave them at zero after every launch. Allocation happens on the first call with a
/// given size, so capture CUDA graphs after a warm-up call.
SplitKWorkspace split_k_workspace(int device, Stream stream, size_t partial_bytes,
                                  size_t counters);

}  // namespace nibble::cuda
