// sm80_attention_prefill — causal attention of a prompt (chunk) over the KV cache, flash-attention
// style on mma.sync.m16n8k16 (bf16 operands, f32 accumulation), for sm_80 and newer.
//
//   for query token t < m at position p = *pos0 + t, head h, kv head h / (Hq/Hkv):
//     out[t, h] = Σ_{j ≤ p} softmax_j(q[t,h]·K[j]ᵀ / √hd) · V[j]
//   computed tile by tile with an online softmax (running max and sum per row, in the log2
//   domain: exp2(s·log2(e)/√hd − m)); P is rounded to bf16 for the P·V product, as in
//   FlashAttention-2.
//
// Operands
//   q      (m, Hq·hd) bf16 row-major (rotated by rope_qkv_store)
//   K, V   one layer's cache, each (Hkv, max_ctx, hd) bf16; rows 0 .. *pos0 + m − 1 are read
//   out    (m, ld) f32 or bf16; columns h·hd .. h·hd + hd − 1 for head h
//   hd ∈ {64, 128}.
//
// Work split (hd = 128; hd = 64 halves every hd-sized count)
//   grid (ceil(m / 64), Hq), 4 warps; a CTA owns 64 query rows of one head, a warp 16 of them.
//   Key tiles of 64 rows stream through a double-buffered cp.async ring (K and V, 2 stages);
//   the Q tile's A fragments stay in registers (hd/16 k-steps × 4) for the whole loop.
//   Per key tile, per warp:  S (16 × 64) = Q·Kᵀ: hd/16 k-steps × 8 n-tiles of mma;
//                            O (16 × hd) += P·V: 4 k-steps × hd/8 n-tiles of mma.
//   CTAs are launched last query tile first: causal tiles further down the prompt have more
//   keys, and starting them first shortens the tail of the grid.
//
//     query tiles ──►  CTA (tile, head):   Q ─ldmatrix─► regs
//     key tiles 0..n   K[n] ─cp.async─► smem ─ldmatrix────► S = Q·Kᵀ → mask → online softmax
//                      V[n] ─cp.async─► smem ─ldmatrix.trans► O += P·V
//
//   Shared memory rows are hd·2 bytes = hd/8 chunks of 16 bytes; chunk c of row r is stored at
//   chunk c ^ (r % 8): ldmatrix reads one chunk column of 8 consecutive rows, which without the
//   XOR would all fall in the same 4 banks (8-way conflict); with it they cover all 32 banks.
//   Shared memory: Q + 2 K stages + 2 V stages = 5 × 64 × hd × 2 bytes (80 KB at hd = 128, two
//   CTAs per SM on Hopper and A100).
//
// Limitations
//   1. mma.sync, not wgmma: on Hopper this reaches roughly half of what FlashAttention-3 does;
//      the measured share of attention in a 2048-token prefill is in docs/runner.md.
//   2. hd must be 64 or 128; out's row stride and base must allow 8-byte (f32) / 4-byte (bf16)
//      stores of column pairs (even ld).
//   3. Query rows of the last tile past m are computed and discarded (zero-filled Q rows).
//   4. The mask is applied per element only on key tiles that cross the causal diagonal of the
//      CTA's first query row.
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.AttentionPrefill*'
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "cuda/launch/dynamic_smem.h"
#include "llm/cuda/kernels.h"
#include "cuda/common/ptx.cuh"

namespace nibble::llm::cuda {

namespace ptx = nibble::cuda::ptx;

namespace {

constexpr int kBM = 64;  // query rows per CTA
constexpr int kBN = 64;  // keys per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

template <int HD>
struct PrefillConfig {
  static constexpr int kChunks = HD / 8;           // 16-byte chunks per row
  static constexpr int kRowBytes = HD * 2;
  static constexpr int kTileBytes = kBM * kRowBytes;  // kBN == kBM: Q, K and V tiles alike
  static constexpr int kSmemBytes = 5 * kTileBytes;   // Q, K[2], V[2]
  static constexpr int kKSteps = HD / 16;          // k16 steps of Q·Kᵀ
  static constexpr int kDimTiles = HD / 8;         // n8 tiles of O
  static_assert(kBN == kBM, "one tile size for Q, K and V");
};

struct PrefillParams {
  const __nv_bfloat16* q;
  int64_t q_ld;  // elements
  const int32_t* pos0;
  int m;
  int group;  // query heads per kv head
  int64_t max_ctx;
  const __nv_bfloat16* k_cache;
  const __nv_bfloat16* v_cache;
  ActOutput out;
  float scale_log2;  // log2(e) / sqrt(the model's hd)
};

/// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile.
template <int HD>
__device__ __forceinline__ int swizzled(int row, int chunk) {
  return row * PrefillConfig<HD>::kRowBytes + ((chunk ^ (row & 7)) << 4);
}

/// Copies a 64-row tile (rows `valid` and beyond zero-filled) from src (row stride ld elements).
template <int HD>
__device__ __forceinline__ void load_tile(uint8_t* tile, const __nv_bfloat16* src, int64_t ld,
                                          int valid) {
  using Cfg = PrefillConfig<HD>;
  constexpr int kPerThread = kBM * Cfg::kChunks / kThreads;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int row = idx / Cfg::kChunks, chunk = idx % Cfg::kChunks;
    const bool ok = row < valid;
    const __nv_bfloat16* g = src + (ok ? row : 0) * ld + chunk * 8;
    ptx::cp_async_16(tile + swizzled<HD>(row, chunk), g, ok);
  }
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <int HD>
__global__ void __launch_bounds__(kThreads, 2) attention_prefill_kernel(PrefillParams p) {
  using Cfg = PrefillConfig<HD>;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* q_sh = smem;
  uint8_t* k_sh = smem + Cfg::kTileBytes;        // 2 stages
  uint8_t* v_sh = smem + 3 * Cfg::kTileBytes;    // 2 stages

  const int tile_m = gridDim.x - 1 - blockIdx.x;  // last query tile first (most keys)
  const int head = blockIdx.y, kv_head = head / p.group;
  const int t0 = tile_m * kBM;
  const int pos0 = *p.pos0;
  const int rows = min(kBM, p.m - t0);
  const int kv_len = pos0 + t0 + rows;  // keys 0 .. kv_len − 1 are visible to some row
  const int n_tiles = (kv_len + kBN - 1) / kBN;
  const __nv_bfloat16* k_gl = p.k_cache + static_cast<int64_t>(kv_head) * p.max_ctx * HD;
  const __nv_bfloat16* v_gl = p.v_cache + static_cast<int64_t>(kv_head) * p.max_ctx * HD;

  load_tile<HD>(q_sh, p.q + static_cast<int64_t>(t0) * p.q_ld + head * HD, p.q_ld, rows);
  load_tile<HD>(k_sh, k_gl, HD, kv_len);
  load_tile<HD>(v_sh, v_gl, HD, kv_len);
  ptx::cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  // Absolute positions of this thread's two rows (g and g + 8 of the warp's 16).
  const int qpos0 = pos0 + t0 + warp * 16 + g, qpos1 = qpos0 + 8;
  const int first_qpos = pos0 + t0;  // the CTA's first row: tiles past it need the mask

  uint32_t qa[Cfg::kKSteps][4];
  float o[Cfg::kDimTiles][4];
#pragma unroll
  for (int j = 0; j < Cfg::kDimTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY;  // running max (log2 domain) of rows g, g + 8
  float l0 = 0.0f, l1 = 0.0f;            // this thread's share of the running sums

  for (int tile = 0; tile < n_tiles; ++tile) {
    ptx::cp_async_wait<0>();
    __syncthreads();  // tile `tile` landed for everyone; everyone is done with tile − 1
    if (tile + 1 < n_tiles) {
      const int n1 = (tile + 1) * kBN, stage = (tile + 1) & 1;
      load_tile<HD>(k_sh + stage * Cfg::kTileBytes, k_gl + static_cast<int64_t>(n1) * HD, HD,
                    kv_len - n1);
      load_tile<HD>(v_sh + stage * Cfg::kTileBytes, v_gl + static_cast<int64_t>(n1) * HD, HD,
                    kv_len - n1);
      ptx::cp_async_commit();
    }
    if (tile == 0) {
      // A fragments of the warp's 16 query rows: lane l addresses row l % 16, chunk l / 16 of
      // each k16 step (matrices: rows 0-7 / 8-15 × k 0-7 / 8-15 = a[0], a[1], a[2], a[3]).
#pragma unroll
      for (int kk = 0; kk < Cfg::kKSteps; ++kk)
        ptx::ldmatrix_x4(qa[kk], q_sh + swizzled<HD>(warp * 16 + lane % 16, kk * 2 + lane / 16));
    }
    const uint8_t* kt = k_sh + (tile & 1) * Cfg::kTileBytes;
    const uint8_t* vt = v_sh + (tile & 1) * Cfg::kTileBytes;
    const int n0 = tile * kBN;

    // S = Q·Kᵀ: 8 n-tiles of 8 keys. One ldmatrix.x4 gives the B fragments of two n-tiles:
    // matrices (keys +0-7, k 0-7), (keys +0-7, k 8-15), (keys +8-15, k 0-7), (keys +8-15, k 8-15).
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < Cfg::kKSteps; ++kk) {
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        const int mi = lane / 8, r = lane % 8;
        uint32_t b[4];
        ptx::ldmatrix_x4(b, kt + swizzled<HD>(np * 16 + (mi / 2) * 8 + r, kk * 2 + mi % 2));
        const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
        ptx::mma_16816<false>(s[2 * np], qa[kk], b_lo);
        ptx::mma_16816<false>(s[2 * np + 1], qa[kk], b_hi);
      }
    }

    // Scale into the log2 domain and mask keys after each row's position.
    const bool needs_mask = n0 + kBN - 1 > first_qpos;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + j * 8 + 2 * c + (e & 1);
        const int qpos = e < 2 ? qpos0 : qpos1;
        float v = s[j][e] * p.scale_log2;
        if (needs_mask && key > qpos) v = -INFINITY;
        s[j][e] = v;
      }
      mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
      mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
    }
    // Row maxima over the quad (the four lanes that share rows g and g + 8).
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xFFFFFFFFu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xFFFFFFFFu, mx1, 2));
    // Every row sees key 0 in tile 0, so the running max is finite from then on; a row whose
    // keys in this tile are all masked keeps its max (mx = −inf) and adds zeros.
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    const float corr0 = exp2f(m0 - mn0), corr1 = exp2f(m1 - mn1);  // 0 on the first tile
    m0 = mn0;
    m1 = mn1;
    l0 *= corr0;
    l1 *= corr1;
#pragma unroll
    for (int j = 0; j < Cfg::kDimTiles; ++j) {
      o[j][0] *= corr0;
      o[j][1] *= corr0;
      o[j][2] *= corr1;
      o[j][3] *= corr1;
    }
    // P = exp2(S − m), and its bf16 A fragments: keys 16kk..16kk+15 are n-tiles 2kk, 2kk+1,
    // whose accumulator layout is exactly the m16k16 A layout (a[0..3] = tile 2kk rows g/g+8,
    // tile 2kk+1 rows g/g+8).
    uint32_t pa[4][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float p0 = exp2f(s[j][0] - mn0), p1 = exp2f(s[j][1] - mn0);
      const float p2 = exp2f(s[j][2] - mn1), p3 = exp2f(s[j][3] - mn1);
      l0 += p0 + p1;
      l1 += p2 + p3;
      pa[j / 2][(j % 2) * 2 + 0] = pack_bf16(p0, p1);
      pa[j / 2][(j % 2) * 2 + 1] = pack_bf16(p2, p3);
    }
    // O += P·V. ldmatrix.trans of V rows (key-major) gives B fragments of two dim tiles:
    // matrices (keys +0-7, dims +0-7), (keys +8-15, dims +0-7), (keys +0-7, dims +8-15),
    // (keys +8-15, dims +8-15).
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int dp = 0; dp < Cfg::kDimTiles / 2; ++dp) {
        const int mi = lane / 8, r = lane % 8;
        uint32_t b[4];
        ptx::ldmatrix_x4_trans(b, vt + swizzled<HD>(kk * 16 + (mi % 2) * 8 + r, dp * 2 + mi / 2));
        const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
        ptx::mma_16816<false>(o[2 * dp], pa[kk], b_lo);
        ptx::mma_16816<false>(o[2 * dp + 1], pa[kk], b_hi);
      }
    }
  }

  // Normalize by the row sums (summed over the quad) and store rows below m.
  l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, 1);
  l0 += __shfl_xor_sync(0xFFFFFFFFu, l0, 2);
  l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, 1);
  l1 += __shfl_xor_sync(0xFFFFFFFFu, l1, 2);
  const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
  const int row0 = t0 + warp * 16 + g, row1 = row0 + 8;
#pragma unroll
  for (int j = 0; j < Cfg::kDimTiles; ++j) {
    const int64_t col = static_cast<int64_t>(head) * HD + j * 8 + 2 * c;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = half == 0 ? row0 : row1;
      if (row >= p.m) continue;
      const float inv = half == 0 ? inv0 : inv1;
      const float a = o[j][2 * half] * inv, b = o[j][2 * half + 1] * inv;
      const int64_t at = static_cast<int64_t>(row) * p.out.ld + col;
      if (p.out.kind == ActKind::f32)
        *reinterpret_cast<float2*>(static_cast<float*>(p.out.data) + at) = make_float2(a, b);
      else
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out.data) + at) =
            __floats2bfloat162_rn(a, b);
    }
  }
}

template <int HD>
void launch(const PrefillParams& p, int n_heads, Stream stream) {
  using Cfg = PrefillConfig<HD>;
  constexpr auto kernel = attention_prefill_kernel<HD>;
  nibble::cuda::allow_dynamic_smem<kernel>(Cfg::kSmemBytes);
  const dim3 grid(static_cast<unsigned>((p.m + kBM - 1) / kBM), static_cast<unsigned>(n_heads));
  kernel<<<grid, kThreads, Cfg::kSmemBytes, stream>>>(p);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_attention_prefill(const uint16_t* q, int64_t m, const int32_t* pos0,
                              const AttentionShape& s, const uint16_t* k_cache,
                              const uint16_t* v_cache, const ActOutput& out, Stream stream) {
  if (m <= 0 || m > (int64_t{1} << 30) || s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0 ||
      (out.kind != ActKind::f32 && out.kind != ActKind::bf16) || out.ld % 2 != 0 ||
      out.ld < int64_t{s.n_heads} * s.head_dim)
    nibble::detail::fail(ErrorCode::internal, "launch_attention_prefill: bad shape or output");
  PrefillParams p;
  p.q = reinterpret_cast<const __nv_bfloat16*>(q);
  p.q_ld = int64_t{s.n_heads} * s.head_dim;
  p.pos0 = pos0;
  p.m = static_cast<int>(m);
  p.group = s.n_heads / s.n_kv_heads;
  p.max_ctx = s.max_ctx;
  p.k_cache = reinterpret_cast<const __nv_bfloat16*>(k_cache);
  p.v_cache = reinterpret_cast<const __nv_bfloat16*>(v_cache);
  p.out = out;
  p.scale_log2 =
      static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(s.model_head_dim())));
  switch (s.head_dim) {
    case 64: return launch<64>(p, s.n_heads, stream);
    case 128: return launch<128>(p, s.n_heads, stream);
  }
  nibble::detail::fail(ErrorCode::unsupported,
                       "nibble::llm: the CUDA attention supports head_dim 64 and 128, got " +
                           std::to_string(s.head_dim));
}

}  // namespace nibble::llm::cuda
