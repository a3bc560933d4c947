// Workspaces of the GEMM kernels: split-K partial tiles (4-byte values) with one arrival counter
// per output tile, and quantized activations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/env.h"
#include "nibble/types.h"

namespace nibble::cuda {

struct SplitKWorkspace {
  void* partials = nullptr;
  int* counters = nullptr;
};

/// A grow-only workspace per (device, stream), shared by the kernel families that run on that
/// stream (their launches are ordered by it). Counters are zeroed in stream order when allocated;
/// the kernels leave them at zero after every launch. Allocation happens on the first call with
/// a given size on a stream, also while that stream captures a CUDA graph; outgrown buffers are
/// kept (a captured graph may still use them).
SplitKWorkspace split_k_workspace(int device, Stream stream, size_t partial_bytes,
                                  size_t counters);

/// The workspace of a Hopper tile grid (sm90_w4a8_gemm, sm90_weight_only_gemm): with stream-K one
/// partial tile (bm × 128 4-byte sums) and one flag per CTA of the `ctas`; with split-K through
/// the workspace every split's M × N partials and one counter per tile; none otherwise (cluster
/// splits reduce on chip): nullptrs.
inline SplitKWorkspace sm90_tile_workspace(int device, Stream stream, bool stream_k, int ctas,
                                           int bm, int splits, bool cluster_split, int64_t m,
                                           int64_t n, int64_t tiles) {
  if (stream_k)
    return split_k_workspace(device, stream, size_t(ctas) * bm * 128 * 4, size_t(ctas));
  if (splits > 1 && !cluster_split)
    return split_k_workspace(device, stream, size_t(splits) * m * n * 4, size_t(tiles));
  return {};
}

/// The split count that NIBBLE_SM80_SPLITS forces on the sm80 decode planners (sm80_w4a8_gemm,
/// sm80_weight_only_gemm; a measurement knob, read per call): 1..64, -1 when unset or empty
/// (another value is an invalid_argument error). The planners clamp it to their largest split
/// and to the K blocks there are.
inline int forced_sm80_splits() {
  return nibble::detail::env_int("NIBBLE_SM80_SPLITS", -1, 1, 64);
}

/// A second grow-only buffer per (device, stream), for activations quantized on the way into a
/// kernel that takes int8 (float-in W4A8 calls above the fused-quantization M). The same rules.
void* activation_workspace(int device, Stream stream, size_t bytes);

}  // namespace nibble::cuda
