// Launcher interface of the activation quantization kernel (act_quant.cu). Host-only types.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/common/operand.h"
#include "nibble/device.h"
#include "nibble/quantize.h"
#include "nibble/types.h"

namespace nibble::cuda {

/// One call: x (M, K) → q (M, K) and scales, with the optional RMSNorm and SmoothQuant divide
/// in front (nibble::ActQuantFusion; the CPU reference in src/cpu/quantize_ref.cpp defines it).
struct ActQuantArgs {
  int64_t m = 0, k = 0;
  Operand x;                   ///< (M, K) f32 / f16 / bf16, any row stride
  void* q = nullptr;           ///< (M, K) s8 / s4 / e4m3
  DType q_dtype = DType::s8;
  int64_t q_row_stride = 0;    ///< in elements (nibbles for s4: always even)
  float* scales = nullptr;     ///< (M) dynamic, or (1) static
  float qmax = 127.0f;         ///< 127 (s8), 7 (s4), 448 (e4m3)
  float static_scale = 0.0f;   ///< > 0: static per-tensor quantization with this scale
  Operand rms_weight;          ///< (K) x's dtype or f32; data null: no RMSNorm
  float rms_eps = 0.0f;
  Operand smooth;              ///< (K) f32 / f16 / bf16 divisor; data null: none
  void* normed = nullptr;      ///< (M, K) x's dtype: receives the RMSNorm output; null: none
  int64_t normed_row_stride = 0;
};

/// How the rows are split (docs/kernels.md, act_quant). A chunk is 16 bytes of x (vec
/// elements); each thread of a row owns chunks lane, lane + threads_per_row, ...
struct ActQuantPlan {
  int vec = 0;                ///< elements of x per chunk: 4 (f32) or 8 (f16 / bf16)
  int threads_per_row = 0;    ///< 32 … 512, whole warps, a power of two
  int tpr_shift = 0;          ///< log2(threads_per_row)
  int chunks_per_thread = 0;  ///< 1, 2, 4 or 8 held in shared memory; 0: the row does not
                              ///< fit on chip and is streamed from global memory once per pass
  int rows_per_block = 0;
  int smoothed_planes = 0;    ///< held rows with a smooth divisor: v = y / smooth is kept on chip
                              ///< as f32 in this many extra planes of 16-byte slots (vec / 4),
                              ///< so each element is divided once; 0: v is recomputed
  bool vectorized = false;    ///< every row and vector start is aligned for 16-byte (x, normed)
                              ///< and chunk-sized (q, rms_weight, smooth) accesses
  int rms_bits = 0;           ///< 62 − ceil(log2 K): the fixed point of RMSNorm's sum
  double inv_k = 0;           ///< RN64(1 / K): RMSNorm's mean
  double inv_qmax = 0;        ///< RN64(1 / qmax): the dynamic scale amax / qmax
  int64_t blocks = 0;
  int threads() const { return threads_per_row * rows_per_block; }
  /// Dynamic shared memory of a launch: 16 bytes per chunk held, and per smoothed plane.
  int shared_bytes() const { return threads() * chunks_per_thread * 16 * (1 + smoothed_planes); }
};

/// The arguments of a validated call (static_scale 0: per token).
ActQuantArgs act_quant_args(const TensorView& x, const QuantizedActivationView& out,
                            const ActQuantFusion& fusion, float static_scale);

/// What the planner aims for; the defaults are what the library runs (`nibble bench
/// act-quant --sweep` times the alternatives).
struct ActQuantPlanOptions {
  int max_chunks = 0;       ///< chunks a thread holds at most (1, 2, 4 or 8); 0: the
                            ///< planner's measured choice (by fusion, row length and M)
  /// Short rows share blocks of about this many threads. 128: one row a block from 128 threads
  /// a row on, since rows sharing a block wait for each other at the reductions' barriers
  /// (measured 1–4% slower with 256, H100, M = 1024 and 4096).
  int block_threads = 128;
  bool keep_smoothed = true;  ///< keep v = y / smooth on chip where shared memory allows
};

/// The split for these arguments on `dev` (its SM count and shared memory per block).
ActQuantPlan plan_act_quant(const ActQuantArgs& args, const DeviceInfo& dev,
                            const ActQuantPlanOptions& options = {});
/// E.g. "act_quant bf16->s8, 64 threads/row x 8 chunks in shared memory, 4 rows/block,
/// 16-byte accesses".
std::string describe(const ActQuantPlan& plan, const ActQuantArgs& args);

/// `overlap`: launch so that the kernel may start before the previous one in the stream has
/// finished (cuda/launch/pdl_launch.h; pass overlapping_launch_allowed(cc_major)).
void launch_act_quant(const ActQuantArgs& args, const ActQuantPlan& plan, Stream stream,
                      bool overlap = false);

}  // namespace nibble::cuda
