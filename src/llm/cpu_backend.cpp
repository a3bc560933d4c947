// The CPU backend: the Llama forward pass in f32 on the host, with the linear layers of
// linear.h (f32, bf16, or nibble formats through the public API). Slow but simple, so that CI
// can run real models end to end and the GPU backend has a reference to match.
//
// One forward call over M tokens at positions p0..p0+M-1:
//
//   x (M, D) = embedding rows
//   per block:  h = rmsnorm(x)·g_attn
//               q (M, Hq·hd), k, v (M, Hkv·hd) = h·Wqᵀ, h·Wkᵀ, h·Wvᵀ
//               q, k rotated by RoPE (pairs (i, i + hd/2) of each head, angle p·θ^(−2i/hd))
//               k, v stored in the cache at p0..p0+M-1
//               a[t, head] = softmax(q·Kᵀ/√hd over positions ≤ p0+t)·V   (GQA: query head h
//                            reads kv head h / (Hq/Hkv))
//               x += a·Woᵀ
//               h = rmsnorm(x)·g_ffn;  x += (silu(h·Wgᵀ) ⊙ h·Wuᵀ)·Wdᵀ
//   logits = rmsnorm(x)·g_out·Eᵀ   (E = output weight, or the embedding when tied)
#include <algorithm>
#include <cmath>
#include <thread>

#include "common/check.h"
#include "llm/backend.h"
#include "llm/model_files.h"
#include "nibble/formats.h"
#if NIBBLE_WITH_CUDA
#include "llm/cuda/cuda_backend.h"
#endif
#include "nibble/numeric.h"

namespace nibble::llm {

namespace {

struct Layer {
  std::vector<float> attn_norm, ffn_norm;
  std::unique_ptr<StrategyLinear> wq, wk, wv, wo, w_gate, w_up, w_down;
  std::vector<float> bq, bk, bv, bo;  // attention biases (Qwen2: q, k, v); empty when none
  std::vector<float> q_norm, k_norm;  // per-head RMSNorm weights of q and k (Qwen3); or empty
};

// y (rows, n) += bias (n) on every row; nothing for an empty bias.
void add_bias(float* y, int64_t rows, const std::vector<float>& bias) {
  const auto n = static_cast<int64_t>(bias.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] += bias[static_cast<size_t>(i)];
}

// RMSNorm of each row: y = x / sqrt(mean(x²) + eps) · g, the mean accumulated in double.
void rmsnorm(const float* x, const float* g, int64_t rows, int64_t d, double eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[r * d + i]) * x[r * d + i];
    const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    for (int64_t i = 0; i < d; ++i) y[r * d + i] = x[r * d + i] * inv * g[i];
  }
}

class CpuBackend final : public Backend, public BlockRunner {
 public:
  CpuBackend(ModelFiles& files, const BackendOptions& opt)
      : c_(files.config),
        pool_(opt.threads > 0 ? opt.threads : std::max(1u, std::thread::hardware_concurrency())) {
    check_weight_mode(opt.strategy.prefill);
    check_weight_mode(opt.strategy.decode);
    if (opt.head_mode != "f32" && opt.head_mode != "bf16")
      detail::fail(ErrorCode::invalid_argument,
                   "nibble::llm: the embedding/output mode must be f32 or bf16, got '" +
                       opt.head_mode + "'");
    n_layers_ = opt.max_layers > 0 ? std::min(opt.max_layers, c_.n_layers) : c_.n_layers;
    max_ctx_ = opt.max_context > 0 ? opt.max_context : std::min<int64_t>(c_.max_context, 4096);
    if (max_ctx_ < 1 || max_ctx_ > c_.max_context)
      detail::fail(ErrorCode::invalid_argument,
                   "nibble::llm: context " + std::to_string(max_ctx_) + " is outside [1, " +
                       std::to_string(c_.max_context) + "], the model's");
    WeightSource& src = *files.weights;
    const int64_t d = c_.dim, hd = c_.head_dim, qd = c_.n_heads * hd, kvd = c_.n_kv_heads * hd;
    // Embedding and output projection in the head mode; a tied model builds both from one load.
    std::vector<float> emb = src.load("token_embd.weight", {c_.vocab_size, d});
    head_bf16_ = opt.head_mode == "bf16";
    if (head_bf16_) {
      emb_bf16_.resize(emb.size());
      for (size_t i = 0; i < emb.size(); ++i) emb_bf16_[i] = f32_to_bf16_bits(emb[i]);
    }
    std::vector<float> out =
        c_.tied_embeddings ? emb : src.load("output.weight", {c_.vocab_size, d});
    if (!head_bf16_) emb_f32_ = std::move(emb);
    output_ = make_linear(opt.head_mode, std::move(out), c_.vocab_size, d, &pool_);
    out_norm_ = src.load("output_norm.weight", {d});
    for (int64_t l = 0; l < n_layers_; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      Layer L;
      auto lin = [&](const char* name, int64_t n, int64_t k) {
        const std::string stored = src.quantized_format(p + name);
        if (stored.empty())
          return std::make_unique<StrategyLinear>(opt.strategy, src.load(p + name, {n, k}), n, k,
                                                  &pool_);
        // A pre-quantized checkpoint runs in a format with its weight format (its floats are
        // gone; the activations are quantized at run time, so their scheme may change), or
        // simulated in one (sim:FORMAT, the accuracy study).
        const std::string mode = opt.strategy.prefill;
        const std::string sim = mode.rfind(kSimPrefix, 0) == 0 ? mode.substr(4) : mode;
        const bool fits = mode != "f32" && mode != "bf16" && opt.strategy.decode == mode &&
                          parse_linear_format(sim).weight == parse_linear_format(stored).weight;
        if (!fits)
          detail::fail(ErrorCode::invalid_argument,
                       "nibble::llm: the checkpoint holds '" + p + name + "' pre-quantized as " +
                           stored + "; it runs with --format " + stored +
                           " (or another activation scheme of its weights, or sim:" + stored +
                           "), not " + opt.strategy.describe());
        return std::make_unique<StrategyLinear>(
            make_quantized_linear(mode, src.load_quantized(p + name, n, k), k, &pool_));
      };
      L.attn_norm = src.load(p + "attn_norm.weight", {d});
      L.ffn_norm = src.load(p + "ffn_norm.weight", {d});
      L.wq = lin("attn_q.weight", qd, d);
      L.wk = lin("attn_k.weight", kvd, d);
      L.wv = lin("attn_v.weight", kvd, d);
      L.wo = lin("attn_output.weight", d, qd);
      L.w_gate = lin("ffn_gate.weight", c_.ffn_dim, d);
      L.w_up = lin("ffn_up.weight", c_.ffn_dim, d);
      L.w_down = lin("ffn_down.weight", d, c_.ffn_dim);
      if (c_.qkv_bias) {
        L.bq = src.load(p + "attn_q.bias", {qd});
        L.bk = src.load(p + "attn_k.bias", {kvd});
        L.bv = src.load(p + "attn_v.bias", {kvd});
      }
      if (c_.o_bias) L.bo = src.load(p + "attn_output.bias", {d});
      if (c_.qk_norm) {
        L.q_norm = src.load(p + "attn_q_norm.weight", {hd});
        L.k_norm = src.load(p + "attn_k_norm.weight", {hd});
      }
      layers_.push_back(std::move(L));
    }
    k_cache_.assign(static_cast<size_t>(n_layers_ * max_ctx_ * kvd), 0.0f);
    v_cache_.assign(k_cache_.size(), 0.0f);
    rope_tables(c_, max_ctx_, cos_, sin_);  // f32 cos/sin of p·rate_i per position
  }

  std::string device() const override { return "cpu"; }
  const ModelConfig& config() const override { return c_; }
  int64_t n_layers() const override { return n_layers_; }
  int64_t max_context() const override { return max_ctx_; }

  void forward(std::span<const int32_t> tokens, int64_t pos, bool all_logits,
               std::vector<float>& logits) override {
    const auto m = static_cast<int64_t>(tokens.size());
    check_forward_positions(m, pos, max_ctx_);
    const int64_t d = c_.dim;
    float* x = buffer(x_, m * d);
    embed(tokens, x);
    for (int64_t l = 0; l < n_layers_; ++l) block(l, x, m, pos, nullptr);
    float* h = buffer(h_, m * d);
    const int64_t rows = all_logits ? m : 1;
    const float* last = x + (m - rows) * d;
    rmsnorm(last, out_norm_.data(), rows, d, c_.norm_eps, h);
    logits.resize(static_cast<size_t>(rows * c_.vocab_size));
    output_->forward(h, rows, logits.data());
  }

  void embed(std::span<const int32_t> tokens, float* x) const override {
    const int64_t d = c_.dim;
    for (size_t t = 0; t < tokens.size(); ++t) {
      const int32_t id = tokens[t];
      if (id < 0 || id >= c_.vocab_size)
        detail::fail(ErrorCode::invalid_argument, "nibble::llm::Backend::forward: token id " +
                                                      std::to_string(id) +
                                                      " is outside the vocabulary");
      for (int64_t i = 0; i < d; ++i)
        x[static_cast<int64_t>(t) * d + i] =
            head_bf16_ ? bf16_bits_to_f32(emb_bf16_[static_cast<size_t>(id * d + i)])
                       : emb_f32_[static_cast<size_t>(id * d + i)];
    }
  }

  void run_block(int64_t layer, float* x, int64_t m, const LinearObserver& observe) override {
    check_block_args(layer, m);
    block(layer, x, m, 0, observe ? &observe : nullptr);
  }

  void set_linear(int64_t layer, BlockLinear which, std::unique_ptr<Linear> linear) override {
    check_block_args(layer, 1);
    Layer& L = layers_[static_cast<size_t>(layer)];
    std::unique_ptr<StrategyLinear>* slots[] = {&L.wq,     &L.wk,   &L.wv,    &L.wo,
                                                &L.w_gate, &L.w_up, &L.w_down};
    auto& slot = *slots[static_cast<int>(which)];
    if (linear->n() != slot->n() || linear->k() != slot->k())
      detail::fail(ErrorCode::invalid_argument,
                   "nibble::llm::BlockRunner::set_linear: a " + std::to_string(linear->n()) + "×" +
                       std::to_string(linear->k()) + " layer cannot replace " + tensor_role(which) +
                       " (" + std::to_string(slot->n()) + "×" + std::to_string(slot->k()) + ")");
    slot = std::make_unique<StrategyLinear>(std::move(linear));
  }

  MemoryReport memory() const override {
    MemoryReport r;
    const int64_t emb =
        static_cast<int64_t>(head_bf16_ ? emb_bf16_.size() * 2 : emb_f32_.size() * 4);
    r.resident_weight_bytes =
        emb + output_->weight_bytes() + static_cast<int64_t>(out_norm_.size()) * 4;
    // A decode step reads one embedding row, every block weight and the output projection.
    r.decode_weight_bytes = output_->weight_bytes() + static_cast<int64_t>(out_norm_.size()) * 4;
    for (const Layer& L : layers_) {
      for (const auto* lin : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
        r.resident_weight_bytes += (*lin)->resident_bytes();
        r.decode_weight_bytes += (*lin)->weight_bytes();
      }
      const auto norms = static_cast<int64_t>(L.attn_norm.size() + L.ffn_norm.size()) * 4;
      r.resident_weight_bytes += norms;
      r.decode_weight_bytes += norms;
    }
    r.kv_cache_bytes = static_cast<int64_t>(k_cache_.size() + v_cache_.size()) * 4;
    return r;
  }

  std::string describe() const override {
    std::string s = "cpu backend, " + std::to_string(pool_.size()) + " threads, " +
                    std::to_string(n_layers_) + "/" + std::to_string(c_.n_layers) +
                    " layers, KV cache " + std::to_string(max_ctx_) + " tokens (f32)\n";
    s += "  embedding, output: " + output_->mode() + "\n";
    if (!layers_.empty())
      s += "  block linears (q k v o gate up down): " + layers_[0].wq->mode() + "\n";
    return s;
  }

 private:
  static float* buffer(std::vector<float>& b, int64_t n) {
    b.resize(static_cast<size_t>(n));
    return b.data();
  }

  void check_block_args(int64_t layer, int64_t m) const {
    if (layer < 0 || layer >= n_layers_ || m < 1 || m > max_ctx_)
      detail::fail(ErrorCode::invalid_argument,
                   "nibble::llm::BlockRunner: block " + std::to_string(layer) + " of " +
                       std::to_string(n_layers_) + " over " + std::to_string(m) +
                       " tokens (the context holds " + std::to_string(max_ctx_) + ")");
  }

  // Block l on x (m, dim) in place, tokens at positions pos..pos+m-1.
  void block(int64_t l, float* x, int64_t m, int64_t pos, const LinearObserver* observe) {
    const int64_t d = c_.dim, hd = c_.head_dim, qd = c_.n_heads * hd, kvd = c_.n_kv_heads * hd;
    const int64_t f = c_.ffn_dim;
    float* h = buffer(h_, m * d);
    float* q = buffer(q_, m * qd);
    float* k = buffer(k_, m * kvd);
    float* v = buffer(v_, m * kvd);
    float* att = buffer(att_, m * qd);
    float* o = buffer(o_, m * std::max(d, f));
    float* gate = buffer(gate_, m * f);
    float* up = buffer(up_, m * f);
    auto run = [&](const StrategyLinear& lin, BlockLinear which, const float* in, float* out) {
      if (observe != nullptr) (*observe)(l, which, in, m, lin.k());
      lin.forward(in, m, out);
    };
    const Layer& L = layers_[static_cast<size_t>(l)];
    rmsnorm(x, L.attn_norm.data(), m, d, c_.norm_eps, h);
    run(*L.wq, BlockLinear::q, h, q);
    run(*L.wk, BlockLinear::k, h, k);
    run(*L.wv, BlockLinear::v, h, v);
    add_bias(q, m, L.bq);
    add_bias(k, m, L.bk);
    add_bias(v, m, L.bv);
    if (c_.qk_norm) {  // each head of q and k is one row of an RMSNorm over head_dim
      rmsnorm(q, L.q_norm.data(), m * c_.n_heads, hd, c_.norm_eps, q);
      rmsnorm(k, L.k_norm.data(), m * c_.n_kv_heads, hd, c_.norm_eps, k);
    }
    for (int64_t t = 0; t < m; ++t) {
      rope(q + t * qd, c_.n_heads, pos + t);
      rope(k + t * kvd, c_.n_kv_heads, pos + t);
    }
    float* kc = k_cache_.data() + l * max_ctx_ * kvd;
    float* vc = v_cache_.data() + l * max_ctx_ * kvd;
    std::copy_n(k, m * kvd, kc + pos * kvd);
    std::copy_n(v, m * kvd, vc + pos * kvd);
    attention(q, kc, vc, m, pos, att);
    run(*L.wo, BlockLinear::o, att, o);
    add_bias(o, m, L.bo);
    for (int64_t i = 0; i < m * d; ++i) x[i] += o[i];
    rmsnorm(x, L.ffn_norm.data(), m, d, c_.norm_eps, h);
    run(*L.w_gate, BlockLinear::gate, h, gate);
    run(*L.w_up, BlockLinear::up, h, up);
    for (int64_t i = 0; i < m * f; ++i) {
      const float g = gate[i];
      gate[i] = g / (1.0f + std::exp(-g)) * up[i];  // silu(g)·u
    }
    run(*L.w_down, BlockLinear::down, gate, o);
    for (int64_t i = 0; i < m * d; ++i) x[i] += o[i];
  }

  // Rotates pairs (i, i + hd/2) of each of `heads` heads by the angles of position p.
  void rope(float* vec, int64_t heads, int64_t p) const {
    const int64_t hd = c_.head_dim, half = hd / 2;
    const float* cs = cos_.data() + p * half;
    const float* sn = sin_.data() + p * half;
    for (int64_t hh = 0; hh < heads; ++hh) {
      float* v = vec + hh * hd;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }

  // Causal attention of m query tokens at positions pos.. over the cache; one (token, head)
  // pair per task.
  void attention(const float* q, const float* kc, const float* vc, int64_t m, int64_t pos,
                 float* out) {
    const int64_t hd = c_.head_dim, qd = c_.n_heads * hd, kvd = c_.n_kv_heads * hd;
    const int64_t group = c_.n_heads / c_.n_kv_heads;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    auto run = [&](int64_t b0, int64_t b1) {
      std::vector<float> scores;
      for (int64_t task = b0; task < b1; ++task) {
        const int64_t t = task / c_.n_heads, head = task % c_.n_heads, kvh = head / group;
        const int64_t n = pos + t + 1;  // positions 0..pos+t
        scores.resize(static_cast<size_t>(n));
        const float* qv = q + t * qd + head * hd;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          scores[static_cast<size_t>(j)] = dot_f32(qv, kc + j * kvd + kvh * hd, hd) * scale;
          mx = std::max(mx, scores[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (auto& s : scores) {
          s = std::exp(s - mx);
          sum += s;
        }
        const auto inv = static_cast<float>(1.0 / sum);
        float* ov = out + t * qd + head * hd;
        std::fill(ov, ov + hd, 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float pj = scores[static_cast<size_t>(j)] * inv;
          const float* vv = vc + j * kvd + kvh * hd;
          for (int64_t i = 0; i < hd; ++i) ov[i] += pj * vv[i];
        }
      }
    };
    const int64_t work = m * c_.n_heads * (pos + m) * hd;
    if (work >= kParallelAttentionWork)
      pool_.parallel_for(m * c_.n_heads, run);
    else
      run(0, m * c_.n_heads);
  }

  ModelConfig c_;
  ThreadPool pool_;
  int64_t n_layers_ = 0, max_ctx_ = 0;
  bool head_bf16_ = true;
  std::vector<uint16_t> emb_bf16_;
  std::vector<float> emb_f32_;
  std::unique_ptr<Linear> output_;
  std::vector<float> out_norm_;
  std::vector<Layer> layers_;
  std::vector<float> k_cache_, v_cache_;                        // (layer, position, kv_head·hd)
  std::vector<float> cos_, sin_;                                // (position, hd/2)
  std::vector<float> x_, h_, q_, k_, v_, att_, o_, gate_, up_;  // scratch, reused across calls
};

}  // namespace

const char* tensor_role(BlockLinear which) {
  static const char* const names[] = {"attn_q.weight",      "attn_k.weight",   "attn_v.weight",
                                      "attn_output.weight", "ffn_gate.weight", "ffn_up.weight",
                                      "ffn_down.weight"};
  return names[static_cast<int>(which)];
}

std::string tensor_name(int64_t layer, BlockLinear which) {
  return "blk." + std::to_string(layer) + "." + tensor_role(which);
}

LinearShape linear_shape(const ModelConfig& c, BlockLinear which) {
  const int64_t d = c.dim, qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  switch (which) {
    case BlockLinear::q: return {qd, d};
    case BlockLinear::k:
    case BlockLinear::v: return {kvd, d};
    case BlockLinear::o: return {d, qd};
    case BlockLinear::gate:
    case BlockLinear::up: return {c.ffn_dim, d};
    case BlockLinear::down: return {d, c.ffn_dim};
  }
  return {0, 0};
}

std::unique_ptr<BlockRunner> make_cpu_block_runner(ModelFiles& files,
                                                   const BackendOptions& options) {
  return std::make_unique<CpuBackend>(files, options);
}

void check_forward_positions(int64_t tokens, int64_t pos, int64_t max_context) {
  if (tokens == 0)
    detail::fail(ErrorCode::invalid_argument, "nibble::llm::Backend::forward: no tokens");
  if (pos < 0 || pos + tokens > max_context)
    detail::fail(ErrorCode::out_of_range,
                 "nibble::llm::Backend::forward: positions " + std::to_string(pos) + ".." +
                     std::to_string(pos + tokens - 1) + " do not fit the context of " +
                     std::to_string(max_context) + " tokens");
}

std::unique_ptr<Backend> make_backend(const std::string& device, ModelFiles& files,
                                      const BackendOptions& options) {
  if (device == "cpu") return std::make_unique<CpuBackend>(files, options);
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
    int ordinal = 0;
    if (device != "cuda") {
      const std::string digits = device.substr(5);
      if (digits.empty() || digits.size() > 4 ||
          digits.find_first_not_of("0123456789") != std::string::npos)
        detail::fail(ErrorCode::invalid_argument,
                     "nibble::llm: device '" + device + "' is not cuda or cuda:N");
      ordinal = std::stoi(digits);
    }
#if NIBBLE_WITH_CUDA
    return make_cuda_backend(files, options, ordinal);
#else
    (void)ordinal;
    detail::fail(ErrorCode::unsupported,
                 "nibble::llm: this build of nibble has no CUDA backend (it was configured "
                 "without a CUDA compiler); use --device cpu");
#endif
  }
  detail::fail(ErrorCode::invalid_argument,
               "nibble::llm: unknown device '" + device + "' (cpu, cuda, cuda:N)");
}

}  // namespace nibble::llm
