// Helpers for the GPU tests: skip without a GPU, and compare device results with CPU reference
// results computed from the same quantized operands. Random data comes from test_util.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "nibble/nibble.h"
#include "test_util.h"

#if NIBBLE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace nibble {

#define NIBBLE_REQUIRE_GPU()                                                          \
  do {                                                                                \
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason(); \
  } while (0)

/// One case of a parameterized linear-layer test: a linear format and the output dtype. Test
/// names and ctest listings show the case ("w4a8_pc_bf16"), not its bytes.
struct LinearCase {
  const char* format;
  DType out;
};
inline void PrintTo(const LinearCase& c, std::ostream* os) {
  *os << c.format << "_" << to_string(c.out);
}

/// Sets an environment variable for the scope and restores its previous value (or absence)
/// afterwards. The dispatch points read their overrides per call (NIBBLE_W4A8_KERNEL,
/// NIBBLE_W8A8_KERNEL, NIBBLE_WEIGHT_ONLY_KERNEL, NIBBLE_FUSED_ACT_QUANT), so tests force a
/// kernel family or path with one of these.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old, had_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_, previous_.c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string previous_;
  bool had_ = false;
};

// Relative Frobenius error bound for float outputs computed from the same quantized operands:
// differences come only from f32 summation order and the final rounding to the output dtype.
constexpr double kRelTolF32Out = 1e-5;
constexpr double kRelTolHalfOut = 8e-3;  // bf16 rounding of each output element dominates

/// Bit-identical contents, wherever each tensor lives.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return test::bytes_of(a) == test::bytes_of(b);
}

/// Whether the sm_90a kernels (the wgmma families) run here: an sm_90 GPU and a build with 90a
/// code. Tests force them in turn beside the sm80 families where they do.
inline bool sm90a_kernels_here() {
  const DeviceInfo info = cuda_device_info(0);
  return info.cc_major == 9 && info.cc_minor == 0 &&
         build_info().cuda_archs.find("90a") != std::string::npos;
}

/// gemm_s32 on the GPU: `a` (host) copied there, the (M, N) s32 result poisoned first so that
/// every element must be written. `wd`: a PackedWeight or a Tensor already on the GPU.
template <class Weight>
Tensor gpu_s32(const Tensor& a, const Weight& wd, int64_t m, int64_t n) {
  Tensor got = Tensor::empty(DType::s32, {m, n}, Device::cuda());
  got.fill_bytes(0xCD);
  const Tensor ad = a.to(Device::cuda());
  gemm_s32(ad.view(), wd.view(), got.view());
  synchronize(Device::cuda());
  return got;
}

inline double rel_error(const Tensor& got, const Tensor& ref) {
  const Tensor g = got.to(Device::cpu());
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.view().numel(); ++i) {
    const double x = load_float(g.data(), g.view().dtype, i);
    const double y = load_float(ref.data(), ref.view().dtype, i);
    if (!std::isfinite(x)) return INFINITY;  // also catches unwritten (poisoned) elements
    num += (x - y) * (x - y);
    den += y * y;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

/// The int8-activation linears (W4A8 on packed weights, W8A8 on logical ones) against the CPU
/// reference on odd shapes: K = 352 ends inside a K block (the zero-filled tail), N = 20 (bf16
/// rows of 40 bytes) takes the unaligned stores, 1000 × 1536 spans several channel tiles; every
/// M of `ms`, through each of `kernels` forced with the environment variable `kernel_env`, into
/// poisoned outputs. `to_device(qw)` gives the weight operand the GPU linear takes.
template <class ToDevice>
void expect_int8_linear_matches_reference(const LinearFormat& f, DType out,
                                          const std::vector<int64_t>& ms,
                                          const std::vector<std::string>& kernels,
                                          const char* kernel_env, ToDevice&& to_device) {
  test::Rng rng;  // fresh seed, printed on failure
  const std::pair<int64_t, int64_t> nk[] = {{136, 512}, {1000, 1536}, {72, 352}, {20, 256}};
  for (auto [n, k] : nk) {
    if (!f.weight.per_channel() && k % f.weight.group_size != 0) continue;
    QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
    const auto wd = to_device(qw);
    const Tensor bias = test::random_normal(DType::bf16, 1, n, rng);
    const Tensor bias_d = bias.to(Device::cuda());
    const TensorView bias_v = test::as_vector(bias), bias_dv = test::as_vector(bias_d);
    for (int64_t m : ms) {
      QuantizedActivation qa(f.act, m, k);
      const Tensor x = test::random_activations(DType::bf16, m, k, rng);
      if (f.act == ActScheme::s8_per_tensor) quantize_activation_static(x.view(), 0.6f, qa.view());
      else quantize_activation(x.view(), qa.view());
      Tensor ref = Tensor::empty(out, {m, n});
      linear(qa.view(), qw.view(), &bias_v, ref.view());
      const QuantizedActivation qad = qa.to(Device::cuda());
      for (const std::string& kernel : kernels) {
        SCOPED_TRACE(kernel + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                     " K=" + std::to_string(k));
        const ScopedEnv force(kernel_env, kernel);
        Tensor got = Tensor::empty(out, {m, n}, Device::cuda());
        got.fill_bytes(0xFF);  // NaN in every float dtype: every element must be written
        linear(qad.view(), wd.view(), &bias_dv, got.view());
        synchronize(Device::cuda());
        ASSERT_LE(rel_error(got, ref), out == DType::f32 ? kRelTolF32Out : kRelTolHalfOut);
      }
    }
  }
}

#if NIBBLE_WITH_CUDA
/// Runs `call(eager_stream, out)` eagerly into `eager`, captures `call(capture_stream, out)`
/// writing `replay` (poisoned first), replays the graph three times on `capture_stream` and
/// checks the bytes equal the eager result. `kernels` receives the captured graph's node count.
template <class Call>
void expect_captured_replay_matches(Call&& call, Tensor& eager, Tensor& replay,
                                    cudaStream_t eager_stream, cudaStream_t capture_stream,
                                    size_t* kernels = nullptr) {
  call(eager_stream, eager);
  ASSERT_EQ(cudaStreamSynchronize(eager_stream), cudaSuccess);
  replay.fill_bytes(0xFF);
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  call(capture_stream, replay);
  ASSERT_EQ(cudaStreamEndCapture(capture_stream, &graph), cudaSuccess);
  if (kernels != nullptr) {
    ASSERT_EQ(cudaGraphGetNodes(graph, nullptr, kernels), cudaSuccess);
  }
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, capture_stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(capture_stream), cudaSuccess);
  EXPECT_TRUE(same_bytes(replay, eager));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

/// Decode runs linears inside CUDA graphs: nothing in a call may allocate or synchronize once
/// warmed up. Warms `call(stream, out)` up on a new stream (the eager result) and captures it on
/// the same stream (expect_captured_replay_matches).
template <class Call>
void expect_graph_replay_matches(Call&& call, Tensor& eager, Tensor& replay,
                                 size_t* kernels = nullptr) {
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  expect_captured_replay_matches(call, eager, replay, stream, stream, kernels);
  cudaStreamDestroy(stream);
}
#endif

}  // namespace nibble
