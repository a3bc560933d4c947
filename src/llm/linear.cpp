#include "llm/linear.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "common/check.h"
#include "cpu/gemm_f32.h"
#include "cpu/reference.h"
#include "nibble/nibble.h"

namespace nibble::llm {

int64_t quantized_weight_bytes(const QuantizedWeight& qw) {
  return qw.q.nbytes() + (qw.scales.defined() ? qw.scales.nbytes() : 0) +
         (qw.zeros.defined() ? qw.zeros.nbytes() : 0) +
         (qw.group_scales.defined() ? qw.group_scales.nbytes() : 0);
}

std::vector<float> dequantized_weights(const QuantizedWeight& qw, int64_t k) {
  Tensor deq = Tensor::empty(DType::f32, {qw.n, qw.k});
  dequantize_weight(qw.view(), deq.view());
  std::vector<float> out(static_cast<size_t>(qw.n * k));
  for (int64_t r = 0; r < qw.n; ++r)
    std::copy_n(deq.view().ptr<float>() + r * qw.k, k, out.data() + r * k);
  return out;
}

// ---- kernels ------------------------------------------------------------------------------------

// The products are cpu::gemm_f32_nt / gemm_bf16w_nt (src/cpu/gemm_f32.h): every output exactly
// dot_f32 of its row pair, whatever the tile, the block or the thread that computes it.
float dot_f32(const float* a, const float* b, int64_t n) { return cpu::dot_f32(a, b, n); }

namespace {

// Output columns are processed in blocks of kBlockN weight rows, and the M input rows in blocks
// of kBlockM: the weight block (kBlockN·K weights, 37 KB at K = 576) stays in L1/L2 while the
// input block (147 KB at K = 576) streams by from L2.
constexpr int64_t kBlockN = 16;
constexpr int64_t kBlockM = 64;

template <class W, class Gemm>
void gemm_rows(const float* x, int64_t m, const W* w, int64_t n, int64_t k, float* y,
               ThreadPool* pool, Gemm gemm) {
  auto run = [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kBlockN, n1 = std::min(n, n0 + kBlockN);
      for (int64_t r0 = 0; r0 < m; r0 += kBlockM)
        gemm(x + r0 * k, k, std::min(kBlockM, m - r0), w + n0 * k, k, n1 - n0, k, y + r0 * n + n0,
             n);
    }
  };
  const int64_t blocks = (n + kBlockN - 1) / kBlockN;
  if (pool != nullptr && pool->size() > 1 && m * n * k >= kParallelLinearMacs)
    pool->parallel_for(blocks, run);
  else
    run(0, blocks);
}

class F32Linear final : public Linear {
 public:
  F32Linear(std::vector<float> w, int64_t n, int64_t k, ThreadPool* pool)
      : w_(std::move(w)), n_(n), k_(k), pool_(pool) {}
  void forward(const float* x, int64_t m, float* y) const override {
    gemm_rows(x, m, w_.data(), n_, k_, y, pool_, cpu::gemm_f32_nt);
  }
  int64_t n() const override { return n_; }
  int64_t k() const override { return k_; }
  int64_t weight_bytes() const override { return n_ * k_ * 4; }
  std::string mode() const override { return "f32"; }

 private:
  std::vector<float> w_;
  int64_t n_, k_;
  ThreadPool* pool_;
};

class Bf16Linear final : public Linear {
 public:
  Bf16Linear(const std::vector<float>& w, int64_t n, int64_t k, ThreadPool* pool)
      : w_(w.size()), n_(n), k_(k), pool_(pool) {
    for (size_t i = 0; i < w.size(); ++i) w_[i] = f32_to_bf16_bits(w[i]);
  }
  void forward(const float* x, int64_t m, float* y) const override {
    // The input is rounded to bf16 too: a bf16 GEMM sees bf16 activations.
    std::vector<float> xr(static_cast<size_t>(m * k_));
    for (size_t i = 0; i < xr.size(); ++i) xr[i] = round_to_dtype(x[i], DType::bf16);
    gemm_rows(xr.data(), m, w_.data(), n_, k_, y, pool_, cpu::gemm_bf16w_nt);
  }
  int64_t n() const override { return n_; }
  int64_t k() const override { return k_; }
  int64_t weight_bytes() const override { return n_ * k_ * 2; }
  std::string mode() const override { return "bf16"; }

 private:
  std::vector<uint16_t> w_;
  int64_t n_, k_;
  ThreadPool* pool_;
};

// A view of rows [r0, r1) of a rank-1 or rank-2 tensor view (empty views stay empty).
TensorView row_slice(const TensorView& t, int64_t r0, int64_t r1) {
  if (t.rank == 0) return t;
  TensorView s = t;
  s.shape[0] = r1 - r0;
  const int64_t elems = r0 * t.stride(0);
  s.data = static_cast<uint8_t*>(t.data) + dtype_storage_bytes(t.dtype, elems);
  return s;
}

QuantizedWeightView weight_rows(const QuantizedWeightView& w, int64_t r0, int64_t r1) {
  QuantizedWeightView s = w;
  s.n = r1 - r0;
  s.q = row_slice(w.q, r0, r1);
  s.scales = row_slice(w.scales, r0, r1);
  s.zeros = row_slice(w.zeros, r0, r1);
  s.group_scales = row_slice(w.group_scales, r0, r1);
  return s;
}

// A layer in a nibble linear format, run through the public API on the CPU reference backend.
class NibbleLinear final : public Linear {
 public:
  NibbleLinear(const LinearFormat& f, const std::string& name, const std::vector<float>& w,
               int64_t n, int64_t k, ThreadPool* pool)
      : format_(f), name_(name), n_(n), k_(k), kp_(padded_k(name, k)), pool_(pool) {
    // Pad K to the group size (and to an even count for packed int4): zero columns of W meet
    // zero columns of x, so the products are those of the unpadded layer.
    std::vector<float> wp = pad_columns(w, n, k, kp_);
    qw_ = QuantizedWeight(f.weight, n, kp_);
    quantize_weight(TensorView::contiguous(wp.data(), DType::f32, {n, kp_}), qw_.view());
  }

  NibbleLinear(const LinearFormat& f, const std::string& name, QuantizedWeight qw, int64_t k,
               ThreadPool* pool)
      : format_(f),
        name_(name),
        n_(qw.n),
        k_(k),
        kp_(padded_k(name, k)),
        qw_(std::move(qw)),
        pool_(pool) {
    if (!(qw_.format == f.weight) || qw_.k != kp_)
      detail::fail(ErrorCode::invalid_argument,
                   "nibble::llm::make_quantized_linear: weights of format " +
                       to_string(qw_.format) + " with K = " + std::to_string(qw_.k) +
                       " do not fit " + name + " with K = " + std::to_string(k) + " (padded " +
                       std::to_string(kp_) + ")");
  }

  void forward(const float* x, int64_t m, float* y) const override {
    // The input, padded to kp_ columns.
    Tensor xp = Tensor::empty(DType::f32, {m, kp_});
    float* xd = xp.view().ptr<float>();
    for (int64_t r = 0; r < m; ++r) {
      std::copy_n(x + r * k_, k_, xd + r * kp_);
      std::fill(xd + r * kp_ + k_, xd + (r + 1) * kp_, 0.0f);
    }
    const QuantizedWeightView wv = qw_.view();
    const TensorView yv = TensorView::contiguous(y, DType::f32, {m, n_});
    // Output columns split over the pool; each chunk is one call of the public linear on a
    // row range of W (row views of q, scales, zeros) writing a column range of y.
    const int64_t chunks = pool_ != nullptr && m * n_ * kp_ >= kParallelLinearMacs ? pool_->size() : 1;
    const int64_t step = (n_ + chunks - 1) / chunks;
    auto run = [&](auto&& call) {
      auto part = [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t r0 = c * step, r1 = std::min(n_, r0 + step);
          if (r0 >= r1) continue;
          TensorView yc = yv;
          yc.shape[1] = r1 - r0;
          yc.data = y + r0;
          call(weight_rows(wv, r0, r1), yc);
        }
      };
      if (chunks > 1)
        pool_->parallel_for(chunks, part);
      else
        part(0, 1);
    };
    if (format_.act == ActScheme::none) {
      // Weight-only formats: the activations enter as bf16, as they would on the GPU.
      Tensor xb = Tensor::empty(DType::bf16, {m, kp_});
      for (int64_t i = 0; i < m * kp_; ++i) store_float(xb.data(), DType::bf16, i, xd[i]);
      run([&](const QuantizedWeightView& wc, const TensorView& yc) {
        linear(xb.view(), wc, nullptr, yc);
      });
      return;
    }
    QuantizedActivation qa(format_.act, m, kp_);
    quantize_activation(xp.view(), qa.view());
    run([&](const QuantizedWeightView& wc, const TensorView& yc) {
      linear(qa.view(), wc, nullptr, yc);
    });
  }

  int64_t n() const override { return n_; }
  int64_t k() const override { return k_; }
  int64_t weight_bytes() const override { return quantized_weight_bytes(qw_); }
  std::string mode() const override { return name_; }
  const QuantizedWeight* quantized() const override { return &qw_; }

 private:
  LinearFormat format_;
  std::string name_;
  int64_t n_, k_, kp_;
  QuantizedWeight qw_;
  ThreadPool* pool_;
};

// The study-only simulated mode "sim:<format>" (docs/accuracy.md): the weights of a nibble format
// dequantized to f32 once, and the activations quantized and dequantized per token as the format
// quantizes them (A16: rounded to bf16, as NibbleLinear feeds them), then the f32 product. The
// reference linear computes the same numbers in another order (integer sums, then scales), so
// the two differ by f32 rounding only; LlmLinear.SimulatedModesMatchTheReferenceLinear and
// docs/accuracy.md measure it.
class SimLinear final : public Linear {
 public:
  SimLinear(const LinearFormat& f, const std::string& name, const QuantizedWeight& qw, int64_t k,
            ThreadPool* pool)
      : act_(f.act),
        name_(name),
        n_(qw.n),
        k_(k),
        bytes_(quantized_weight_bytes(qw)),
        w_(dequantized_weights(qw, k)),
        pool_(pool) {}

  void forward(const float* x, int64_t m, float* y) const override {
    std::vector<float> xq(x, x + m * k_);
    for (int64_t r = 0; r < m; ++r) fake_quantize_row(xq.data() + r * k_);
    gemm_rows(xq.data(), m, w_.data(), n_, k_, y, pool_, cpu::gemm_f32_nt);
  }
  int64_t n() const override { return n_; }
  int64_t k() const override { return k_; }
  int64_t weight_bytes() const override { return bytes_; }
  std::string mode() const override { return name_; }

 private:
  // One token's activations through the format's per-token quantizer and back (formats.md,
  // table 2): s = amax / qmax, q = quantize_int(x, s, ±qmax) (e4m3: the satfinite conversion).
  void fake_quantize_row(float* v) const {
    if (act_ == ActScheme::none) {
      for (int64_t i = 0; i < k_; ++i) v[i] = round_to_dtype(v[i], DType::bf16);
      return;
    }
    const float qmax = act_ == ActScheme::s4_per_token     ? 7.0f
                       : act_ == ActScheme::e4m3_per_token ? 448.0f
                                                           : 127.0f;
    float amax = 0.0f;
    for (int64_t i = 0; i < k_; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float s = amax / qmax;
    for (int64_t i = 0; i < k_; ++i) {
      if (act_ == ActScheme::e4m3_per_token)
        v[i] = s == 0.0f ? 0.0f : s * round_to_dtype(v[i] / s, DType::e4m3);
      else
        v[i] = s * static_cast<float>(
                       cpu::quantize_int(v[i], s, -static_cast<int>(qmax), static_cast<int>(qmax)));
    }
  }

  ActScheme act_;
  std::string name_;
  int64_t n_, k_, bytes_;
  std::vector<float> w_;  // (n, k): deq(W) without the padding
  ThreadPool* pool_;
};

// "sim:w4a8_g128" → "w4a8_g128"; "" when the mode is not simulated.
std::string simulated_format(const std::string& mode) {
  return mode.rfind(kSimPrefix, 0) == 0 ? mode.substr(sizeof kSimPrefix - 1) : std::string();
}

}  // namespace

void check_weight_mode(const std::string& mode) {
  if (mode == "f32" || mode == "bf16") return;
  const std::string sim = simulated_format(mode);
  LinearFormat f;
  try {
    f = parse_linear_format(sim.empty() ? mode : sim);
  } catch (const Error&) {
    detail::fail(ErrorCode::invalid_argument,
                 "nibble::llm: unknown weight format '" + mode +
                     "' (f32, bf16, or a nibble linear format such as w4a8_pc, w4a8_g128, w8a8, "
                     "w4a16_g128, w4a16_g128_asym, optionally as sim:FORMAT; `nibble formats` "
                     "lists them)");
  }
  if (f.act == ActScheme::s8_per_tensor)
    detail::fail(ErrorCode::unsupported, "nibble::llm: '" + mode +
                                             "' needs calibrated static activation scales, which "
                                             "the runner does not compute");
}

std::vector<float> pad_columns(const std::vector<float>& w, int64_t n, int64_t k, int64_t kp) {
  if (kp == k) return w;
  std::vector<float> out(static_cast<size_t>(n * kp), 0.0f);
  for (int64_t r = 0; r < n; ++r) std::copy_n(w.data() + r * k, k, out.data() + r * kp);
  return out;
}

int64_t padded_k(const std::string& mode, int64_t k) {
  if (mode == "f32" || mode == "bf16") return k;
  const std::string sim = simulated_format(mode);
  const LinearFormat f = parse_linear_format(sim.empty() ? mode : sim);
  const int64_t g = f.weight.per_channel()
                        ? (dtype_bits(weight_value_dtype(f.weight.scheme)) == 4 ? 2 : 1)
                        : f.weight.group_size;
  return (k + g - 1) / g * g;
}

std::unique_ptr<Linear> make_quantized_linear(const std::string& mode, QuantizedWeight qw,
                                              int64_t k, ThreadPool* pool) {
  check_weight_mode(mode);
  if (mode == "f32" || mode == "bf16")
    detail::fail(ErrorCode::invalid_argument,
                 "nibble::llm::make_quantized_linear: '" + mode + "' is not a quantized format");
  if (const std::string sim = simulated_format(mode); !sim.empty()) {
    const LinearFormat f = parse_linear_format(sim);
    if (!(qw.format == f.weight) || qw.k != padded_k(sim, k))
      detail::fail(ErrorCode::invalid_argument,
                   "nibble::llm::make_quantized_linear: weights of format " + to_string(qw.format) +
                       " with K = " + std::to_string(qw.k) + " do not fit " + mode +
                       " with K = " + std::to_string(k));
    return std::make_unique<SimLinear>(f, mode, qw, k, pool);
  }
  return std::make_unique<NibbleLinear>(parse_linear_format(mode), mode, std::move(qw), k, pool);
}

std::unique_ptr<Linear> make_linear(const std::string& mode, std::vector<float> w, int64_t n,
                                    int64_t k, ThreadPool* pool) {
  check_weight_mode(mode);
  if (static_cast<int64_t>(w.size()) != n * k)
    detail::fail(ErrorCode::internal, "nibble::llm::make_linear: weight size does not match n·k");
  if (mode == "f32") return std::make_unique<F32Linear>(std::move(w), n, k, pool);
  if (mode == "bf16") return std::make_unique<Bf16Linear>(w, n, k, pool);
  if (const std::string sim = simulated_format(mode); !sim.empty()) {
    // Quantized exactly as the reference mode quantizes (round to nearest, K padded).
    const NibbleLinear ref(parse_linear_format(sim), sim, w, n, k, nullptr);
    return std::make_unique<SimLinear>(parse_linear_format(sim), mode, *ref.quantized(), k, pool);
  }
  return std::make_unique<NibbleLinear>(parse_linear_format(mode), mode, w, n, k, pool);
}

StrategyLinear::StrategyLinear(const LinearStrategy& s, std::vector<float> w, int64_t n, int64_t k,
                               ThreadPool* pool) {
  if (s.decode != s.prefill) decode_ = make_linear(s.decode, w, n, k, pool);
  prefill_ = make_linear(s.prefill, std::move(w), n, k, pool);
}

void StrategyLinear::forward(const float* x, int64_t m, float* y) const {
  (m == 1 && decode_ ? decode_ : prefill_)->forward(x, m, y);
}

int64_t StrategyLinear::resident_bytes() const {
  return prefill_->weight_bytes() + (decode_ ? decode_->weight_bytes() : 0);
}

std::string StrategyLinear::mode() const {
  return decode_ ? prefill_->mode() + " prefill / " + decode_->mode() + " decode"
                 : prefill_->mode();
}

// ---- thread pool --------------------------------------------------------------------------------

struct ThreadPool::State {
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  uint64_t generation = 0;
  int pending = 0;
  bool stop = false;
  std::vector<std::thread> workers;
};

ThreadPool::ThreadPool(int threads)
    : threads_(std::max(1, threads)), state_(std::make_unique<State>()) {
  for (int t = 1; t < threads_; ++t)
    state_->workers.emplace_back([this, t] {
      State& s = *state_;
      uint64_t seen = 0;
      while (true) {
        std::unique_lock<std::mutex> lock(s.mu);
        s.work_cv.wait(lock, [&] { return s.stop || s.generation != seen; });
        if (s.stop) return;
        seen = s.generation;
        const auto* fn = s.fn;
        const int64_t n = s.n;
        lock.unlock();
        const int64_t b0 = n * t / threads_, b1 = n * (t + 1) / threads_;
        if (b0 < b1) (*fn)(b0, b1);
        lock.lock();
        if (--s.pending == 0) s.done_cv.notify_one();
      }
    });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  for (auto& w : state_->workers) w.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (threads_ == 1 || n <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.fn = &fn;
    s.n = n;
    s.pending = threads_ - 1;
    ++s.generation;
  }
  s.work_cv.notify_all();
  const int64_t b1 = n / threads_;  // the calling thread takes chunk 0
  if (b1 > 0) fn(0, b1);
  std::unique_lock<std::mutex> lock(s.mu);
  s.done_cv.wait(lock, [&] { return s.pending == 0; });
}

}  // namespace nibble::llm
