// Activation quantization on the GPU: x (M, K) f32/f16/bf16 → q (M, K) s8 / s4 / e4m3 with one
// f32 scale per row (dynamic) or a given per-tensor scale (static).
//
//   dynamic: s[m] = max_k |x[m,k]| / qmax,  q = clamp(rne(x / s), -qmax, qmax)   (s = 0 → q = 0)
//   e4m3:    q = e4m3_satfinite(x / s), qmax = 448
//   static:  q = clamp(rne(x / scale), -127, 127)
// The division is IEEE (__fdiv_rn), as in the CPU reference, so results are bit-identical.
// Layout: any row stride, contiguous K; s4 output packs element 2i in the low nibble.
// Work split: one block per row; the row's max is a block reduction.
// Limitations: 1. A standalone launch; fused variants (into the GEMM prologue, with RMSNorm or
// SmoothQuant) belong to the decode and activation-op kernels. 2. One block per row leaves SMs
// idle when M is small and K short; that is a few microseconds at worst.
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='Cuda*Quant*'
#include <cuda_runtime.h>

#include "common/cuda_runtime_check.h"
#include "cuda/common/element.cuh"
#include "cuda/generic/act_quant.h"

namespace nibble::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ int quantize_int(float x, float s, int qmax) {
  if (s == 0.0f) return 0;
  const float q = rintf(__fdiv_rn(x, s));  // rintf: round half to even
  return static_cast<int>(fminf(fmaxf(q, float(-qmax)), float(qmax)));
}

__global__ void act_quant_kernel(ActQuantArgs p) {
  const int64_t m = blockIdx.x;
  __shared__ float warp_max[kThreads / 32];
  float s = p.static_scale;
  if (s == 0.0f) {  // dynamic: s = amax / qmax
    float amax = 0.0f;
    for (int64_t k = threadIdx.x; k < p.k; k += kThreads) amax = fmaxf(amax, fabsf(load_float(p.x, m, k)));
    for (int offset = 16; offset > 0; offset >>= 1)
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
    s = __fdiv_rn(amax, p.qmax);
  }
  if (threadIdx.x == 0 && (p.static_scale == 0.0f || m == 0)) p.scales[p.static_scale == 0.0f ? m : 0] = s;
  const int qmax = static_cast<int>(p.qmax);
  switch (p.q_dtype) {
    case DType::s8: {
      auto* q = static_cast<int8_t*>(p.q) + m * p.q_row_stride;
      for (int64_t k = threadIdx.x; k < p.k; k += kThreads)
        q[k] = static_cast<int8_t>(quantize_int(load_float(p.x, m, k), s, qmax));
      break;
    }
    case DType::s4: {  // two elements per byte, element 2i in the low nibble
      auto* q = static_cast<uint8_t*>(p.q) + m * p.q_row_stride / 2;
      for (int64_t i = threadIdx.x; i < p.k / 2; i += kThreads) {
        const int lo = quantize_int(load_float(p.x, m, 2 * i), s, qmax);
        const int hi = quantize_int(load_float(p.x, m, 2 * i + 1), s, qmax);
        q[i] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      }
      break;
    }
    case DType::e4m3: {
      auto* q = static_cast<__nv_fp8_storage_t*>(p.q) + m * p.q_row_stride;
      for (int64_t k = threadIdx.x; k < p.k; k += kThreads) {
        const float v = s == 0.0f ? 0.0f : __fdiv_rn(load_float(p.x, m, k), s);
        q[k] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
      }
      break;
    }
    default: break;
  }
}

}  // namespace

void launch_act_quant(const ActQuantArgs& args, Stream stream) {
  act_quant_kernel<<<static_cast<unsigned>(args.m), kThreads, 0, stream>>>(args);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace nibble::cuda
