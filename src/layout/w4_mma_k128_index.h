// Where weight (n, k) lives in layout w4_mma_k128 (include/nibble/layout.h, docs/layouts.md):
// one inline definition for the host packer (packed_weight.cpp) and the GPU kernels that read
// single elements of a packed weight (the generic SIMT fallback).
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "nibble/layout.h"

namespace nibble::detail {

NIBBLE_HOST_DEVICE inline NibbleIndex w4_mma_k128_position(int64_t n, int64_t k, int64_t k_pad) {
  const int64_t nb = n / 8, g = n % 8, kb = k / 128, kr = k % 128;
  const int64_t j = kr / 32, within = kr % 32;  // k32 step, position inside it
  const int64_t high = within / 16, c = (within % 16) / 4, b = within % 4;
  const int64_t lane = 4 * g + c;
  const int64_t block = nb * (k_pad / 128) + kb;
  return {block * 512 + lane * 16 + j * 4 + b, static_cast<int>(high * 4)};
}

}  // namespace nibble::detail
