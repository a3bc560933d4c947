// The W4A-FP8 instances of sm80_w4a8_gemm (e4m3 activations, f32 MMA sums: reported as
// sm80_w4afp8_gemm), in their own translation unit so they compile in parallel with the int8
// ones. The thin tiles only (InstanceFp8).
#include "cuda/launch/sm80_w4a8_instances.cuh"

namespace nibble::cuda::sm80_w4a8 {

namespace {

template <Tile T>
void launch_fp8_tile(const W4A8GemmParams& p, W4A8Epilogue e, dim3 grid, Stream stream) {
  if (e == W4A8Epilogue::per_channel)
    return launch_config<typename InstanceFp8<T, W4A8Epilogue::per_channel>::Cfg>(p, grid, stream);
  if (e == W4A8Epilogue::group)
    return launch_config<typename InstanceFp8<T, W4A8Epilogue::group>::Cfg>(p, grid, stream);
  nibble::detail::fail(ErrorCode::internal, "sm80_w4afp8_gemm: per-channel or g128 weights only");
}

}  // namespace

void launch_fp8(const W4A8GemmParams& p, Tile tile, W4A8Epilogue e, dim3 grid, Stream stream) {
  if (tile == Tile::m16) return launch_fp8_tile<Tile::m16>(p, e, grid, stream);
  if (tile == Tile::m32) return launch_fp8_tile<Tile::m32>(p, e, grid, stream);
  nibble::detail::fail(ErrorCode::internal, "sm80_w4afp8_gemm: the 16- and 32-token tiles only");
}

}  // namespace nibble::cuda::sm80_w4a8
