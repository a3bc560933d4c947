// The CUDA backend: the CPU backend's Llama forward pass (cpu_backend.cpp, the reference) on the
// GPU. One forward call over M tokens at positions p0 .. p0 + M − 1:
//
//   x (M, D) f32 = embedding rows                                       embedding.cu
//   per block:  h = rmsnorm(x + δ)·g_attn          (δ: the previous block's down output)
//                                                                       rmsnorm.cu (add_rmsnorm)
//               qkv (M, (Hq + 2Hkv)·hd) f32 = h · [Wq; Wk; Wv]ᵀ        one fused linear
//               (+ [bq; bk; bv], then per-head RMSNorm of q and k, where the architecture has
//               them: Qwen2, Qwen3)                                     attention_extras.cu
//     M = 1:    attention_decode_cluster.cu (sm_90+) or attention_decode_splitkv.cu — RoPE of
//               q, k; k, v into the cache at p; split-KV softmax(q·Kᵀ/√hd)·V with a
//               deterministic combine; writes the o input directly
//     M > 1:    rope.cu (q → bf16, k, v → cache) then sm80_attention_prefill.cu (tensor cores)
//               δ = att · Woᵀ (+ bo: Llama attention_bias)
//               h = rmsnorm(x + δ)·g_ffn
//               gu (M, 2F) f32 = h · [Wgate; Wup]ᵀ                      one fused linear
//               a = silu(gu[:, :F]) ⊙ gu[:, F:]                         swiglu.cu
//               δ = a · Wdownᵀ
//   logits = rmsnorm(x + δ)·g_out · Eᵀ (last row, or every row for all_logits)
//
// So a decode step is 4 GEMMs and 4 small kernels per block (Llama-3-8B: qkv 6144×4096,
// o 4096×4096, gate_up 28672×4096, down 4096×14336), captured once as one CUDA graph: the
// token id and position are read from device memory (d_step_), every buffer and workspace is
// allocated before capture, and a first eager step runs before it (so nibble's split-K
// workspace, cuBLAS's kernels and every lazily loaded module exist; nothing allocates, syncs or
// loads during capture). Prompts run eagerly on their own stream, in chunks of up to 2048
// tokens. Linear layers run through GpuLinear (gpu_linear.h), the one place that maps a format
// to a kernel through nibble's public API. Greedy generation (decode_greedy) appends argmax.cu
// to each replay: the token goes from the logits to the next step's input on the GPU, and the
// host, which only reads 4 bytes a step, keeps a few steps queued ahead.
//
// Precision (chosen to mirror the CPU backend's bf16 mode rounding point by rounding point):
//   residual stream x, linear outputs, RMSNorm (sum of squares in double), RoPE, softmax,
//   SwiGLU: f32, as on the CPU, with the same operation order and no FMA contraction in the
//   element-wise kernels;
//   linear inputs: bf16 for bf16 and weight-only formats (the CPU rounds them to bf16 too),
//   int8 per token for the A8 formats (quantized from the same f32 values, bit-identical to
//   quantize_activation); weights rounded/quantized on the host by the same code as the CPU;
//   KV cache: bf16 (the CPU keeps f32) — the one deliberate difference of the decode path;
//   the prefill attention also rounds q and the softmax probabilities P to bf16 for its
//   tensor-core products (FlashAttention-2's choice).
// The remaining differences are f32 summation orders (cuBLAS, nibble's kernels, attention).
#include "llm/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "llm/cuda/cublas_check.h"
#include "llm/cuda/gpu_linear.h"
#include "llm/cuda/kernels.h"
#include "llm/model_files.h"
#include "nibble/nibble.h"

namespace nibble::llm {

namespace {

using cuda::ActKind;
using cuda::ActOutput;
using cuda::GpuLinear;
using cuda::LinearInput;
using cuda::LinearScratch;

// The longest run of prompt tokens one eager pass computes: activation buffers are sized for
// it (Llama-3-8B: ~0.6 GB), and longer prompts run as several passes at increasing positions.
// 2048 keeps the 2048-token TTFT prompt in one pass.
constexpr int64_t kPrefillChunk = 2048;
// cuBLAS workspace per handle; cuBLAS asks for 32 MiB on Hopper. Set explicitly so that no
// cuBLAS call allocates, which a graph capture would forbid.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// Greedy decode steps queued ahead of the host (decode_greedy): enough that the GPU never waits
// for the host to read a token and launch the next step.
constexpr int64_t kGreedyAhead = 4;

enum Phase : int { kPrefill = 0, kDecode = 1 };

// ---- RAII for the runtime objects that Tensor does not cover -------------------------------

struct StreamHandle {
  cudaStream_t s = nullptr;
  ~StreamHandle() {
    if (s != nullptr) cudaStreamDestroy(s);
  }
};
struct BlasHandle {
  cublasHandle_t h = nullptr;
  ~BlasHandle() {
    if (h != nullptr) cublasDestroy(h);
  }
};
struct PinnedBuffer {
  void* p = nullptr;
  ~PinnedBuffer() {
    if (p != nullptr) cudaFreeHost(p);
  }
};
struct GraphHandles {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~GraphHandles() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

struct EventList {
  std::vector<cudaEvent_t> events;
  ~EventList() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
  }
};

// Events recorded between the ops of a profiled decode step, with the op each one ends.
struct ProfileMarks {
  EventList events;
  std::vector<std::string> ops;
};

struct Layer {
  Tensor attn_norm, ffn_norm;  // (D) f32
  // Attention extras (attention_extras.cu), undefined when the architecture has none:
  // q|k|v biases (qkv_ld) and the o bias (D) f32 (Qwen2, Llama attention_bias); per-head q and k
  // RMSNorm weights (head_dim) f32 (Qwen3).
  Tensor qkv_bias, o_bias, q_norm, k_norm;
  // [phase]; the decode entry is the prefill one when the strategy uses one format.
  std::shared_ptr<GpuLinear> qkv[2], o[2], gate_up[2], down[2];
};

// Rows of quantized weights stacked into one (Σn, k) weight: every buffer is row-major with N
// rows (q (N, K), scales (N) or (N, K/G), zeros and group scales (N, K/G)).
QuantizedWeight concat_rows(const std::vector<QuantizedWeight>& parts) {
  int64_t n = 0;
  for (const auto& p : parts) n += p.n;
  QuantizedWeight out(parts[0].format, n, parts[0].k);
  auto append = [&](Tensor QuantizedWeight::*buf) {
    if (!(out.*buf).defined()) return;
    auto* dst = static_cast<uint8_t*>((out.*buf).data());
    for (const auto& p : parts) {
      std::memcpy(dst, (p.*buf).data(), static_cast<size_t>((p.*buf).nbytes()));
      dst += (p.*buf).nbytes();
    }
  };
  append(&QuantizedWeight::q);
  append(&QuantizedWeight::scales);
  append(&QuantizedWeight::zeros);
  append(&QuantizedWeight::group_scales);
  return out;
}

// Heads of the model's head_dim h run as heads of H, the attention kernels' 64 or 128 (H == h
// when h is one of them): dimension j of a head sits at at(j) = j (j < h/2) or j − h/2 + H/2 of
// its padded head, zeros elsewhere, so RoPE's rotate-half pairs stay pairs (attention_extras.cu,
// launch_compact_heads, has the whole scheme).
struct HeadPadding {
  int64_t h = 0, H = 0;
  bool active() const { return H != h; }
  int64_t at(int64_t j) const { return j < h / 2 ? j : j - h / 2 + H / 2; }
  // (heads·h, k) row-major → (heads·H, k): row head·h + j moves to row head·H + at(j).
  std::vector<float> pad_rows(const std::vector<float>& w, int64_t k) const {
    if (!active()) return w;
    const int64_t heads = static_cast<int64_t>(w.size()) / (h * k);
    std::vector<float> out(static_cast<size_t>(heads * H * k), 0.0f);
    for (int64_t head = 0; head < heads; ++head)
      for (int64_t j = 0; j < h; ++j)
        std::copy_n(w.data() + (head * h + j) * k, k, out.data() + (head * H + at(j)) * k);
    return out;
  }
  // The same for quantized rows: every buffer of a QuantizedWeight has one row per output
  // (q, scales, zeros, group scales), and all-zero bytes are a zero weight in every format
  // (its scales are 0).
  QuantizedWeight pad_rows(const QuantizedWeight& w) const {
    if (!active()) return w;
    const int64_t heads = w.n / h;
    QuantizedWeight out(w.format, heads * H, w.k);
    auto pad = [&](Tensor QuantizedWeight::*buf) {
      if (!(w.*buf).defined()) return;
      const int64_t row = (w.*buf).nbytes() / w.n;
      const auto* src = static_cast<const uint8_t*>((w.*buf).data());
      auto* dst = static_cast<uint8_t*>((out.*buf).data());
      std::memset(dst, 0, static_cast<size_t>((out.*buf).nbytes()));
      for (int64_t head = 0; head < heads; ++head)
        for (int64_t j = 0; j < h; ++j)
          std::memcpy(dst + (head * H + at(j)) * row, src + (head * h + j) * row,
                      static_cast<size_t>(row));
    };
    pad(&QuantizedWeight::q);
    pad(&QuantizedWeight::scales);
    pad(&QuantizedWeight::zeros);
    pad(&QuantizedWeight::group_scales);
    return out;
  }
};

int64_t act_element_bytes(ActKind k) {
  return k == ActKind::f32 ? 4 : k == ActKind::bf16 ? 2 : 1;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(ModelFiles& files, const BackendOptions& opt, int ordinal)
      : c_(files.config), dev_(Device::cuda(ordinal)), fuse_(opt.fuse_activation_quant) {
    const int count = cuda_device_count();
    if (ordinal < 0 || ordinal >= count)
      detail::fail(ErrorCode::unsupported,
                   "nibble::llm: no CUDA device " + std::to_string(ordinal) + " (" +
                       std::to_string(count) + " found" +
                       (count == 0 ? ": " + cuda_unavailable_reason() : std::string()) + ")");
    info_ = cuda_device_info(ordinal);
    if (info_.cc_major < 8)
      detail::fail(ErrorCode::unsupported, "nibble::llm: the CUDA runner needs sm_80 or newer, " +
                                               info_.name + " is sm_" +
                                               std::to_string(info_.cc_major) +
                                               std::to_string(info_.cc_minor));
    detail::DeviceGuard guard(ordinal);
    NIBBLE_CUDA_CHECK(cudaFree(nullptr));  // create the context before measuring memory
    baseline_used_ = device_used_bytes();
    peak_used_ = baseline_used_;

    check_shapes(opt);
    GpuLinear::check_mode(opt.strategy.prefill);
    GpuLinear::check_mode(opt.strategy.decode);
    GpuLinear::check_mode(opt.head_mode);
    strategy_ = opt.strategy;
    head_mode_ = opt.head_mode;

    NIBBLE_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[kPrefill].s, cudaStreamNonBlocking));
    NIBBLE_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[kDecode].s, cudaStreamNonBlocking));
    for (int ph : {kPrefill, kDecode}) {
      blas_workspace_[ph] = device_tensor(DType::u8, {static_cast<int64_t>(kCublasWorkspaceBytes)});
      NIBBLE_CUBLAS_CHECK(cublasCreate(&blas_[ph].h));
      NIBBLE_CUBLAS_CHECK(cublasSetStream(blas_[ph].h, streams_[ph].s));
      NIBBLE_CUBLAS_CHECK(
          cublasSetWorkspace(blas_[ph].h, blas_workspace_[ph].data(), kCublasWorkspaceBytes));
    }

    load_weights(files, opt);
    allocate_buffers();
    if (opt.time_prefill_attention)
      for (int64_t i = 0; i < 2 * n_layers_; ++i) {
        cudaEvent_t e = nullptr;
        NIBBLE_CUDA_CHECK(cudaEventCreate(&e));
        attn_events_.events.push_back(e);
      }
    // Uploads (cudaMemcpy from pageable memory may return before its DMA ends), memsets on the
    // legacy stream and the device-made weights on the prefill stream are all finished before
    // the non-blocking streams use them.
    NIBBLE_CUDA_CHECK(cudaDeviceSynchronize());
    sample_memory();
    if (opt.cuda_graph) capture_decode_graph();
    sample_memory();
  }

  ~CudaBackend() override {
    detail::DeviceGuard guard(dev_.index);
    for (auto& s : streams_)
      if (s.s != nullptr) cudaStreamSynchronize(s.s);  // errors surface in the next call
  }

  std::string device() const override { return to_string(dev_); }
  double last_prefill_attention_seconds() const override { return last_attention_seconds_; }
  const ModelConfig& config() const override { return c_; }
  int64_t n_layers() const override { return n_layers_; }
  int64_t max_context() const override { return max_ctx_; }

  void forward(std::span<const int32_t> tokens, int64_t pos, bool all_logits,
               std::vector<float>& logits) override {
    const auto m = static_cast<int64_t>(tokens.size());
    check_forward_positions(m, pos, max_ctx_);
    for (const int32_t id : tokens) check_token_id(id, "forward");
    detail::DeviceGuard guard(dev_.index);
    if (m == 1)
      decode_step(tokens[0], pos, logits);
    else
      prefill(tokens, pos, all_logits, logits);
  }

  void check_token_id(int32_t id, const char* who) const {
    if (id < 0 || id >= c_.vocab_size)
      detail::fail(ErrorCode::invalid_argument, std::string("nibble::llm::Backend::") + who +
                                                    ": token id " + std::to_string(id) +
                                                    " is outside the vocabulary");
  }

  // The decode graph's input: the token and its position, into d_step_ on stream s.
  void set_decode_input(int32_t token, int64_t pos, Stream s) {
    auto* step = static_cast<int32_t*>(h_step_.p);
    step[0] = token;
    step[1] = static_cast<int32_t>(pos);
    NIBBLE_CUDA_CHECK(cudaMemcpyAsync(d_step_.data(), step, 8, cudaMemcpyHostToDevice, s));
  }

  // Greedy decoding with the argmax on the GPU (argmax.cu): each step's token goes straight
  // into d_step_ for the next replay, and the host keeps up to kGreedyAhead steps queued, so
  // the GPU runs step after step while the host reads each token 4 bytes at a time (instead of
  // copying and scanning the logits between steps with the GPU idle).
  void decode_greedy(int32_t token, int64_t pos, int64_t steps,
                     const std::function<bool(int32_t)>& on_token) override {
    if (steps <= 0) return;
    check_forward_positions(steps, pos, max_ctx_);
    check_token_id(token, "decode_greedy");
    detail::DeviceGuard guard(dev_.index);
    const Stream s = streams_[kDecode].s;
    set_decode_input(token, pos, s);
    auto* d_step = static_cast<int32_t*>(d_step_.data());
    auto* ring = static_cast<int32_t*>(h_greedy_.p);
    int64_t queued = 0, taken = 0;
    while (taken < steps) {
      for (; queued < steps && queued - taken < kGreedyAhead; ++queued) {
        const auto slot = static_cast<size_t>(queued % kGreedyAhead);
        replay_decode(s);
        cuda::launch_argmax(static_cast<const float*>(logits_.data()), c_.vocab_size, d_step,
                            /*advance_position=*/true, static_cast<int*>(argmax_ws_.data()), s);
        NIBBLE_CUDA_CHECK(cudaMemcpyAsync(ring + slot, d_step, 4, cudaMemcpyDeviceToHost, s));
        NIBBLE_CUDA_CHECK(cudaEventRecord(greedy_events_.events[slot], s));
      }
      const auto slot = static_cast<size_t>(taken % kGreedyAhead);
      NIBBLE_CUDA_CHECK(cudaEventSynchronize(greedy_events_.events[slot]));
      ++taken;
      if (!on_token(ring[slot])) break;
    }
    NIBBLE_CUDA_CHECK(cudaStreamSynchronize(s));  // steps queued past the last token taken
  }

  std::vector<OpTime> profile_decode_step(int32_t token, int64_t pos) override {
    check_forward_positions(1, pos, max_ctx_);
    check_token_id(token, "profile_decode_step");
    detail::DeviceGuard guard(dev_.index);
    const Stream s = streams_[kDecode].s;
    set_decode_input(token, pos, s);
    // 50 ms: far longer than enqueueing a step (a few hundred launches and events) takes.
    cuda::launch_gpu_wait(50'000'000, s);
    ProfileMarks marks;
    profile_ = &marks;
    try {
      mark("start", s);
      enqueue_decode(s);
    } catch (...) {
      profile_ = nullptr;
      throw;
    }
    profile_ = nullptr;
    NIBBLE_CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<OpTime> ops;
    for (size_t i = 1; i < marks.events.events.size(); ++i) {
      float ms = 0.0f;
      NIBBLE_CUDA_CHECK(
          cudaEventElapsedTime(&ms, marks.events.events[i - 1], marks.events.events[i]));
      auto it = std::find_if(ops.begin(), ops.end(),
                             [&](const OpTime& o) { return o.op == marks.ops[i]; });
      if (it == ops.end()) it = ops.insert(ops.end(), OpTime{marks.ops[i], 0, 0.0});
      it->calls += 1;
      it->seconds += ms * 1e-3;
    }
    return ops;
  }

  MemoryReport memory() const override {
    MemoryReport r;
    const int64_t norms = static_cast<int64_t>(n_layers_ * 2 + 1) * c_.dim * 4;
    const bool head_shares_table = head_->bf16_weight().data() == emb_.data();
    r.resident_weight_bytes = emb_.nbytes() + norms + (head_shares_table ? 0 : head_->weight_bytes());
    // A decode step reads one embedding row, every decode-phase block weight and the output.
    r.decode_weight_bytes = head_->weight_bytes() + norms + c_.dim * 2;
    for (const Layer& L : layers_) {
      for (const Tensor* t : {&L.qkv_bias, &L.o_bias, &L.q_norm, &L.k_norm})
        if (t->defined()) {
          r.resident_weight_bytes += t->nbytes();
          r.decode_weight_bytes += t->nbytes();
        }
      for (auto* lin : {&L.qkv, &L.o, &L.gate_up, &L.down}) {
        r.resident_weight_bytes += (*lin)[kPrefill]->weight_bytes();
        if ((*lin)[kDecode] != (*lin)[kPrefill])
          r.resident_weight_bytes += (*lin)[kDecode]->weight_bytes();
        r.decode_weight_bytes += (*lin)[kDecode]->weight_bytes();
      }
    }
    r.kv_cache_bytes = k_cache_.nbytes() + v_cache_.nbytes();
    r.device_allocated_bytes = allocated_bytes_ + r.resident_weight_bytes;
    detail::DeviceGuard guard(dev_.index);
    sample_memory();
    r.device_peak_bytes = peak_used_ - baseline_used_;
    return r;
  }

  std::string describe() const override {
    std::string s = "cuda backend, " + info_.name + " (sm_" + std::to_string(info_.cc_major) +
                    std::to_string(info_.cc_minor) + ", " + std::to_string(info_.sm_count) +
                    " SMs), " + std::to_string(n_layers_) + "/" + std::to_string(c_.n_layers) +
                    " layers, KV cache " + std::to_string(max_ctx_) + " tokens (bf16)\n";
    if (pad_.active())
      s += "  attention heads of " + std::to_string(pad_.h) + " run zero-padded to " +
           std::to_string(pad_.H) + " (the kernels' size): KV cache and attention work grow by " +
           std::to_string(pad_.H * 100 / pad_.h - 100) + "%\n";
    if (random_on_device_)
      s += "  weights: random, generated on the GPU (seed " + std::to_string(random_seed_) +
           "; not a trained model)\n";
    s += "  decode step: " +
         (graph_.exec != nullptr ? "one CUDA graph of " + std::to_string(graph_nodes_) + " nodes"
                                 : std::string("eager launches (no CUDA graph)")) +
         "; prompts: eager, chunks of " + std::to_string(m_max_) + " tokens\n";
    s += "  embedding: bf16; output: " + head_->describe(1) +
         (head_->bf16_weight().data() == emb_.data() ? " (tied: the embedding table)" : "") + "\n";
    if (!layers_.empty()) {
      const Layer& L = layers_[0];
      s += "  block linears (qkv and gate_up fused): " + strategy_.describe() + "\n";
      s += "    decode gate_up " + L.gate_up[kDecode]->describe(1) + "\n";
      if (L.gate_up[kPrefill] != L.gate_up[kDecode] || m_max_ > 1)
        s += "    prefill gate_up " + L.gate_up[kPrefill]->describe(std::min<int64_t>(m_max_, 512)) +
             " (at M = " + std::to_string(std::min<int64_t>(m_max_, 512)) + ")\n";
      s += std::string("    linear inputs: decode ") +
           cuda::to_string(L.qkv[kDecode]->input_kind(fuse_, 1)) +
           (L.qkv[kDecode]->quantizes_in_linear(fuse_, 1) ? " (quantized inside the W4A8 GEMM)"
                                                          : "") +
           ", prefill " + cuda::to_string(L.qkv[kPrefill]->input_kind(fuse_, m_max_)) +
           (L.qkv[kPrefill]->input_kind(fuse_, m_max_) == ActKind::s8_per_token
                ? " (int8 quantization fused into RMSNorm / SwiGLU)"
                : "") +
           "\n";
    }
    return s;
  }

 private:
  // ---- construction ---------------------------------------------------------------------------

  void check_shapes(const BackendOptions& opt) {
    n_layers_ = opt.max_layers > 0 ? std::min(opt.max_layers, c_.n_layers) : c_.n_layers;
    max_ctx_ = opt.max_context > 0 ? opt.max_context : std::min<int64_t>(c_.max_context, 4096);
    if (max_ctx_ < 1 || max_ctx_ > c_.max_context)
      detail::fail(ErrorCode::invalid_argument,
                   "nibble::llm: context " + std::to_string(max_ctx_) + " is outside [1, " +
                       std::to_string(c_.max_context) + "], the model's");
    if (c_.head_dim > 128)
      detail::fail(ErrorCode::unsupported,
                   "nibble::llm: the CUDA backend's attention kernels take head_dim up to 128 "
                   "(smaller heads run zero-padded to 64 or 128), this model has " +
                       std::to_string(c_.head_dim) + " (use --device cpu)");
    if (c_.n_heads / c_.n_kv_heads > 8)
      detail::fail(ErrorCode::unsupported,
                   "nibble::llm: the CUDA backend's decode attention takes up to 8 query heads "
                   "per kv head, this model has " + std::to_string(c_.n_heads / c_.n_kv_heads));
    if (max_ctx_ > 65536)
      detail::fail(ErrorCode::unsupported,
                   "nibble::llm: the CUDA backend's decode attention takes contexts up to 65536 "
                   "tokens, got " + std::to_string(max_ctx_) + " (lower --ctx-size)");
    shape_.n_heads = static_cast<int>(c_.n_heads);
    shape_.n_kv_heads = static_cast<int>(c_.n_kv_heads);
    pad_.h = c_.head_dim;
    pad_.H = c_.head_dim <= 64 ? 64 : 128;
    shape_.head_dim = static_cast<int>(pad_.H);
    shape_.logical_head_dim = pad_.active() ? static_cast<int>(pad_.h) : 0;
    shape_.max_ctx = max_ctx_;
    m_max_ = std::min(max_ctx_, kPrefillChunk);
  }

  Tensor device_tensor(DType dtype, std::vector<int64_t> shape) {
    Tensor t(dtype, std::move(shape), dev_);
    allocated_bytes_ += t.nbytes();
    return t;
  }

  Tensor upload_f32(const std::vector<float>& v) {
    Tensor t(DType::f32, {static_cast<int64_t>(v.size())}, dev_);  // counted as weights
    NIBBLE_CUDA_CHECK(cudaMemcpy(t.data(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return t;
  }

  Tensor ones(int64_t n) {
    Tensor t(DType::f32, {n}, dev_);
    cuda::launch_fill_f32(static_cast<float*>(t.data()), n, 1.0f, streams_[kPrefill].s);
    return t;
  }

  uint64_t tensor_seed(const std::string& name) const {
    uint64_t s = random_seed_ ^ 0x6E6962626C65ull;  // FNV-1a over the name, as RandomSource
    for (const char ch : name) s = (s ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;
    return s;
  }

  void load_weights(ModelFiles& files, const BackendOptions& opt) {
    WeightSource& src = *files.weights;
    const int64_t d = c_.dim, hd = c_.head_dim, qd = c_.n_heads * hd, kvd = c_.n_kv_heads * hd;
    const int64_t f = c_.ffn_dim, vocab = c_.vocab_size;
    // Padded heads need the q/k/v rows on the host to place them.
    random_on_device_ =
        opt.random_weights_on_device && src.random_seed().has_value() && !pad_.active();
    if (random_on_device_) random_seed_ = *src.random_seed();
    const Stream fill = streams_[kPrefill].s;

    // Embedding (bf16) and output projection; a tied model builds both from one load.
    std::vector<float> emb;
    if (random_on_device_) {
      emb_ = Tensor(DType::bf16, {vocab, d}, dev_);
      cuda::launch_fill_uniform_bf16(static_cast<uint16_t*>(emb_.data()), vocab * d,
                                     static_cast<float>(std::sqrt(3.0)),
                                     tensor_seed("token_embd.weight"), fill);
    } else {
      emb = src.load("token_embd.weight", {vocab, d});
      std::vector<uint16_t> bits(emb.size());
      for (size_t i = 0; i < emb.size(); ++i) bits[i] = f32_to_bf16_bits(emb[i]);
      emb_ = Tensor(DType::bf16, {vocab, d}, dev_);
      NIBBLE_CUDA_CHECK(
          cudaMemcpy(emb_.data(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    }
    if (c_.tied_embeddings && head_mode_ == "bf16") {
      head_ = GpuLinear::bf16_shared(emb_);
    } else if (random_on_device_) {
      head_ = GpuLinear::random(head_mode_, vocab, d, tensor_seed("output.weight"), dev_, fill);
    } else if (c_.tied_embeddings) {
      head_ = GpuLinear::from_floats(head_mode_, emb, vocab, d, dev_);
    } else {
      emb.clear();
      emb.shrink_to_fit();
      head_ = GpuLinear::from_floats(head_mode_, src.load("output.weight", {vocab, d}), vocab, d,
                                     dev_);
    }
    emb.clear();
    emb.shrink_to_fit();
    out_norm_ = random_on_device_ ? ones(d) : upload_f32(src.load("output_norm.weight", {d}));

    // Block linears: q|k|v and gate|up stacked into one weight each.
    for (int64_t l = 0; l < n_layers_; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Layer L;
      // `parts` name the tensors stacked (in order) into one (n, k) layer; with `head_rows`,
      // each part's rows are heads of head_dim, placed into padded heads (HeadPadding).
      auto lin = [&](std::shared_ptr<GpuLinear>(&slot)[2], std::vector<std::string> parts,
                     std::vector<int64_t> rows, int64_t k, bool head_rows = false) {
        int64_t n = 0;
        for (int64_t r : rows) n += head_rows ? r / pad_.h * pad_.H : r;
        const std::string stored = src.quantized_format(p + parts[0]);
        if (!stored.empty()) {
          // A pre-quantized checkpoint runs in its own format only (its floats are gone).
          if (strategy_.prefill != stored || strategy_.decode != stored)
            detail::fail(ErrorCode::invalid_argument,
                         "nibble::llm: the checkpoint holds '" + p + parts[0] +
                             "' pre-quantized as " + stored + "; it runs with --format " +
                             stored + ", not " + strategy_.describe());
          std::vector<QuantizedWeight> qws;
          for (size_t i = 0; i < parts.size(); ++i) {
            QuantizedWeight part = src.load_quantized(p + parts[i], rows[i], k);
            qws.push_back(head_rows ? pad_.pad_rows(part) : std::move(part));
          }
          slot[kPrefill] = GpuLinear::from_quantized(stored, concat_rows(qws), k, dev_);
          slot[kDecode] = slot[kPrefill];
          return;
        }
        auto make = [&](const std::string& mode, const std::vector<float>* w) {
          return std::shared_ptr<GpuLinear>(
              w == nullptr ? GpuLinear::random(mode, n, k, tensor_seed(p + parts[0]), dev_, fill)
                           : GpuLinear::from_floats(mode, *w, n, k, dev_));
        };
        std::vector<float> w;
        if (!random_on_device_) {
          w.reserve(static_cast<size_t>(n * k));
          for (size_t i = 0; i < parts.size(); ++i) {
            std::vector<float> part = src.load(p + parts[i], {rows[i], k});
            if (head_rows) part = pad_.pad_rows(part, k);
            w.insert(w.end(), part.begin(), part.end());
          }
        }
        const std::vector<float>* wp = random_on_device_ ? nullptr : &w;
        slot[kPrefill] = make(strategy_.prefill, wp);
        slot[kDecode] =
            strategy_.decode == strategy_.prefill ? slot[kPrefill] : make(strategy_.decode, wp);
      };
      L.attn_norm =
          random_on_device_ ? ones(d) : upload_f32(src.load(p + "attn_norm.weight", {d}));
      L.ffn_norm = random_on_device_ ? ones(d) : upload_f32(src.load(p + "ffn_norm.weight", {d}));
      // The extras are small: loaded from the source even for weights made on the device.
      if (c_.qkv_bias) {
        std::vector<float> b = pad_.pad_rows(src.load(p + "attn_q.bias", {qd}), 1);
        for (const char* part : {"attn_k.bias", "attn_v.bias"}) {
          const std::vector<float> kv = pad_.pad_rows(src.load(p + part, {kvd}), 1);
          b.insert(b.end(), kv.begin(), kv.end());
        }
        L.qkv_bias = upload_f32(b);
      }
      if (c_.o_bias) L.o_bias = upload_f32(src.load(p + "attn_output.bias", {d}));
      if (c_.qk_norm) {
        L.q_norm = upload_f32(pad_.pad_rows(src.load(p + "attn_q_norm.weight", {hd}), 1));
        L.k_norm = upload_f32(pad_.pad_rows(src.load(p + "attn_k_norm.weight", {hd}), 1));
      }
      lin(L.qkv, {"attn_q.weight", "attn_k.weight", "attn_v.weight"}, {qd, kvd, kvd}, d,
          /*head_rows=*/true);
      lin(L.o, {"attn_output.weight"}, {d}, qd);
      lin(L.gate_up, {"ffn_gate.weight", "ffn_up.weight"}, {f, f}, d);
      lin(L.down, {"ffn_down.weight"}, {d}, f);
      layers_.push_back(std::move(L));
    }
  }

  // Every linear's input kind in a phase; the buffers each needs.
  void allocate_buffers() {
    // qd: the attention output's width as o reads it; the attention itself works on padded heads
    // of hd (HeadPadding) and writes them to att_padded_ first when they are padded.
    const int64_t d = c_.dim, hd = pad_.H, qd = c_.n_heads * c_.head_dim;
    const int64_t qd_padded = c_.n_heads * hd;
    const int64_t f = c_.ffn_dim, vocab = c_.vocab_size, m = m_max_;
    bool need[3] = {false, false, false};  // indexed by ActKind
    bool need_int8 = false;
    int64_t width = std::max({d, qd, f});
    auto note = [&](const GpuLinear& lin, bool prefill_attention_input) {
      for (int64_t rows : {int64_t{1}, m}) {
        ActKind k = lin.input_kind(fuse_, rows);
        // The prefill attention writes floats; its int8 consumer quantizes itself.
        if (prefill_attention_input && k == ActKind::s8_per_token) k = ActKind::f32;
        need[static_cast<int>(k)] = true;
      }
      if (lin.path() == GpuLinear::Path::packed_a8 || lin.path() == GpuLinear::Path::quantized_act)
        need_int8 = true;
      width = std::max(width, lin.k_padded());
    };
    for (const Layer& L : layers_)
      for (int ph : {kPrefill, kDecode}) {
        note(*L.qkv[ph], false);
        note(*L.o[ph], ph == kPrefill);
        note(*L.gate_up[ph], false);
        note(*L.down[ph], false);
      }
    note(*head_, false);
    act_ld_ = (width + 7) / 8 * 8;        // 16-byte bf16 rows (packed weight-only kernels)
    act_ld_s8_ = (width + 15) / 16 * 16;  // 16-byte rows for the tensor-core kernels' cp.async
    if (need[static_cast<int>(ActKind::bf16)]) act_bf16_ = zeros(DType::bf16, {m, act_ld_});
    if (need[static_cast<int>(ActKind::f32)]) act_f32_ = zeros(DType::f32, {m, act_ld_});
    if (need[static_cast<int>(ActKind::s8_per_token)] || need_int8) {
      act_s8_ = zeros(DType::s8, {m, act_ld_s8_});
      act_scales_ = zeros(DType::f32, {m});
    }
    x_ = device_tensor(DType::f32, {m, d});
    delta_ = device_tensor(DType::f32, {m, d});
    x_sumsq_ = device_tensor(DType::f64, {1, sumsq_granules(d)});
    qkv_ = device_tensor(DType::f32, {m, shape_.qkv_ld()});
    gu_ = device_tensor(DType::f32, {m, 2 * f});
    q_bf16_ = device_tensor(DType::bf16, {m, qd_padded});
    if (pad_.active()) att_padded_ = device_tensor(DType::f32, {m, qd_padded});  // any ActKind
    logits_ = device_tensor(DType::f32, {1, vocab});
    k_cache_ = zeros(DType::bf16, {n_layers_, c_.n_kv_heads, max_ctx_, hd});
    v_cache_ = zeros(DType::bf16, {n_layers_, c_.n_kv_heads, max_ctx_, hd});
    attn_partials_ = device_tensor(DType::f32, {cuda::decode_attention_partial_floats(shape_)});
    attn_row_ = device_tensor(DType::f32, {qd_padded});
    attn_counters_ = zeros(DType::s32, {cuda::decode_attention_counter_ints(shape_)});
    d_tokens_ = device_tensor(DType::s32, {m + 1});  // tokens, then the first position
    d_step_ = device_tensor(DType::s32, {2});        // decode: token, position
    NIBBLE_CUDA_CHECK(cudaMallocHost(&h_tokens_.p, static_cast<size_t>(m + 1) * 4));
    NIBBLE_CUDA_CHECK(cudaMallocHost(&h_step_.p, 8));
    NIBBLE_CUDA_CHECK(cudaMallocHost(&h_logits_.p, static_cast<size_t>(vocab) * 4));
    argmax_ws_ = zeros(DType::s32, {cuda::argmax_workspace_ints()});
    NIBBLE_CUDA_CHECK(cudaMallocHost(&h_greedy_.p, size_t{kGreedyAhead} * 4));
    greedy_events_.events.resize(kGreedyAhead);
    for (cudaEvent_t& e : greedy_events_.events)
      NIBBLE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

    const int64_t half = hd / 2, model_half = c_.head_dim / 2;
    std::vector<float> cs, sn;
    rope_tables(c_, max_ctx_, cs, sn);  // the CPU backend's f32 cos/sin table, (max_ctx, hd/2)
    if (pad_.active()) {  // pairs past the model's rotate zeros: cos 1, sin 0
      std::vector<float> pc(static_cast<size_t>(max_ctx_ * half), 1.0f);
      std::vector<float> ps(pc.size(), 0.0f);
      for (int64_t p = 0; p < max_ctx_; ++p)
        for (int64_t i = 0; i < model_half; ++i) {
          pc[static_cast<size_t>(p * half + i)] = cs[static_cast<size_t>(p * model_half + i)];
          ps[static_cast<size_t>(p * half + i)] = sn[static_cast<size_t>(p * model_half + i)];
        }
      cs = std::move(pc);
      sn = std::move(ps);
    }
    cos_ = device_tensor(DType::f32, {max_ctx_, half});
    sin_ = device_tensor(DType::f32, {max_ctx_, half});
    NIBBLE_CUDA_CHECK(cudaMemcpy(cos_.data(), cs.data(), cs.size() * 4, cudaMemcpyHostToDevice));
    NIBBLE_CUDA_CHECK(cudaMemcpy(sin_.data(), sn.data(), sn.size() * 4, cudaMemcpyHostToDevice));
  }

  Tensor zeros(DType dtype, std::vector<int64_t> shape) {
    Tensor t = device_tensor(dtype, std::move(shape));
    NIBBLE_CUDA_CHECK(cudaMemset(t.data(), 0, static_cast<size_t>(t.nbytes())));
    return t;
  }

  // One eager decode step (position 0, token 0: it writes cache row 0, which any prompt
  // overwrites) so that everything the step uses exists, then its capture.
  void capture_decode_graph() {
    const Stream s = streams_[kDecode].s;
    set_decode_input(0, 0, s);
    enqueue_decode(s);
    NIBBLE_CUDA_CHECK(cudaStreamSynchronize(s));
    NIBBLE_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue_decode(s);
    } catch (...) {
      cudaGraph_t broken = nullptr;
      cudaStreamEndCapture(s, &broken);  // leave the stream usable, then report the failure
      if (broken != nullptr) cudaGraphDestroy(broken);
      cudaGetLastError();
      throw;
    }
    NIBBLE_CUDA_CHECK(cudaStreamEndCapture(s, &graph_.graph));
    NIBBLE_CUDA_CHECK(cudaGraphGetNodes(graph_.graph, nullptr, &graph_nodes_));
    NIBBLE_CUDA_CHECK(cudaGraphInstantiate(&graph_.exec, graph_.graph, 0));
    NIBBLE_CUDA_CHECK(cudaGraphUpload(graph_.exec, s));
    NIBBLE_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  // ---- the forward pass -----------------------------------------------------------------------

  ActOutput act_output(ActKind kind) {
    ActOutput o;
    o.kind = kind;
    switch (kind) {
      case ActKind::bf16:
        o.data = act_bf16_.data();
        o.ld = act_ld_;
        break;
      case ActKind::f32:
        o.data = act_f32_.data();
        o.ld = act_ld_;
        break;
      case ActKind::s8_per_token:
        o.data = act_s8_.data();
        o.ld = act_ld_s8_;
        o.scales = static_cast<float*>(act_scales_.data());
        break;
    }
    if (o.data == nullptr)
      detail::fail(ErrorCode::internal, std::string("nibble::llm: no ") + cuda::to_string(kind) +
                                            " activation buffer was allocated");
    return o;
  }

  // Where the attention writes `att`: att itself, or with padded heads att_padded_ in the same
  // form (rows of n_heads × the padded head_dim; launch_compact_heads then moves them to att).
  ActOutput padded_heads_output(const ActOutput& att) {
    if (!pad_.active()) return att;
    ActOutput o = att;
    o.data = att_padded_.data();
    o.ld = c_.n_heads * pad_.H;
    return o;
  }

  // Runs `lin` on what a producer wrote into `in` (`width` real columns per row), y (m, N) f32.
  void run_linear(const GpuLinear& lin, const ActOutput& in, int64_t m, int64_t width, float* y,
                  int64_t y_ld, Stream s, cublasHandle_t blas,
                  const LinearFusion& fusion = LinearFusion{}) {
    const int64_t kp = lin.k_padded();
    if (kp > width) {  // zero columns up to the padded K (they may hold an earlier row's data)
      const int64_t e = act_element_bytes(in.kind);
      NIBBLE_CUDA_CHECK(cudaMemset2DAsync(static_cast<uint8_t*>(in.data) + width * e,
                                          static_cast<size_t>(in.ld * e), 0,
                                          static_cast<size_t>((kp - width) * e),
                                          static_cast<size_t>(m), s));
    }
    LinearInput li;
    li.quantize_in_linear = lin.quantizes_in_linear(fuse_, m);
    li.fusion = fusion;
    if (in.kind == ActKind::s8_per_token) {
      li.quantized = true;
      li.qa.scheme = ActScheme::s8_per_token;
      li.qa.q = cuda::strided(in.data, DType::s8, m, kp, in.ld, dev_);
      li.qa.scales = TensorView::contiguous(in.scales, DType::f32, {m}, dev_);
    } else {
      li.x = cuda::strided(in.data, in.kind == ActKind::f32 ? DType::f32 : DType::bf16, m, kp,
                           in.ld,
                     dev_);
    }
    LinearScratch scratch;
    scratch.q = act_s8_.data();
    scratch.ld = act_ld_s8_;
    scratch.scales = static_cast<float*>(act_scales_.data());
    lin.forward(li, scratch, m, cuda::strided(y, DType::f32, m, lin.n(), y_ld, dev_), s, blas);
  }

  // Ends the op `op` of a profiled step: an event on s (nothing unless profile_decode_step runs;
  // never during graph capture).
  void mark(const char* op, Stream s) {
    if (profile_ == nullptr) return;
    cudaEvent_t e = nullptr;
    NIBBLE_CUDA_CHECK(cudaEventCreate(&e));
    profile_->events.events.push_back(e);
    profile_->ops.emplace_back(op);
    NIBBLE_CUDA_CHECK(cudaEventRecord(e, s));
  }

  // The RMSNorm (weight g) of the residual stream x (rows × d) as `lin`'s input: inside its
  // linear from x's granule sums where the linear that last added to x wrote them
  // (norm_in_linear), else add_rmsnorm adds a pending delta first and writes the normalized rows.
  void run_normed_linear(const GpuLinear& lin, float* x, float* delta, int64_t rows,
                         const float* g, float* y, int64_t y_ld, Stream s, cublasHandle_t blas) {
    const int64_t d = c_.dim;
    if (!delta_pending_ && sums_current_ && lin.norm_in_linear(fuse_, rows)) {
      LinearFusion norm;
      norm.in_sumsq = x_sumsq_.view();
      norm.norm_weight = TensorView::contiguous(const_cast<float*>(g), DType::f32, {d}, dev_);
      norm.norm_eps = static_cast<float>(c_.norm_eps);
      ActOutput in;
      in.kind = ActKind::f32;
      in.data = x;
      in.ld = d;
      run_linear(lin, in, rows, d, y, y_ld, s, blas, norm);
      return;
    }
    const ActOutput h = act_output(lin.input_kind(fuse_, rows));
    cuda::launch_add_rmsnorm(x, delta_pending_ ? delta : nullptr, rows, d, g, c_.norm_eps, h, s);
    delta_pending_ = false;
    mark("add_rmsnorm", s);
    run_linear(lin, h, rows, d, y, y_ld, s, blas);
  }

  // A block's output linear (o or down) from `in`: added to the residual stream x in its
  // epilogue, which also writes x's granule sums for the next norm, where it can
  // (norm_in_linear) and there is no bias; else written to delta (plus the bias: the CPU's
  // order, linear output then bias, then the residual add) for the next add_rmsnorm.
  void run_residual_linear(const GpuLinear& lin, const ActOutput& in, int64_t m, int64_t width,
                           float* x, float* delta, Stream s, cublasHandle_t blas,
                           const Tensor& bias = Tensor{}) {
    const int64_t d = c_.dim;
    if (!delta_pending_ && !bias.defined() && lin.norm_in_linear(fuse_, m)) {
      LinearFusion residual;
      residual.accumulate = true;
      residual.out_sumsq = x_sumsq_.view();
      run_linear(lin, in, m, width, x, d, s, blas, residual);
      sums_current_ = true;
      return;
    }
    run_linear(lin, in, m, width, delta, d, s, blas);
    if (bias.defined()) cuda::launch_add_bias(delta, m, d, static_cast<const float*>(bias.data()), s);
    delta_pending_ = true;
    sums_current_ = false;
  }

  // Embedding and every block for m tokens (ids and first position in device memory); leaves
  // the residual stream in x_, and the last block's down output in delta_ when delta_pending_
  // (in x_ already otherwise).
  void enqueue_blocks(Phase ph, int64_t m, const int32_t* tokens, const int32_t* pos, Stream s,
                      cublasHandle_t blas) {
    const int64_t d = c_.dim, qd = c_.n_heads * c_.head_dim, f = c_.ffn_dim;
    auto* x = static_cast<float*>(x_.data());
    auto* delta = static_cast<float*>(delta_.data());
    auto* qkv = static_cast<float*>(qkv_.data());
    auto* gu = static_cast<float*>(gu_.data());
    cuda::launch_embedding(static_cast<const uint16_t*>(emb_.data()), tokens, m, d, x, s);
    delta_pending_ = sums_current_ = false;
    mark("embedding", s);
    const int64_t cache_stride = c_.n_kv_heads * max_ctx_ * shape_.head_dim;
    for (int64_t l = 0; l < n_layers_; ++l) {
      const Layer& L = layers_[static_cast<size_t>(l)];
      auto* kc = static_cast<uint16_t*>(k_cache_.data()) + l * cache_stride;
      auto* vc = static_cast<uint16_t*>(v_cache_.data()) + l * cache_stride;
      // Attention.
      run_normed_linear(*L.qkv[ph], x, delta, m, static_cast<const float*>(L.attn_norm.data()),
                        qkv, shape_.qkv_ld(), s, blas);
      mark("qkv", s);
      if (L.qkv_bias.defined())
        cuda::launch_add_bias(qkv, m, shape_.qkv_ld(), static_cast<const float*>(L.qkv_bias.data()),
                              s);
      if (L.q_norm.defined())
        cuda::launch_head_rmsnorm(qkv, m, shape_, static_cast<const float*>(L.q_norm.data()),
                                  static_cast<const float*>(L.k_norm.data()), c_.norm_eps, s);
      if (L.qkv_bias.defined() || L.q_norm.defined()) mark("attention_extras", s);
      ActKind att_kind = L.o[ph]->input_kind(fuse_, m);
      if (ph == kDecode) {
        const ActOutput att = act_output(att_kind);
        const ActOutput att_written = padded_heads_output(att);
        cuda::DecodeAttentionWorkspace ws;
        ws.partials = static_cast<float*>(attn_partials_.data());
        ws.row_f32 = static_cast<float*>(attn_row_.data());
        ws.counters = static_cast<int*>(attn_counters_.data());
        cuda::launch_attention_decode(qkv, pos, shape_, static_cast<const float*>(cos_.data()),
                                      static_cast<const float*>(sin_.data()), kc, vc, ws,
                                      att_written, s);
        if (pad_.active()) cuda::launch_compact_heads(att_written, att, m, shape_, s);
        mark("attention", s);
        run_residual_linear(*L.o[ph], att, m, qd, x, delta, s, blas, L.o_bias);
        mark("o", s);
      } else {
        if (att_kind == ActKind::s8_per_token) att_kind = ActKind::f32;  // o quantizes itself
        const ActOutput att = act_output(att_kind);
        auto* q = static_cast<uint16_t*>(q_bf16_.data());
        const bool timed = !attn_events_.events.empty();
        if (timed)
          NIBBLE_CUDA_CHECK(cudaEventRecord(attn_events_.events[static_cast<size_t>(2 * l)], s));
        cuda::launch_rope_qkv_store(qkv, m, pos, shape_, static_cast<const float*>(cos_.data()),
                                    static_cast<const float*>(sin_.data()), q, kc, vc, s);
        const ActOutput att_written = padded_heads_output(att);
        cuda::launch_attention_prefill(q, m, pos, shape_, kc, vc, att_written, s);
        if (pad_.active()) cuda::launch_compact_heads(att_written, att, m, shape_, s);
        if (timed)
          NIBBLE_CUDA_CHECK(
              cudaEventRecord(attn_events_.events[static_cast<size_t>(2 * l + 1)], s));
        run_residual_linear(*L.o[ph], att, m, qd, x, delta, s, blas, L.o_bias);
      }
      // MLP.
      run_normed_linear(*L.gate_up[ph], x, delta, m, static_cast<const float*>(L.ffn_norm.data()),
                        gu, 2 * f, s, blas);
      mark("gate_up", s);
      const ActOutput a = act_output(L.down[ph]->input_kind(fuse_, m));
      cuda::launch_swiglu(gu, m, f, a, s);
      mark("swiglu", s);
      run_residual_linear(*L.down[ph], a, m, f, x, delta, s, blas);
      mark("down", s);
    }
  }

  // The final norm and the output projection of rows [m − rows, m): logits (rows, vocab) f32.
  void enqueue_head(int64_t m, int64_t rows, float* logits, Stream s, cublasHandle_t blas) {
    const int64_t d = c_.dim, r0 = m - rows;
    auto* x = static_cast<float*>(x_.data()) + r0 * d;
    auto* delta = static_cast<float*>(delta_.data()) + r0 * d;
    if (r0 > 0) sums_current_ = false;  // x_sumsq_ holds row 0's sums only
    run_normed_linear(*head_, x, delta, rows, static_cast<const float*>(out_norm_.data()), logits,
                      c_.vocab_size, s, blas);
    mark("head", s);
  }

  void enqueue_decode(Stream s) {
    const auto* step = static_cast<const int32_t*>(d_step_.data());
    enqueue_blocks(kDecode, 1, step, step + 1, s, blas_[kDecode].h);
    enqueue_head(1, 1, static_cast<float*>(logits_.data()), s, blas_[kDecode].h);
  }

  // One decode step from d_step_: the captured graph, or its launches one by one without it.
  void replay_decode(Stream s) {
    if (graph_.exec != nullptr)
      NIBBLE_CUDA_CHECK(cudaGraphLaunch(graph_.exec, s));
    else
      enqueue_decode(s);
  }

  void decode_step(int32_t token, int64_t pos, std::vector<float>& logits) {
    const Stream s = streams_[kDecode].s;
    set_decode_input(token, pos, s);
    replay_decode(s);
    const auto vocab = static_cast<size_t>(c_.vocab_size);
    NIBBLE_CUDA_CHECK(
        cudaMemcpyAsync(h_logits_.p, logits_.data(), vocab * 4, cudaMemcpyDeviceToHost, s));
    NIBBLE_CUDA_CHECK(cudaStreamSynchronize(s));
    const auto* hl = static_cast<const float*>(h_logits_.p);
    logits.assign(hl, hl + vocab);
  }

  void prefill(std::span<const int32_t> tokens, int64_t pos, bool all_logits,
               std::vector<float>& logits) {
    const Stream s = streams_[kPrefill].s;
    cublasHandle_t blas = blas_[kPrefill].h;
    const auto m = static_cast<int64_t>(tokens.size());
    const int64_t vocab = c_.vocab_size;
    logits.resize(static_cast<size_t>((all_logits ? m : 1) * vocab));
    if (all_logits && !logits_all_.defined()) logits_all_ = device_tensor(DType::f32, {m_max_, vocab});
    auto* staged = static_cast<int32_t*>(h_tokens_.p);
    double attention_seconds = 0.0;
    for (int64_t c0 = 0; c0 < m; c0 += m_max_) {
      const int64_t mc = std::min(m_max_, m - c0);
      std::copy_n(tokens.data() + c0, mc, staged);
      staged[mc] = static_cast<int32_t>(pos + c0);
      auto* dt = static_cast<int32_t*>(d_tokens_.data());
      NIBBLE_CUDA_CHECK(cudaMemcpyAsync(dt, staged, static_cast<size_t>(mc + 1) * 4,
                                        cudaMemcpyHostToDevice, s));
      enqueue_blocks(kPrefill, mc, dt, dt + mc, s, blas);
      const bool last = c0 + mc == m;
      if (all_logits) {
        enqueue_head(mc, mc, static_cast<float*>(logits_all_.data()), s, blas);
        NIBBLE_CUDA_CHECK(cudaMemcpyAsync(logits.data() + c0 * vocab, logits_all_.data(),
                                          static_cast<size_t>(mc * vocab) * 4,
                                          cudaMemcpyDeviceToHost, s));
      } else if (last) {
        enqueue_head(mc, 1, static_cast<float*>(logits_.data()), s, blas);
        NIBBLE_CUDA_CHECK(cudaMemcpyAsync(logits.data(), logits_.data(),
                                          static_cast<size_t>(vocab) * 4, cudaMemcpyDeviceToHost,
                                          s));
      }
      NIBBLE_CUDA_CHECK(cudaStreamSynchronize(s));  // the staging buffer is reused next chunk
      for (size_t i = 0; i + 1 < attn_events_.events.size(); i += 2) {
        float ms = 0.0f;
        NIBBLE_CUDA_CHECK(
            cudaEventElapsedTime(&ms, attn_events_.events[i], attn_events_.events[i + 1]));
        attention_seconds += ms * 1e-3;
      }
    }
    last_attention_seconds_ = attn_events_.events.empty() ? -1.0 : attention_seconds;
    sample_memory();
  }

  // ---- memory ---------------------------------------------------------------------------------

  int64_t device_used_bytes() const {
    size_t free_b = 0, total_b = 0;
    NIBBLE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return static_cast<int64_t>(total_b - free_b);
  }
  void sample_memory() const { peak_used_ = std::max(peak_used_, device_used_bytes()); }

  // Declaration order is destruction order reversed: the graph and cuBLAS handles go before
  // the streams they use; tensors free themselves (cudaFree synchronizes).
  ModelConfig c_;
  Device dev_;
  DeviceInfo info_;
  bool fuse_ = true;
  LinearStrategy strategy_;
  std::string head_mode_;
  cuda::AttentionShape shape_;
  HeadPadding pad_;  // the model's head_dim and the attention kernels' (equal unless padded)
  int64_t n_layers_ = 0, max_ctx_ = 0, m_max_ = 0;
  bool random_on_device_ = false;
  uint64_t random_seed_ = 0;
  int64_t baseline_used_ = 0, allocated_bytes_ = 0;
  mutable int64_t peak_used_ = 0;

  StreamHandle streams_[2];
  Tensor blas_workspace_[2];
  BlasHandle blas_[2];

  Tensor emb_;  // (vocab, D) bf16
  std::unique_ptr<GpuLinear> head_;
  Tensor out_norm_;
  std::vector<Layer> layers_;

  int64_t act_ld_ = 0, act_ld_s8_ = 0;
  Tensor act_bf16_, act_f32_, act_s8_, act_scales_;  // a linear layer's input, (m_max, ld)
  Tensor x_, delta_, qkv_, gu_, q_bf16_, logits_, logits_all_;
  Tensor att_padded_;  // (m_max, n_heads·padded head_dim) f32-sized: padded heads' attention output
  // The decode step's residual stream through LinearFusion (run_normed_linear,
  // run_residual_linear): x_'s granule sums as the last block-output linear wrote them, and
  // while enqueueing a pass, whether delta_ holds an output not yet added to x_ and whether
  // x_sumsq_ holds x_'s current sums.
  Tensor x_sumsq_;
  bool delta_pending_ = false, sums_current_ = false;
  Tensor k_cache_, v_cache_;  // (layers, Hkv, max_ctx, hd) bf16
  Tensor cos_, sin_;
  Tensor attn_partials_, attn_row_, attn_counters_;
  Tensor d_tokens_, d_step_;
  Tensor argmax_ws_;  // decode_greedy's argmax (argmax_workspace_ints, zero between launches)
  PinnedBuffer h_tokens_, h_step_, h_logits_, h_greedy_;
  EventList greedy_events_;  // one per queued greedy step (kGreedyAhead)
  GraphHandles graph_;
  size_t graph_nodes_ = 0;
  EventList attn_events_;  // (start, stop) per layer when timing the prefill attention
  ProfileMarks* profile_ = nullptr;  // set during profile_decode_step only
  double last_attention_seconds_ = -1.0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(ModelFiles& files, const BackendOptions& options,
                                           int ordinal) {
  return std::make_unique<CudaBackend>(files, options, ordinal);
}

}  // namespace nibble::llm
