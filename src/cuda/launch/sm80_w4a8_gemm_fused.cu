// The fused-quantization instances of sm80_w4a8_gemm (bf16 / f16 activations quantized per token
// in the kernel; the m16 decode tile), in their own translation unit so they compile in parallel
// with the int8-activation instances (sm80_w4a8_gemm.cu).
#include "cuda/launch/sm80_w4a8_instances.cuh"

namespace nibble::cuda::sm80_w4a8 {

void launch_fused(const W4A8GemmParams& p, DType x_dtype, W4A8Epilogue e, W4Decode decode,
                  int group, dim3 grid, Stream stream) {
  if (x_dtype == DType::f16) return launch_tile<Tile::m16, __half>(p, e, decode, group, grid, stream);
  launch_tile<Tile::m16, __nv_bfloat16>(p, e, decode, group, grid, stream);
}

}  // namespace nibble::cuda::sm80_w4a8
