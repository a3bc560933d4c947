// The runner: generation (greedy or sampled, with time to first token and decode speed) and
// perplexity over a token stream, on any Backend.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "llm/backend.h"

namespace nibble::llm {

struct SamplingOptions {
  double temperature = 0.0;  ///< 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 0;         ///< keep the k most likely tokens (0: all)
  double top_p = 1.0;        ///< keep the smallest set whose probability reaches p (1: all)
  uint64_t seed = 0;
};

/// Picks the next token from logits. With temperature > 0: softmax(logits / T), then top-k,
/// then top-p (nucleus) over the survivors, renormalized, drawn with a seeded mt19937_64 — so a
/// seed reproduces a run on any machine whose logits are the same.
class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o);
  int32_t sample(std::span<const float> logits);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

/// argmax with the lowest index on ties.
int32_t argmax(std::span<const float> v);

struct GenerateResult {
  std::vector<int32_t> tokens;  ///< generated tokens (the prompt excluded)
  double prefill_seconds = 0;   ///< the prompt's forward pass
  double ttft_seconds = 0;      ///< start to the first generated token (prefill + sampling)
  double decode_seconds = 0;    ///< the steps after the first token
  bool stopped = false;         ///< ended at an end-of-generation token
  /// Generated tokens after the first, per second of decode_seconds.
  double decode_tokens_per_second() const;
};

/// Runs the prompt, then generates up to `max_new` tokens. `stop(id)` (may be empty) ends the
/// run after a token for which it returns true; `on_token(id)` sees each token as it comes.
GenerateResult generate(Backend& backend, std::span<const int32_t> prompt, int64_t max_new,
                        const SamplingOptions& sampling,
                        const std::function<bool(int32_t)>& stop = {},
                        const std::function<void(int32_t)>& on_token = {});

struct PerplexityResult {
  double nll_sum = 0;  ///< Σ −log p(token | its window so far), natural log
  int64_t scored = 0;  ///< tokens scored
  int64_t windows = 0;
  double seconds = 0;
  double perplexity() const;  ///< exp(nll_sum / scored)
};

/// Perplexity of `tokens` in non-overlapping windows of `ctx` tokens, each run from position 0
/// (after a BOS token when `bos` ≥ 0); every token of a window but its first is scored from the
/// tokens before it in the window. The tail shorter than two tokens is dropped.
/// `on_window(result so far)` (may be empty) reports progress.
PerplexityResult perplexity(Backend& backend, std::span<const int32_t> tokens, int64_t ctx,
                            int32_t bos,
                            const std::function<void(const PerplexityResult&)>& on_window = {});

/// Resident set size of this process now and at its peak (Linux /proc/self/status; 0 elsewhere).
struct RssReport {
  int64_t current_bytes = 0, peak_bytes = 0;
};
RssReport process_rss();

}  // namespace nibble::llm
