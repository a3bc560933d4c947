// The linear layers of the CPU runner: y (M, N) = x (M, K) · W (N, K)ᵀ, f32 in and out.
//
// A layer is made once from its f32 weights in a *weight mode*:
//
//   f32    the weights as the file holds them (dequantized), f32 products and sums;
//   bf16   weights rounded to bf16 and the input rounded to bf16, f32 sums (what a bf16
//          tensor-core GEMM computes, short of its summation order);
//   any nibble linear format (w4a8_pc, w4a8_g128, w8a8, w4a16_g128, ...): the weights are
//          quantized by nibble::quantize_weight (round to nearest), and forward() goes through
//          the public API: quantize_activation + linear for A8/A4/FP8 formats, linear on bf16
//          activations for the weight-only A16 formats. When K is not a multiple of the group
//          size (SmolLM2's 576 with g128), W and x are padded with zero columns to the next
//          multiple: the products are unchanged, the last group just holds fewer real weights.
//
//   sim:<format>  (study only, docs/accuracy.md) the same quantized weights dequantized to f32,
//          the activations quantized and dequantized per token as the format does (A16: rounded
//          to bf16), then the runner's f32 product: the reference linear's numbers up to f32
//          rounding, an order of magnitude faster on the CPU.
//
// `LinearStrategy` pairs a prefill mode (M > 1) with a decode mode (M = 1), e.g. W4A8 for
// prompts and W4A16 for generation; the two are kept as separate weights.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nibble/tensor.h"

namespace nibble::llm {

class ThreadPool;

class Linear {
 public:
  virtual ~Linear() = default;
  /// y (m, n()) = x (m, k()) · Wᵀ; both f32 row-major, caller-owned.
  virtual void forward(const float* x, int64_t m, float* y) const = 0;
  virtual int64_t n() const = 0;
  virtual int64_t k() const = 0;
  /// Bytes of weights (and scales, zeros) the layer reads per forward call.
  virtual int64_t weight_bytes() const = 0;
  virtual std::string mode() const = 0;
  /// The quantized weights of a layer in a nibble format (K padded, see padded_k), else null.
  virtual const QuantizedWeight* quantized() const { return nullptr; }
};

/// The prefix of the simulated modes ("sim:w4a8_g128").
inline constexpr char kSimPrefix[] = "sim:";

/// "f32", "bf16", a linear format string of nibble (parse_linear_format), or "sim:" and one; throws
/// nibble::Error(invalid_argument) listing the choices for anything else.
void check_weight_mode(const std::string& mode);

/// A layer of weights w (n, k) row-major in `mode`. `pool` (may be null) runs the f32/bf16
/// products on several threads; nibble's reference linear runs on the calling thread.
std::unique_ptr<Linear> make_linear(const std::string& mode, std::vector<float> w, int64_t n,
                                    int64_t k, ThreadPool* pool);

/// K as a layer in a nibble format stores it: rounded up to the group size (to an even count
/// for per-channel 4-bit formats). K itself for f32 and bf16.
int64_t padded_k(const std::string& mode, int64_t k);
/// w (n, k) row-major → (n, kp) with kp − k zero columns appended (kp ≥ k).
std::vector<float> pad_columns(const std::vector<float>& w, int64_t n, int64_t k, int64_t kp);

/// A layer from weights already quantized in the nibble format `mode` (a pre-quantized
/// checkpoint): qw is (n, padded_k(mode, k)) in the weight format of `mode`; a "sim:" mode runs
/// them simulated.
std::unique_ptr<Linear> make_quantized_linear(const std::string& mode, QuantizedWeight qw,
                                              int64_t k, ThreadPool* pool);

/// Bytes of a quantized weight's buffers (values, scales, zeros, group scales).
int64_t quantized_weight_bytes(const QuantizedWeight& qw);
/// deq(W) (n, k) f32 of weights stored with K padded (qw.k ≥ k): the padded columns dropped.
std::vector<float> dequantized_weights(const QuantizedWeight& qw, int64_t k);

/// Prefill (M > 1) and decode (M = 1) modes; equal modes share one set of weights.
struct LinearStrategy {
  std::string prefill = "bf16";
  std::string decode = "bf16";
  std::string describe() const {
    return prefill == decode ? prefill : prefill + " prefill / " + decode + " decode";
  }
};

/// A layer under a strategy: one Linear per distinct mode, chosen by M.
class StrategyLinear final : public Linear {
 public:
  StrategyLinear(const LinearStrategy& s, std::vector<float> w, int64_t n, int64_t k,
                 ThreadPool* pool);
  /// One layer for both phases (e.g. pre-quantized weights).
  explicit StrategyLinear(std::unique_ptr<Linear> both) : prefill_(std::move(both)) {}
  void forward(const float* x, int64_t m, float* y) const override;
  int64_t n() const override { return prefill_->n(); }
  int64_t k() const override { return prefill_->k(); }
  /// The decode weights: what a generated token reads.
  int64_t weight_bytes() const override { return (decode_ ? decode_ : prefill_)->weight_bytes(); }
  /// All weights held (both modes).
  int64_t resident_bytes() const;
  std::string mode() const override;
  const QuantizedWeight* quantized() const override { return prefill_->quantized(); }

 private:
  std::unique_ptr<Linear> prefill_, decode_;  // decode_ null when it equals prefill_
};

/// Below this many multiply-adds a linear runs on the calling thread: waking the pool costs tens
/// of microseconds (a condition variable), more than a decode step's 576×1536 product takes on
/// one core (measured 0.1 ms alone, 0.2 ms split over two threads).
inline constexpr int64_t kParallelLinearMacs = int64_t{1} << 22;
/// Below this much attention work (tokens × heads × positions attended × head_dim), as for one
/// decode step over a short cache, attention runs on the calling thread.
inline constexpr int64_t kParallelAttentionWork = int64_t{1} << 20;

/// A fixed set of worker threads for parallel loops (the calling thread works too).
class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  int size() const { return threads_; }
  /// Runs fn(begin, end) over [0, n) split into contiguous chunks, one per thread; returns
  /// when all are done. Each index is handled by exactly one call, so results do not depend
  /// on the number of threads.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct State;
  int threads_;
  std::unique_ptr<State> state_;
};

/// Dot product of two f32 vectors with a fixed summation order (8 interleaved partial sums),
/// vectorized for the host (AVX2+FMA when the CPU has it): cpu::dot_f32 (src/cpu/gemm_f32.h).
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace nibble::llm
