// nibble — what this build contains and which CUDA devices it can see.
#pragma once

#include <string>
#include <cstdint>
#include <vector>

#include "nibble/types.h"

namespace nibble {

struct BuildInfo {
  std::string version;
  bool cuda = false;             ///< compiled with the CUDA backend
  std::string cuda_archs;        ///< e.g. "80;90a" (empty without CUDA)
  std::string cuda_runtime;      ///< runtime version the library was built against, e.g. "13.0"
  std::string compiler;
  std::string build_type;
};
BuildInfo build_info();

/// Properties read from a CUDA device (never hard-coded).
struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  ///< compute capability
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int64_t smem_per_block_optin = 0;  ///< bytes a block may use after raising its limit
  int64_t global_mem_bytes = 0;
  int clock_khz = 0, mem_clock_khz = 0, mem_bus_bits = 0;
};

/// Number of CUDA devices the runtime reports; 0 in a CPU-only build or without a driver/GPU.
int cuda_device_count();
/// Why no GPU can be used (empty when cuda_device_count() > 0).
std::string cuda_unavailable_reason();
DeviceInfo cuda_device_info(int ordinal = 0);
/// ρ, a GPU's int4 tensor-core throughput (int8 where it has no int4 MMA) over its f32
/// CUDA-core throughput, per SM and clock, from the compute capability: 64 (sm_80), 16
/// (sm_86/87), 8 (sm_89), 32 (sm_90); 0 if unknown. The indicator of the APEX4 study for
/// whether group-wise W4A4 (a per-group f32 rescale on the CUDA cores) pays.
int tensor_core_ratio(int cc_major, int cc_minor);
/// Waits for all work queued on `device` (no-op for the CPU).
void synchronize(Device device);

}  // namespace nibble
