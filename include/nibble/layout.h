// nibble — kernel-native packed weight layouts.
//
// Files and APIs carry logical formats (formats.h); tensor-core kernels read weights in a
// private, versioned layout made once, offline, by `pack_weight`. Each layout has a host
// `index()` so tests can check the packing is a bijection and `nibble layout --print` can draw
// it. docs/layouts.md describes each layout in full.
//
// Layout w4_mma_k128 (version 1), for int4 weights on mma.sync.m16n8k32 (sm_80+):
//   N is padded to a multiple of 8 and K to a multiple of 128. The matrix is cut into blocks of
//   8 rows (n) × 128 columns (k); block (nb, kb) is 512 contiguous bytes at ((nb·K_pad/128)+kb)·512,
//   so one block is one 16-byte load per lane of a warp. Lane l = 4g + c (g = l/4, c = l%4)
//   owns bytes [16l, 16l+16): word j ∈ 0..3 covers the k32 step j, and its byte b holds
//     low nibble  = u(n = 8nb + g, k = 128kb + 32j + 4c + b)
//     high nibble = u(n = 8nb + g, k = 128kb + 32j + 16 + 4c + b)
//   which are exactly the B-fragment registers b[0] and b[1] of that lane for that k32 step.
//   Nibbles are unsigned: u = v + 8 for s4_sym weights, u = q for s4_two_level weights; padding
//   nibbles are u = 8. Scales become f32: per channel (N_pad), per group (K_pad/G, N_pad), and
//   two-level group parameters are u8 (K_pad/G, 2·N_pad) byte pairs (g_s, 128 − g_s·g_z), so
//   the kernel's int8 weight is ((u · g_s) + (128 − g_s·g_z)) XOR 0x80 (see sm80_w4a8_gemm).
//   Padded rows and groups have zero scales and parameters; they only ever meet zero-filled
//   activations (k ≥ K) or unstored outputs (n ≥ N), so they never change a result.
#pragma once

#include <cstdint>
#include <string>

#include "nibble/formats.h"
#include "nibble/quantize.h"
#include "nibble/tensor.h"
#include "nibble/types.h"

namespace nibble {

enum class WeightLayout : uint8_t {
  w4_mma_k128 = 1,  ///< int4 weights for mma.sync.m16n8k32 (s4_sym, s4_two_level)
};
constexpr int kW4MmaK128Version = 1;

const char* to_string(WeightLayout layout);

/// A weight matrix in a kernel-native layout. `format` is the logical format it came from.
struct PackedWeightView {
  WeightLayout layout = WeightLayout::w4_mma_k128;
  int version = 0;
  WeightFormat format;
  bool has_scales = true;  ///< false for a raw s4 matrix (gemm_s32 only)
  int64_t n = 0, k = 0;          ///< logical sizes
  int64_t n_pad = 0, k_pad = 0;  ///< padded sizes of the layout
  TensorView q;             ///< u8 (n_pad/8 · k_pad/128 · 512) bytes
  TensorView scales;        ///< f32 (n_pad) or (k_pad/G, n_pad)
  TensorView group_params;  ///< two-level only: u8 (k_pad/G, 2·n_pad) pairs (g_s, offset)
};

/// Owns a packed weight.
struct PackedWeight {
  PackedWeightView view() const;
  PackedWeight to(Device device) const;

  WeightLayout layout = WeightLayout::w4_mma_k128;
  int version = 0;
  WeightFormat format;
  bool has_scales = true;
  int64_t n = 0, k = 0, n_pad = 0, k_pad = 0;
  Tensor q, scales, group_params;
};

/// Allocates an empty w4_mma_k128 weight of `format` for an N×K matrix on `device`, with the
/// layout's padded sizes: every nibble u = 8, scales and group parameters zero. pack_weight
/// fills one on the host; benchmarks fill one with random contents directly on the GPU.
PackedWeight allocate_packed_weight(const WeightFormat& format, int64_t n, int64_t k,
                                    Device device = Device::cpu());

/// Repacks a quantized weight (on the CPU) into the layout its format's kernels read, then
/// copies it to `device`. Supported: s4_sym (per channel or any group size) and s4_two_level.
PackedWeight pack_weight(const QuantizedWeightView& w, Device device = Device::cpu());

/// Packs a raw s4 matrix (N, K), for gemm_s32 with packed weights; it carries no scales.
PackedWeight pack_s4_matrix(const TensorView& w, Device device = Device::cpu());

/// Where logical element (n, k) lives in the w4_mma_k128 bytes: byte offset and bit shift (0
/// for the low nibble, 4 for the high one).
struct NibbleIndex {
  int64_t byte;
  int shift;
};
NibbleIndex w4_mma_k128_index(int64_t n, int64_t k, int64_t k_pad);

/// Reads the signed weight integer at (n, k) back out of a packed view on the CPU: v for s4_sym
/// (u − 8), q for s4_two_level. Tests use it to check the packing is a bijection.
int packed_weight_value(const PackedWeightView& w, int64_t n, int64_t k);

/// A text drawing of which (n, k) each lane's bytes hold in one 8×128 block.
std::string describe_layout(WeightLayout layout);

}  // namespace nibble
