// The runner's commands: `nibble info MODEL`, `nibble generate MODEL ...`,
// `nibble perplexity MODEL --text FILE ...` (src/llm/ does the work; this file parses options
// and prints).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "cli.h"
#include "llm/backend.h"
#include "llm/file_util.h"
#include "llm/model_files.h"
#include "llm/quantize_model.h"
#include "llm/runner.h"
#include "nibble/nibble.h"

namespace nibble::cli {

namespace {

using llm::BackendOptions;
using llm::ModelFiles;

const std::vector<std::string> kModelOptions = {
    "format",         "prefill-format", "decode-format", "device", "threads",    "ctx-size",
    "random-weights", "arch",           "seed",          "layers", "head-format"};

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

[[noreturn]] void usage_error(const std::string& cmd, const std::string& msg) {
  throw Error(ErrorCode::invalid_argument, "nibble " + cmd + ": " + msg);
}

// MODEL is the first word after the command (a path), unless --random-weights names none.
struct Invocation {
  std::string model;
  Args args;
};

Invocation parse(const std::string& cmd, int argc, char** argv, std::vector<std::string> known) {
  known.insert(known.end(), kModelOptions.begin(), kModelOptions.end());
  // `-n N` is accepted as `--n N`, the spelling of most runners.
  std::vector<std::string> words(argv, argv + argc);
  for (auto& w : words)
    if (w == "-n") w = "--n";
  std::vector<char*> ptrs;
  for (auto& w : words) ptrs.push_back(w.data());
  Invocation inv;
  int first = 2;
  if (argc > 2 && words[2].rfind("--", 0) != 0) {
    inv.model = words[2];
    first = 3;
  }
  inv.args = parse_args(argc, ptrs.data(), first, known);
  if (inv.model.empty() && !inv.args.has("random-weights"))
    usage_error(cmd,
                "expected a model path (a .gguf file or a Hugging Face directory) or "
                "--random-weights --arch NAME");
  if (!inv.model.empty() && inv.args.has("random-weights"))
    usage_error(cmd, "give either a model path or --random-weights, not both");
  return inv;
}

ModelFiles open(const Invocation& inv) {
  if (inv.args.has("random-weights"))
    return llm::random_model(inv.args.get("arch", "smollm2-135m"),
                             static_cast<uint64_t>(inv.args.get_int("seed", 0)));
  return llm::open_model(inv.model);
}

// The format to run: --format, else a pre-quantized checkpoint's own, else bf16.
std::string default_format(const Args& a, const ModelFiles& m) {
  if (a.has("format")) return a.get("format", "bf16");
  const std::string stored = m.weights->quantized_format("blk.0.attn_q.weight");
  return stored.empty() ? "bf16" : stored;
}

// The weight strategy: --format FMT for everything, or --prefill-format / --decode-format.
llm::LinearStrategy strategy_for(const Args& a, const std::string& format) {
  llm::LinearStrategy s;
  s.prefill = a.get("prefill-format", format);
  s.decode = a.get("decode-format", format);
  return s;
}

BackendOptions backend_options(const Args& a, const std::string& format) {
  BackendOptions o;
  o.strategy = strategy_for(a, format);
  // f32 runs keep everything in f32 (the exact reference); otherwise the head is bf16.
  o.head_mode = a.get("head-format",
                      o.strategy.prefill == "f32" && o.strategy.decode == "f32" ? "f32" : "bf16");
  o.threads = static_cast<int>(a.get_int("threads", 0));
  o.max_context = a.get_int("ctx-size", 0);
  o.max_layers = a.get_int("layers", 0);
  return o;
}

double get_double(const Args& a, const std::string& name, double fallback) {
  if (!a.has(name)) return fallback;
  const std::string v = a.get(name, "");
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0')
    throw Error(ErrorCode::invalid_argument,
                "nibble: option --" + name + " needs a number, got '" + v + "'");
  return d;
}

std::vector<int32_t> parse_ids(const std::string& s, int64_t vocab) {
  std::vector<int32_t> ids;
  for (const auto& w : split_list(s)) {
    char* end = nullptr;
    const long long v = std::strtoll(w.c_str(), &end, 10);
    if (end == w.c_str() || *end != '\0' || v < 0 || v >= vocab)
      throw Error(ErrorCode::invalid_argument,
                  "nibble: '" + w + "' is not a token id below " + std::to_string(vocab));
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

void print_ids(const char* label, const std::vector<int32_t>& ids) {
  std::printf("%s", label);
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? "," : "", ids[i]);
  std::printf("\n");
}

// Prints decoded text as tokens arrive, holding back an incomplete UTF-8 sequence.
class TextStream {
 public:
  explicit TextStream(const llm::Tokenizer* t) : t_(t) {}
  void push(int32_t id) {
    if (t_ == nullptr) return;
    ids_.push_back(id);
    const std::string text = t_->decode(ids_, true);
    size_t end = text.size();  // do not print a trailing partial character
    size_t lead = end;
    while (lead > 0 && (static_cast<unsigned char>(text[lead - 1]) & 0xC0) == 0x80) --lead;
    if (lead > 0) {
      const auto c = static_cast<unsigned char>(text[lead - 1]);
      const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      if (end - (lead - 1) < need) end = lead - 1;
    }
    if (end > printed_) {
      std::fwrite(text.data() + printed_, 1, end - printed_, stdout);
      std::fflush(stdout);
      printed_ = end;
    }
  }

 private:
  const llm::Tokenizer* t_;
  std::vector<int32_t> ids_;
  size_t printed_ = 0;
};

struct Row {
  std::string format;
  double ttft_ms, decode_tps, size_mib, rss_mib, peak_mib, gbps;
  int64_t prompt_tokens, new_tokens;
};

}  // namespace

int run_model_info(int argc, char** argv) {
  const Invocation inv = parse("info", argc, argv, {"load"});
  ModelFiles m = open(inv);
  std::printf("model:     %s\n", m.path.c_str());
  std::printf("config:    %s\n", m.config.describe().c_str());
  std::printf("weights:   %s", m.weights->describe().c_str());
  if (m.file_bytes > 0) std::printf(" (%.1f MiB on disk)", mib(m.file_bytes));
  std::printf("\n");
  if (m.tokenizer) std::printf("tokenizer: %s\n", m.tokenizer->describe().c_str());
  if (inv.args.has("load")) {  // also build the backend, to report its memory
    const std::string format = default_format(inv.args, m);
    auto be =
        llm::make_backend(inv.args.get("device", "cpu"), m, backend_options(inv.args, format));
    const auto mem = be->memory();
    std::printf("%s", be->describe().c_str());
    std::printf("memory:    weights %.1f MiB (%.1f MiB read per token), KV cache %.1f MiB\n",
                mib(mem.resident_weight_bytes), mib(mem.decode_weight_bytes),
                mib(mem.kv_cache_bytes));
  }
  return 0;
}

int run_generate(int argc, char** argv) {
  const Invocation inv = parse("generate", argc, argv,
                               {"prompt", "prompt-ids", "prompt-len", "n", "temperature", "top-k",
                                "top-p", "chat", "ids", "dump-logits", "no-stop", "quiet"});
  const Args& a = inv.args;
  std::vector<std::string> formats = split_list(a.get("format", ""));
  if (!a.has("format")) formats = {default_format(a, open(inv))};
  if (formats.empty()) usage_error("generate", "--format needs a value");
  if (formats.size() > 1 && (a.has("prefill-format") || a.has("decode-format")))
    usage_error("generate",
                "a list of formats cannot be combined with --prefill-format/--decode-format");
  const int64_t n_new = a.get_int("n", 32);
  llm::SamplingOptions so;
  so.temperature = get_double(a, "temperature", 0.0);
  so.top_k = a.get_int("top-k", 0);
  so.top_p = get_double(a, "top-p", 1.0);
  so.seed = static_cast<uint64_t>(a.get_int("seed", 0));
  const bool quiet = a.has("quiet");

  std::vector<Row> rows;
  std::vector<int32_t> first_tokens;
  for (size_t fi = 0; fi < formats.size(); ++fi) {
    const std::string& format = formats[fi];
    ModelFiles m = open(inv);  // reopened per format: each backend converts its own copy
    const llm::Tokenizer* tok = m.tokenizer ? &*m.tokenizer : nullptr;
    std::vector<int32_t> prompt;
    if (a.has("prompt-ids")) {
      prompt = parse_ids(a.get("prompt-ids", ""), m.config.vocab_size);
    } else if (tok != nullptr) {
      std::string text = a.get("prompt", "Once upon a time,");
      if (a.has("chat")) {
        if (tok->model() != llm::Tokenizer::Model::byte_bpe ||
            tok->encode("<|im_start|>", false).size() != 1)
          usage_error("generate",
                      "--chat needs a ChatML vocabulary (<|im_start|>), which this model lacks");
        text = "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n";
      }
      prompt = tok->encode(text);
    } else {  // random weights: a deterministic prompt of --prompt-len ids
      const int64_t len = a.get_int("prompt-len", 16);
      for (int64_t i = 0; i < len; ++i)
        prompt.push_back(static_cast<int32_t>((i * 7919 + 1) % m.config.vocab_size));
    }
    if (prompt.empty()) usage_error("generate", "the prompt has no tokens");
    const auto t_load = std::chrono::steady_clock::now();
    auto be = llm::make_backend(a.get("device", "cpu"), m, backend_options(a, format));
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
    m.weights.reset();  // the backend holds its own converted weights
    if (!quiet) {
      std::fprintf(stderr, "%s | %s | loaded in %.1f s\n%s", m.config.describe().c_str(),
                   m.path.c_str(), load_s, be->describe().c_str());
      if (be->n_layers() < m.config.n_layers)
        std::fprintf(stderr, "  NOTE: only %lld of %lld layers run (--layers)\n",
                     static_cast<long long>(be->n_layers()),
                     static_cast<long long>(m.config.n_layers));
      if (!tok) std::fprintf(stderr, "  NOTE: random weights, the output is meaningless\n");
    }
    if (a.has("dump-logits")) {  // logits at every prompt position, f32 little-endian (n, vocab)
      std::vector<float> logits;
      be->forward(prompt, 0, true, logits);
      std::ofstream f(a.get("dump-logits", ""), std::ios::binary);
      f.write(reinterpret_cast<const char*>(logits.data()),
              static_cast<std::streamsize>(logits.size() * 4));
      if (!f) throw Error(ErrorCode::io_error, "nibble generate: cannot write --dump-logits file");
    }
    TextStream stream(quiet || formats.size() > 1 ? nullptr : tok);
    if (tok != nullptr && !quiet && formats.size() == 1) {
      // The prompt, then the continuation; a chat shows the question, not its template.
      if (a.has("chat"))
        std::printf("> %s\n", a.get("prompt", "Once upon a time,").c_str());
      else
        std::printf("%s", tok->decode(prompt, true).c_str());
      std::fflush(stdout);
    }
    auto stop = [&](int32_t id) {
      return tok != nullptr && !a.has("no-stop") && tok->is_end_of_generation(id);
    };
    const llm::GenerateResult r =
        llm::generate(*be, prompt, n_new, so, stop, [&](int32_t id) { stream.push(id); });
    if (tok != nullptr && !quiet && formats.size() == 1) std::printf("\n");
    if (a.has("ids")) {
      print_ids("prompt ids: ", prompt);
      print_ids("generated ids: ", r.tokens);
    }
    if (fi == 0) first_tokens = r.tokens;
    const auto mem = be->memory();
    const auto rss = llm::process_rss();
    rows.push_back(
        {format, r.ttft_seconds * 1e3, r.decode_tokens_per_second(), mib(mem.resident_weight_bytes),
         mib(rss.current_bytes), mib(rss.peak_bytes),
         static_cast<double>(mem.decode_weight_bytes) * r.decode_tokens_per_second() / 1e9,
         static_cast<int64_t>(prompt.size()), static_cast<int64_t>(r.tokens.size())});
  }
  std::printf("\n%-22s %9s %9s %10s %10s %11s %9s %9s\n", "format", "prompt", "new", "TTFT ms",
              "decode t/s", "weights MiB", "RSS MiB", "wGB/s");
  for (const Row& r : rows)
    std::printf("%-22s %9lld %9lld %10.1f %10.2f %11.1f %9.0f %9.2f\n", r.format.c_str(),
                static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.new_tokens),
                r.ttft_ms, r.decode_tps, r.size_mib, r.rss_mib, r.gbps);
  std::printf(
      "device %s; peak RSS of the process %.0f MiB; wGB/s = weight bytes read per token × "
      "decode tokens/s\n",
      a.get("device", "cpu").c_str(), rows.empty() ? 0.0 : rows.back().peak_mib);
  return 0;
}

int run_tokenize(int argc, char** argv) {
  const Invocation inv = parse("tokenize", argc, argv, {"text", "file", "no-bos"});
  const Args& a = inv.args;
  ModelFiles m = open(inv);
  if (!m.tokenizer) usage_error("tokenize", "the model has no tokenizer");
  const std::string text =
      a.has("file") ? llm::read_text_file(a.get("file", ""), "nibble tokenize") : a.get("text", "");
  print_ids("", m.tokenizer->encode(text, !a.has("no-bos")));
  return 0;
}

namespace {

// A progress bar on stderr: "[#####.....] 12/210 gptq", redrawn in place.
void progress_bar(const llm::QuantizeProgress& p) {
  constexpr int kWidth = 30;
  const int filled = p.total > 0 ? static_cast<int>(kWidth * p.done / p.total) : kWidth;
  std::fprintf(stderr, "\r[%s%s] %lld/%lld %s",
               std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), '.').c_str(),
               static_cast<long long>(p.done), static_cast<long long>(p.total), p.stage.c_str());
  if (p.done == p.total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

// quantize and quantize-model: one implementation (the latter is `--method rtn`).
int quantize_command(const std::string& cmd, int argc, char** argv) {
  const Invocation inv = parse(cmd, argc, argv,
                               {"out", "method", "alpha", "calib", "calib-samples", "calib-len",
                                "bits", "damp", "block-size", "act-order", "quiet"});
  const Args& a = inv.args;
  if (!a.has("out") || !a.has("format"))
    usage_error(cmd, "--format FMT and --out DIR are required");
  ModelFiles m = open(inv);
  llm::ModelQuantOptions o;
  o.format = a.get("format", "");
  o.method = a.get("method", "rtn");
  o.alpha = get_double(a, "alpha", 0.5);
  o.threads = static_cast<int>(a.get_int("threads", 0));
  o.weights.damp = get_double(a, "damp", 0.01);
  o.weights.block_size = static_cast<int>(a.get_int("block-size", 128));
  o.weights.act_order = a.has("act-order");
  if (a.has("bits")) {  // 3 and 2 restrict the 4-bit grid: qmax = 2^(bits-1) - 1
    const long long bits = a.get_int("bits", 4);
    const int format_bits =
        dtype_bits(weight_value_dtype(parse_linear_format(o.format).weight.scheme));
    if (bits < 2 || bits > format_bits)
      usage_error(cmd,
                  "--bits must be in [2, " + std::to_string(format_bits) + "] for " + o.format);
    if (bits < format_bits) o.weights.qmax = (1 << (bits - 1)) - 1;
  }
  std::vector<std::vector<int32_t>> calib;
  const int64_t samples = a.get_int("calib-samples", 8), len = a.get_int("calib-len", 512);
  const uint64_t seed = static_cast<uint64_t>(a.get_int("seed", 0));
  if (llm::needs_calibration(o.method)) {
    if (!a.has("calib"))
      usage_error(cmd, "--method " + o.method + " needs --calib TEXT (e.g. austen-train.txt)");
    if (!m.tokenizer) usage_error(cmd, "the model has no tokenizer for the calibration text");
    const std::string text = llm::read_text_file(a.get("calib", ""), ("nibble " + cmd).c_str());
    calib = llm::calibration_windows(*m.tokenizer, text, samples, len, seed);
  }
  const bool quiet = a.has("quiet");
  const auto t0 = std::chrono::steady_clock::now();
  ModelFiles q = llm::quantize_model(m, calib, o, quiet ? nullptr : progress_bar);
  llm::write_nibble_checkpoint(q, o.format, a.get("head-format", "bf16"), a.get("out", ""));
  std::printf(
      "wrote %s/{model.safetensors,config.json,tokenizer.json}: %s pre-quantized to %s "
      "(method %s%s%s) in %.1f s\n",
      a.get("out", "").c_str(), m.config.name.c_str(), o.format.c_str(), o.method.c_str(),
      o.weights.qmax ? (", qmax " + std::to_string(o.weights.qmax)).c_str() : "",
      calib.empty() ? ""
                    : (", " + std::to_string(samples) + "×" + std::to_string(len) +
                       " calibration tokens, seed " + std::to_string(seed))
                          .c_str(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace

int run_quantize(int argc, char** argv) { return quantize_command("quantize", argc, argv); }

int run_quantize_model(int argc, char** argv) {
  return quantize_command("quantize-model", argc, argv);
}

int run_perplexity(int argc, char** argv) {
  const Invocation inv = parse("perplexity", argc, argv, {"text", "ctx", "max-tokens", "quiet"});
  const Args& a = inv.args;
  if (!a.has("text")) usage_error("perplexity", "--text FILE is required");
  if (a.has("random-weights"))
    usage_error("perplexity", "perplexity needs a trained model, not --random-weights");
  ModelFiles m = open(inv);
  const std::string format = default_format(a, m);
  if (!m.tokenizer) usage_error("perplexity", "the model has no tokenizer");
  const std::string text = llm::read_text_file(a.get("text", ""), "nibble perplexity");
  std::vector<int32_t> tokens = m.tokenizer->encode(text, false);
  const int64_t max_tokens = a.get_int("max-tokens", 0);
  if (max_tokens > 0 && static_cast<int64_t>(tokens.size()) > max_tokens)
    tokens.resize(static_cast<size_t>(max_tokens));
  const int64_t ctx = a.get_int("ctx", 512);
  BackendOptions bo = backend_options(a, format);
  if (bo.max_context == 0) bo.max_context = ctx;
  auto be = llm::make_backend(a.get("device", "cpu"), m, bo);
  m.weights.reset();
  const int32_t bos = m.tokenizer->add_bos() ? m.tokenizer->bos_id() : -1;
  if (!a.has("quiet"))
    std::fprintf(stderr, "%s\n%s%lld tokens of %s, windows of %lld%s\n",
                 m.config.describe().c_str(), be->describe().c_str(),
                 static_cast<long long>(tokens.size()), a.get("text", "").c_str(),
                 static_cast<long long>(ctx), bos >= 0 ? " (BOS first)" : "");
  const auto r = llm::perplexity(*be, tokens, ctx, bos, [&](const llm::PerplexityResult& p) {
    if (!a.has("quiet"))
      std::fprintf(stderr, "  window %lld: %lld tokens scored, perplexity so far %.4f (%.1f s)\n",
                   static_cast<long long>(p.windows), static_cast<long long>(p.scored),
                   p.perplexity(), p.seconds);
  });
  std::printf(
      "perplexity %.4f  format %s  tokens scored %lld  windows %lld of %lld  nll %.6f  %.1f s\n",
      r.perplexity(), llm::LinearStrategy(bo.strategy).describe().c_str(),
      static_cast<long long>(r.scored), static_cast<long long>(r.windows),
      static_cast<long long>(ctx), r.nll_sum / static_cast<double>(std::max<int64_t>(1, r.scored)),
      r.seconds);
  return 0;
}

}  // namespace nibble::cli
