// How many warps per scheduler does mma.sync.m16n8k32.s8 need on this GPU to reach its peak?
// Register-only loop, NACC independent accumulators per warp, 256-thread blocks, 1..8 blocks
// per SM. Build and run: nvcc -O3 -gencode arch=compute_90a,code=sm_90a mma_occupancy.cu && ./a.out
#include <cuda_runtime.h>

#include <cstdio>

template <int NACC>
__global__ void __launch_bounds__(256) mma_loop(int iters, int* out) {
  unsigned a0 = threadIdx.x * 0x01010101u, a1 = a0 ^ 0x5a5a5a5au, a2 = a0 + 7, a3 = a0 * 3;
  unsigned b0 = a0 ^ 0x33333333u, b1 = a1 + 11;
  int acc[NACC][4] = {};
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < NACC; ++i)
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
          "{%8,%9}, {%0,%1,%2,%3};\n"
          : "+r"(acc[i][0]), "+r"(acc[i][1]), "+r"(acc[i][2]), "+r"(acc[i][3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  int s = 0;
  for (int i = 0; i < NACC; ++i) s += acc[i][0] + acc[i][1] + acc[i][2] + acc[i][3];
  if (s == 0x7fffffff) out[0] = s;
}

template <int NACC>
void run(int sms, int per_sm) {
  int* out;
  cudaMalloc(&out, 4);
  const int blocks = sms * per_sm, iters = 2048;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float ms = 0;
  for (int rep = 0; rep < 2; ++rep) {
    cudaEventRecord(e0);
    mma_loop<NACC><<<blocks, 256>>>(iters, out);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
  }
  const double ops = double(blocks) * 8 * iters * NACC * 2.0 * 16 * 8 * 32;
  std::printf("acc=%2d blocks/SM=%d warps/scheduler=%2d: %7.1f TOPS\n", NACC, per_sm,
              per_sm * 2, ops / (ms * 1e-3) / 1e12);
  cudaFree(out);
}

int main() {
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, 0);
  for (int per_sm : {1, 2, 4, 8}) {
    run<8>(p.multiProcessorCount, per_sm);
    run<32>(p.multiProcessorCount, per_sm);
  }
  return 0;
}
