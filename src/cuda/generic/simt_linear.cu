// Generic SIMT GEMMs: the guaranteed fallback of the dispatcher for every format and shape.
//
//   D[m,n] = A[m,:] · W[n,:]ᵀ, in one of three modes:
//     integer  s32 out (gemm_s32), or per-group int32 partial sums rescaled in f32 (W4A8, W8A8,
//              W4A4, two-level): D = s_a[m] · Σ_g s_w[n,g] · Σ_{k∈g} q_a·q_w  (+ bias)
//     fp8      as integer, but q_a is e4m3 and partial sums are f32
//     a16      D = Σ_k x[m,k] · deq(W)[n,k]  (+ bias), f32 products and sums
//
// Layout: any row stride, contiguous K; 4-bit operands packed two per byte (low nibble first);
// or int4 weights in the packed w4_mma_k128 layout (W4A8 and W4A-FP8 calls on packed weights
// that no tensor-core kernel takes, e.g. fp8 activations off Hopper).
// Work split: one warp per output element; lanes stride over K inside a group, the group's
// partial is reduced across the warp (exactly, for integers), and lane 0 applies the scales in
// the reference's order with explicitly rounded (non-contracted) f32 operations, so integer
// formats reproduce the CPU reference bit for bit.
// Limitations: 1. Correctness-first: every operand element is fetched with a run-time dtype
// switch and no reuse, so it runs far below the memory and tensor-core ceilings; the tensor-core
// kernels of src/cuda/sm80 and sm90 replace it wherever their preconditions hold.
// 2. K-splitting is not used, so very small M·N leaves SMs idle.
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='Cuda*'
#include <cuda_runtime.h>

#include "common/cuda_runtime_check.h"
#include "cuda/common/element.cuh"
#include "cuda/generic/simt_linear.h"
#include "layout/w4_mma_k128_index.h"

namespace nibble::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

__device__ __forceinline__ float weight_value(const SimtLinearArgs& p, int64_t n, int64_t k) {
  // Dequantized weight (a16 mode), the format's exact inverse mapping.
  const int64_t gi = p.group_size == 0 ? 0 : k / p.group_size;
  const int32_t q = load_int(p.w, n, k);
  switch (p.w_scheme) {
    case WeightScheme::s4_sym:
    case WeightScheme::s8_sym: return __fmul_rn(load_float(p.w_scales, n, gi), float(q));
    case WeightScheme::u4_asym:
      return __fmul_rn(load_float(p.w_scales, n, gi), float(q - load_int(p.w_zeros, n, gi)));
    case WeightScheme::u4_fzp:
      return __fadd_rn(__fmul_rn(load_float(p.w_scales, n, gi), float(q - 8)),
                       load_float(p.w_zeros, n, gi));
    default: return 0.0f;
  }
}

__device__ __forceinline__ int32_t weight_int(const SimtLinearArgs& p, int64_t n, int64_t k) {
  if (p.w_packed_k_pad > 0) {  // w4_mma_k128: u = v + 8
    const NibbleIndex at = detail::w4_mma_k128_position(n, k, p.w_packed_k_pad);
    const uint8_t byte = static_cast<const uint8_t*>(p.w.data)[at.byte];
    return int32_t((byte >> at.shift) & 0xF) - 8;
  }
  if (p.w_scheme != WeightScheme::s4_two_level) return load_int(p.w, n, k);
  const int64_t gi = k / p.group_size;  // two-level: w8 = g_s · (q − g_z)
  return load_int(p.w_group_scales, n, gi) * (load_int(p.w, n, k) - load_int(p.w_zeros, n, gi));
}

__global__ void simt_linear_kernel(SimtLinearArgs p) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t m = blockIdx.y;
  if (n >= p.n) return;  // whole warp exits together
  const int64_t span = p.scale_span;  // K range sharing one weight scale
  float sum = 0.0f;
  for (int64_t k0 = 0; k0 < p.k; k0 += span) {
    float partial_f = 0.0f;
    int32_t partial_i = 0;
    for (int64_t k = k0 + lane; k < k0 + span; k += 32) {
      switch (p.mode) {
        case SimtMode::integer: partial_i += load_int(p.a, m, k) * weight_int(p, n, k); break;
        case SimtMode::fp8:
          partial_f = __fadd_rn(partial_f, __fmul_rn(load_float(p.a, m, k), float(weight_int(p, n, k))));
          break;
        case SimtMode::a16:
          partial_f = __fadd_rn(partial_f, __fmul_rn(load_float(p.a, m, k), weight_value(p, n, k)));
          break;
      }
    }
    if (p.mode == SimtMode::integer) {
      partial_i = warp_sum(partial_i);
      partial_f = float(partial_i);
    } else {
      partial_f = warp_sum(partial_f);
    }
    if (p.out_s32) {  // raw integer GEMM: one span covers all of K
      if (lane == 0) static_cast<int32_t*>(p.d)[m * p.d_row_stride + n] = partial_i;
      continue;
    }
    // Packed scale tables are (K_pad/G, N_pad): group-major.
    const float s_w = p.mode == SimtMode::a16   ? 1.0f
                      : p.w_packed_k_pad > 0   ? load_float(p.w_scales, k0 / span, n)
                                               : load_float(p.w_scales, n, k0 / span);
    sum = __fadd_rn(sum, __fmul_rn(s_w, partial_f));
  }
  if (p.out_s32 || lane != 0) return;
  if (p.mode != SimtMode::a16) sum = __fmul_rn(load_float(p.a_scales, p.a_per_tensor ? 0 : m, 0), sum);
  if (p.bias.data != nullptr) sum = __fadd_rn(sum, load_float(p.bias, n, 0));
  store_float(p.d, p.d_dtype, m * p.d_row_stride + n, sum);
}

}  // namespace

void launch_simt_linear(const SimtLinearArgs& args, Stream stream) {
  const dim3 grid(static_cast<unsigned>((args.n + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(args.m));
  simt_linear_kernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(args);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace nibble::cuda
