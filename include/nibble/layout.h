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
//
// Layouts w4_mma16_k128 and w8_mma16_k128 (version 1), for 4- and 8-bit weights on 16-bit
// tensor cores (mma.sync.m16n8k16 bf16/f16; W4A16, W8A16):
//   The same 8×128 blocks and padding; a block is B = 512 (4-bit) or 1024 (8-bit) bytes at
//   ((nb·K_pad/128)+kb)·B, and lane l = 4g + c owns bytes [l·B/32, (l+1)·B/32): one 16- or
//   32-byte load holds its B fragments for the block's eight k16 steps.
//     w4: word j (k32 step j) nibble i (bits 4i..4i+3) holds
//           u(n = 8nb + g, k = 128kb + 32j + 16·((i>>1)&1) + 8·(i&1) + 2c + (i>>2))
//         so (word >> 4i) & 0x000F000F is a k-pair of one B register (see sm80_weight_only_gemm).
//     w8: word t (k16 step t) byte b holds u(n = 8nb + g, k = 128kb + 16t + 2c + (b&1) + 8(b>>1)).
//   Values are unsigned: u = v + 8 (s4_sym), u = q (u4_asym, u4_fzp), u = v + 128 (s8_sym);
//   padding u = 8 or 128. Scales f32, (N_pad) per channel or (⌈K_pad/G⌉, N_pad) per group;
//   zeros f32 of the same shape for u4_asym (the integer zero z) and u4_fzp (the float zero).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "nibble/formats.h"
#include "nibble/quantize.h"
#include "nibble/tensor.h"
#include "nibble/types.h"

namespace nibble {

enum class WeightLayout : uint8_t {
  w4_mma_k128 = 1,    ///< int4 weights for int8 mma (W4A8: s4_sym, s4_two_level)
  w4_mma16_k128 = 2,  ///< int4 weights for bf16/f16 mma (W4A16: s4_sym, u4_asym, u4_fzp)
  w8_mma16_k128 = 3,  ///< int8 weights for bf16/f16 mma (W8A16: s8_sym)
};
constexpr int kW4MmaK128Version = 1;
constexpr int kW4Mma16K128Version = 1;
constexpr int kW8Mma16K128Version = 1;

const char* to_string(WeightLayout layout);
/// "w4_mma_k128", ... → the layout; throws invalid_argument naming the choices.
WeightLayout parse_weight_layout(std::string_view s);
/// The current version of a layout, and the bits of one stored weight value (4 or 8).
int layout_version(WeightLayout layout);
int layout_weight_bits(WeightLayout layout);

/// Whether the quantized-linear kernels read a packed layout for this format, and which:
/// W4A8 (s8 activations × s4_sym / s4_two_level) and W4A-FP8 (e4m3 activations × s4_sym)
/// → w4_mma_k128; W4A16 (s4_sym, u4_asym,
/// u4_fzp) → w4_mma16_k128; W8A16 (s8_sym) → w8_mma16_k128. packed_layout throws unsupported
/// for any other format (those run on logical weights).
bool has_packed_layout(const LinearFormat& format);
WeightLayout packed_layout(const LinearFormat& format);

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
  TensorView zeros;         ///< u4_asym / u4_fzp in w4_mma16_k128: f32 (k_pad/G, n_pad)
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
  Tensor q, scales, group_params, zeros;
};

/// Allocates an empty packed weight of `format` for an N×K matrix on `device`, with the
/// layout's padded sizes: every value u = 8 (128 for 8-bit layouts), scales, zeros and group
/// parameters zero. pack_weight fills one on the host; benchmarks fill one with random contents
/// directly on the GPU.
PackedWeight allocate_packed_weight(const WeightFormat& format, int64_t n, int64_t k,
                                    Device device = Device::cpu(),
                                    WeightLayout layout = WeightLayout::w4_mma_k128);

/// Repacks a quantized weight (on the CPU) into `layout`, then copies it to `device`.
/// w4_mma_k128: s4_sym (per channel or any group size) and s4_two_level; w4_mma16_k128:
/// s4_sym, u4_asym, u4_fzp; w8_mma16_k128: s8_sym. Use packed_layout(linear format) to pick it.
PackedWeight pack_weight(const QuantizedWeightView& w, WeightLayout layout,
                         Device device = Device::cpu());
/// The W4A8 layout w4_mma_k128.
PackedWeight pack_weight(const QuantizedWeightView& w, Device device = Device::cpu());

/// Packs a raw s4 matrix (N, K), for gemm_s32 with packed weights; it carries no scales.
PackedWeight pack_s4_matrix(const TensorView& w, Device device = Device::cpu());

/// Where logical element (n, k) lives in a layout's bytes: byte offset and bit shift (0 or 4 for
/// 4-bit values; 0 for 8-bit ones).
struct NibbleIndex {
  int64_t byte;
  int shift;
};
NibbleIndex packed_weight_index(WeightLayout layout, int64_t n, int64_t k, int64_t k_pad);
NibbleIndex w4_mma_k128_index(int64_t n, int64_t k, int64_t k_pad);

/// Reads the weight integer at (n, k) back out of a packed view on the CPU, as the logical
/// format stores it: v for s4_sym and s8_sym, q for u4_asym, u4_fzp and s4_two_level. Tests
/// use it to check the packing is a bijection.
int packed_weight_value(const PackedWeightView& w, int64_t n, int64_t k);

/// The logical weight a packed one holds (host memory; w on the host): the inverse of
/// pack_weight, bit-exact (scales and zeros return to the format's scale dtype exactly).
QuantizedWeight unpack_weight(const PackedWeightView& w);

/// A text drawing of which (n, k) each lane's bytes hold in one 8×128 block.
std::string describe_layout(WeightLayout layout);

}  // namespace nibble
