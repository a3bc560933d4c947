// Launchers of the CUDA runner's own kernels (everything in a Llama block that is not a linear
// layer): host-only declarations, no CUDA headers, so the backend and the tests are plain C++.
// Each launcher checks its launch (NIBBLE_CUDA_CHECK_LAUNCH) and throws nibble::Error for
// arguments a kernel cannot take. The kernels and their header blocks (formula, layouts,
// limitations, verify command) are in the .cu files of this directory.
//
// Shared conventions
//   * Activations are row-major, one row per token; `ld` is a row stride in elements.
//   * The residual stream x and every linear output are f32 (as the CPU backend keeps them).
//   * A producer of a linear layer's input (RMSNorm, SwiGLU, decode attention) writes it in the
//     form that layer reads (ActOutput): bf16 (cuBLAS, weight-only formats), f32, or int8 per
//     token with an f32 scale per row, computed exactly as nibble::quantize_activation computes
//     it from the f32 values (s = amax/127 with IEEE division, q = rint(x/s) clamped to ±127),
//     so a fused producer is bit-identical to "write f32, then quantize_activation".
//   * KV cache of one layer: K and V each (n_kv_heads, max_ctx, head_dim) bf16, head-major, so
//     one head's keys are one contiguous (max_ctx, head_dim) matrix.
//   * Positions come from device memory (`const int32_t* pos`), so a captured CUDA graph replays
//     for every decode step.
#pragma once

#include <cstdint>

#include "nibble/types.h"

namespace nibble::llm::cuda {

/// The form in which a producer writes the input of the next linear layer.
enum class ActKind : uint8_t { f32, bf16, s8_per_token };
const char* to_string(ActKind k);

struct ActOutput {
  ActKind kind = ActKind::bf16;
  void* data = nullptr;     ///< (M, ld): f32, bf16 or s8
  int64_t ld = 0;           ///< row stride, elements
  float* scales = nullptr;  ///< s8_per_token: (M) f32
};

/// x[t, :] = float(table[tokens[t], :]) for t < m; table (vocab, d) bf16, x (m, d) f32.
void launch_embedding(const uint16_t* table_bf16, const int32_t* tokens, int64_t m, int64_t d,
                      float* x, Stream stream);

/// Per row r < m: x[r] += delta[r] (when delta is not null), then
///   out[r, i] = x[r, i] · inv · g[i],  inv = 1 / sqrt(mean(x[r]²) + eps)   (mean in double)
/// written as `out` says. x, delta: (m, d) f32 with row stride d.
void launch_add_rmsnorm(float* x, const float* delta, int64_t m, int64_t d, const float* g,
                        double eps, const ActOutput& out, Stream stream);

/// out[r, i] = silu(gu[r, i]) · gu[r, f + i] for i < f (gate and up side by side in one row of
/// the fused gate_up linear's output, (m, 2f) f32), written as `out` says.
void launch_swiglu(const float* gu, int64_t m, int64_t f, const ActOutput& out, Stream stream);

struct AttentionShape {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t max_ctx = 0;
  /// The model's head_dim when its heads run zero-padded to head_dim (the kernels' 64 or 128;
  /// see launch_compact_heads); 0 when they are not padded. The softmax scale 1/√d and the q/k
  /// norms' mean use it.
  int logical_head_dim = 0;
  constexpr int qkv_ld() const { return (n_heads + 2 * n_kv_heads) * head_dim; }
  constexpr int model_head_dim() const { return logical_head_dim > 0 ? logical_head_dim : head_dim; }
};

/// Prefill half of RoPE: for token t < m at position p = *pos0 + t, rotates the pairs
/// (i, i + hd/2) of every q and k head of qkv[t] (f32, (m, qkv_ld): q | k | v), writes q as
/// bf16 to q_out (m, n_heads·hd) and k, v as bf16 to the cache at position p.
/// cos/sin: (max_ctx, hd/2) f32, the CPU backend's table.
void launch_rope_qkv_store(const float* qkv, int64_t m, const int32_t* pos0,
                           const AttentionShape& s, const float* cos, const float* sin,
                           uint16_t* q_out, uint16_t* k_cache, uint16_t* v_cache, Stream stream);

/// y (m, n) f32, row stride n: y[r, i] += bias[i] (attention biases; attention_extras.cu).
void launch_add_bias(float* y, int64_t m, int64_t n, const float* bias, Stream stream);

/// Per-head RMSNorm of q and k in place (Qwen3): for token t < m, every q head and k head of
/// qkv[t] (f32, (m, qkv_ld): q | k | v) becomes v·inv·w, inv = 1/sqrt(mean(v²) + eps) (mean in
/// double), w = q_norm or k_norm (head_dim) f32. v heads are untouched.
void launch_head_rmsnorm(float* qkv, int64_t m, const AttentionShape& s, const float* q_norm,
                         const float* k_norm, double eps, Stream stream);

/// Heads of the model's head_dim h (s.logical_head_dim) run zero-padded to H = s.head_dim: the
/// h/2 halves that RoPE pairs sit at [0, h/2) and [H/2, H/2 + h/2) of each padded head, zeros
/// elsewhere. Writes the attention output rows `padded` (m, n_heads·H) back without the padding
/// into `out` (m, n_heads·h), in the same form (f32, bf16 or int8 codes; an int8 row's scale is
/// unchanged, the padding being zeros, and stays where the attention wrote it).
void launch_compact_heads(const ActOutput& padded, const ActOutput& out, int64_t m,
                          const AttentionShape& s, Stream stream);

/// Workspace of the decode attention: partial softmax states and arrival counters.
struct DecodeAttentionWorkspace {
  float* partials = nullptr;  ///< (n_heads, splits, hd + 4) f32: acc, m, l, padding
  float* row_f32 = nullptr;   ///< (n_heads·hd) f32, for int8 output
  /// (decode_attention_counter_ints): an arrival counter per kv head, one for the int8 row, then
  /// the int8 row's max |x| as float bits; zero between launches (the kernel resets them)
  int* counters = nullptr;
};
/// Positions per CTA of the decode attention, and the number of CTAs along the KV length.
constexpr int kDecodeAttentionChunk = 64;
inline int decode_attention_splits(int64_t max_ctx) {
  return static_cast<int>((max_ctx + kDecodeAttentionChunk - 1) / kDecodeAttentionChunk);
}
int64_t decode_attention_partial_floats(const AttentionShape& s);
inline int64_t decode_attention_counter_ints(const AttentionShape& s) { return s.n_kv_heads + 2; }

/// One decode step of attention for the token at position p = *pos (fused RoPE + cache store):
/// rotates q and k of qkv (1, qkv_ld) f32, stores k, v (bf16) at position p of the cache, and
/// writes softmax(q·Kᵀ/√hd over positions 0..p)·V of every head to out (1, n_heads·hd).
/// Split over the KV length (flash decoding) with a deterministic combine: on sm_90+ a
/// thread-block cluster per kv head (attention_decode_cluster.cu; uses only ws.row_f32 and
/// ws.counters), else a grid of 64-key chunks (attention_decode_splitkv.cu).
void launch_attention_decode(const float* qkv, const int32_t* pos, const AttentionShape& s,
                             const float* cos, const float* sin, uint16_t* k_cache,
                             uint16_t* v_cache, const DecodeAttentionWorkspace& ws,
                             const ActOutput& out, Stream stream);

/// Causal attention of m query tokens at positions *pos0 .. *pos0 + m − 1 over cache positions
/// 0 .. *pos0 + m − 1: q (m, n_heads·hd) bf16 (already rotated), out (m, ld) f32 or bf16.
/// Tensor cores (mma.sync m16n8k16 bf16, f32 accumulation), online softmax.
void launch_attention_prefill(const uint16_t* q, int64_t m, const int32_t* pos0,
                              const AttentionShape& s, const uint16_t* k_cache,
                              const uint16_t* v_cache, const ActOutput& out, Stream stream);

/// The greedy next token of a logits row (n) f32: writes to *token the index llm::argmax
/// returns (the lowest index of the largest value; NaNs never win except at index 0; −0 equals
/// +0). With advance_position, `token` is the decode graph's {token, position} and the kernel
/// also adds 1 to token[1], so that the next decode-graph replay continues from it. `workspace`:
/// argmax_workspace_ints() ints, 8-byte aligned, zero before the first launch (the kernel
/// leaves them zero).
void launch_argmax(const float* logits, int64_t n, int32_t* token, bool advance_position,
                   int* workspace, Stream stream);
constexpr int64_t argmax_workspace_ints() { return 4; }

/// Deterministic random contents for --random-weights runs, generated on the device from a
/// counter-based hash of (seed, element index): no host work for an 8B model.
/// bf16 values uniform in [-a, a).
void launch_fill_uniform_bf16(uint16_t* dst, int64_t count, float a, uint64_t seed, Stream stream);
/// Random bytes (every byte value occurs).
void launch_fill_random_bytes(uint8_t* dst, int64_t bytes, uint64_t seed, Stream stream);
/// Constant f32 values.
void launch_fill_f32(float* dst, int64_t count, float value, Stream stream);

/// A one-thread kernel that spins for `nanoseconds` of GPU time (%globaltimer): launches
/// queued behind it start back to back, so events between them time the GPU alone (profiling).
void launch_gpu_wait(int64_t nanoseconds, Stream stream);
/// Random u8 pairs (g_s, 128 − g_s·8), g_s uniform in [9, 16]: two-level group parameters whose
/// int8 weights g_s·(q − 8) stay in [−128, 112] (layout w4_mma_k128).
void launch_fill_two_level_params(uint8_t* dst, int64_t pairs, uint64_t seed, Stream stream);

}  // namespace nibble::llm::cuda
