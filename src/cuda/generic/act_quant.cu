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
// copy up to 8 of them (4 when a fusion is on) into their own 16-byte slots of shared memory
// (cp.async, no barrier: a thread reads back only its own slots), so x is read from global
// memory once: the loads are all issued first, then the row's reductions (max |x|, Σ x²,
// max |v| — warp shuffles, then one shared-memory step across the row's warps) and the
// quantized stores read the slots. Short rows share a block (up to 256 threads of rows), long
// rows get up to 512 threads. Why shared memory and not registers: register-held chunks need
// every pass unrolled over them, which made the fused kernel 180 KB of SASS executed once per
// row and bound by instruction fetch (ncu on the H100, M = 1, K = 4096: 77% of the stall
// cycles "no instruction"); the rolled shared-memory loops are 12 KB unfused and 58 KB fused,
// and measured 1.05–2.6× faster in every cell of `nibble bench act-quant` (H100, 2026-11-23).
// Longer rows (K > 32768 plain 16-bit, > 16384 plain f32 or fused 16-bit, > 8192 fused f32)
// stream x from global memory once per pass instead (up to four; the row is then usually in L2).
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
// 4. A fused row holds at most 4 chunks a thread (the measured plan; 8 is untried since the
// rows moved to shared memory), so a fused 14336-wide bf16 row fills a 512-thread block alone
// (one row per SM) and rows past 16384 stream from global memory.
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='CudaActQuant*:CudaQuantize*'
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

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
constexpr int kMaxFusedChunks = 4;

// ---- element types --------------------------------------------------------------------------

template <class T>
struct Elem;
template <>
struct Elem<float> {
  __device__ static float to_f32(float v) { return v; }
  __device__ static float from_f32(float v) { return v; }
};
template <>
struct Elem<__half> {
  __device__ static float to_f32(__half v) { return __half2float(v); }
  __device__ static __half from_f32(float v) { return __float2half_rn(v); }
};
template <>
struct Elem<__nv_bfloat16> {
  __device__ static float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 from_f32(float v) { return __float2bfloat16_rn(v); }
};

// Rounds an f32 to the nearest value of T (round to nearest even), kept as f32.
template <class T>
__device__ __forceinline__ float round_to(float v) {
  return Elem<T>::to_f32(Elem<T>::from_f32(v));
}

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

// One 16-byte chunk of x, n elements valid (zeros after them).
template <class T, int V>
__device__ __forceinline__ Pack<T, V> load_x(const T* p, int n, bool vectorized) {
  if (vectorized && n == V) return *reinterpret_cast<const Pack<T, V>*>(p);
  Pack<T, V> pk;
#pragma unroll
  for (int i = 0; i < V; ++i) pk.v[i] = i < n ? p[i] : Elem<T>::from_f32(0.0f);
  return pk;
}

template <class U, int V>
__device__ __forceinline__ void store(U* p, const Pack<U, V>& pk, int n, bool vectorized) {
  if (vectorized && n == V) {
    *reinterpret_cast<Pack<U, V>*>(p) = pk;
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (i < n) p[i] = pk.v[i];
  }
}

// ---- quantization of one value --------------------------------------------------------------

// ---- row reductions ---------------------------------------------------------------------------

struct MaxOp {
  __device__ uint32_t operator()(uint32_t a, uint32_t b) const { return max(a, b); }
};
struct SumOp {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a + b;
  }
};

// Combines v over the threads_per_row threads of each row (whole warps). Every thread of the
// block must call it (it synchronizes the block); `red` holds one value per warp.
template <class U, class Op>
__device__ __forceinline__ U row_reduce(U v, Op op, U* red, int threads_per_row) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  const int warps_per_row = threads_per_row / 32;
  const int first = static_cast<int>(threadIdx.x) / threads_per_row * warps_per_row;
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
  static constexpr int V = 16 / sizeof(T);
  const T* row;
  int64_t k, chunks;
  int lane, stride;  // first chunk and chunk step of this thread
  bool live, vectorized;
  Pack<T, V>* held;  // kHeld: this thread's slot for its chunk j is held[j * slot_step]
  int slot_step;

  __device__ int valid(int64_t c) const {
    const int64_t left = k - c * V;
    return left < V ? static_cast<int>(left) : V;
  }

  // Issues every load of this thread's chunks before waiting for any.
  __device__ void load() {
    if constexpr (kHeld) {
      if (live) {
#pragma unroll 1
        for (int j = 0;; ++j) {
          const int64_t c = lane + int64_t{j} * stride;
          if (c >= chunks) break;
          Pack<T, V>* slot = held + j * slot_step;
          const int n = valid(c);
          if (vectorized && n == V)
            ptx::cp_async_16(slot, row + c * V, true);
          else
            *slot = load_x<T, V>(row + c * V, n, vectorized);
        }
      }
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();  // only this thread's own slots are read back: no barrier
    }
  }

  // f(c, x[V], n) for each of this thread's chunks c (x as f32, zeros past the n valid ones).
  // kKeep: f may change x to other values of T, which replace the chunk held on chip (the
  // RMSNorm output y, so that the last pass need not compute it again).
  template <bool kKeep = false, class F>
  __device__ void visit(F&& f) {
    if (!live) return;
    float x[V];
    if constexpr (kHeld) {
#pragma unroll 1
      for (int j = 0;; ++j) {
        const int64_t c = lane + int64_t{j} * stride;
        if (c >= chunks) break;
        Pack<T, V>* slot = held + j * slot_step;
        Pack<T, V> pk = *slot;
#pragma unroll
        for (int i = 0; i < V; ++i) x[i] = Elem<T>::to_f32(pk.v[i]);
        f(c, x, valid(c));
        if constexpr (kKeep) {
#pragma unroll
          for (int i = 0; i < V; ++i) pk.v[i] = Elem<T>::from_f32(x[i]);
          *slot = pk;
        }
      }
    } else {
      for (int64_t c = lane; c < chunks; c += stride) {
        const Pack<T, V> pk = load_x<T, V>(row + c * V, valid(c), vectorized);
#pragma unroll
        for (int i = 0; i < V; ++i) x[i] = Elem<T>::to_f32(pk.v[i]);
        f(c, x, valid(c));
      }
    }
  }
};

// kStatic: per-tensor int8 with p.static_scale (kQ = s8); otherwise a dynamic scale per row.
// kHeld: the row is held in shared memory (RowChunks). kFusions: the RMSNorm and smooth code is
// compiled in (the instances for unfused calls leave it out: it is most of the kernel's code).
template <class T, DType kQ, bool kStatic, bool kHeld, bool kFusions>
__global__ void __launch_bounds__(kMaxThreads)
    act_quant_kernel(const ActQuantArgs p, const ActQuantPlan plan) {
  constexpr int V = 16 / sizeof(T);
  __shared__ uint32_t red_max[kMaxThreads / 32];
  __shared__ unsigned long long red_sum[kMaxThreads / 32];

  const int tpr = plan.threads_per_row;
  const int64_t m = int64_t{blockIdx.x} * plan.rows_per_block + threadIdx.x / tpr;
  RowChunks<T, kHeld> row;
  row.live = m < p.m;
  row.k = p.k;
  row.chunks = (p.k + V - 1) / V;
  row.lane = static_cast<int>(threadIdx.x) % tpr;
  row.stride = tpr;
  row.vectorized = plan.vectorized;
  row.row = static_cast<const T*>(p.x.data) + (row.live ? m : 0) * p.x.row_stride;
  if constexpr (kHeld) {
    extern __shared__ uint4 row_slots[];  // threads × chunks_per_thread slots of 16 bytes
    row.held = reinterpret_cast<Pack<T, V>*>(row_slots) + threadIdx.x;
    row.slot_step = static_cast<int>(blockDim.x);
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
    row.visit([&](int64_t, const float(&x)[V], int) {
#pragma unroll
      for (int i = 0; i < V; ++i) amax = max(amax, abs_bits(x[i]));
    });
    amax = row_reduce(amax, MaxOp{}, red_max, tpr);
    // amax < 2^e, so each term below is at most 2^rms_bits (e is garbage for a NaN or
    // infinite row, whose scale is then non-finite anyway).
    const int e = amax != 0 && amax < 0x7F800000u ? frexp_exponent(__uint_as_float(amax)) : 0;
    const double up = pow2_f64(plan.rms_bits - 2 * e);
    unsigned long long sum = 0;
    if (amax != 0)
      row.visit([&](int64_t, const float(&x)[V], int) {
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const double d = x[i];
          sum += __double2ull_rn(__dmul_rn(__dmul_rn(d, d), up));  // d·d is exact in f64
        }
      });
    sum = row_reduce(sum, SumOp{}, red_sum, tpr);
    const float ms = __double2float_rn(__dmul_rn(
        __dmul_rn(__ull2double_rn(sum), pow2_f64(2 * e - plan.rms_bits)), plan.inv_k));
    // r = RN(1 / RN(sqrt(RN(ms + eps)))), each correctly rounded without a subroutine call.
    const float t = __fadd_rn(ms, p.rms_eps);
    const float u = detail::sqrt_rn(t, detail::rsqrt_seed(t));
    r = detail::divide_rn(1.0f, u, detail::reciprocal_seed(u));
  }

  // y (normalized, in T's precision) and v (the value quantized) of one chunk; x is y already
  // when `normalized` (the slots hold y after the dynamic scale's pass).
  const auto fuse = [&](int64_t c, const float(&x)[V], int n, bool normalized, float(&y)[V],
                        float(&v)[V]) {
    float w[V], sm[V];
    const bool apply_norm = norm && !normalized;
    if (apply_norm) load_channels<V>(p.rms_weight, c * V, n, plan.vectorized, 0.0f, w);
    if (smooth) load_channels<V>(p.smooth, c * V, n, plan.vectorized, 1.0f, sm);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      y[i] = apply_norm ? round_to<T>(__fmul_rn(round_to<T>(__fmul_rn(x[i], r)), w[i])) : x[i];
      v[i] = smooth ? detail::divide(y[i], sm[i]) : y[i];
    }
  };

  float scale = p.static_scale;
  bool normalized = false;  // whether the slots hold y instead of x
  if constexpr (!kStatic) {
    uint32_t amax = 0;
    const auto amax_pass = [&](int64_t c, float(&x)[V], int n) {
      float y[V], v[V];
      fuse(c, x, n, false, y, v);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        amax = max(amax, abs_bits(v[i]));
        x[i] = y[i];
      }
    };
    if (norm) {
      row.template visit<true>(amax_pass);  // the chunks on chip keep y for the last pass
      normalized = kHeld;
    } else {
      row.visit(amax_pass);
    }
    amax = row_reduce(amax, MaxOp{}, red_max, tpr);
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
  const auto divide = [&](float v) {
    float vs = __fmul_rn(v, div.pow2);
    if constexpr (kStatic) vs = fminf(fmaxf(vs, -v_max), v_max);
    return div.divide_scaled(vs);
  };
  // clamp(rne(v / s), ±qmax); a dynamic quotient never exceeds qmax, so only static clamps.
  const auto quantize_int = [&](float v) {
    if (scale == 0.0f) return 0;
    float q = rintf(divide(v));  // rintf: round half to even
    if constexpr (kStatic) q = fminf(fmaxf(q, -p.qmax), p.qmax);
    return static_cast<int>(q);
  };

  constexpr int kQBytes = kQ == DType::s4 ? V / 2 : V;  // bytes of q per chunk
  auto* q_row = static_cast<uint8_t*>(p.q) +
                (row.live ? m : 0) * (kQ == DType::s4 ? p.q_row_stride / 2 : p.q_row_stride);
  T* normed_row = static_cast<T*>(p.normed) + (row.live ? m : 0) * p.normed_row_stride;
  row.visit([&](int64_t c, const float(&x)[V], int n) {
    float y[V], v[V];
    fuse(c, x, n, normalized, y, v);
    Pack<uint8_t, kQBytes> q;
    if constexpr (kQ == DType::s4) {
#pragma unroll
      for (int i = 0; i < V; i += 2)
        q.v[i / 2] = static_cast<uint8_t>((quantize_int(v[i]) & 0xF) |
                                          ((quantize_int(v[i + 1]) & 0xF) << 4));
    } else if constexpr (kQ == DType::e4m3) {
#pragma unroll
      for (int i = 0; i < V; i += 2) {
        const float2 pair = scale == 0.0f ? make_float2(0.0f, 0.0f)
                                          : make_float2(divide(v[i]), divide(v[i + 1]));
        const __nv_fp8x2_storage_t f8 = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
        q.v[i] = static_cast<uint8_t>(f8 & 0xFF);  // .x in the low byte
        q.v[i + 1] = static_cast<uint8_t>(f8 >> 8);
      }
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) q.v[i] = static_cast<uint8_t>(quantize_int(v[i]));
    }
    store<uint8_t, kQBytes>(q_row + c * kQBytes, q, kQ == DType::s4 ? n / 2 : n, plan.vectorized);
    if (kFusions && p.normed != nullptr) {
      Pack<T, V> out;
#pragma unroll
      for (int i = 0; i < V; ++i) out.v[i] = Elem<T>::from_f32(y[i]);
      store<T, V>(normed_row + c * V, out, n, plan.vectorized);
    }
  });
}

// ---- instances and launch ---------------------------------------------------------------------

// Up to 512 threads × 8 chunks × 16 bytes = 64 KiB of slots: past the 48 KiB default.
template <auto Kernel>
void launch_kernel(const ActQuantArgs& args, const ActQuantPlan& plan, cudaStream_t stream,
                   bool overlap) {
  allow_dynamic_smem<Kernel>(kMaxThreads * kMaxChunks * 16);
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

ActQuantPlan plan_act_quant(const ActQuantArgs& a, int sm_count,
                            const ActQuantPlanOptions& options) {
  ActQuantPlan plan;
  const int64_t x_bytes = dtype_bits(a.x.dtype) / 8;
  plan.vec = static_cast<int>(16 / x_bytes);
  plan.rms_bits = 62 - ceil_log2(a.k);
  plan.inv_k = 1.0 / static_cast<double>(a.k);
  plan.inv_qmax = 1.0 / static_cast<double>(a.qmax);
  const int64_t chunks = (a.k + plan.vec - 1) / plan.vec;
  // Fused calls hold at most 4 chunks a thread: the plan measured (kernel file, limitation 4).
  const bool fused = a.rms_weight.data != nullptr || a.smooth.data != nullptr;
  const int64_t max_chunks =
      std::clamp(options.max_chunks, 1, fused ? kMaxFusedChunks : kMaxChunks);
  // At most max_chunks chunks a thread, as few threads as that allows (at least a warp): the
  // row's loads are then all in flight at once and its reductions span few warps.
  plan.threads_per_row = static_cast<int>(std::clamp<int64_t>(
      int64_t{1} << ceil_log2((chunks + max_chunks - 1) / max_chunks), 32, kMaxThreads));
  plan.chunks_per_thread =
      1 << ceil_log2((chunks + plan.threads_per_row - 1) / plan.threads_per_row);
  if (plan.chunks_per_thread > max_chunks) {  // too long to hold: stream it
    plan.threads_per_row = kMaxThreads;
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
         std::to_string(plan.rows_per_block) + " rows/block";
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
