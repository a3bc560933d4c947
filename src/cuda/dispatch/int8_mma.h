// Choice between the two int8-MMA GEMM families for one call, and the W8A8 registry row.
//
// sm80_w4a8_gemm (mma.sync, any sm_80+) and sm90_w4a8_gemm (wgmma + TMA, sm_90a) compute the
// same results from the same operands: int4 weights in the packed w4_mma_k128 layout, or — as
// the W8A8 GEMMs sm80_w8a8_gemm / sm90_w8a8_gemm — the logical row-major s8 weights. This file
// decides which one runs a W4A8Launch (by M, grid size and format) and registers the W8A8 GEMM
// in the logical-weight kernel ladder (dispatch/registry.h) ahead of the SIMT fallback.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/dispatch/registry.h"
#include "cuda/launch/sm80_w4a8_gemm.h"

namespace nibble::cuda {

/// Whether the Hopper family runs this call. NIBBLE_W4A8_KERNEL (int4 weights) and
/// NIBBLE_W8A8_KERNEL (int8 weights) = sm80_… or sm90_… force one where it can run.
bool use_sm90_int8_mma(int device, int64_t m, int64_t n_pad, int64_t k_pad,
                       sm80::W4A8Epilogue epilogue, int group, int weight_bits);
/// Launches the chosen family.
void launch_int8_mma(const W4A8Launch& launch, Stream stream);

/// The kernels of a W4A-FP8 call (packed int4 weights × per-token e4m3 activations).
enum class W4AFp8Kernel { sm80_w4afp8_gemm, sm90_w4afp8_gemm, simt_linear };
const char* to_string(W4AFp8Kernel kernel);
/// Which one runs: for per-channel and g128 weights the thin mma.sync tiles (sm80_w4afp8_gemm)
/// below M = 17 and sm90_w4afp8_gemm from there on Hopper; sm80_w4afp8_gemm at every M on an
/// sm_89 build for sm_89; the SIMT kernel on the packed layout otherwise. NIBBLE_W4AFP8_KERNEL=<name> forces
/// one; a name that is not a kernel, or one that cannot run this call, is an invalid_argument
/// error.
W4AFp8Kernel w4afp8_kernel(int device, int64_t m, sm80::W4A8Epilogue epilogue, int group);
/// explain() text for the chosen family and its plan.
std::string describe_int8_mma(int device, int64_t m, int64_t n, int64_t k,
                              sm80::W4A8Epilogue epilogue, int group, int weight_bits,
                              bool a4 = false);

/// The W8A8 row of the registry: w8a8 (per-token or static per-tensor int8 activations, int8
/// per-channel weights with any scale dtype) on sm_80+, K % 16 == 0, 16-byte aligned operands.
LinearKernel w8a8_int8_mma_entry();
/// The W4A4 row: w4a4_pc (per-token int4 activations, per-channel int4 weights, logical
/// row-major packed operands) on sm_80+, K % 32 == 0, 16-byte aligned rows; on sm_90+ (no int4
/// tensor cores, int8 emulation) K ≤ 131071.
LinearKernel w4a4_int8_mma_entry();

/// Whether the logical s8 × s8 or s4 × s4 → s32 GEMM can run on the int8-MMA family (sm_80+,
/// K % 16 (s8) or 32 (s4) == 0, both operands row-major with 16-byte aligned rows), and the
/// launch.
bool int8_mma_handles_s32(const TensorView& a, const TensorView& w);
void launch_int8_mma_s32(const TensorView& a, const TensorView& w, const TensorView& d,
                         Stream stream);

/// explain()'s sentence on W4A4 granularity for `device`: ρ and the format it suggests.
std::string w4a4_granularity_note(int device);

/// Row-major with a unit inner stride and 16-byte aligned base and row pitch.
bool rows_aligned16(const TensorView& t);

}  // namespace nibble::cuda
