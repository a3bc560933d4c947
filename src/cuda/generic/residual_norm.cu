// rms_from_sums and residual_store — LinearFusion's input and output sides as kernels of their
// own (residual_norm.h): the unfused path around the W4A8 GEMMs where sm80_w4a8_gemm cannot run
// them inside. The arithmetic is cuda/common/residual_norm.cuh's, shared with the fused kernel,
// so both paths store the same bits.
//
//   rms_from_sums:   one block of 256 threads per row; every warp finds the row's inv (one
//                    warp-wide sum of its granule sums), then the threads write y = RN(RN(x·inv)·w).
//   residual_store:  one thread per element, blocks of 256 along a row (16 granules); a
//                    granule is a half-warp.
// Limitations: the rows are independent launches' worth of work (nothing is shared across rows);
// both are plain element-wise passes, not tuned beyond coalescing.
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='CudaLinearFusion*'
#include "cuda/generic/residual_norm.h"

#include <cuda_runtime.h>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "cuda/common/element.cuh"
#include "cuda/common/residual_norm.cuh"
#include "nibble/gemm.h"

namespace nibble::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    rms_from_sums_kernel(int64_t k, Operand x, const double* sums, int64_t sums_ld, int granules,
                         double inv_k, const float* w, float eps, float* y, int64_t ldy) {
  const int64_t row = blockIdx.x;
  const float inv = warp_rms_inverse(sums + row * sums_ld, granules, inv_k, eps);
  for (int64_t c = threadIdx.x; c < k; c += kThreads)
    y[row * ldy + c] = rms_apply(load_float(x, row, c), inv, w[c]);
}

__global__ void __launch_bounds__(kThreads)
    residual_store_kernel(int n, const float* t, int64_t ldt, float* d, int64_t ldd,
                          bool accumulate, double* sums, int64_t sums_ld) {
  const int row = static_cast<int>(blockIdx.y);
  const int begin = static_cast<int>(blockIdx.x) * kThreads;
  // A one-row tile of kThreads columns at (row, begin); the shared helper does the rest.
  const float first_d = accumulate ? first_residual<kThreads>(d, ldd, n, 0, kThreads, row, begin)
                                   : 0.0f;
  store_residual_tile<kThreads, kThreads>(
      d, ldd, n, accumulate, first_d, sums, sums_ld, 0, kThreads, row, begin,
      [&](int, int r, int c) { return t[int64_t(r) * ldt + c]; });
}

}  // namespace

void launch_rms_from_sums(int64_t m, int64_t k, const Operand& x, const double* sums,
                          int64_t sums_ld, const float* w, float eps, float* y, int64_t ldy,
                          Stream stream) {
  if (m <= 0 || m > 0x7FFFFFFF || k <= 0)
    nibble::detail::fail(ErrorCode::internal, "launch_rms_from_sums: bad shape");
  rms_from_sums_kernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(
      k, x, sums, sums_ld, static_cast<int>(sumsq_granules(k)), 1.0 / static_cast<double>(k), w, eps,
      y, ldy);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

void launch_residual_store(int64_t m, int64_t n, const float* t, int64_t ldt, float* d,
                           int64_t ldd, bool accumulate, double* sums, int64_t sums_ld,
                           Stream stream) {
  if (m <= 0 || m > 65535 || n <= 0 || n > (int64_t{1} << 30))
    nibble::detail::fail(ErrorCode::internal, "launch_residual_store: bad shape");
  const dim3 grid(static_cast<unsigned>((n + kThreads - 1) / kThreads), static_cast<unsigned>(m));
  residual_store_kernel<<<grid, kThreads, 0, stream>>>(static_cast<int>(n), t, ldt, d, ldd,
                                                        accumulate, sums, sums_ld);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace nibble::cuda
