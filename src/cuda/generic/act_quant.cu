// Activation quantization on the GPU, with RMSNorm and SmoothQuant's divide fused in front:
// x (M, K) f32/f16/bf16 → q (M, K) s8 / s4 / e4m3 with one f32 scale per row (dynamic) or a
// given per-tensor scale (static). For a row x of dtype T (src/cpu/quantize_ref.cpp is the
// normative definition, docs/formats.md §6.1 states it):
//
//   RMSNorm (optional)  ms   = Σ rne(x² · 2^(bits − 2e)) · 2^(2e − bits) / K   (exact uint64
//                              sum, amax = max|x| < 2^e, bits = 62 − ceil(log2 K))
//                       r    = 1 / sqrt(ms + eps)
//                       y    = round_T(round_T(x · r) · w)      → `normed` when asked for
//   smooth (optional)   v    = y / smooth
//   dynamic             s    = max|v| / qmax,  q = clamp(rne(v / s), ±qmax)   (s = 0 → q = 0)
//   e4m3                q    = e4m3_satfinite(v / s), qmax = 448
//   static              q    = clamp(rne(v / scale), ±127)
//
// Every float operation gives the bits of the reference's IEEE operation, in its order:
// products are explicitly rounded (__fmul_rn, __dmul_rn: never contracted into an FMA), and
// divisions and the square root are correctly rounded sequences of multiplications and FMAs
// (common/rounded_math.h) instead of __fdiv_rn / __fsqrt_rn, whose slow-path subroutine calls
// cost registers and code. So q, the scales and y are bit-identical to the CPU. The sum of
// squares is an integer sum.
//
// Operands: any row stride, K contiguous; s4 output packs element 2i in the low nibble.
// Work split (ASCII below; docs/kernels.md "act_quant"): a row is cut into 16-byte chunks of
// x; threads_per_row threads (whole warps) own chunks lane, lane + threads_per_row, ... and
// copy up to 8 of them (the planner's choice by fusion, K and M) into their own slots of shared memory
// (cp.async, no barrier: a thread reads back only its own slots), so x is read from global
// memory once: the loads are all issued first, then the row's reductions (max |x|, Σ x²,
// max |v| — warp shuffles, then one shared-memory step across the row's warps) and the
// quantized stores read the slots. Short rows share a block (up to 128 threads of rows), long
// rows get up to 512 threads. Why shared memory and not registers: register-held chunks need
// every pass unrolled over them, which made the fused kernel 180 KB of SASS executed once per
// row and bound by instruction fetch (ncu on the H100, M = 1, K = 4096: 77% of the stall
// cycles "no instruction"); the rolled shared-memory loops are 12 KB unfused and 58 KB fused,
// and measured 1.05–2.6× faster in every cell of `nibble bench act-quant` (H100, 2026-11-23).
// Longer rows (K > 32768 for 16-bit x, > 16384 for f32) stream x from global memory once per
// pass instead (up to four; the row is then usually in L2).
// With a smooth divisor and a dynamic scale, the max pass also writes v = y / smooth as f32 into
// vec / 4 more planes of slots (plan.smoothed_planes) and the last pass reads it back, so each
// element is divided once, not twice (4096 × 4096 bf16: 61 → 50 µs); rows of more than 4 chunks
// a thread, and devices short of shared memory, divide again instead.
// 16-bit x works on element pairs as stored: one cvt.rn.{bf16x2,f16x2}.f32 rounds two products
// to T, one max.u16x2 takes two magnitudes, and on sm_90 a weight of x's dtype multiplies two
// elements (mul.rn pairs). Integer codes come from adding 1.5·2^23 (the quotient rounded half to
// even lands in the low mantissa bits), not rintf and a conversion. Per element the fused
// RMSNorm path went from 75 to 35 instructions (ncu, H100, M = K = 4096).
//
//   block (rows_per_block = 2, threads_per_row = 128, chunks_per_thread = 4):
//     threads   0..127  row m0   thread t: chunks t, t+128, t+256, t+384 of row m0
//     threads 128..255  row m0+1
//
// Preconditions: validated by src/api/ (shapes, dtypes, devices). 16-byte vector accesses
// when every pointer and row stride allows them (plan.vectorized), element accesses otherwise.
// Arch: any (sm_80+ targets); no tensor cores.
// Limitations: 1. One row is processed by one block: M < the SM count leaves SMs idle, so
// small M is bound by latency (one round trip to memory plus the reductions), not bandwidth.
// 2. rms_weight and smooth are re-read for every row (from L1/L2, not HBM).
// 3. Non-finite x, a zero smooth[k] or a y that overflows T are not reported: such a row gets
// a non-finite scale (NaN propagates through the max) — the CPU rejects them instead.
// 4. A block holds its rows' loads and then works on them: the load latency is hidden only by
// the other blocks on the SM (a persistent, double-buffered variant measured slower: its loop
// raised registers to 64 and its second buffer halved the blocks that fit).
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='CudaActQuant*:CudaQuantize*'
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "common/check.h"
#include "common/rounded_math.h"
#include "cuda/common/element.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/token_quant.cuh"
#include "cuda/generic/act_quant.h"
#include "cuda/launch/dynamic_smem.h"
#include "cuda/launch/pdl_launch.h"

namespace nibble::cuda {

namespace {

constexpr int kMaxThreads = 512;  // a row of 512 threads × 8 chunks is 64 KiB of x
constexpr int kMaxChunks = 8;     // 64 KiB of slots for 512 threads
// The kernel's static shared memory: one max (u32) and one sum (u64) per warp.
constexpr int kStaticSharedBytes = kMaxThreads / 32 * 12;

// ---- element types --------------------------------------------------------------------------

template <class T>
struct Elem;
template <>
struct Elem<float> {
  __device__ static float to_f32(float v) { return v; }
};
template <>
struct Elem<__half> {
  __device__ static float to_f32(__half v) { return __half2float(v); }
};
template <>
struct Elem<__nv_bfloat16> {
  __device__ static float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
};

// V elements of U as one aligned access: 16 bytes is one LDG.128/STG.128, 32 bytes two.
template <class U, int V>
struct alignas(V * sizeof(U) >= 16 ? 16 : V * sizeof(U)) Pack {
  U v[V];
};

// V elements of U starting at p[0], n of them valid (the rest read as `fill`), as f32.
template <class U, int V>
__device__ __forceinline__ void load_floats(const U* p, int n, bool vectorized, float fill,
                                            float (&out)[V]) {
  if (vectorized && n == V) {
    const Pack<U, V> pk = *reinterpret_cast<const Pack<U, V>*>(p);
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = Elem<U>::to_f32(pk.v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) out[i] = i < n ? Elem<U>::to_f32(p[i]) : fill;
  }
}

// The same for a (K) vector whose dtype is known at run time (uniform across the grid).
template <int V>
__device__ __forceinline__ void load_channels(const Operand& t, int64_t k0, int n,
                                              bool vectorized, float fill, float (&out)[V]) {
  switch (t.dtype) {
    case DType::f32:
      load_floats<float, V>(static_cast<const float*>(t.data) + k0, n, vectorized, fill, out);
      break;
    case DType::f16:
      load_floats<__half, V>(static_cast<const __half*>(t.data) + k0, n, vectorized, fill, out);
      break;
    default:
      load_floats<__nv_bfloat16, V>(static_cast<const __nv_bfloat16*>(t.data) + k0, n,
                                    vectorized, fill, out);
      break;
  }
}

// One chunk's codes (kBytes, the first `bytes` of them valid) from their little-endian words.
template <int kBytes>
__device__ __forceinline__ void store_codes(uint8_t* p, const uint32_t (&w)[(kBytes + 3) / 4],
                                            int bytes, bool vectorized) {
  if (vectorized && bytes == kBytes) {
    if constexpr (kBytes == 8)
      *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    else if constexpr (kBytes == 4)
      *reinterpret_cast<uint32_t*>(p) = w[0];
    else
      *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(w[0]);
    return;
  }
#pragma unroll
  for (int i = 0; i < kBytes; ++i)
    if (i < bytes) p[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
}

// ---- 16-byte chunks of x ------------------------------------------------------------------------
//
// A chunk is 16 bytes of x (or y) kept as its four 32-bit words, V = 16 / sizeof(T) elements:
// word j holds element j (f32), or elements 2j (low half) and 2j + 1 (high half) of a 16-bit T —
// the memory order. The 16-bit paths work on the pairs as they are (one conversion instruction
// rounds two f32 values to T, one integer max takes two magnitudes) instead of element by element.

template <class T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));
template <class T>
constexpr bool kPairs = sizeof(T) == 2;

__device__ __forceinline__ uint32_t word(const uint4& c, int j) {
  return j == 0 ? c.x : j == 1 ? c.y : j == 2 ? c.z : c.w;
}
__device__ __forceinline__ void set_word(uint4& c, int j, uint32_t v) {
  if (j == 0) c.x = v;
  else if (j == 1) c.y = v;
  else if (j == 2) c.z = v;
  else c.w = v;
}

// Two 16-bit elements (element 0 in the low half) as f32 (exact); the way back, two f32 values
// rounded to T, is pack2_rn (cuda/common/element.cuh).
template <class T>
__device__ __forceinline__ float2 unpack2(uint32_t u) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
  } else {
    __half2 h;
    memcpy(&h, &u, 4);
    return __half22float2(h);
  }
}

// The correctly rounded products of two pairs of T (no contraction into an FMA).
template <class T>
__device__ __forceinline__ uint32_t mul2_rn(uint32_t a, uint32_t b) {
  uint32_t u;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    const __nv_bfloat162 z = __hmul2_rn(x, y);
    memcpy(&u, &z, 4);
  } else {
    __half2 x, y;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    const __half2 z = __hmul2_rn(x, y);
    memcpy(&u, &z, 4);
  }
  return u;
}

// The chunk's elements as f32 (exact).
template <class T>
__device__ __forceinline__ void to_floats(const uint4& c, float (&x)[kVec<T>]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if constexpr (kPairs<T>) {
      const float2 f = unpack2<T>(word(c, j));
      x[2 * j] = f.x;
      x[2 * j + 1] = f.y;
    } else {
      x[j] = __uint_as_float(word(c, j));
    }
  }
}
// The bits of element i of p (n valid: the rest are +0).
template <class T>
__device__ __forceinline__ uint4 load_chunk(const T* p, int n, bool vectorized) {
  constexpr int V = kVec<T>;
  if (vectorized && n == V) return *reinterpret_cast<const uint4*>(p);
  uint4 c = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    if (i >= n) break;
    if constexpr (kPairs<T>) {
      const uint32_t bits = reinterpret_cast<const uint16_t*>(p)[i];
      set_word(c, i / 2, word(c, i / 2) | bits << (16 * (i % 2)));
    } else {
      set_word(c, i, reinterpret_cast<const uint32_t*>(p)[i]);
    }
  }
  return c;
}
template <class T>
__device__ __forceinline__ void store_chunk(T* p, const uint4& c, int n, bool vectorized) {
  constexpr int V = kVec<T>;
  if (vectorized && n == V) {
    *reinterpret_cast<uint4*>(p) = c;
    return;
  }
#pragma unroll
  for (int i = 0; i < V; ++i) {
    if (i >= n) break;
    if constexpr (kPairs<T>)
      reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(word(c, i / 2) >> (16 * (i % 2)));
    else
      reinterpret_cast<uint32_t*>(p)[i] = word(c, i);
  }
}

// max |element| over a chunk, as integer-ordered magnitude bits: for non-negative floats the
// integer order is the float order, and a NaN (above +inf) survives the max. 16-bit T keeps two
// 16-bit maxima in `acc` (one max.u16x2 per word); magnitude_f32_bits turns them into the f32
// abs_bits of the larger (both exact).
__device__ __forceinline__ uint32_t max_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  return __vmaxu2(a, b);
#endif
}
__device__ __forceinline__ uint32_t min_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t r;
  asm("min.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
#else
  return __vminu2(a, b);
#endif
}
template <class T>
__device__ __forceinline__ uint32_t magnitude_max(const uint4& c, uint32_t acc) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    acc = kPairs<T> ? max_u16x2(acc, word(c, j) & 0x7FFF7FFFu) : max(acc, word(c, j) & 0x7FFFFFFFu);
  return acc;
}
template <class T>
__device__ __forceinline__ uint32_t magnitude_f32_bits(uint32_t acc) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return max(acc << 16, acc & 0xFFFF0000u);
  } else if constexpr (std::is_same_v<T, __half>) {
    const uint32_t m = max(acc & 0xFFFFu, acc >> 16);
    return abs_bits(__half2float(__ushort_as_half(static_cast<unsigned short>(m))));
  } else {
    return acc;
  }
}

// Low bytes of four words as one word (byte i from t_i): the s8 codes of four elements.
__device__ __forceinline__ uint32_t low_bytes(uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
  return __byte_perm(__byte_perm(t0, t1, 0x0040), __byte_perm(t2, t3, 0x0040), 0x5410);
}
// Low nibbles of two words as one byte (nibble 0 from t0): the s4 codes of two elements.
__device__ __forceinline__ uint32_t low_nibbles(uint32_t t0, uint32_t t1) {
  return (t0 & 0xFu) | ((t1 << 4) & 0xF0u);
}

// ---- row reductions ---------------------------------------------------------------------------

struct MaxOp {
  __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return max(a, b); }
};
struct SumOp {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a + b;
  }
};

// Combines v over the threads_per_row threads of each row (whole warps, 2^tpr_shift of them).
// Every thread of the block must call it (it synchronizes the block); `red` holds one value per
// warp.
template <class U, class Op>
__device__ __forceinline__ U row_reduce(U v, Op op, U* red, int tpr_shift) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  const int warps_per_row = 1 << (tpr_shift - 5);
  const int first = static_cast<int>(threadIdx.x >> tpr_shift) << (tpr_shift - 5);
  if (tpr_shift == 5) return v;  // one warp a row: no shared-memory step, no barrier
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  U r = red[first];
  for (int w = 1; w < warps_per_row; ++w) r = op(r, red[first + w]);
  __syncthreads();  // `red` is reused by the next reduction
  return r;
}

// ---- the kernel -------------------------------------------------------------------------------

// This thread's chunks of one row: held in shared memory (kHeld: per-thread 16-byte slots,
// visited by rolled loops, so the code is one chunk's worth whatever the chunk count), or
// re-read from global memory on every visit (rows too long to keep on chip).
template <class T, bool kHeld>
struct RowChunks {
  static constexpr int V = kVec<T>;
  const T* row;
  int chunks;
  int last_n;        // valid elements of the last chunk (every other chunk has V)
  int lane, stride;  // first chunk and chunk step (2^shift) of this thread
  int shift;
  bool live, vectorized;
  uint4* held;  // kHeld: this thread's slot for its chunk j is held[j * slot_step]
  int slot_step;
  int plane_step;  // kHeld: slots of a plane; plane p of chunk j is held[p * plane_step + j * slot_step]

  __device__ int valid(int c) const { return c == chunks - 1 ? last_n : V; }
  // kHeld: this thread's slot for row chunk c in plane p (0: x or y; 1, 2: v).
  __device__ uint4* slot(int c, int p) const {
    return held + p * plane_step + ((c - lane) >> shift) * slot_step;
  }

  // Issues every load of this thread's chunks before waiting for any.
  __device__ void load() {
    if constexpr (kHeld) {
      if (live) {
        uint4* slot = held;
        const T* src = row + lane * V;
#pragma unroll 1
        for (int c = lane; c < chunks; c += stride, slot += slot_step, src += stride * V) {
          const int n = valid(c);
          if (vectorized && n == V)
            ptx::cp_async_16(slot, src, true);
          else
            *slot = load_chunk(src, n, vectorized);
        }
      }
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();  // only this thread's own slots are read back: no barrier
    }
  }

  // f(c, chunk, n) for each of this thread's chunks c (elements past the n valid ones are +0).
  // kKeep: the chunk f leaves replaces the one held on chip (the RMSNorm output y, so that the
  // last pass need not compute it again).
  template <bool kKeep = false, class F>
  __device__ void visit(F&& f) {
    if (!live) return;
    if constexpr (kHeld) {
      uint4* slot = held;
#pragma unroll 1
      for (int c = lane; c < chunks; c += stride, slot += slot_step) {
        uint4 chunk = *slot;
        f(c, chunk, valid(c));
        if constexpr (kKeep) *slot = chunk;
      }
    } else {
#pragma unroll 1
      for (int c = lane; c < chunks; c += stride) {
        const int n = valid(c);
        uint4 chunk = load_chunk(row + int64_t{c} * V, n, vectorized);
        f(c, chunk, n);
      }
    }
  }
};

// kStatic: per-tensor int8 with p.static_scale (kQ = s8); otherwise a dynamic scale per row.
// kHeld: the row is held in shared memory (RowChunks). kFusions: the RMSNorm and smooth code is
// compiled in (the instances for unfused calls leave it out: it is most of the kernel's code).
// The explicit minimum of one block: without it ptxas (13.0, sm_90a) held the fused instances
// to 40 registers and spilled.
template <class T, DType kQ, bool kStatic, bool kHeld, bool kFusions>
__global__ void __launch_bounds__(kMaxThreads, 1)
    act_quant_kernel(const ActQuantArgs p, const ActQuantPlan plan) {
  constexpr int V = kVec<T>;
  __shared__ uint32_t red_max[kMaxThreads / 32];
  __shared__ unsigned long long red_sum[kMaxThreads / 32];
  static_assert(sizeof(red_max) + sizeof(red_sum) == kStaticSharedBytes);

  const int shift = plan.tpr_shift;
  const int64_t m = int64_t{blockIdx.x} * plan.rows_per_block + (threadIdx.x >> shift);
  RowChunks<T, kHeld> row;
  row.live = m < p.m;
  row.chunks = static_cast<int>((p.k + V - 1) / V);
  row.last_n = static_cast<int>(p.k - int64_t{row.chunks - 1} * V);
  row.lane = static_cast<int>(threadIdx.x & ((1u << shift) - 1));
  row.stride = 1 << shift;
  row.shift = shift;
  row.vectorized = plan.vectorized;
  row.row = static_cast<const T*>(p.x.data) + (row.live ? m : 0) * p.x.row_stride;
  if constexpr (kHeld) {
    extern __shared__ uint4 row_slots[];  // threads × chunks_per_thread slots of 16 bytes
    row.held = row_slots + threadIdx.x;
    row.slot_step = static_cast<int>(blockDim.x);
    row.plane_step = static_cast<int>(blockDim.x) * plan.chunks_per_thread;
  }
  // Launched to overlap the kernel before it (cuda/launch/pdl_launch.h): the next kernel (the
  // GEMM this feeds) may start its weight prefetch now; x is read only after the wait.
  ptx::griddep_launch_dependents();
  ptx::griddep_wait();
  row.load();  // every load of the row is in flight before the first reduction waits

  // RMSNorm's r. Every thread takes part in the reductions, rows of zeros and rows past M too.
  const bool norm = kFusions && p.rms_weight.data != nullptr;
  const bool smooth = kFusions && p.smooth.data != nullptr;
  float r = 0.0f;
  if (norm) {
    uint32_t amax = 0;
    row.visit([&](int, const uint4& c, int) { amax = magnitude_max<T>(c, amax); });
    amax = row_reduce(magnitude_f32_bits<T>(amax), MaxOp{}, red_max, shift);
    // amax < 2^e, so each term below is at most 2^rms_bits (e is garbage for a NaN or
    // infinite row, whose scale is then non-finite anyway).
    const int e = amax != 0 && amax < 0x7F800000u ? frexp_exponent(__uint_as_float(amax)) : 0;
    const int d = plan.rms_bits - 2 * e;  // each term is rne(x² · 2^d)
    unsigned long long sum = 0;
    if (amax != 0 && kPairs<T> && e >= -31 && e <= 64) {
      // 16-bit x: RN(x · x) · 2^d is x² · 2^d exactly in f32 for these rows: x² has at most 22
      // significant bits and is below 2^128, and 2^d (d ∈ [-100, 124]) is a normal power of two;
      // an x² below 2^-126 (rounded) makes a product below 2^-2, which rounds to the term's 0 all
      // the same. One uint64 conversion instead of two f64 conversions.
      const float up = pow2_f32(d);
      row.visit([&](int, const uint4& c, int) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 x = unpack2<T>(word(c, j));
          sum += __float2ull_rn(__fmul_rn(__fmul_rn(x.x, x.x), up)) +
                 __float2ull_rn(__fmul_rn(__fmul_rn(x.y, x.y), up));
        }
      });
    } else if (amax != 0) {  // f32 x (x² needs f64), or a 16-bit row outside [2^-32, 2^64)
      const double up = pow2_f64(d);
      row.visit([&](int, const uint4& c, int) {
        float x[V];
        to_floats<T>(c, x);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const double t = x[i];
          sum += __double2ull_rn(__dmul_rn(__dmul_rn(t, t), up));  // t·t is exact in f64
        }
      });
    }
    sum = row_reduce(sum, SumOp{}, red_sum, shift);
    const float ms = __double2float_rn(__dmul_rn(
        __dmul_rn(__ull2double_rn(sum), pow2_f64(2 * e - plan.rms_bits)), plan.inv_k));
    r = detail::reciprocal_sqrt_rn(__fadd_rn(ms, p.rms_eps));  // RN(1 / RN(sqrt(RN(ms + eps))))
  }

  // y = round_T(round_T(x · r) · w) of one chunk (each product in f32; docs/formats.md §6.1).
  // A weight of x's 16-bit dtype multiplies two elements an instruction (mul.rn.{bf16x2,f16x2}):
  // the product of two T values is exact in f32, so T's correctly rounded product is the
  // reference's rounding — except for bf16 products below 2^-126, which f32 rounds first (f16
  // products never get there). A chunk with a bf16 result that small (or zero) is redone in f32.
  // sm_90 only: with both paths ptxas spilled the sm_80 build, which keeps the f32 products.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const bool w_pairs = kPairs<T> && plan.vectorized && p.rms_weight.dtype == p.x.dtype;
#else
  constexpr bool w_pairs = false;
#endif
  const auto normalize = [&](int c, const uint4& x, int n) {
    uint4 y;
    if constexpr (kPairs<T>) {
      uint4 a;  // round_T(x · r)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 xf = unpack2<T>(word(x, j));
        set_word(a, j, pack2_rn<T>(__fmul_rn(xf.x, r), __fmul_rn(xf.y, r)));
      }
      if (w_pairs && n == V) {
        const uint4 w =
            *reinterpret_cast<const uint4*>(static_cast<const T*>(p.rms_weight.data) + int64_t{c} * V);
        uint32_t least = 0xFFFFFFFFu;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          set_word(y, j, mul2_rn<T>(word(a, j), word(w, j)));
          least = min_u16x2(least, word(y, j) & 0x7FFF7FFFu);
        }
        if (!std::is_same_v<T, __nv_bfloat16> || min(least & 0xFFFFu, least >> 16) > 0x0080u)
          return y;
      }
      float w[V];
      load_channels<V>(p.rms_weight, int64_t{c} * V, n, plan.vectorized, 0.0f, w);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 af = unpack2<T>(word(a, j));
        set_word(y, j, pack2_rn<T>(__fmul_rn(af.x, w[2 * j]), __fmul_rn(af.y, w[2 * j + 1])));
      }
    } else {  // f32 x: the roundings to T are exact
      float w[V];
      load_channels<V>(p.rms_weight, int64_t{c} * V, n, plan.vectorized, 0.0f, w);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        set_word(y, j, __float_as_uint(__fmul_rn(__fmul_rn(__uint_as_float(word(x, j)), r), w[j])));
    }
    return y;
  };
  // v = y / smooth of one chunk, as f32.
  const auto smoothed = [&](int c, const uint4& y, int n, float(&v)[V]) {
    to_floats<T>(y, v);
    if (smooth) {
      float sm[V];
      load_channels<V>(p.smooth, int64_t{c} * V, n, plan.vectorized, 1.0f, sm);
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = detail::divide(v[i], sm[i]);
    }
  };

  // v as f32 words in planes 1 (elements 0..3 of a chunk) and 2 (4..7) of the held row: the max
  // pass divides each element once and the quantizing pass reads v back (plan.smoothed_planes).
  const bool keep_v = kHeld && !kStatic && smooth && plan.smoothed_planes > 0;
  const auto put_v = [&](int c, const float(&v)[V]) {
    uint4* to = row.slot(c, 1);
#pragma unroll
    for (int q = 0; q < V / 4; ++q)
      to[q * row.plane_step] = make_uint4(__float_as_uint(v[4 * q]), __float_as_uint(v[4 * q + 1]),
                                          __float_as_uint(v[4 * q + 2]), __float_as_uint(v[4 * q + 3]));
  };
  const auto get_v = [&](int c, float(&v)[V]) {
    const uint4* from = row.slot(c, 1);
#pragma unroll
    for (int q = 0; q < V / 4; ++q) {
      const uint4 w = from[q * row.plane_step];
      v[4 * q] = __uint_as_float(w.x);
      v[4 * q + 1] = __uint_as_float(w.y);
      v[4 * q + 2] = __uint_as_float(w.z);
      v[4 * q + 3] = __uint_as_float(w.w);
    }
  };

  float scale = p.static_scale;
  bool normalized = false;  // whether the slots hold y instead of x
  if constexpr (!kStatic) {
    // max |v|: over T's bits while v = y (two elements an instruction), else over f32 bits.
    uint32_t pair_max = 0, f32_max = 0;
    const auto amax_pass = [&](int c, uint4& chunk, int n) {
      if (norm) chunk = normalize(c, chunk, n);
      if (!smooth) {
        pair_max = magnitude_max<T>(chunk, pair_max);
      } else {
        float v[V];
        smoothed(c, chunk, n, v);
#pragma unroll
        for (int i = 0; i < V; ++i) f32_max = max(f32_max, abs_bits(v[i]));
        if (keep_v) put_v(c, v);
      }
    };
    if (norm) {
      row.template visit<true>(amax_pass);  // the chunks on chip keep y for the last pass
      normalized = kHeld;
    } else {
      row.visit(amax_pass);
    }
    const uint32_t amax =
        row_reduce(max(f32_max, magnitude_f32_bits<T>(pair_max)), MaxOp{}, red_max, shift);
    // amax / qmax, correctly rounded: f32(f64(amax) · RN64(1 / qmax)) equals it for every
    // non-negative f32 amax and qmax 7, 127, 448 (checked exhaustively, common/rounded_math.h).
    scale = token_scale(amax, plan.inv_qmax);
    if (row.live && row.lane == 0) p.scales[m] = scale;
  } else {
    if (m == 0 && row.lane == 0) p.scales[0] = scale;
  }

  // v / scale without an IEEE division per element (eight operations, a branch and a
  // subroutine call): from the scale's reciprocal in three (common/rounded_math.h), after
  // multiplying v and the scale by the power of two 2^min(1 − e, 127) that brings the scale
  // into [1, 2) — into [2^-22, 1) for a subnormal scale. That is exact: it scales up, or down to
  // a v whose quotient is below 2^-124 and quantizes to 0 (or ±0) either way, sign kept. A
  // dynamic quotient is at most qmax; a static one can be anything, so v is first clamped to
  // ±256 · scale, past which the result saturates to ±127 anyway.
  const TokenDivider div = TokenDivider::make(scale);
  const float v_max = kStatic ? __fmul_rn(256.0f, div.s_unit) : INFINITY;
  const auto scaled = [&](float v) {
    float vs = __fmul_rn(v, div.pow2);
    if constexpr (kStatic) vs = fminf(fmaxf(vs, -v_max), v_max);
    return vs;
  };
  // clamp(rne(v / s), ±qmax) in the low bits of the result (two's complement): adding
  // 1.5 · 2^23 rounds a quotient below 2^22 to an integer, half to even, and leaves it in the
  // low mantissa bits (the sum's exponent is fixed). Clamping the quotient before rounding is the
  // same as after (the bounds are integers), and the sign of a zero quotient does not matter. A
  // zero scale (a row of zeros) or a non-finite one (a NaN row) gives codes 0: `keep` masks them.
  const uint32_t keep = kStatic || (scale > 0.0f && scale < INFINITY) ? ~0u : 0u;
  const auto code = [&](float v) {
    float q = div.divide_scaled_any_zero_sign(scaled(v));
    if constexpr (kStatic) q = fminf(fmaxf(q, -p.qmax), p.qmax);
    return __float_as_uint(__fadd_rn(q, 12582912.0f));
  };

  constexpr int kQBytes = kQ == DType::s4 ? V / 2 : V;  // bytes of q per chunk
  constexpr int kQWords = (kQBytes + 3) / 4;
  auto* q_row = static_cast<uint8_t*>(p.q) +
                (row.live ? m : 0) * (kQ == DType::s4 ? p.q_row_stride / 2 : p.q_row_stride);
  T* normed_row = static_cast<T*>(p.normed) + (row.live ? m : 0) * p.normed_row_stride;
  row.visit([&](int c, uint4& chunk, int n) {
    const uint4 y = norm && !normalized ? normalize(c, chunk, n) : chunk;
    float v[V];
    if (keep_v)
      get_v(c, v);
    else
      smoothed(c, y, n, v);
    uint32_t q[kQWords];  // the chunk's codes, little-endian
    if constexpr (kQ == DType::e4m3) {
#pragma unroll
      for (int i = 0; i < V; i += 4) {
        uint32_t pairs[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float2 two = scale == 0.0f ? make_float2(0.0f, 0.0f)
                                           : make_float2(div.divide_scaled(scaled(v[i + 2 * h])),
                                                         div.divide_scaled(scaled(v[i + 2 * h + 1])));
          pairs[h] = __nv_cvt_float2_to_fp8x2(two, __NV_SATFINITE, __NV_E4M3);  // .x low
        }
        q[i / 4] = pairs[0] | pairs[1] << 16;
      }
    } else {
      uint32_t t[V];
#pragma unroll
      for (int i = 0; i < V; ++i) t[i] = code(v[i]);
      if constexpr (kQ == DType::s4 && V == 8) {
        q[0] = low_bytes(low_nibbles(t[0], t[1]), low_nibbles(t[2], t[3]), low_nibbles(t[4], t[5]),
                         low_nibbles(t[6], t[7]));
      } else if constexpr (kQ == DType::s4) {
        q[0] = low_nibbles(t[0], t[1]) | low_nibbles(t[2], t[3]) << 8;
      } else {
#pragma unroll
        for (int i = 0; i < V / 4; ++i) q[i] = low_bytes(t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
      }
#pragma unroll
      for (int i = 0; i < kQWords; ++i) q[i] &= keep;
    }
    store_codes<kQBytes>(q_row + int64_t{c} * kQBytes, q, kQ == DType::s4 ? n / 2 : n,
                         plan.vectorized);
    if (kFusions && p.normed != nullptr)
      store_chunk<T>(normed_row + int64_t{c} * V, y, n, plan.vectorized);
  });
}

// ---- instances and launch ---------------------------------------------------------------------

// Up to 512 threads × 8 chunks × 16 bytes = 64 KiB of slots, or 512 × 4 chunks × 48 bytes =
// 96 KiB with v kept (plan.smoothed_planes): past the 48 KiB default, raised per plan.
template <auto Kernel>
void launch_kernel(const ActQuantArgs& args, const ActQuantPlan& plan, cudaStream_t stream,
                   bool overlap) {
  allow_dynamic_smem<Kernel>(plan.shared_bytes());
  launch_overlapping(Kernel, dim3(static_cast<unsigned>(plan.blocks)),
                     dim3(static_cast<unsigned>(plan.threads())), plan.shared_bytes(), stream,
                     overlap, 1, args, plan);
}

template <class T, DType kQ, bool kStatic>
void launch_typed(const ActQuantArgs& args, const ActQuantPlan& plan, cudaStream_t stream,
                  bool overlap) {
  const bool fused = args.rms_weight.data != nullptr || args.smooth.data != nullptr;
  if (plan.chunks_per_thread == 0)
    launch_kernel<act_quant_kernel<T, kQ, kStatic, false, true>>(args, plan, stream, overlap);
  else if (fused)
    launch_kernel<act_quant_kernel<T, kQ, kStatic, true, true>>(args, plan, stream, overlap);
  else
    launch_kernel<act_quant_kernel<T, kQ, kStatic, true, false>>(args, plan, stream, overlap);
}

template <class T>
void launch_for_input(const ActQuantArgs& args, const ActQuantPlan& plan, cudaStream_t stream,
                      bool overlap) {
  if (args.static_scale > 0.0f)
    return launch_typed<T, DType::s8, true>(args, plan, stream, overlap);
  switch (args.q_dtype) {
    case DType::s4: launch_typed<T, DType::s4, false>(args, plan, stream, overlap); break;
    case DType::e4m3: launch_typed<T, DType::e4m3, false>(args, plan, stream, overlap); break;
    default: launch_typed<T, DType::s8, false>(args, plan, stream, overlap); break;
  }
}

bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

int ceil_log2(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return l;
}

float act_qmax(ActScheme s) {
  return s == ActScheme::s4_per_token ? 7.0f : s == ActScheme::e4m3_per_token ? 448.0f : 127.0f;
}

}  // namespace

ActQuantArgs act_quant_args(const TensorView& x, const QuantizedActivationView& out,
                            const ActQuantFusion& fusion, float static_scale) {
  ActQuantArgs args;
  args.m = x.size(0);
  args.k = x.size(1);
  args.x = operand(x);
  args.q = out.q.data;
  args.q_dtype = out.q.dtype;
  args.q_row_stride = out.q.stride(0);
  args.scales = static_cast<float*>(out.scales.data);
  args.qmax = act_qmax(out.scheme);
  args.static_scale = static_scale;
  args.rms_weight = operand(fusion.rms_weight);
  args.rms_eps = fusion.rms_eps;
  args.smooth = operand(fusion.smooth);
  if (fusion.normed.data != nullptr) {
    args.normed = fusion.normed.data;
    args.normed_row_stride = fusion.normed.stride(0);
  }
  return args;
}

ActQuantPlan plan_act_quant(const ActQuantArgs& a, const DeviceInfo& dev,
                            const ActQuantPlanOptions& options) {
  const int sm_count = dev.sm_count;
  ActQuantPlan plan;
  const int64_t x_bytes = dtype_bits(a.x.dtype) / 8;
  plan.vec = static_cast<int>(16 / x_bytes);
  plan.rms_bits = 62 - ceil_log2(a.k);
  plan.inv_k = 1.0 / static_cast<double>(a.k);
  plan.inv_qmax = 1.0 / static_cast<double>(a.qmax);
  const int64_t chunks = (a.k + plan.vec - 1) / plan.vec;
  if (chunks > std::numeric_limits<int>::max())  // the kernel counts a row's chunks in an int
    detail::fail(ErrorCode::invalid_argument,
                 "nibble: quantize_activation: x has " + std::to_string(a.k) +
                     " columns; at most " +
                     std::to_string(int64_t{std::numeric_limits<int>::max()} * plan.vec) +
                     " are supported");
  // Threads for a row of at most `most` chunks a thread, whole warps, a power of two.
  const auto threads_for = [&](int64_t most) {
    return static_cast<int>(std::clamp<int64_t>(
        int64_t{1} << ceil_log2((chunks + most - 1) / most), 32, kMaxThreads));
  };
  // The measured choice (`nibble bench act-quant --sweep`, H100,
  // bench/results/h100_act_quant_sweep_5d48dc1.log): rows hold 4 chunks a thread, unless that
  // takes more than 256 threads a row (K > 8192 for 16-bit x), where the reductions across 16
  // warps cost more than the longer chunk loops and rows hold 8. Fewer threads with more chunks
  // each lost (M = K = 4096: 8 chunks 20.1 against 19.3 µs plain, 30.9–32.3 against 31.2 with
  // RMSNorm; one warp a row with 16 chunks 22.5 and 37.2 µs).
  // A smooth divisor with a dynamic scale keeps v on chip (below) with 4 chunks a thread up to
  // 512 threads a row (K ≤ 16384 for 16-bit x): measured faster than 8 chunks, whose three
  // planes of slots cut the blocks an SM holds (4096 × 14336: 186 against 221 µs).
  const bool fused = a.rms_weight.data != nullptr || a.smooth.data != nullptr;
  const bool keeps_v = a.smooth.data != nullptr && a.static_scale <= 0.0f && options.keep_smoothed;
  const bool automatic = options.max_chunks <= 0;
  const int64_t max_chunks = !automatic ? std::min(options.max_chunks, kMaxChunks)
                             : chunks <= int64_t{4} * (keeps_v ? kMaxThreads : 256) ? 4
                                                                                     : kMaxChunks;
  // At most max_chunks chunks a thread, as few threads as that allows (at least a warp): the
  // row's loads are then all in flight at once and its reductions span few warps.
  plan.threads_per_row = threads_for(max_chunks);
  plan.chunks_per_thread =
      1 << ceil_log2((chunks + plan.threads_per_row - 1) / plan.threads_per_row);
  // Few rows (under two fifths of the threads the GPU holds, four fifths for plain rows, whose
  // passes are short): more threads a row, fewer chunks each, so that each row's chain of passes
  // is shorter — the call is then one wave, bound by a row's latency rather than by bandwidth
  // (measured: M = 256 … 1024, K = 4096; plain s8 at M = 1024 7.9 → 6.9 µs with 256 threads,
  // with RMSNorm 11.2 → 13.1 µs).
  const int64_t gpu_threads = int64_t{sm_count} * 2048;
  while (automatic && plan.chunks_per_thread > 1 && plan.threads_per_row < kMaxThreads &&
         5 * a.m * plan.threads_per_row < (fused ? 2 : 4) * gpu_threads) {
    plan.threads_per_row *= 2;
    plan.chunks_per_thread =
        1 << ceil_log2((chunks + plan.threads_per_row - 1) / plan.threads_per_row);
  }
  plan.tpr_shift = ceil_log2(plan.threads_per_row);
  if (plan.chunks_per_thread > max_chunks) {  // too long to hold: stream it
    plan.threads_per_row = kMaxThreads;
    plan.tpr_shift = ceil_log2(kMaxThreads);
    plan.chunks_per_thread = 0;
    plan.rows_per_block = 1;
  } else {
    // Short rows share blocks, but never so many that fewer than two blocks per SM remain.
    plan.rows_per_block = std::max(1, std::min(options.block_threads, kMaxThreads) /
                                          plan.threads_per_row);
    while (plan.rows_per_block > 1 &&
           (a.m + plan.rows_per_block - 1) / plan.rows_per_block < 2 * int64_t{sm_count})
      plan.rows_per_block /= 2;
  }
  plan.blocks = (a.m + plan.rows_per_block - 1) / plan.rows_per_block;
  // A dynamic scale with a smooth divisor needs v twice (max |v|, then the codes): keeping v
  // on chip (f32, vec / 4 more planes of slots) saves the second correctly rounded division
  // per element, for rows of at most 4 chunks a thread (8 would triple 64 KiB of slots) where
  // the device's shared memory per block allows it.
  if (keeps_v && plan.chunks_per_thread > 0 && plan.chunks_per_thread <= 4) {
    const int planes = plan.vec / 4;
    const int64_t bytes = int64_t{plan.threads()} * plan.chunks_per_thread * 16 * (1 + planes);
    if (bytes + kStaticSharedBytes <= dev.smem_per_block_optin) plan.smoothed_planes = planes;
  }
  const int64_t q_chunk = a.q_dtype == DType::s4 ? plan.vec / 2 : plan.vec;
  const auto vector_ok = [&](const Operand& t) {
    return t.data == nullptr ||
           aligned(t.data, std::min<int64_t>(16, plan.vec * (dtype_bits(t.dtype) / 8)));
  };
  plan.vectorized = aligned(a.x.data, 16) && (a.x.row_stride * x_bytes) % 16 == 0 &&
                    aligned(a.q, q_chunk) &&
                    (a.q_dtype == DType::s4 ? a.q_row_stride / 2 : a.q_row_stride) % q_chunk == 0 &&
                    (a.normed == nullptr ||
                     (aligned(a.normed, 16) && (a.normed_row_stride * x_bytes) % 16 == 0)) &&
                    vector_ok(a.rms_weight) && vector_ok(a.smooth);
  return plan;
}

std::string describe(const ActQuantPlan& plan, const ActQuantArgs& args) {
  std::string s = std::string("act_quant ") + to_string(args.x.dtype) + "->" +
                  to_string(args.q_dtype) + ", " + std::to_string(plan.threads_per_row) +
                  " threads/row";
  if (plan.chunks_per_thread > 0)
    s += " x " + std::to_string(plan.chunks_per_thread) + " chunks in shared memory, " +
         std::to_string(plan.rows_per_block) + " rows/block" +
         (plan.smoothed_planes > 0 ? ", v = y / smooth kept on chip" : "");
  else
    s += ", row streamed from global memory per pass";
  return s + (plan.vectorized ? ", 16-byte accesses" : ", element accesses");
}

void launch_act_quant(const ActQuantArgs& args, const ActQuantPlan& plan, Stream stream,
                      bool overlap) {
  switch (args.x.dtype) {
    case DType::f32: launch_for_input<float>(args, plan, stream, overlap); break;
    case DType::f16: launch_for_input<__half>(args, plan, stream, overlap); break;
    case DType::bf16: launch_for_input<__nv_bfloat16>(args, plan, stream, overlap); break;
    default:
      detail::fail(ErrorCode::internal, std::string("nibble: act_quant: input dtype ") +
                                            to_string(args.x.dtype));
  }
}

}  // namespace nibble::cuda
