// The fused-quantization instances of sm80_w4a8_gemm with f32 activations (the LLM runner's
// decode linears read the f32 rows their producers write), in their own translation unit so
// they compile in parallel with the 16-bit ones (sm80_w4a8_gemm_fused.cu).
#include "cuda/launch/sm80_w4a8_instances.cuh"

namespace nibble::cuda::sm80_w4a8 {

void launch_fused_f32(const W4A8GemmParams& p, W4A8Epilogue e, W4Decode decode, int group,
                      dim3 grid, Stream stream) {
  launch_tile<Tile::m16, float>(p, e, decode, group, grid, stream);
}

}  // namespace nibble::cuda::sm80_w4a8
