// `nibble bench gemm` options and entry point (bench/gemm_bench.cu; CUDA builds only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nibble::bench {

struct Shape {
  std::string name;
  int64_t n, k;
};

/// The Llama layers of the bench grid.
inline std::vector<Shape> llama_shapes() {
  return {{"llama3-8b.qkv", 6144, 4096},    {"llama3-8b.o", 4096, 4096},
          {"llama3-8b.gate_up", 28672, 4096}, {"llama3-8b.down", 4096, 14336},
          {"llama3-70b.qkv", 10240, 8192},  {"llama3-70b.down", 8192, 28672}};
}

struct GemmBenchOptions {
  std::vector<Shape> shapes = llama_shapes();
  std::vector<int64_t> ms = {1, 16, 64, 256, 1024, 4096};
  std::vector<std::string> formats = {"w4a8_pc",   "w4a8_g128",  "w4a8_g128_2level",
                                      "w4afp8_pc", "w4afp8_g128", "w8a8"};
  int iters = 20, reps = 7;
  /// Peers timed beside nibble: "all" (cuBLAS bf16, cuBLASLt int8 with and without the rescale,
  /// cuBLASLt FP8), "bf16" (cuBLAS bf16 only) or "none" (for sweeps of nibble's own knobs).
  std::string peers = "all";
  /// Whether the int8-activation formats are also timed from bf16 activations (the ".bf16_in"
  /// rows: the per-token quantization included). Sweeps of the GEMM's own knobs turn it off.
  bool bf16_in = true;
  std::string json_path, commit = "unknown";
};

int run_gemm_bench(const GemmBenchOptions& options);

}  // namespace nibble::bench
