// Device-side element access by run-time dtype, for the generic (SIMT) kernels that accept any
// format. Specialised kernels use compile-time types and packed layouts instead.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/common/operand.h"
#include "nibble/types.h"

namespace nibble::cuda {

/// Two f32 values rounded to a pair of 16-bit T (__nv_bfloat16 or __half; round to nearest
/// even, subnormals kept: cvt.rn.{bf16x2,f16x2}.f32), the first in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack2_rn(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    memcpy(&u, &h, 4);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    memcpy(&u, &h, 4);
  }
  return u;
}

// For rank-1 operands the "row" index is the element index (row_stride = element stride).
__device__ __forceinline__ float load_float(const Operand& t, int64_t r, int64_t c) {
  const int64_t i = r * t.row_stride + c;
  switch (t.dtype) {
    case DType::f32: return static_cast<const float*>(t.data)[i];
    case DType::f16: return __half2float(static_cast<const __half*>(t.data)[i]);
    case DType::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(t.data)[i]);
    case DType::e4m3: {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(
          static_cast<const __nv_fp8_storage_t*>(t.data)[i], __NV_E4M3);
      return __half2float(__half(h));
    }
    default: return 0.0f;
  }
}

__device__ __forceinline__ int32_t load_int(const Operand& t, int64_t r, int64_t c) {
  const int64_t i = r * t.row_stride + c;
  switch (t.dtype) {
    case DType::s8: return static_cast<const int8_t*>(t.data)[i];
    case DType::u8: return static_cast<const uint8_t*>(t.data)[i];
    case DType::s32: return static_cast<const int32_t*>(t.data)[i];
    case DType::s4:
    case DType::u4: {
      const uint8_t byte = static_cast<const uint8_t*>(t.data)[i >> 1];
      const int32_t nib = (i & 1) ? (byte >> 4) : (byte & 0xF);
      return (t.dtype == DType::s4 && nib >= 8) ? nib - 16 : nib;
    }
    default: return 0;
  }
}

/// Stores f32 rounded to nearest even into an f32/f16/bf16 element.
__device__ __forceinline__ void store_float(void* base, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::f32: static_cast<float*>(base)[i] = v; break;
    case DType::f16: static_cast<__half*>(base)[i] = __float2half_rn(v); break;
    case DType::bf16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); break;
    default: break;
  }
}

/// Stores two adjacent outputs i, i+1 (the second only if `two`); an aligned pair goes out as
/// one 2-element vector store.
__device__ __forceinline__ void store_float_pair(void* base, DType dtype, int64_t i, float v0,
                                                 float v1, bool two) {
  if (two && i % 2 == 0) {
    switch (dtype) {
      case DType::bf16:
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + i) =
            __floats2bfloat162_rn(v0, v1);
        return;
      case DType::f16:
        *reinterpret_cast<__half2*>(static_cast<__half*>(base) + i) = __floats2half2_rn(v0, v1);
        return;
      default:
        *reinterpret_cast<float2*>(static_cast<float*>(base) + i) = make_float2(v0, v1);
        return;
    }
  }
  store_float(base, dtype, i, v0);
  if (two) store_float(base, dtype, i + 1, v1);
}

}  // namespace nibble::cuda
