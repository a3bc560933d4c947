// Build information and CUDA device discovery.
#include "nibble/device.h"

#include <map>
#include <mutex>
#include <string>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "nibble/version.h"

namespace nibble {

#if NIBBLE_WITH_CUDA
namespace detail {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(ErrorCode::cuda_error, std::string("nibble: CUDA call ") + call + " failed at " +
                                         file + ":" + std::to_string(line) + ": " +
                                         cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

DeviceGuard::DeviceGuard(int ordinal) {
  NIBBLE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != ordinal) NIBBLE_CUDA_CHECK(cudaSetDevice(ordinal));
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) cudaSetDevice(previous_);
}

}  // namespace detail
#endif

BuildInfo build_info() {
  BuildInfo b;
  b.version = NIBBLE_VERSION_STRING;
#if NIBBLE_WITH_CUDA
  b.cuda = true;
  b.cuda_archs = NIBBLE_CUDA_ARCHS_STRING;
  b.cuda_runtime = std::to_string(CUDART_VERSION / 1000) + "." +
                   std::to_string(CUDART_VERSION % 1000 / 10);
#endif
#if defined(__clang__)
  b.compiler = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  b.compiler = "g++ " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__);
#endif
  b.build_type = NIBBLE_BUILD_TYPE_STRING;
  return b;
}

int tensor_core_ratio(int cc_major, int cc_minor) {
  // Dense MMA and f32 FMA rates per SM per clock, from the vendors' datasheets (TOPS / SMs /
  // boost clock): sm_80 (A100) int4 8192 vs 128 f32 ops; sm_86 (GA10x) 4096 vs 256; sm_89
  // (AD10x) 2048 vs 256; sm_90 (H100) no int4 MMA, int8 8192 vs 256.
  switch (cc_major * 10 + cc_minor) {
    case 80: return 64;
    case 86:
    case 87: return 16;
    case 89: return 8;
    case 90: return 32;
    default: return 0;
  }
}

int cuda_device_count() {
#if NIBBLE_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

std::string cuda_unavailable_reason() {
#if NIBBLE_WITH_CUDA
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return std::string("the CUDA runtime reports ") + cudaGetErrorName(err) + ": " +
           cudaGetErrorString(err);
  }
  return count == 0 ? "the CUDA runtime found no device" : "";
#else
  return "this build of nibble has no CUDA backend (configure with a CUDA compiler)";
#endif
}

DeviceInfo cuda_device_info(int ordinal) {
  // Properties are read once per device: cudaGetDeviceProperties costs far more than a launch.
  static std::mutex mu;
  static std::map<int, DeviceInfo> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(ordinal); it != cache.end()) return it->second;
  }
  const detail::ArgCheck check("cuda_device_info");
  const int count = cuda_device_count();
  check.condition(ordinal >= 0 && ordinal < count, "ordinal",
                  "must name a visible CUDA device (" + std::to_string(count) + " found), got " +
                      std::to_string(ordinal),
                  ErrorCode::unsupported);
  DeviceInfo d;
#if NIBBLE_WITH_CUDA
  cudaDeviceProp p{};
  NIBBLE_CUDA_CHECK(cudaGetDeviceProperties(&p, ordinal));
  d.ordinal = ordinal;
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  d.l2_bytes = p.l2CacheSize;
  d.smem_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  d.global_mem_bytes = static_cast<int64_t>(p.totalGlobalMem);
  // Clock rates moved out of cudaDeviceProp in CUDA 13; read them as attributes.
  NIBBLE_CUDA_CHECK(cudaDeviceGetAttribute(&d.clock_khz, cudaDevAttrClockRate, ordinal));
  NIBBLE_CUDA_CHECK(cudaDeviceGetAttribute(&d.mem_clock_khz, cudaDevAttrMemoryClockRate, ordinal));
  NIBBLE_CUDA_CHECK(
      cudaDeviceGetAttribute(&d.mem_bus_bits, cudaDevAttrGlobalMemoryBusWidth, ordinal));
#endif
  std::lock_guard<std::mutex> lock(mu);
  cache[ordinal] = d;
  return d;
}

void synchronize(Device device) {
  if (device.type == DeviceType::cpu) return;
#if NIBBLE_WITH_CUDA
  detail::DeviceGuard guard(device.index);
  NIBBLE_CUDA_CHECK(cudaDeviceSynchronize());
#else
  detail::fail(ErrorCode::unsupported, "nibble::synchronize: argument 'device' is " +
                                           to_string(device) + ", but this build has no CUDA");
#endif
}

}  // namespace nibble
