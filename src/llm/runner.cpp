#include "llm/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/check.h"

namespace nibble::llm {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

int32_t argmax(std::span<const float> v) {
  int32_t best = 0;
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] > v[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

void Backend::decode_greedy(int32_t token, int64_t pos, int64_t steps,
                            const std::function<bool(int32_t)>& on_token) {
  std::vector<float> logits;
  for (int64_t i = 0; i < steps; ++i) {
    const int32_t one[1] = {token};
    forward(one, pos + i, false, logits);
    token = argmax(logits);
    if (!on_token(token)) return;
  }
}

Sampler::Sampler(const SamplingOptions& o) : o_(o), rng_(o.seed) {
  if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
    detail::fail(ErrorCode::invalid_argument, "nibble::llm::Sampler: temperature must be ≥ 0");
  if (o.top_k < 0)
    detail::fail(ErrorCode::invalid_argument, "nibble::llm::Sampler: top_k must be ≥ 0");
  if (!(o.top_p > 0.0 && o.top_p <= 1.0))
    detail::fail(ErrorCode::invalid_argument, "nibble::llm::Sampler: top_p must be in (0, 1]");
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (o_.temperature == 0.0) return argmax(logits);
  cand_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) cand_[i] = {logits[i], static_cast<int32_t>(i)};
  // Most likely first (ties by id, so the order is the same everywhere).
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t keep = cand_.size();
  if (o_.top_k > 0 && static_cast<size_t>(o_.top_k) < keep) {
    keep = static_cast<size_t>(o_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(keep), cand_.end(),
                      by_logit);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax of logit/T over the kept candidates, in double.
  std::vector<double> p(keep);
  const double mx = cand_[0].first;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((cand_[i].first - mx) / o_.temperature);
    sum += p[i];
  }
  if (o_.top_p < 1.0) {
    double acc = 0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      acc += p[i] / sum;
      if (acc >= o_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += p[i];
  }
  const double r = std::uniform_real_distribution<double>(0.0, sum)(rng_);
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (r < acc) return cand_[i].second;
  }
  return cand_[keep - 1].second;
}

double GenerateResult::decode_tokens_per_second() const {
  return tokens.size() > 1 && decode_seconds > 0
             ? static_cast<double>(tokens.size() - 1) / decode_seconds
             : 0.0;
}

GenerateResult generate(Backend& backend, std::span<const int32_t> prompt, int64_t max_new,
                        const SamplingOptions& sampling, const std::function<bool(int32_t)>& stop,
                        const std::function<void(int32_t)>& on_token) {
  if (prompt.empty())
    detail::fail(ErrorCode::invalid_argument, "nibble::llm::generate: the prompt has no tokens");
  if (max_new < 0) detail::fail(ErrorCode::invalid_argument, "nibble::llm::generate: max_new < 0");
  const auto np = static_cast<int64_t>(prompt.size());
  if (np + max_new > backend.max_context())
    detail::fail(ErrorCode::out_of_range,
                 "nibble::llm::generate: " + std::to_string(np) + " prompt + " +
                     std::to_string(max_new) + " new tokens exceed the context of " +
                     std::to_string(backend.max_context()) + " (raise --ctx-size)");
  GenerateResult r;
  if (max_new == 0) return r;
  Sampler sampler(sampling);
  std::vector<float> logits;
  const double t0 = now_seconds();
  backend.forward(prompt, 0, false, logits);
  r.prefill_seconds = now_seconds() - t0;
  int32_t next = sampler.sample(logits);
  r.ttft_seconds = now_seconds() - t0;
  const double t1 = now_seconds();
  // Takes a token; false when the run ends with it.
  auto take = [&](int32_t t) {
    r.tokens.push_back(t);
    if (on_token) on_token(t);
    if (stop && stop(t)) {
      r.stopped = true;
      return false;
    }
    return static_cast<int64_t>(r.tokens.size()) < max_new;
  };
  if (take(next)) {
    if (sampling.temperature == 0.0) {  // greedy: the backend may pick tokens on its device
      backend.decode_greedy(next, np, max_new - 1, take);
    } else {
      for (int64_t i = 0;; ++i) {
        const int32_t one[1] = {next};
        backend.forward(one, np + i, false, logits);
        next = sampler.sample(logits);
        if (!take(next)) break;
      }
    }
  }
  r.decode_seconds = now_seconds() - t1;
  return r;
}

double PerplexityResult::perplexity() const {
  return scored > 0 ? std::exp(nll_sum / static_cast<double>(scored)) : 0.0;
}

PerplexityResult perplexity(Backend& backend, std::span<const int32_t> tokens, int64_t ctx,
                            int32_t bos,
                            const std::function<void(const PerplexityResult&)>& on_window) {
  const int64_t slots = ctx - (bos >= 0 ? 1 : 0);  // text tokens per window
  if (ctx < 2 || ctx > backend.max_context() || slots < 2)
    detail::fail(ErrorCode::invalid_argument, "nibble::llm::perplexity: the window of " +
                                                  std::to_string(ctx) + " tokens must be in [2, " +
                                                  std::to_string(backend.max_context()) +
                                                  "] (with BOS, 3)");
  PerplexityResult r;
  const double t0 = now_seconds();
  std::vector<int32_t> window;
  std::vector<float> logits;
  const auto vocab = backend.config().vocab_size;
  for (size_t start = 0; start + 1 < tokens.size(); start += static_cast<size_t>(slots)) {
    const size_t len = std::min(static_cast<size_t>(slots), tokens.size() - start);
    if (len < 2) break;
    window.clear();
    if (bos >= 0) window.push_back(bos);
    window.insert(window.end(), tokens.begin() + static_cast<std::ptrdiff_t>(start),
                  tokens.begin() + static_cast<std::ptrdiff_t>(start + len));
    backend.forward(window, 0, true, logits);
    // Row i predicts window[i + 1]; the first text token (after BOS, if any) is not scored.
    const size_t first = bos >= 0 ? 1 : 0;
    for (size_t i = first; i + 1 < window.size(); ++i) {
      const float* row = logits.data() + i * static_cast<size_t>(vocab);
      double mx = row[0];
      for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      double sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
      r.nll_sum += -(static_cast<double>(row[window[i + 1]]) - mx - std::log(sum));
      ++r.scored;
    }
    ++r.windows;
    r.seconds = now_seconds() - t0;
    if (on_window) on_window(r);
  }
  r.seconds = now_seconds() - t0;
  return r;
}

RssReport process_rss() {
  RssReport r;
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string key;
    int64_t kb = 0;
    is >> key >> kb;
    if (key == "VmRSS:") r.current_bytes = kb * 1024;
    if (key == "VmHWM:") r.peak_bytes = kb * 1024;
  }
  return r;
}

}  // namespace nibble::llm
