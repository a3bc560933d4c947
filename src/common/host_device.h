// NIBBLE_HOST_DEVICE marks inline functions that nvcc compiles for both the host and the GPU
// and that g++ compiles as plain host code, so one definition serves a kernel and the CPU test
// that checks it.
#pragma once

#if defined(__CUDACC__)
#define NIBBLE_HOST_DEVICE __host__ __device__
/// For the few-instruction helpers of kernel inner loops: always inlined on the GPU.
#define NIBBLE_HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define NIBBLE_HOST_DEVICE
#define NIBBLE_HOST_DEVICE_INLINE inline
#endif
