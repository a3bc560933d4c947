// Thin wrappers over the PTX instructions the tensor-core kernels use (sm_80+). Each wrapper is
// one instruction; the comments state the operand layouts they assume.
#pragma once

#include <cstdint>

namespace nibble::cuda::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte asynchronous global→shared copy. When `valid` is false nothing is read and the 16
/// destination bytes are zero-filled (src-size 0), so tiles past the matrix edge become zeros.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(valid ? 16 : 0));
}

/// Asynchronous copy of kBytes = 4 or 8 bytes (zero-filled when !valid); the source must be
/// kBytes-aligned. For small strided tables (a row's few group scales).
template <int kBytes>
__device__ __forceinline__ void cp_async_small(void* smem, const void* gmem, bool valid) {
  static_assert(kBytes == 4 || kBytes == 8, "cp.async.ca copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "n"(kBytes), "r"(valid ? kBytes : 0));
}

/// Same, with an L2 evict-first hint: weights are streamed once per call and should not push
/// the (reused) activations out of L2.
__device__ __forceinline__ void cp_async_16_stream(void* smem, const void* gmem, bool valid,
                                                   uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(
                   smem_addr(smem)),
               "l"(gmem), "r"(valid ? 16 : 0), "l"(policy));
}

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/// Waits until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

/// ldmatrix.x4: four 8×8 b16 matrices; lane l supplies the row address of matrix l/8, row l%8.
/// For an s8 A tile this yields the m16n8k32 A fragment when the four matrices are (rows 0-7,
/// bytes 0-15), (rows 8-15, bytes 0-15), (rows 0-7, bytes 16-31), (rows 8-15, bytes 16-31).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}

/// ldmatrix.x4.trans: as ldmatrix_x4, each 8×8 b16 matrix transposed on the way (lane l gets
/// elements (2(l%4), l/4) and (2(l%4)+1, l/4) of each matrix). For a row-major (k, n) tile this
/// yields the "col" B fragment of mma.m16n8k16 (e.g. the runner's P·V, V stored key-major).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(smem_row)));
}

/// D = A·B + D with s8 operands and s32 accumulators, m16n8k32, A row-major, B column-major.
/// Fragments (g = lane/4, c = lane%4):
///   a[0]: row g,   k 4c..4c+3      a[1]: row g+8, k 4c..4c+3
///   a[2]: row g,   k 16+4c..       a[3]: row g+8, k 16+4c..
///   b[0]: col g,   k 4c..4c+3      b[1]: col g,   k 16+4c..
///   d[0..1]: row g, cols 2c, 2c+1  d[2..3]: row g+8, cols 2c, 2c+1
__device__ __forceinline__ void mma_s8_16832(int32_t (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// D = A·B + D with fp8 e4m3 operands and f32 accumulators, m16n8k32 (sm_89+): the fragments
/// are mma_s8_16832's bytes, each an e4m3 code. Compiled for an older target it traps (the
/// launchers run it only where the GPU and the build have sm_89+ code).
__device__ __forceinline__ void mma_e4m3_16832(float (&d)[4], const uint32_t (&a)[4],
                                               const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  (void)d;
  (void)a;
  (void)b;
  __trap();
#endif
}

/// Four e4m3 codes (the bytes of `x`) as two f16x2, exactly: `lo` from bytes 0 and 1, `hi` from
/// bytes 2 and 3 (the lower byte in the lower half). sm_89+.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t x, uint32_t& lo, uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
      " cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(x));
#else
  (void)x;
  lo = hi = 0;
  __trap();
#endif
}

/// D = A·B + D with s4 operands and s32 accumulators, m16n8k64 (native on sm_80/86/89; sm_90 has
/// no int4 tensor cores and emulates it, far slower). The fragments are mma_s8_16832's bytes,
/// each byte two k (the lower k in the low nibble): a[0]: row g, k 8c..8c+7; a[2]: row g,
/// k 32+8c..; b[0]: col g, k 8c..8c+7; b[1]: col g, k 32+8c..; d as above.
__device__ __forceinline__ void mma_s4_16864(int32_t (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// D = A·B + D with bf16 (or f16, kF16) operands and f32 accumulators, m16n8k16, A row-major,
/// B column-major. Each register holds two 16-bit values, the lower k in the low half
/// (g = lane/4, c = lane%4):
///   a[0]: row g, k 2c..2c+1   a[1]: row g+8, k 2c..2c+1   a[2]: row g, k 8+2c..   a[3]: row g+8, k 8+2c..
///   b[0]: col g, k 2c..2c+1   b[1]: col g, k 8+2c..8+2c+1
///   d[0..1]: row g, cols 2c, 2c+1   d[2..3]: row g+8, cols 2c, 2c+1
template <bool kF16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2]) {
  if constexpr (kF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

/// 32-bit shared-memory load.
__device__ __forceinline__ uint32_t lds32(const void* smem) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(smem_addr(smem)));
  return v;
}

/// 128-bit shared-memory load.
__device__ __forceinline__ uint4 lds128(const void* smem) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_addr(smem)));
  return v;
}

// ---- programmatic dependent launch (sm_90+; no-ops on older targets) -------------------------
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization (see
// cuda/launch/pdl_launch.h) may start while the previous kernel in the stream still runs, once
// that kernel has executed griddep_launch_dependents (or exited). Before its first read of
// anything an earlier kernel may have written, and before its first global write, it must
// execute griddep_wait, which returns when the earlier grids have completed and their writes
// are visible. Without the launch attribute both are no-ops.

/// Lets the next kernel in the stream start its own prologue (it still waits for this grid).
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);
#endif
}

/// Waits until every grid this one depends on has completed and its writes are visible.
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

/// Asks L2 to fetch [gmem, gmem + bytes) (bytes a multiple of 16, gmem 16-byte aligned) without
/// reading it into the SM: safe before griddep_wait, because L2 is the point of coherence — an
/// earlier kernel's writes to these lines still land in L2 and later loads see them.
__device__ __forceinline__ void prefetch_l2(const void* gmem, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(gmem), "r"(bytes) : "memory");
#else
  (void)gmem;
  (void)bytes;
#endif
}

// ---- flags between CTAs of one grid (stream-K partial tiles) ---------------------------------

/// A load that later loads and stores of this thread cannot move above, seeing everything the
/// thread that stored the value with st_release_gpu wrote before it (GPU scope).
__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/// A store that earlier loads and stores of this thread cannot move below (GPU scope).
__device__ __forceinline__ void st_release_gpu(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// ---- thread-block clusters (sm_90+) ----------------------------------------------------------
// Only launches with a cluster dimension (cuda/launch/pdl_launch.h) may call these.

/// cluster_sync in two halves, so that work can run between them: after cluster_arrive
/// (release), cluster_wait (acquire) returns once every thread of the cluster has arrived.
__device__ __forceinline__ void cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

/// Every thread of every CTA of the cluster: arrive (release) and wait (acquire), so shared
/// memory written before it by any CTA of the cluster is visible to all after it.
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}

/// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
#endif
  return rank;
}

/// The address of `local` (a shared-memory address of this CTA) in the shared memory of the
/// cluster's CTA `rank` (distributed shared memory; offsets from it stay in that CTA's window).
__device__ __forceinline__ uint32_t map_shared_cluster(uint32_t local, uint32_t rank) {
  uint32_t remote = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
#else
  (void)local, (void)rank;
#endif
  return remote;
}

/// The 4 bytes at `remote`, an address from map_shared_cluster.
__device__ __forceinline__ uint32_t ld_shared_cluster_u32(uint32_t remote) {
  uint32_t v = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(v) : "r"(remote) : "memory");
#else
  (void)remote;
#endif
  return v;
}

/// The 16 bytes at `remote` (16-byte aligned), an address from map_shared_cluster.
__device__ __forceinline__ uint4 ld_shared_cluster_v4(uint32_t remote) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(remote)
               : "memory");
#else
  (void)remote;
#endif
  return v;
}

/// Stores 4 bytes at `remote`, an address from map_shared_cluster. Visible to that CTA after the
/// next cluster_sync.
__device__ __forceinline__ void st_shared_cluster_u32(uint32_t remote, uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(remote), "r"(v) : "memory");
#else
  (void)remote, (void)v;
#endif
}

/// The 4 bytes at `local` (a shared-memory address of this CTA) in the shared memory of the
/// cluster's CTA `rank`.
__device__ __forceinline__ uint32_t ld_shared_cluster_u32(uint32_t local, uint32_t rank) {
  return ld_shared_cluster_u32(map_shared_cluster(local, rank));
}

}  // namespace nibble::cuda::ptx
