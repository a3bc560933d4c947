#include "llm/quantize_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>

#include "common/check.h"
#include "llm/backend.h"
#include "llm/linear.h"
#include "nibble/nibble.h"

namespace nibble::llm {

namespace {

[[noreturn]] void fail_quant(const std::string& msg, ErrorCode code = ErrorCode::invalid_argument) {
  detail::fail(code, "nibble::llm::quantize_model: " + msg);
}

// The linears reading one input: q/k/v, o, gate/up, down. Observers and Hessians are kept per
// input, under the first linear of each group.
BlockLinear input_of(BlockLinear which) {
  switch (which) {
    case BlockLinear::k:
    case BlockLinear::v:
      return BlockLinear::q;
    case BlockLinear::up:
      return BlockLinear::gate;
    default:
      return which;
  }
}
constexpr BlockLinear kInputs[] = {BlockLinear::q, BlockLinear::o, BlockLinear::gate,
                                   BlockLinear::down};

// Folds SmoothQuant into the float weights of one block (see quantize_model.h).
void fold_smoothquant(MemorySource& mem, const ModelConfig& c, int64_t layer,
                      const std::map<BlockLinear, std::vector<float>>& act, double alpha) {
  auto colmax = [&](std::initializer_list<BlockLinear> ls) {
    std::vector<float> m;
    for (BlockLinear l : ls) {
      const LinearShape s = linear_shape(c, l);
      m.resize(static_cast<size_t>(s.k), 0.0f);
      std::vector<float>& w = mem.values(tensor_name(layer, l));
      column_absmax(TensorView::contiguous(w.data(), DType::f32, {s.n, s.k}), m);
    }
    return m;
  };
  auto scale_cols = [&](BlockLinear l, const std::vector<float>& s) {
    const LinearShape sh = linear_shape(c, l);
    std::vector<float>& w = mem.values(tensor_name(layer, l));
    scale_weight_columns(TensorView::contiguous(w.data(), DType::f32, {sh.n, sh.k}), s);
  };
  auto divide_rows = [&](BlockLinear l, const std::vector<float>& s) {
    const LinearShape sh = linear_shape(c, l);
    std::vector<float>& w = mem.values(tensor_name(layer, l));
    for (int64_t r = 0; r < sh.n; ++r)
      for (int64_t i = 0; i < sh.k; ++i)
        w[static_cast<size_t>(r * sh.k + i)] /= s[static_cast<size_t>(r)];
  };
  auto divide_norm = [&](const char* role, const std::vector<float>& s) {
    std::vector<float>& g = mem.values("blk." + std::to_string(layer) + "." + role);
    for (size_t i = 0; i < g.size(); ++i) g[i] /= s[i];
  };
  const std::string blk = "blk." + std::to_string(layer) + ".";
  // q/k/v and gate/up: 1/s into the RMSNorm weight that produces their input.
  const auto s_qkv = smoothquant_scales(
      act.at(BlockLinear::q), colmax({BlockLinear::q, BlockLinear::k, BlockLinear::v}), alpha);
  divide_norm("attn_norm.weight", s_qkv);
  for (BlockLinear l : {BlockLinear::q, BlockLinear::k, BlockLinear::v}) scale_cols(l, s_qkv);
  const auto s_gu = smoothquant_scales(act.at(BlockLinear::gate),
                                       colmax({BlockLinear::gate, BlockLinear::up}), alpha);
  divide_norm("ffn_norm.weight", s_gu);
  for (BlockLinear l : {BlockLinear::gate, BlockLinear::up}) scale_cols(l, s_gu);
  // o: its input channel (h, i) is a convex combination of v's output channel (h / group, i),
  // so 1/s goes into the rows of v; one s per KV channel, from the maxima over its query heads.
  const int64_t hd = c.head_dim, group = c.n_heads / c.n_kv_heads, kvd = c.n_kv_heads * hd;
  const std::vector<float> o_w = colmax({BlockLinear::o});
  const std::vector<float>& o_a = act.at(BlockLinear::o);
  std::vector<float> kv_a(static_cast<size_t>(kvd), 0.0f), kv_w(kv_a.size(), 0.0f);
  for (int64_t h = 0; h < c.n_heads; ++h)
    for (int64_t i = 0; i < hd; ++i) {
      const auto src = static_cast<size_t>(h * hd + i),
                 dst = static_cast<size_t>((h / group) * hd + i);
      kv_a[dst] = std::max(kv_a[dst], o_a[src]);
      kv_w[dst] = std::max(kv_w[dst], o_w[src]);
    }
  const auto s_kv = smoothquant_scales(kv_a, kv_w, alpha);
  std::vector<float> s_o(static_cast<size_t>(c.n_heads * hd));
  for (int64_t h = 0; h < c.n_heads; ++h)
    for (int64_t i = 0; i < hd; ++i)
      s_o[static_cast<size_t>(h * hd + i)] = s_kv[static_cast<size_t>((h / group) * hd + i)];
  divide_rows(BlockLinear::v, s_kv);
  if (c.qkv_bias) {  // v's output channel is v·x + b: its bias is divided with its row
    std::vector<float>& b = mem.values(blk + "attn_v.bias");
    for (size_t i = 0; i < b.size(); ++i) b[i] /= s_kv[i];
  }
  scale_cols(BlockLinear::o, s_o);
  // down: its input silu(gate)·up is linear in up's output, so 1/s goes into the rows of up.
  const auto s_down =
      smoothquant_scales(act.at(BlockLinear::down), colmax({BlockLinear::down}), alpha);
  divide_rows(BlockLinear::up, s_down);
  scale_cols(BlockLinear::down, s_down);
}

}  // namespace

bool needs_calibration(const std::string& method) {
  return method == "gptq" || method == "smoothquant-rtn" || method == "smoothquant-gptq";
}

std::vector<std::vector<int32_t>> calibration_windows(const Tokenizer& tokenizer,
                                                      std::string_view text, int64_t samples,
                                                      int64_t len, uint64_t seed) {
  if (samples < 1 || len < 2)
    fail_quant("calibration needs at least 1 window of at least 2 tokens, got " +
               std::to_string(samples) + " of " + std::to_string(len));
  if (text.empty()) fail_quant("the calibration text is empty");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> offset(0, text.size() - 1);
  std::vector<std::vector<int32_t>> out;
  for (int64_t s = 0; s < samples; ++s) {
    size_t b = offset(rng);
    while (b > 0 && text[b - 1] != '\n') --b;  // the start of its line
    // Tokenize from b in pieces of 8 bytes per wanted token, doubling until len tokens come
    // (a piece may cut its last word; 16 tokens of margin keep that cut beyond len).
    std::vector<int32_t> ids;
    for (size_t bytes = static_cast<size_t>(len) * 8;; bytes *= 2) {
      const std::string_view piece = text.substr(b, bytes);
      ids = tokenizer.encode(piece, false);
      if (static_cast<int64_t>(ids.size()) > len + 16 || b + bytes >= text.size()) break;
    }
    if (static_cast<int64_t>(ids.size()) < len)
      fail_quant("the calibration text has fewer than " + std::to_string(len) +
                 " tokens after byte " + std::to_string(b));
    ids.resize(static_cast<size_t>(len));
    out.push_back(std::move(ids));
  }
  return out;
}

ModelFiles quantize_model(ModelFiles& model, const std::vector<std::vector<int32_t>>& calib,
                          const ModelQuantOptions& opt,
                          const std::function<void(const QuantizeProgress&)>& progress) {
  const std::string& m = opt.method;
  if (m != "rtn" && m != "rtn-mse" && m != "gptq" && m != "smoothquant-rtn" &&
      m != "smoothquant-gptq")
    fail_quant("unknown method '" + m + "' (" + kQuantMethods + ")");
  check_weight_mode(opt.format);
  if (opt.format == "f32" || opt.format == "bf16" || opt.format.rfind(kSimPrefix, 0) == 0)
    fail_quant("the format must be a nibble linear format, got '" + opt.format + "'");
  const LinearFormat lf = parse_linear_format(opt.format);
  const bool symmetric =
      lf.weight.scheme == WeightScheme::s4_sym || lf.weight.scheme == WeightScheme::s8_sym;
  if (!symmetric && (m != "rtn" || opt.weights.qmax != 0))
    fail_quant("method " + m +
               " needs a symmetric weight format (w4a8_*, w8a8*, w4a16_g*, "
               "w8a16, ...), got " +
               opt.format);
  if (needs_calibration(m) && calib.empty()) fail_quant("method " + m + " needs calibration text");
  const bool smooth = m.rfind("smoothquant-", 0) == 0;
  const bool gptq = m == "gptq" || m == "smoothquant-gptq";
  const ModelConfig& c = model.config;
  for (const auto& w : calib)
    if (w.empty() || static_cast<int64_t>(w.size()) > c.max_context)
      fail_quant("a calibration window must hold 1 to " + std::to_string(c.max_context) +
                 " tokens");
  auto report = [&](const char* stage, int64_t done, int64_t total) {
    if (progress) progress({stage, done, total});
  };

  // Every float the result needs, under the canonical names.
  auto mem_owned = std::make_unique<MemorySource>();
  MemorySource& mem = *mem_owned;
  const int64_t d = c.dim;
  auto copy = [&](const std::string& name, std::vector<int64_t> shape) {
    std::vector<float> v;
    if (shape.size() == 1)
      v = model.weights->load(name, {shape[0]});
    else
      v = model.weights->load(name, {shape[0], shape[1]});
    mem.put(name, std::move(shape), std::move(v));
  };
  copy("token_embd.weight", {c.vocab_size, d});
  copy("output_norm.weight", {d});
  if (!c.tied_embeddings) copy("output.weight", {c.vocab_size, d});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    copy("blk." + std::to_string(l) + ".attn_norm.weight", {d});
    copy("blk." + std::to_string(l) + ".ffn_norm.weight", {d});
    const std::string p = "blk." + std::to_string(l) + ".";
    const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
    if (c.qkv_bias) {  // biases are added after the product: quantization leaves them alone
      copy(p + "attn_q.bias", {qd});
      copy(p + "attn_k.bias", {kvd});
      copy(p + "attn_v.bias", {kvd});
    }
    if (c.o_bias) copy(p + "attn_output.bias", {d});
    if (c.qk_norm) {  // on q's and k's outputs: smoothing their inputs leaves them alone
      copy(p + "attn_q_norm.weight", {c.head_dim});
      copy(p + "attn_k_norm.weight", {c.head_dim});
    }
    for (BlockLinear which : kBlockLinears) {
      const LinearShape s = linear_shape(c, which);
      copy(tensor_name(l, which), {s.n, s.k});
    }
  }
  ModelFiles work;
  work.config = c;
  work.tokenizer = model.tokenizer;
  work.path = model.path + " (" + m + ", " + opt.format + ")";
  work.weights = std::move(mem_owned);

  BackendOptions bo;
  bo.strategy = {"f32", "f32"};
  bo.head_mode = "f32";
  bo.threads = opt.threads;
  int64_t ctx = 1;
  for (const auto& w : calib) ctx = std::max<int64_t>(ctx, static_cast<int64_t>(w.size()));
  bo.max_context = ctx;

  if (smooth) {
    // One f32 pass: per-channel max |x| of the four inputs of every block.
    std::vector<std::map<BlockLinear, std::vector<float>>> act(static_cast<size_t>(c.n_layers));
    for (auto& a : act)
      for (BlockLinear in : kInputs) a[in].assign(static_cast<size_t>(linear_shape(c, in).k), 0.0f);
    auto runner = make_cpu_block_runner(work, bo);
    const LinearObserver observe = [&](int64_t layer, BlockLinear which, const float* x,
                                       int64_t rows, int64_t k) {
      if (input_of(which) != which) return;  // k, v, up: the input q / gate already saw
      std::vector<float>& a = act[static_cast<size_t>(layer)][which];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < k; ++i)
          a[static_cast<size_t>(i)] = std::max(a[static_cast<size_t>(i)], std::fabs(x[r * k + i]));
    };
    std::vector<float> x;
    for (size_t s = 0; s < calib.size(); ++s) {
      const auto len = static_cast<int64_t>(calib[s].size());
      x.resize(static_cast<size_t>(len * d));
      runner->embed(calib[s], x.data());
      for (int64_t l = 0; l < c.n_layers; ++l) runner->run_block(l, x.data(), len, observe);
      report("smoothquant statistics", static_cast<int64_t>(s) + 1,
             static_cast<int64_t>(calib.size()));
    }
    for (int64_t l = 0; l < c.n_layers; ++l)
      fold_smoothquant(mem, c, l, act[static_cast<size_t>(l)], opt.alpha);
  }

  GptqOptions wopt = opt.weights;
  if (m == "rtn-mse") wopt.clip = ClipMethod::mse;
  const int64_t total = c.n_layers * 7;
  // One linear of block l, quantized with `h` (GPTQ) or by rounding; stored in mem.
  auto quantize_one = [&](int64_t l, BlockLinear which, const GptqHessian* h) {
    const LinearShape s = linear_shape(c, which);
    const std::string name = tensor_name(l, which);
    const int64_t kp = padded_k(opt.format, s.k);
    std::vector<float> w = pad_columns(mem.values(name), s.n, s.k, kp);
    const TensorView wv = TensorView::contiguous(w.data(), DType::f32, {s.n, kp});
    QuantizedWeight qw(lf.weight, s.n, kp);
    if (h != nullptr)
      quantize_weight_gptq(wv, *h, qw.view(), wopt);
    else if (symmetric)
      quantize_weight_rtn(wv, qw.view(), wopt);
    else
      quantize_weight(wv, qw.view());
    mem.put_quantized(name, opt.format, std::move(qw));
  };

  if (!gptq) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (BlockLinear which : kBlockLinears) quantize_one(l, which, nullptr);
      report("rtn", (l + 1) * 7, total);
    }
    return work;
  }

  // GPTQ, block by block. x[s]: the hidden states of window s entering the current block.
  ThreadPool pool(bo.threads > 0 ? bo.threads : 2);
  auto runner = make_cpu_block_runner(work, bo);
  std::vector<std::vector<float>> xs(calib.size());
  for (size_t s = 0; s < calib.size(); ++s) {
    xs[s].resize(calib[s].size() * static_cast<size_t>(d));
    runner->embed(calib[s], xs[s].data());
  }
  std::vector<float> tmp, padded;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::map<BlockLinear, std::unique_ptr<GptqHessian>> hs;
    for (BlockLinear in : kInputs)
      hs[in] = std::make_unique<GptqHessian>(padded_k(opt.format, linear_shape(c, in).k));
    const LinearObserver observe = [&](int64_t, BlockLinear which, const float* x, int64_t rows,
                                       int64_t k) {
      if (input_of(which) != which) return;
      GptqHessian& h = *hs[which];
      const int64_t kp = h.k();  // padded columns of x are zeros: dead columns for GPTQ
      padded.assign(static_cast<size_t>(rows * kp), 0.0f);
      for (int64_t r = 0; r < rows; ++r) std::copy_n(x + r * k, k, padded.data() + r * kp);
      h.add(TensorView::contiguous(padded.data(), DType::f32, {rows, kp}));
    };
    for (size_t s = 0; s < calib.size(); ++s) {  // block l in f32, its output discarded
      tmp = xs[s];
      runner->run_block(l, tmp.data(), static_cast<int64_t>(calib[s].size()), observe);
    }
    // The seven GPTQ runs are independent: spread over the pool, the largest first so that
    // the two contiguous halves take about as long.
    static constexpr BlockLinear order[] = {BlockLinear::down, BlockLinear::q, BlockLinear::k,
                                            BlockLinear::v,    BlockLinear::o, BlockLinear::gate,
                                            BlockLinear::up};
    pool.parallel_for(7, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) quantize_one(l, order[i], hs[input_of(order[i])].get());
    });
    for (BlockLinear which : kBlockLinears) {
      const LinearShape s = linear_shape(c, which);
      const std::string name = tensor_name(l, which);
      runner->set_linear(
          l, which,
          make_linear("f32", dequantized_weights(mem.load_quantized(name, s.n, s.k), s.k), s.n, s.k,
                      &pool));
    }
    for (size_t s = 0; s < calib.size(); ++s)  // block l quantized: the next block's inputs
      runner->run_block(l, xs[s].data(), static_cast<int64_t>(calib[s].size()), {});
    report("gptq", (l + 1) * 7, total);
  }
  return work;
}

}  // namespace nibble::llm
