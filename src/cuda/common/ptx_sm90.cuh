// Thin wrappers over the Hopper (sm_90 / sm_90a) PTX the warp-specialised kernels use: mbarriers,
// the bulk tensor copy engine (TMA), warpgroup MMA (wgmma) and register reallocation. Each
// wrapper is one instruction (or a short fixed sequence); comments state operand layouts.
// mbarrier and TMA need sm_90; wgmma and setmaxnreg need the arch-specific sm_90a target, so
// callers compile those paths only under __CUDA_ARCH_FEAT_SM90_ALL.
#pragma once

#include <cstdint>

#include "cuda/common/ptx.cuh"

namespace nibble::cuda::ptx {

// ---- mbarrier (shared-memory transaction barriers) -------------------------------------------

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}

/// Makes initialised barriers visible to the async proxy (TMA) before any copy uses them.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/// Orders this thread's earlier generic-proxy accesses to shared memory before later async-proxy
/// ones (TMA): needed before a stage written with st.shared is handed back to TMA loads.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/// Arrives once and announces `bytes` of transactions (TMA copies) the phase must also wait for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

/// Arrives once on the barrier at `bar`'s offset in the shared memory of the cluster's CTA
/// `rank` (this CTA's own included). Only launches with a cluster dimension may call it. The
/// default semantics (release at CTA scope), as CUTLASS's ClusterBarrier uses them to hand a
/// consumed stage back to another CTA's TMA producer: with `.release.cluster` the W4A8 GEMM's
/// CTA pairs ran 1.3–2.9× slower than unpaired CTAs (H100, 2026-11-24), a fence on every
/// stage's release.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(
                   map_shared_cluster(smem_addr(bar), rank))
               : "memory");
}

/// Spins until the phase with parity `phase` has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}

// ---- TMA: bulk tensor copies global → shared, completing on an mbarrier ----------------------

/// Copies the box at coordinates (c0, c1) of the tensor map into `dst`; elements outside the
/// tensor are zero-filled, and the barrier is credited with the full box's bytes either way.
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tensor_map, uint64_t* bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%3, %4}], [%2];\n" ::"r"(smem_addr(dst)),
      "l"(tensor_map), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}

/// tma_load_2d into the shared memory of every CTA of the cluster whose bit is set in
/// `cta_mask`: the box lands at `dst`'s offset in each, and each CTA's barrier at `bar`'s offset
/// is credited with the box's bytes.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const void* tensor_map,
                                                      uint64_t* bar, int c0, int c1,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(smem_addr(dst)),
      "l"(tensor_map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

__device__ __forceinline__ void tma_load_3d(void* dst, const void* tensor_map, uint64_t* bar,
                                            int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
      "{%3, %4, %5}], [%2];\n" ::"r"(smem_addr(dst)),
      "l"(tensor_map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map) : "memory");
}

// ---- TMA: bulk tensor copies shared → global (stores), tracked by bulk groups ----------------

/// Copies the box at `src` (laid out as the tensor map's box, with its swizzle) to coordinates
/// (c0, c1) of the tensor; elements outside the tensor are not written. The writer threads must
/// have run fence_proxy_async_shared() after their st.shared / stmatrix, then synchronised.
__device__ __forceinline__ void tma_store_2d(const void* tensor_map, const void* src, int c0,
                                             int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
          tensor_map),
      "r"(smem_addr(src)), "r"(c0), "r"(c1)
      : "memory");
}
/// Closes this thread's bulk group: the stores issued since the last commit.
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
/// Waits until at most `kPending` of this thread's committed bulk groups have yet to finish
/// reading their shared-memory source (the buffer may then be written again).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
/// Waits until at most `kPending` of this thread's committed bulk groups are incomplete (their
/// writes to global memory done).
template <int kPending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

/// stmatrix .x4 .trans: four 8×8 matrices of 16-bit values, each held as mma fragments (lane
/// g·4 + c holds row g, columns 2c and 2c+1 of matrix k in r[k], the first in the low half), are
/// stored transposed: row j of the stored matrix k (16 bytes) is column j of the fragment
/// matrix, at the address lane 8k + j gives.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1,
                                                  uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---- warpgroup MMA (sm_90a) ---------------------------------------------------------------------

/// Shared-memory matrix descriptor for a K-major operand stored with the 128-byte swizzle, as
/// TMA writes it with CU_TENSOR_MAP_SWIZZLE_128B: rows of 128 bytes, 8-row groups 1024 bytes
/// apart (stride byte offset), the tile 1024-byte aligned (base offset 0). The leading byte
/// offset is unused for swizzled K-major layouts. To address the k32 step j of a 128-byte row,
/// add 32·j bytes to the start address (the swizzle is applied to the final address bits).
__device__ __forceinline__ uint64_t smem_desc_k128_sw128(const void* tile) {
  const uint64_t addr = smem_addr(tile);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) |
         (uint64_t(1) << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
/// Waits until at most `kPending` committed wgmma groups of this warpgroup are in flight.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

/// Ties a register to the surrounding asm ordering: wgmma reads its register operands and
/// writes its accumulators asynchronously, so the compiler must neither move nor reuse them
/// across the fence/commit/wait sequence.
__device__ __forceinline__ void fence_operand(int32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

/// Register reallocation between warpgroups (sm_90a): producers give registers up, consumers
/// take them, so the accumulator-heavy warpgroups fit without spilling.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// The accumulator operand lists of m64nNk32 (N/2 registers per thread), written out once
// because inline asm has no repetition construct: NIBBLE_WGMMA_ACC_REGS_<n> is the "%0, …"
// text (without braces), NIBBLE_WGMMA_ACC_OUT_<n>(d) the matching "+r" outputs (int32) and
// NIBBLE_WGMMA_FACC_OUT_<n>(d) the "+f" ones (f32). Inputs follow at %<n>.
// clang-format off
#define NIBBLE_WGMMA_ACC_REGS_32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define NIBBLE_WGMMA_ACC_REGS_64 NIBBLE_WGMMA_ACC_REGS_32 \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define NIBBLE_WGMMA_ACC_REGS_128 NIBBLE_WGMMA_ACC_REGS_64 \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define NIBBLE_WGMMA_ACC_OUT_32(d) \
  "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), \
  "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), \
  "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), \
  "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
#define NIBBLE_WGMMA_ACC_OUT_64(d) NIBBLE_WGMMA_ACC_OUT_32(d), \
  "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), \
  "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), \
  "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), \
  "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
#define NIBBLE_WGMMA_ACC_OUT_128(d) NIBBLE_WGMMA_ACC_OUT_64(d), \
  "+r"(d[64]), "+r"(d[65]), "+r"(d[66]), "+r"(d[67]), "+r"(d[68]), "+r"(d[69]), "+r"(d[70]), "+r"(d[71]), \
  "+r"(d[72]), "+r"(d[73]), "+r"(d[74]), "+r"(d[75]), "+r"(d[76]), "+r"(d[77]), "+r"(d[78]), "+r"(d[79]), \
  "+r"(d[80]), "+r"(d[81]), "+r"(d[82]), "+r"(d[83]), "+r"(d[84]), "+r"(d[85]), "+r"(d[86]), "+r"(d[87]), \
  "+r"(d[88]), "+r"(d[89]), "+r"(d[90]), "+r"(d[91]), "+r"(d[92]), "+r"(d[93]), "+r"(d[94]), "+r"(d[95]), \
  "+r"(d[96]), "+r"(d[97]), "+r"(d[98]), "+r"(d[99]), "+r"(d[100]), "+r"(d[101]), "+r"(d[102]), "+r"(d[103]), \
  "+r"(d[104]), "+r"(d[105]), "+r"(d[106]), "+r"(d[107]), "+r"(d[108]), "+r"(d[109]), "+r"(d[110]), "+r"(d[111]), \
  "+r"(d[112]), "+r"(d[113]), "+r"(d[114]), "+r"(d[115]), "+r"(d[116]), "+r"(d[117]), "+r"(d[118]), "+r"(d[119]), \
  "+r"(d[120]), "+r"(d[121]), "+r"(d[122]), "+r"(d[123]), "+r"(d[124]), "+r"(d[125]), "+r"(d[126]), "+r"(d[127])
#define NIBBLE_WGMMA_FACC_OUT_32(d) \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define NIBBLE_WGMMA_FACC_OUT_64(d) NIBBLE_WGMMA_FACC_OUT_32(d), \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define NIBBLE_WGMMA_FACC_OUT_128(d) NIBBLE_WGMMA_FACC_OUT_64(d), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
// clang-format on

// wgmma with A from registers. The A fragment of each warp w (rows 16w..16w+15 of the m64 tile)
// is laid out as mma.m16n8k32's A (g = lane/4, c = lane%4):
//   a[0]: row g,   k 4c..4c+3      a[1]: row g+8, k 4c..4c+3
//   a[2]: row g,   k 16+4c..       a[3]: row g+8, k 16+4c..
// Accumulators: d[4i+0..1] row g, cols 8i+2c, 8i+2c+1; d[4i+2..3] row g+8, the same cols.
// `accumulate` = 0 overwrites D (scale-d false), 1 adds to it.

/// wgmma m64n64k32 s8·s8 → s32, A from registers, B from shared memory through `desc_b`.
__device__ __forceinline__ void wgmma_m64n64k32_s8_rs(int32_t (&d)[32], const uint32_t (&a)[4],
                                                     uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {" NIBBLE_WGMMA_ACC_REGS_32 "}"
      ", {%32, %33, %34, %35}, %36, p;\n}\n"
      : NIBBLE_WGMMA_ACC_OUT_32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

/// wgmma m64n128k32 s8·s8 → s32, A from registers, B from shared memory through `desc_b`.
__device__ __forceinline__ void wgmma_m64n128k32_s8_rs(int32_t (&d)[64], const uint32_t (&a)[4],
                                                     uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {" NIBBLE_WGMMA_ACC_REGS_64 "}"
      ", {%64, %65, %66, %67}, %68, p;\n}\n"
      : NIBBLE_WGMMA_ACC_OUT_64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

/// wgmma m64n256k32 s8·s8 → s32, A from registers, B from shared memory through `desc_b`.
__device__ __forceinline__ void wgmma_m64n256k32_s8_rs(int32_t (&d)[128], const uint32_t (&a)[4],
                                                     uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {" NIBBLE_WGMMA_ACC_REGS_128 "}"
      ", {%128, %129, %130, %131}, %132, p;\n}\n"
      : NIBBLE_WGMMA_ACC_OUT_128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// wgmma m64nNk32 with fp8 e4m3 inputs and f32 accumulators, A from registers (the fragment
// layout of the s8 form: four 8-bit values per register), B from shared memory. The immediates
// after the predicate: scale-a 1, scale-b 1 (fp8 operands are K-major only: no transpose).

/// wgmma m64n64k32 e4m3·e4m3 → f32, A from registers.
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_rs(float (&d)[32], const uint32_t (&a)[4],
                                                       uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {" NIBBLE_WGMMA_ACC_REGS_32 "}"
      ", {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : NIBBLE_WGMMA_FACC_OUT_32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

/// wgmma m64n128k32 e4m3·e4m3 → f32, A from registers.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_rs(float (&d)[64], const uint32_t (&a)[4],
                                                        uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" NIBBLE_WGMMA_ACC_REGS_64 "}"
      ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : NIBBLE_WGMMA_FACC_OUT_64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

/// wgmma m64n256k32 e4m3·e4m3 → f32, A from registers.
__device__ __forceinline__ void wgmma_m64n256k32_e4m3_rs(float (&d)[128], const uint32_t (&a)[4],
                                                        uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {" NIBBLE_WGMMA_ACC_REGS_128 "}"
      ", {%128, %129, %130, %131}, %132, p, 1, 1;\n}\n"
      : NIBBLE_WGMMA_FACC_OUT_128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// wgmma with both operands in shared memory (K-major, 128-byte swizzle: smem_desc_k128_sw128):
// A through `desc_a` (64 rows), B through `desc_b` (N rows). Accumulators as above.

/// wgmma m64n64k32 s8·s8 → s32, A and B from shared memory.
__device__ __forceinline__ void wgmma_m64n64k32_s8_ss(int32_t (&d)[32], uint64_t desc_a,
                                                     uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {" NIBBLE_WGMMA_ACC_REGS_32 "}"
      ", %32, %33, p;\n}\n"
      : NIBBLE_WGMMA_ACC_OUT_32(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/// wgmma m64n128k32 s8·s8 → s32, A and B from shared memory.
__device__ __forceinline__ void wgmma_m64n128k32_s8_ss(int32_t (&d)[64], uint64_t desc_a,
                                                     uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {" NIBBLE_WGMMA_ACC_REGS_64 "}"
      ", %64, %65, p;\n}\n"
      : NIBBLE_WGMMA_ACC_OUT_64(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/// wgmma m64n256k32 s8·s8 → s32, A and B from shared memory.
__device__ __forceinline__ void wgmma_m64n256k32_s8_ss(int32_t (&d)[128], uint64_t desc_a,
                                                     uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8 {" NIBBLE_WGMMA_ACC_REGS_128 "}"
      ", %128, %129, p;\n}\n"
      : NIBBLE_WGMMA_ACC_OUT_128(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/// wgmma_s8_rs<N>: the m64nNk32 instruction for the accumulator count N/2.
template <int N>
__device__ __forceinline__ void wgmma_s8_rs(int32_t (&d)[N / 2], const uint32_t (&a)[4],
                                            uint64_t desc_b, int accumulate) {
  static_assert(N == 64 || N == 128 || N == 256, "instantiated for N = 64, 128, 256");
  if constexpr (N == 64) wgmma_m64n64k32_s8_rs(d, a, desc_b, accumulate);
  if constexpr (N == 128) wgmma_m64n128k32_s8_rs(d, a, desc_b, accumulate);
  if constexpr (N == 256) wgmma_m64n256k32_s8_rs(d, a, desc_b, accumulate);
}

/// wgmma_e4m3_rs<N>: the fp8 m64nNk32 instruction for N/2 f32 accumulators.
template <int N>
__device__ __forceinline__ void wgmma_e4m3_rs(float (&d)[N / 2], const uint32_t (&a)[4],
                                              uint64_t desc_b, int accumulate) {
  static_assert(N == 64 || N == 128 || N == 256, "instantiated for N = 64, 128, 256");
  if constexpr (N == 64) wgmma_m64n64k32_e4m3_rs(d, a, desc_b, accumulate);
  if constexpr (N == 128) wgmma_m64n128k32_e4m3_rs(d, a, desc_b, accumulate);
  if constexpr (N == 256) wgmma_m64n256k32_e4m3_rs(d, a, desc_b, accumulate);
}

/// wgmma_s8_ss<N>: the shared-memory-only m64nNk32 instruction for the accumulator count N/2.
template <int N>
__device__ __forceinline__ void wgmma_s8_ss(int32_t (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                            int accumulate) {
  static_assert(N == 64 || N == 128 || N == 256, "instantiated for N = 64, 128, 256");
  if constexpr (N == 64) wgmma_m64n64k32_s8_ss(d, desc_a, desc_b, accumulate);
  if constexpr (N == 128) wgmma_m64n128k32_s8_ss(d, desc_a, desc_b, accumulate);
  if constexpr (N == 256) wgmma_m64n256k32_s8_ss(d, desc_a, desc_b, accumulate);
}


// wgmma m64nNk16 with 16-bit inputs (bf16, or f16 when kF16) and f32 accumulators, A from
// registers, B (N rows, K-major, 128-byte swizzle) from shared memory. The A fragment of warp w
// (rows 16w..16w+15) is mma.m16n8k16's A (g = lane/4, c = lane%4): a[0] row g, k 2c..2c+1;
// a[1] row g+8, same k; a[2] row g, k 8+2c..; a[3] row g+8, k 8+2c... Accumulators as the s8
// form's. The immediates after the predicate: scale-a 1, scale-b 1, B not transposed.
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n64k16_f32_rs(float (&d)[32], const uint32_t (&a)[4],
                                                      uint64_t desc_b, int accumulate) {
  if constexpr (kF16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {" NIBBLE_WGMMA_ACC_REGS_32 "}"
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : NIBBLE_WGMMA_FACC_OUT_32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" NIBBLE_WGMMA_ACC_REGS_32 "}"
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : NIBBLE_WGMMA_FACC_OUT_32(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  }
}

template <bool kF16>
__device__ __forceinline__ void wgmma_m64n128k16_f32_rs(float (&d)[64], const uint32_t (&a)[4],
                                                      uint64_t desc_b, int accumulate) {
  if constexpr (kF16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" NIBBLE_WGMMA_ACC_REGS_64 "}"
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : NIBBLE_WGMMA_FACC_OUT_64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" NIBBLE_WGMMA_ACC_REGS_64 "}"
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : NIBBLE_WGMMA_FACC_OUT_64(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  }
}

template <bool kF16>
__device__ __forceinline__ void wgmma_m64n256k16_f32_rs(float (&d)[128], const uint32_t (&a)[4],
                                                      uint64_t desc_b, int accumulate) {
  if constexpr (kF16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" NIBBLE_WGMMA_ACC_REGS_128 "}"
        ", {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : NIBBLE_WGMMA_FACC_OUT_128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" NIBBLE_WGMMA_ACC_REGS_128 "}"
        ", {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : NIBBLE_WGMMA_FACC_OUT_128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  }
}

/// wgmma_f32_rs<N, kF16>: the 16-bit-input m64nNk16 instruction for N/2 f32 accumulators.
template <int N, bool kF16>
__device__ __forceinline__ void wgmma_f32_rs(float (&d)[N / 2], const uint32_t (&a)[4],
                                             uint64_t desc_b, int accumulate) {
  static_assert(N == 64 || N == 128 || N == 256, "instantiated for N = 64, 128, 256");
  if constexpr (N == 64) wgmma_m64n64k16_f32_rs<kF16>(d, a, desc_b, accumulate);
  if constexpr (N == 128) wgmma_m64n128k16_f32_rs<kF16>(d, a, desc_b, accumulate);
  if constexpr (N == 256) wgmma_m64n256k16_f32_rs<kF16>(d, a, desc_b, accumulate);
}

__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

}  // namespace nibble::cuda::ptx
