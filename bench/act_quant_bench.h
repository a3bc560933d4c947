// `nibble bench act-quant` options and entry point (bench/act_quant_bench.cu; CUDA builds only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nibble::bench {

/// The variants `nibble bench act-quant` knows: activation scheme and fusion.
inline std::vector<std::string> act_quant_variants() {
  return {"s8",   "s8_rmsnorm", "s8_rmsnorm_smooth", "s8_rmsnorm_smooth_normed",
          "s4",   "e4m3",       "static",            "static_rmsnorm_smooth"};
}

struct ActQuantBenchOptions {
  std::vector<int64_t> ms = {1, 16, 64, 256, 1024, 4096};
  std::vector<int64_t> ks = {4096, 14336};
  std::vector<std::string> variants = {"s8", "s8_rmsnorm", "s8_rmsnorm_smooth",
                                       "s4", "e4m3",       "static"};
  std::string dtype = "bf16";  ///< x's dtype: bf16, f16 or f32
  bool sweep = false;          ///< also time the planner's alternatives (chunks × block size)
  int iters = 20, reps = 7;
  std::string json_path, commit = "unknown";
};

int run_act_quant_bench(const ActQuantBenchOptions& options);

}  // namespace nibble::bench
