// The seam between the runner (tokenizing, sampling, timing, perplexity: runner.h) and the
// hardware that computes the model. A Backend owns the weights in its own form (bf16, nibble
// formats, packed for a kernel) and the KV cache, and computes logits for a run of tokens.
//
// The CPU backend (cpu_backend.cpp) is the slow, exact one that CI runs end to end. The CUDA
// backend (cuda/cuda_backend.cpp, built with NIBBLE_WITH_CUDA) plugs in behind the same
// interface: make_backend() picks it for device "cuda"; it pulls the weights tensor by tensor
// from the WeightSource (quantize, pack_weight, upload, drop the host copy), keeps the KV cache
// on the GPU, and captures the one-token decode step as a CUDA graph at construction (the
// position and the token id come from device memory, so one graph replays for every step).
// See docs/runner.md, "The GPU backend".
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "llm/config.h"
#include "llm/linear.h"

namespace nibble::llm {

struct ModelFiles;

struct BackendOptions {
  /// Modes of the seven linear layers of every block (linear.h).
  LinearStrategy strategy;
  /// Mode of the embedding table and the output projection: "bf16" or "f32". They stay out of
  /// the low-bit formats, as in most W4 deployments (the output layer is the most sensitive).
  std::string head_mode = "bf16";
  /// KV-cache length in tokens; 0 means min(model context, 4096).
  int64_t max_context = 0;
  /// CPU threads; 0 means all hardware threads.
  int threads = 0;
  /// Run only the first `max_layers` blocks (0: all) — for 8B-shaped runs on a small machine.
  int64_t max_layers = 0;
  /// CUDA: capture the one-token decode step as one CUDA graph (off: launch its kernels one by
  /// one each step — for debugging, and for the test that the graph equals eager launches).
  bool cuda_graph = true;
  /// CUDA: kernels that produce the input of an int8-per-token linear (RMSNorm, SwiGLU, decode
  /// attention) quantize it themselves, bit-identically to quantize_activation (off: they write
  /// f32 and the layer calls quantize_activation).
  bool fuse_activation_quant = true;
  /// CUDA: make --random-weights directly on the GPU (same distributions as the host's random
  /// weights, not the same values; an 8B model is never built on the host).
  bool random_weights_on_device = false;
  /// CUDA: time the attention of every prompt pass with CUDA events (RoPE, the KV-cache store
  /// and the attention kernel of every layer), for Backend::last_prefill_attention_seconds().
  bool time_prefill_attention = false;
};

struct MemoryReport {
  int64_t resident_weight_bytes = 0;  ///< every weight held, in its stored form
  int64_t decode_weight_bytes = 0;    ///< weights read to generate one token
  int64_t kv_cache_bytes = 0;
  /// CUDA: bytes the backend allocated on the device (weights, KV cache, activations,
  /// workspaces); 0 on the CPU.
  int64_t device_allocated_bytes = 0;
  /// CUDA: peak device memory in use, above what was in use when the backend started
  /// (cudaMemGetInfo, sampled after loading and after every prompt; includes cuBLAS's and
  /// nibble's split-K workspaces, and anything else on the GPU at the time); 0 on the CPU.
  int64_t device_peak_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string device() const = 0;  ///< "cpu", "cuda:0"
  virtual const ModelConfig& config() const = 0;
  /// Layers actually run (config().n_layers unless BackendOptions::max_layers cut it).
  virtual int64_t n_layers() const = 0;
  virtual int64_t max_context() const = 0;

  /// Runs tokens at positions [pos, pos + tokens.size()) — the cache must already hold every
  /// position below pos, and positions from pos on are overwritten — and writes the logits:
  /// of every token, (n, vocab) row-major, when `all_logits`, else of the last one (vocab).
  virtual void forward(std::span<const int32_t> tokens, int64_t pos, bool all_logits,
                       std::vector<float>& logits) = 0;
  virtual MemoryReport memory() const = 0;
  /// Greedy decoding: runs `token` at position pos, then each step's argmax (llm::argmax of its
  /// logits) at the next position, for at most `steps` steps, and calls on_token with each
  /// step's argmax in order until it returns false. The cache rules are forward's. A backend may
  /// compute a few steps beyond the one whose token ended the run (the CUDA backend queues steps
  /// ahead of the host); their cache positions are overwritten by later calls.
  /// The default runs forward and llm::argmax step by step.
  virtual void decode_greedy(int32_t token, int64_t pos, int64_t steps,
                             const std::function<bool(int32_t)>& on_token);
  /// A line per kind of layer: its mode and bytes (for `nibble info` and reports).
  virtual std::string describe() const = 0;
  /// Seconds the last prompt (a forward call of several tokens) spent in attention, when the
  /// backend measures it (CUDA with BackendOptions::time_prefill_attention); < 0 otherwise.
  virtual double last_prefill_attention_seconds() const { return -1.0; }

  /// GPU time of one decode step op by op (CUDA; empty elsewhere): the token at position pos
  /// (cache rules as forward; its logits are discarded) runs eagerly behind a GPU-side wait, so
  /// every launch is queued before the first op starts and the events between ops time the GPU
  /// alone, launch gaps between back-to-back kernels included as in a graph replay.
  struct OpTime {
    std::string op;       ///< "add_rmsnorm", "qkv", "attention", ...
    int calls = 0;        ///< launches of that op in the step (one per layer for most)
    double seconds = 0;   ///< summed over the calls
  };
  virtual std::vector<OpTime> profile_decode_step(int32_t /*token*/, int64_t /*pos*/) {
    return {};
  }
};

/// Backend::forward's argument check, shared by every backend: at least one token, and positions
/// [pos, pos + tokens) inside the KV cache's max_context. Throws nibble::Error naming them.
void check_forward_positions(int64_t tokens, int64_t pos, int64_t max_context);

/// A backend for `device` ("cpu", "cuda" or "cuda:N"), loading the weights from
/// `files.weights` tensor by tensor. "cuda" in a build without the CUDA backend throws
/// nibble::Error(unsupported).
std::unique_ptr<Backend> make_backend(const std::string& device, ModelFiles& files,
                                      const BackendOptions& options);

/// The seven linear layers of a block, in the order the forward pass runs them.
enum class BlockLinear : uint8_t { q, k, v, o, gate, up, down };
inline constexpr BlockLinear kBlockLinears[] = {
    BlockLinear::q,    BlockLinear::k,  BlockLinear::v,   BlockLinear::o,
    BlockLinear::gate, BlockLinear::up, BlockLinear::down};
/// Its tensor name within a block: "attn_q.weight", ..., "ffn_down.weight".
const char* tensor_role(BlockLinear which);
/// Its full tensor name in layer `layer`: "blk.3.attn_q.weight".
std::string tensor_name(int64_t layer, BlockLinear which);
/// Its weight's shape (N output features, K input features) in a model of config c.
struct LinearShape {
  int64_t n, k;
};
LinearShape linear_shape(const ModelConfig& c, BlockLinear which);

/// Sees the input x (m, k) of a block linear just before it runs.
using LinearObserver =
    std::function<void(int64_t layer, BlockLinear which, const float* x, int64_t m, int64_t k)>;

/// Block-by-block access to the CPU backend, for calibration (src/llm/quantize_model.cpp): run
/// one block over the hidden states of a sequence, watch the inputs of its linears, and swap a
/// linear for its quantized version before the next block sees its outputs.
class BlockRunner {
 public:
  virtual ~BlockRunner() = default;
  virtual const ModelConfig& config() const = 0;
  /// x (tokens.size(), dim) = the embedding rows (in the head mode, as forward() reads them).
  virtual void embed(std::span<const int32_t> tokens, float* x) const = 0;
  /// Runs block `layer` in place on the hidden states x (m, dim) of one sequence at positions
  /// 0..m−1 (its KV cache entries are overwritten); `observe` (may be empty) sees the input of
  /// every linear (q, k and v see the same one).
  virtual void run_block(int64_t layer, float* x, int64_t m, const LinearObserver& observe) = 0;
  /// Replaces one linear of a block.
  virtual void set_linear(int64_t layer, BlockLinear which, std::unique_ptr<Linear> linear) = 0;
};

/// The CPU backend behind the BlockRunner interface (the blocks in options.strategy).
std::unique_ptr<BlockRunner> make_cpu_block_runner(ModelFiles& files,
                                                   const BackendOptions& options);

}  // namespace nibble::llm
