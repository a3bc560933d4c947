// The fused-quantization instances of sm80_w4a8_gemm with the residual-stream fusions
// (LinearFusion: RMSNorm from granule sums in the prologue, d += result and the granule sums
// in the epilogue; f32 activations, the m16 decode tile), in their own translation unit so
// they compile in parallel with the others.
#include "cuda/launch/sm80_w4a8_instances.cuh"

namespace nibble::cuda::sm80_w4a8 {

void launch_fused_residual(const W4A8GemmParams& p, W4A8Epilogue e, W4Decode decode, int group,
                           dim3 grid, Stream stream) {
  launch_tile<Tile::m16, float, true>(p, e, decode, group, grid, stream);
}

}  // namespace nibble::cuda::sm80_w4a8
