// Kernel launches that may overlap the previous kernel in the stream (programmatic dependent
// launch, sm_90+). A decode-sized GEMM is a short weight stream whose first loads wait for the
// launch and for HBM's latency; launched this way it starts while the kernel before it (the
// RMSNorm or activation quantization feeding it, or the previous linear) is still running,
// asks L2 for the first stages of its weights (ptx::prefetch_l2, safe before the dependency is
// met), and only then waits for that kernel (ptx::griddep_wait). Results do not change: every
// read of data an earlier kernel may write, and every write, comes after the wait.
// In CUDA graphs captured from a stream the overlap becomes a programmatic edge.
// NIBBLE_NO_PDL=1 in the environment launches everything plainly (for measurements).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "common/cuda_runtime_check.h"
#include "common/env.h"
#include "nibble/device.h"

namespace nibble::cuda {

/// Whether launches on a GPU of compute capability `cc_major` may overlap (sm_90+, and not
/// turned off with NIBBLE_NO_PDL=1).
inline bool overlapping_launch_allowed(int cc_major) {
  static const bool disabled = [] {
    const char* v = std::getenv("NIBBLE_NO_PDL");
    return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
  }();
  return cc_major >= 9 && !disabled;
}

/// overlapping_launch_allowed for the current CUDA device (for launchers that get no device).
inline bool overlapping_launch_allowed_here() {
  int device = 0;
  NIBBLE_CUDA_CHECK(cudaGetDevice(&device));
  return overlapping_launch_allowed(cuda_device_info(device).cc_major);
}

/// Whether a decode-tile GEMM plan of `splits` K splits launches to overlap the kernel before
/// it: only split-K plans (the output tiles alone leave SMs idle). Measured on the H100,
/// 2026-11-23, it took 0.4-1.3 us off those at M = 1 (4096x4096, 6144x4096, 4096x14336) but
/// slowed the one-wave 28672x4096 from 24.4 to 27.8 us (docs/kernels.md, overlapping launches).
inline bool overlap_split_k_launch(int cc_major, int splits) {
  return overlapping_launch_allowed(cc_major) && splits > 1;
}

/// Whether an sm90 warp-specialised GEMM plan (sm90_w4a8_gemm, sm90_weight_only_gemm) launches
/// to overlap the kernel before it: cluster-split grids only. Those are one wave of one tile (or
/// split) per CTA, so the first stages' weights can load while that kernel finishes; persistent
/// and paired grids walk or share tiles and launch plainly.
inline bool overlap_cluster_split_launch(bool cluster_split) {
  return cluster_split && overlapping_launch_allowed(9);
}

/// Weight blocks per row that a decode GEMM asks L2 for, past the ring stages it loads before
/// waiting for the kernel before it (NIBBLE_PREFETCH_BLOCKS sets it; 0: none). Launched to
/// overlap (`overlap`), where every prologue stage's weights already load before the wait:
/// none. Measured on the H100 (2026-11-24, bench/results/h100_prefetch_blocks_ab.log), 0 against
/// 2: Llama-3-8B decode W4A8 363.3-363.4 against 360.7-362.2 tokens/s (404 against 397 at a
/// 16-token context), W4A16 284.3-284.6 against 274.4-274.6; alone at M = 1 6144x4096 8.33
/// against 8.74 us (W4A16 14.2 against 15.6). A plain launch (the one-wave layers) keeps 2 from
/// the CTA's first block: 28672x4096 24.9 us against 25.3 with none (and 25.0 against 27.2 with
/// the early stages, 2026-11-23).
inline int overlap_prefetch_blocks(bool overlap) {
  static const int blocks = nibble::detail::env_int("NIBBLE_PREFETCH_BLOCKS", -1, 0, 1 << 16);
  return blocks >= 0 ? blocks : overlap ? 0 : 2;
}

/// Ring stages whose weights a decode GEMM loads into shared memory before it waits for the
/// kernel before it (cuda/common/overlap_prologue.cuh). When the launch may overlap (`overlap`):
/// every stage of the prologue (NIBBLE_EARLY_WEIGHT_STAGES sets the number; 0: none, all loads
/// after the wait as before 2026-11-24, for A/B measurements). A plain launch waits for
/// nothing, and there the old order (and its 2-block L2 prefetch from the CTA's first block)
/// measured faster (28672x4096 at M = 1: 25.0 against 27.2 us, H100), so none.
inline int overlap_early_weight_stages(bool overlap) {
  static const int stages =
      nibble::detail::env_int("NIBBLE_EARLY_WEIGHT_STAGES", 1 << 20, 0, 1 << 20);
  return overlap ? stages : 0;
}

/// The launch attribute that cuts a grid into thread-block clusters of `cluster` CTAs.
inline cudaLaunchAttribute cluster_attribute(dim3 cluster) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = cluster.x;
  a.val.clusterDim.y = cluster.y;
  a.val.clusterDim.z = cluster.z;
  return a;
}

/// The launch attribute that cuts a grid into thread-block clusters of (1, 1, cluster_z).
inline cudaLaunchAttribute cluster_z_attribute(unsigned cluster_z) {
  return cluster_attribute(dim3(1, 1, cluster_z));
}

/// How many clusters of (1, 1, cluster_z) CTAs of `kernel` (block threads, smem_bytes of dynamic
/// shared memory each) the current device runs at once; 0 when it cannot run them. Set the
/// kernel's shared-memory (and non-portable cluster size) attributes first.
template <class... Params>
int max_active_clusters(void (*kernel)(Params...), dim3 block, size_t smem_bytes,
                        unsigned cluster_z) {
  cudaLaunchAttribute cluster = cluster_z_attribute(cluster_z);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1, 1, cluster_z);
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the GPU simply cannot run clusters of this size
    n = 0;
  }
  return n;
}

/// kernel<<<grid, block, smem_bytes, stream>>>(args...), allowed to start before the previous
/// kernel in the stream has finished when `overlap` is true. The kernel must call
/// ptx::griddep_wait before touching data that earlier kernels write (cuda/common/ptx.cuh).
/// `cluster` other than (1, 1, 1): the grid is cut into thread-block clusters of that shape
/// (sm_90+); a number cluster_z stands for (1, 1, cluster_z).
template <class... Params, class... Args>
void launch_overlapping(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                        cudaStream_t stream, bool overlap, dim3 cluster, Args&&... args) {
  cudaLaunchAttribute attributes[2]{};
  unsigned count = 0;
  if (overlap) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster.x * cluster.y * cluster.z > 1) attributes[count++] = cluster_attribute(cluster);
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  NIBBLE_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}
template <class... Params, class... Args>
void launch_overlapping(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                        cudaStream_t stream, bool overlap, unsigned cluster_z, Args&&... args) {
  launch_overlapping(kernel, grid, block, smem_bytes, stream, overlap, dim3(1, 1, cluster_z),
                     std::forward<Args>(args)...);
}

}  // namespace nibble::cuda
