// The LLM runner's decode-step kernels that are not linear layers (add_rmsnorm, swiglu, the
// decode attention: split-KV and cluster kernels), timed alone at Llama-3-8B sizes, batch 1, against an empty
// kernel: how much of each op's time in a decode step (bench-model --profile-decode) is the
// kernel itself and how much is the launch floor, with warm and with cold caches.
//
// Method: bench::time_graph (bench/bench_util.h) — a CUDA graph of R back-to-back launches
// (R = 100), replayed 5 times after a warm-up; the median replay / R is one launch. "cold" puts an L2-evicting kernel
// (writes 2× the L2 size) before every launch and subtracts that kernel's own time, measured
// the same way: what a launch costs right after a linear layer has streamed its weights.
//
// Built with the CUDA backend (CMake target runner_ops_bench); on a GPU machine:
//   build/cuda/bench/runner_ops_bench [FILE]
// FILE, when given, receives every case's outputs after one launch from fresh inputs, so that
// two builds of the kernels can be compared byte for byte (cmp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "bench/bench_util.h"
#include "llm/cuda/kernels.h"

namespace {

using namespace nibble::llm::cuda;
using nibble::Error;  // BENCH_CUDA throws nibble::Error
using nibble::ErrorCode;

#define CHECK(x) BENCH_CUDA(x)

__global__ void empty_kernel() {}

// Writes `words` 16-byte words: pushes everything else out of L2.
__global__ void evict_l2(uint4* p, size_t words) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < words;
       i += size_t{gridDim.x} * blockDim.x)
    p[i] = make_uint4(static_cast<unsigned>(i), 1, 2, 3);
}

__global__ void fill(float* p, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x)
    p[i] = scale * (static_cast<float>((i * 2654435761u) % 2001) / 1000.0f - 1.0f);
}

template <class T>
T* dev(size_t n) {
  T* p = nullptr;
  CHECK(cudaMalloc(&p, n * sizeof(T)));
  CHECK(cudaMemset(p, 0, n * sizeof(T)));
  return p;
}

float* dev_random(size_t n, float scale) {
  float* p = dev<float>(n);
  fill<<<256, 256>>>(p, n, scale);
  CHECK(cudaGetLastError());
  return p;
}

// Median µs of one launch of `body` (a stream-ordered enqueue), in a graph of `reps` launches.
double time_launch(cudaStream_t s, const std::function<void(cudaStream_t)>& body, int reps = 100) {
  return nibble::bench::time_graph(s, reps, 5, [&](int) { body(s); });
}

}  // namespace

int run(int argc, char** argv) {  // main's body
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int64_t d = 4096, f = 14336, max_ctx = 2112;
  const AttentionShape shape{32, 8, 128, max_ctx};

  float* x = dev_random(d, 1.0f);
  float* delta = dev_random(d, 0.1f);
  float* g = dev_random(d, 1.0f);
  float* gu = dev_random(2 * f, 2.0f);
  float* qkv = dev_random(shape.qkv_ld(), 1.0f);
  float* cosv = dev_random(max_ctx * 64, 1.0f);
  float* sinv = dev_random(max_ctx * 64, 1.0f);
  auto* kc = dev<uint16_t>(size_t{8} * max_ctx * 128);
  auto* vc = dev<uint16_t>(size_t{8} * max_ctx * 128);
  DecodeAttentionWorkspace ws;
  ws.partials = dev<float>(static_cast<size_t>(decode_attention_partial_floats(shape)));
  ws.row_f32 = dev<float>(32 * 128);
  ws.counters = dev<int>(static_cast<size_t>(decode_attention_counter_ints(shape)));
  int* pos = dev<int>(1);
  float* out_f32 = dev<float>(f);
  auto* out_bf16 = dev<uint16_t>(f);
  auto* out_s8 = dev<int8_t>(f);
  float* out_scale = dev<float>(1);
  const size_t evict_words = 2 * static_cast<size_t>(prop.l2CacheSize) / 16;
  auto* evict_buf = dev<uint4>(evict_words);
  CHECK(cudaDeviceSynchronize());

  auto out_of = [&](ActKind k, int64_t ld) {
    ActOutput o;
    o.kind = k;
    o.ld = ld;
    o.data = k == ActKind::f32 ? static_cast<void*>(out_f32)
             : k == ActKind::bf16 ? static_cast<void*>(out_bf16)
                                  : static_cast<void*>(out_s8);
    o.scales = out_scale;
    return o;
  };
  auto evict = [&](cudaStream_t st) {
    evict_l2<<<prop.multiProcessorCount * 4, 512, 0, st>>>(evict_buf, evict_words);
  };
  const double evict_us = time_launch(s, evict, 20);
  const double empty_us = time_launch(s, [](cudaStream_t st) { empty_kernel<<<1, 32, 0, st>>>(); });
  // The same with programmatic dependent launch: each kernel may start before the previous
  // one has finished (what a decode step's chain of small kernels could save per boundary).
  const double pdl_us = time_launch(s, [](cudaStream_t st) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(1);
    cfg.blockDim = dim3(32);
    cfg.stream = st;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CHECK(cudaLaunchKernelEx(&cfg, empty_kernel));
  });
  std::printf("%s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  std::printf("empty kernel: %.2f us per launch in a graph (%.2f us with programmatic dependent "
              "launch); L2 eviction kernel %.1f us\n", empty_us, pdl_us, evict_us);
  std::printf("%-40s %10s %10s\n", "op (Llama-3-8B sizes, batch 1)", "warm us", "cold us");

  // Outputs of one launch of every case from freshly filled inputs, to a file (argv[1]) that two
  // builds of the kernels can be compared on byte for byte.
  FILE* dump = argc > 1 ? std::fopen(argv[1], "wb") : nullptr;
  auto dump_case = [&](const std::function<void(cudaStream_t)>& op) {
    if (dump == nullptr) return;
    fill<<<256, 256, 0, s>>>(x, d, 1.0f);
    CHECK(cudaMemsetAsync(out_f32, 0, f * 4, s));
    CHECK(cudaMemsetAsync(out_bf16, 0, f * 2, s));
    CHECK(cudaMemsetAsync(out_s8, 0, f, s));
    op(s);
    CHECK(cudaStreamSynchronize(s));
    std::vector<char> h(static_cast<size_t>(d * 4 + f * 7 + 4));
    char* w = h.data();
    CHECK(cudaMemcpy(w, x, d * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(w + d * 4, out_f32, f * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(w + d * 4 + f * 4, out_bf16, f * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(w + d * 4 + f * 6, out_s8, f, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(w + d * 4 + f * 7, out_scale, 4, cudaMemcpyDeviceToHost));
    std::fwrite(h.data(), 1, h.size(), dump);
  };
  auto report = [&](const char* name, const std::function<void(cudaStream_t)>& op) {
    dump_case(op);
    const double warm = time_launch(s, op);
    const double cold = time_launch(s, [&](cudaStream_t st) {
      evict(st);
      op(st);
    }, 20) - evict_us;
    std::printf("%-40s %10.2f %10.2f\n", name, warm, cold);
  };
  for (ActKind k : {ActKind::f32, ActKind::bf16, ActKind::s8_per_token}) {
    char name[80];
    std::snprintf(name, sizeof name, "add_rmsnorm d=4096 -> %s", to_string(k));
    // x += delta every launch: the values drift but stay finite over a few hundred launches.
    report(name, [&, k](cudaStream_t st) {
      launch_add_rmsnorm(x, delta, 1, d, g, 1e-5, out_of(k, d), st);
    });
  }
  for (ActKind k : {ActKind::f32, ActKind::bf16, ActKind::s8_per_token}) {
    char name[80];
    std::snprintf(name, sizeof name, "swiglu f=14336 -> %s", to_string(k));
    report(name, [&, k](cudaStream_t st) { launch_swiglu(gu, 1, f, out_of(k, f), st); });
  }
  // Both decode-attention kernels (NIBBLE_DECODE_ATTENTION_KERNEL; the cluster one needs sm_90).
  for (const char* kernel : {"splitkv", "cluster"}) {
    if (std::strcmp(kernel, "cluster") == 0 && prop.major < 9) continue;
    setenv("NIBBLE_DECODE_ATTENTION_KERNEL", kernel, 1);
    for (int p : {16, 80, 1024, 2047}) {
      CHECK(cudaMemcpy(pos, &p, 4, cudaMemcpyHostToDevice));
      for (ActKind k : {ActKind::bf16, ActKind::s8_per_token}) {
        char name[80];
        std::snprintf(name, sizeof name, "attention %s pos=%d -> %s", kernel, p, to_string(k));
        report(name, [&, k](cudaStream_t st) {
          launch_attention_decode(qkv, pos, shape, cosv, sinv, kc, vc, ws, out_of(k, 32 * 128), st);
        });
      }
    }
  }
  unsetenv("NIBBLE_DECODE_ATTENTION_KERNEL");
  CHECK(cudaDeviceSynchronize());
  if (dump != nullptr) std::fclose(dump);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "runner_ops: %s\n", e.what());
    return 1;
  }
}
