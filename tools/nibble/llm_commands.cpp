// The runner's commands: `nibble info MODEL`, `nibble generate MODEL ...`,
// `nibble perplexity MODEL --text FILE ...` (src/llm/ does the work; this file parses options
// and prints).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

#include "cli.h"
#include "llm/backend.h"
#include "llm/file_util.h"
#include "llm/json.h"
#include "llm/linear.h"
#include "llm/model_files.h"
#include "llm/quantize_model.h"
#include "llm/runner.h"
#include "nibble/nibble.h"
#include "nibble/quant_algorithms.h"

namespace nibble::cli {

namespace {

using llm::BackendOptions;
using llm::ModelConfig;
using llm::ModelFiles;

const std::vector<std::string> kModelOptions = {
    "format", "prefill-format", "decode-format", "device", "threads",     "ctx-size",
    "random-weights", "arch", "seed", "layers", "head-format", "no-cuda-graph",
    "no-fused-quant"};

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

bool is_cuda(const Args& a) { return a.get("device", "cpu").rfind("cuda", 0) == 0; }

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
  // The GPU makes --random-weights itself (an 8B model is never built on the host) and
  // captures its decode step as a CUDA graph unless told not to.
  o.random_weights_on_device = is_cuda(a) && a.has("random-weights");
  o.cuda_graph = !a.has("no-cuda-graph");
  o.fuse_activation_quant = !a.has("no-fused-quant");
  return o;
}

// One untimed run of the prompt and a token, so that first-use costs (loading kernel modules,
// cuBLAS heuristics for the prompt's shapes) stay out of the measured TTFT on the GPU.
void warm_up(llm::Backend& be, const std::vector<int32_t>& prompt) {
  if (be.device() == "cpu") return;
  llm::generate(be, prompt, 2, llm::SamplingOptions{});
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
  double ttft_ms, decode_tps, size_mib, rss_mib, peak_mib, gbps, gpu_peak_mib;
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
    if (mem.device_allocated_bytes > 0)
      std::printf("GPU:       %.1f MiB allocated by the backend, peak %.1f MiB in use above the "
                  "idle context\n",
                  mib(mem.device_allocated_bytes), mib(mem.device_peak_bytes));
  }
  return 0;
}

int run_generate(int argc, char** argv) {
  const Invocation inv = parse("generate", argc, argv,
                               {"prompt", "prompt-ids", "prompt-len", "n", "temperature", "top-k",
                                "top-p", "chat", "system", "ids", "dump-logits", "no-stop", "quiet"});
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
      if (a.has("system") && !a.has("chat")) usage_error("generate", "--system needs --chat");
      if (a.has("chat")) {
        if (tok->chat_format() == llm::Tokenizer::ChatFormat::none)
          usage_error("generate",
                      "--chat needs a chat format nibble knows (ChatML <|im_start|>, Llama 3 "
                      "<|start_header_id|>, or [INST] in the model's chat template); this model "
                      "has none");
        text = tok->chat_prompt(text, a.get("system", ""));
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
    warm_up(*be, prompt);
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
         mib(mem.device_peak_bytes), static_cast<int64_t>(prompt.size()),
         static_cast<int64_t>(r.tokens.size())});
  }
  const bool gpu = is_cuda(a);
  std::printf("\n%-22s %9s %9s %10s %10s %11s %9s %9s%s\n", "format", "prompt", "new", "TTFT ms",
              "decode t/s", "weights MiB", "RSS MiB", "wGB/s", gpu ? "  GPU peak MiB" : "");
  for (const Row& r : rows) {
    std::printf("%-22s %9lld %9lld %10.1f %10.2f %11.1f %9.0f %9.2f", r.format.c_str(),
                static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.new_tokens),
                r.ttft_ms, r.decode_tps, r.size_mib, r.rss_mib, r.gbps);
    if (gpu) std::printf(" %13.0f", r.gpu_peak_mib);
    std::printf("\n");
  }
  std::printf(
      "device %s; peak RSS of the process %.0f MiB; wGB/s = weight bytes read per token × "
      "decode tokens/s%s\n",
      a.get("device", "cpu").c_str(), rows.empty() ? 0.0 : rows.back().peak_mib,
      gpu ? "; weights = model size on the GPU; GPU peak = device memory in use above the idle "
            "context (cudaMemGetInfo); TTFT after one untimed warm-up run"
          : "");
  return 0;
}

namespace {

std::string json_escape(const std::string& v) {
  std::string out;
  for (const char ch : v) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
      continue;
    }
    out += ch;
  }
  return out;
}

std::string today_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

struct BenchRun {
  std::string entry, prefill, decode, head;
  double load_s = 0, ttft_ms = 0, prefill_ms = 0, attention_ms = -1;
  double decode_tps = 0, decode_tps_short = 0;
  int64_t new_tokens = 0, new_tokens_short = 0;
  llm::MemoryReport mem;
  std::vector<llm::Backend::OpTime> decode_ops;  // --profile-decode
};

// [{"op": ..., "calls": ..., "us": ...}, ...] of a profiled decode step ([] when not profiled).
std::string ops_json(const std::vector<llm::Backend::OpTime>& ops) {
  std::string j = "[";
  for (size_t i = 0; i < ops.size(); ++i) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s{\"op\": \"%s\", \"calls\": %d, \"us\": %.2f}",
                  i ? ", " : "", ops[i].op.c_str(), ops[i].calls, ops[i].seconds * 1e6);
    j += buf;
  }
  return j + "]";
}

}  // namespace

int run_bench_model(int argc, char** argv) {
  const Invocation inv = parse("bench-model", argc, argv,
                               {"prompt-len", "short-prompt-len", "n", "json", "commit",
                                "head-formats", "profile-decode"});
  const Args& a = inv.args;
  if (a.has("prefill-format") || a.has("decode-format") || a.has("head-format"))
    usage_error("bench-model",
                "give strategies as PREFILL:DECODE entries of --format and heads with "
                "--head-formats");
  const std::vector<std::string> entries = split_list(a.get("format", "bf16,w4a8_pc,w4a8_g128"));
  const std::vector<std::string> heads = split_list(a.get("head-formats", "bf16"));
  if (entries.empty() || heads.empty()) usage_error("bench-model", "no formats to run");
  const std::string device = a.get("device", "cuda");
  const int64_t prompt_len = a.get_int("prompt-len", 2048);
  const int64_t short_len = a.get_int("short-prompt-len", 16);
  const int64_t n_new = a.get_int("n", 64);
  if (prompt_len < 2 || short_len < 2 || n_new < 2)
    usage_error("bench-model", "--prompt-len and --short-prompt-len need ≥ 2 tokens, -n ≥ 2");

  std::vector<BenchRun> runs;
  ModelConfig cfg;
  std::string weights_desc, model_desc;
  int64_t layers_run = 0;
  for (const std::string& entry : entries) {
    const auto colon = entry.find(':');
    const std::string prefill = entry.substr(0, colon);
    const std::string decode = colon == std::string::npos ? prefill : entry.substr(colon + 1);
    for (const std::string& head_choice : heads) {
      // "same": the output projection in the run's decode format (bf16 runs keep bf16).
      const std::string head = head_choice == "same" ? decode : head_choice;
      bool seen = false;
      for (const BenchRun& r : runs) seen = seen || (r.entry == entry && r.head == head);
      if (seen) continue;
      BenchRun run;
      run.entry = entry;
      run.prefill = prefill;
      run.decode = decode;
      run.head = head;
      ModelFiles m = open(inv);
      cfg = m.config;
      weights_desc = m.weights->describe();
      model_desc = m.path;
      BackendOptions o = backend_options(a, prefill);
      o.strategy.prefill = prefill;
      o.strategy.decode = decode;
      o.head_mode = head;
      o.time_prefill_attention = true;
      o.random_weights_on_device = device.rfind("cuda", 0) == 0 && a.has("random-weights");
      if (o.max_context == 0) o.max_context = std::max(prompt_len, short_len) + n_new;
      const auto t0 = std::chrono::steady_clock::now();
      auto be = llm::make_backend(device, m, o);
      run.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      m.weights.reset();
      layers_run = be->n_layers();
      std::fprintf(stderr, "== %s (output %s): loaded in %.1f s\n%s", entry.c_str(), head.c_str(),
                   run.load_s, be->describe().c_str());
      auto ids = [&](int64_t len, int64_t salt) {
        std::vector<int32_t> p;
        for (int64_t i = 0; i < len; ++i)
          p.push_back(static_cast<int32_t>((i * 7919 + salt) % m.config.vocab_size));
        return p;
      };
      const std::vector<int32_t> long_prompt = ids(prompt_len, 1), short_prompt = ids(short_len, 3);
      warm_up(*be, long_prompt);
      warm_up(*be, short_prompt);
      const llm::SamplingOptions greedy;
      const llm::GenerateResult r = llm::generate(*be, long_prompt, n_new, greedy);
      run.ttft_ms = r.ttft_seconds * 1e3;
      run.prefill_ms = r.prefill_seconds * 1e3;
      run.attention_ms = be->last_prefill_attention_seconds() * 1e3;
      run.decode_tps = r.decode_tokens_per_second();
      run.new_tokens = static_cast<int64_t>(r.tokens.size());
      const llm::GenerateResult rs = llm::generate(*be, short_prompt, n_new, greedy);
      run.decode_tps_short = rs.decode_tokens_per_second();
      run.new_tokens_short = static_cast<int64_t>(rs.tokens.size());
      run.mem = be->memory();
      // One more step at the short context, op by op (its logits are not used).
      if (a.has("profile-decode"))
        run.decode_ops = be->profile_decode_step(short_prompt[0], short_len);
      runs.push_back(run);
    }
  }

  const BenchRun* base = nullptr;
  for (const BenchRun& r : runs)
    if (r.entry == "bf16" && r.head == "bf16") base = base ? base : &r;
  auto gbps = [](const BenchRun& r, double tps) {
    return static_cast<double>(r.mem.decode_weight_bytes) * tps / 1e9;
  };
  std::printf("\n%s | %s | %lld/%lld layers | device %s\n", model_desc.c_str(),
              weights_desc.c_str(), static_cast<long long>(layers_run),
              static_cast<long long>(cfg.n_layers), device.c_str());
  std::printf("%-28s %-10s %9s %9s %8s %11s %11s %10s %10s %8s %8s\n", "format", "output",
              "TTFT ms", "attn %", "decode", "decode t/s", "weights", "GPU peak", "wGB/s",
              "x bf16", "TTFT x");
  std::printf("%-28s %-10s %9s %9s %8s %11s %11s %10s %10s %8s %8s\n", "", "", "", "of prefill",
              "t/s", "short ctx", "MiB", "MiB", "", "decode", "bf16");
  for (const BenchRun& r : runs) {
    const double share = r.attention_ms >= 0 && r.prefill_ms > 0 ? 100 * r.attention_ms / r.prefill_ms : -1;
    char share_text[16] = "-";
    if (share >= 0) std::snprintf(share_text, sizeof share_text, "%.1f", share);
    std::printf("%-28s %-10s %9.1f %9s %8.1f %11.1f %11.1f %10.1f %10.1f", r.entry.c_str(),
                r.head.c_str(), r.ttft_ms, share_text, r.decode_tps, r.decode_tps_short,
                mib(r.mem.resident_weight_bytes), mib(r.mem.device_peak_bytes),
                gbps(r, r.decode_tps_short));
    if (base != nullptr && base->decode_tps > 0)
      std::printf(" %8.2f %8.2f", r.decode_tps / base->decode_tps, base->ttft_ms / r.ttft_ms);
    std::printf("\n");
  }
  std::printf(
      "prompt %lld tokens (TTFT, attention share, decode t/s after it), short prompt %lld "
      "tokens (decode t/s short ctx), %lld new tokens each; x bf16 = decode t/s / bf16's, TTFT x = "
      "bf16 TTFT / TTFT; weights = model size on the device; GPU peak = device memory in use "
      "above the idle context; wGB/s = weight bytes read per token × short-ctx decode t/s%s\n",
      static_cast<long long>(prompt_len), static_cast<long long>(short_len),
      static_cast<long long>(n_new),
      a.has("random-weights") ? "; RANDOM WEIGHTS (not a trained model)" : "");

  // Where a decode step's GPU time goes, op by op, against the graph-replayed step.
  for (const BenchRun& r : runs) {
    if (r.decode_ops.empty()) continue;
    double total = 0;
    for (const auto& op : r.decode_ops) total += op.seconds;
    std::printf("\ndecode step op by op, %s (output %s), short ctx: %.1f us on the GPU "
                "(eager, queued); graph-replayed step incl. the argmax %.1f us\n",
                r.entry.c_str(), r.head.c_str(), total * 1e6,
                r.decode_tps_short > 0 ? 1e6 / r.decode_tps_short : 0.0);
    std::printf("  %-16s %6s %10s %10s %7s\n", "op", "calls", "total us", "us/call", "share");
    for (const auto& op : r.decode_ops)
      std::printf("  %-16s %6d %10.1f %10.2f %6.1f%%\n", op.op.c_str(), op.calls,
                  op.seconds * 1e6, op.seconds * 1e6 / op.calls, 100 * op.seconds / total);
  }

  if (a.has("json")) {
    std::string dev_name = device;
    int sm_count = 0;
    if (device.rfind("cuda", 0) == 0 && cuda_device_count() > 0) {
      const int ordinal = device.size() > 5 ? std::atoi(device.c_str() + 5) : 0;
      const DeviceInfo info = cuda_device_info(ordinal);
      dev_name = info.name;
      sm_count = info.sm_count;
    }
    const BuildInfo b = build_info();
    std::string j = "{\n";
    j += " \"device\": \"" + json_escape(dev_name) + "\",\n";
    j += " \"sm_count\": " + std::to_string(sm_count) + ",\n";
    j += " \"cuda_runtime\": \"" + json_escape(b.cuda_runtime) + "\",\n";
    j += " \"date\": \"" + today_utc() + "\",\n";
    j += " \"commit\": \"" + json_escape(a.get("commit", "unknown")) + "\",\n";
    j += " \"model\": \"" + json_escape(model_desc) + "\",\n";
    j += " \"weights\": \"" + json_escape(weights_desc) + "\",\n";
    j += std::string(" \"random_weights\": ") + (a.has("random-weights") ? "true" : "false") + ",\n";
    j += " \"config\": \"" + json_escape(cfg.describe()) + "\",\n";
    j += " \"layers_run\": " + std::to_string(layers_run) + ",\n";
    j += " \"method\": \"per format: one untimed warm-up run of each prompt, then greedy "
         "generation of n tokens after the long prompt (TTFT, attention share from CUDA "
         "events, decode t/s at that context) and after the short prompt (decode t/s short "
         "ctx); decode steps replay one CUDA graph, the greedy argmax runs on the GPU and the "
         "host reads 4 bytes a step, with up to 4 steps queued ahead (Backend::decode_greedy)"
         "\",\n";
    j += " \"runs\": [\n";
    for (size_t i = 0; i < runs.size(); ++i) {
      const BenchRun& r = runs[i];
      char buf[4096];
      std::snprintf(
          buf, sizeof buf,
          "  {\"format\": \"%s\", \"prefill_format\": \"%s\", \"decode_format\": \"%s\", "
          "\"head_format\": \"%s\", \"prompt_len\": %lld, \"ttft_ms\": %.3f, \"prefill_ms\": "
          "%.3f, \"attention_ms\": %s, \"decode_tok_s\": %.3f, \"short_prompt_len\": %lld, "
          "\"decode_tok_s_short\": %.3f, \"new_tokens\": %lld, \"weight_bytes\": %lld, "
          "\"decode_weight_bytes\": %lld, \"kv_cache_bytes\": %lld, \"allocated_gpu_bytes\": "
          "%lld, \"peak_gpu_bytes\": %lld, \"weight_gbps\": %.3f, \"weight_gbps_short\": %.3f, "
          "\"load_s\": %.3f, \"decode_ops\": %s}%s\n",
          json_escape(r.entry).c_str(), json_escape(r.prefill).c_str(),
          json_escape(r.decode).c_str(), json_escape(r.head).c_str(),
          static_cast<long long>(prompt_len), r.ttft_ms, r.prefill_ms,
          r.attention_ms >= 0 ? std::to_string(r.attention_ms).c_str() : "null",
          r.decode_tps, static_cast<long long>(short_len), r.decode_tps_short,
          static_cast<long long>(r.new_tokens),
          static_cast<long long>(r.mem.resident_weight_bytes),
          static_cast<long long>(r.mem.decode_weight_bytes),
          static_cast<long long>(r.mem.kv_cache_bytes),
          static_cast<long long>(r.mem.device_allocated_bytes),
          static_cast<long long>(r.mem.device_peak_bytes), gbps(r, r.decode_tps),
          gbps(r, r.decode_tps_short), r.load_s, ops_json(r.decode_ops).c_str(),
          i + 1 < runs.size() ? "," : "");
      j += buf;
    }
    j += " ]\n}\n";
    std::ofstream f(a.get("json", ""));
    f << j;
    if (!f) throw Error(ErrorCode::io_error, "nibble bench-model: cannot write " + a.get("json", ""));
    std::printf("wrote %s\n", a.get("json", "").c_str());
  }
  return 0;
}

int run_tokenize(int argc, char** argv) {
  const Invocation inv =
      parse("tokenize", argc, argv, {"text", "file", "jsonl", "no-bos", "pieces"});
  const Args& a = inv.args;
  ModelFiles m = open(inv);
  if (!m.tokenizer) usage_error("tokenize", "the model has no tokenizer");
  if (a.has("jsonl")) {  // one JSON string per line in, one line of ids per string out
    const std::string path = a.get("jsonl", "");
    const std::string all = llm::read_text_file(path, "nibble tokenize");
    size_t start = 0, line = 1;
    while (start < all.size()) {
      size_t end = all.find('\n', start);
      if (end == std::string::npos) end = all.size();
      const std::string what = path + " line " + std::to_string(line++);
      const llm::Json j = llm::Json::parse(std::string_view(all).substr(start, end - start), what);
      if (!j.is_string()) usage_error("tokenize", what + " is not a JSON string");
      if (a.has("pieces")) {  // the pre-tokenizer's pieces as a JSON array of strings
        std::string out = "[";
        for (std::string_view piece : m.tokenizer->pre_split(j.string())) {
          if (out.size() > 1) out += ',';
          out += llm::json_quote(piece);
        }
        std::printf("%s]\n", out.c_str());
      } else {
        print_ids("", m.tokenizer->encode(j.string(), !a.has("no-bos")));
      }
      start = end + 1;
    }
    return 0;
  }
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

// `nibble granularity MODEL`: the W4A4 mixed-granularity plan of a model's block linears
// (plan_w4a4_granularity) for a GPU of ratio ρ, from each layer's weight error in w4a4_pc and
// w4a4_g128 (round to nearest; K padded with zero columns to 128 as the runner pads it, which
// changes neither error).
int run_granularity(int argc, char** argv) {
  const Invocation inv = parse("granularity", argc, argv, {"rho", "budget"});
  const Args& a = inv.args;
  int rho = static_cast<int>(a.get_int("rho", 0));
  if (rho == 0 && cuda_device_count() > 0) {
    const DeviceInfo info = cuda_device_info(0);
    rho = tensor_core_ratio(info.cc_major, info.cc_minor);
  }
  if (rho <= 0)
    usage_error("granularity", "give --rho R (64 sm_80, 16 sm_86, 8 sm_89, 32 sm_90): no GPU to "
                               "read it from, or an unknown one");
  const double budget = std::atof(a.get("budget", "0.1").c_str());
  ModelFiles m = open(inv);
  const ModelConfig& c = m.config;
  const WeightFormat pc = parse_linear_format("w4a4_pc").weight;
  const WeightFormat g128 = parse_linear_format("w4a4_g128").weight;
  std::vector<GranularityLayer> layers;
  const int64_t n_layers = a.has("layers") ? std::min<int64_t>(a.get_int("layers", 0), c.n_layers)
                                           : c.n_layers;
  for (int64_t l = 0; l < n_layers; ++l)
    for (const llm::BlockLinear which : llm::kBlockLinears) {
      const std::string name = llm::tensor_name(l, which);
      const auto [n, k] = llm::linear_shape(c, which);
      const int64_t kp = llm::padded_k("w4a4_g128", k);
      std::vector<float> w = llm::pad_columns(m.weights->load(name, {n, k}), n, k, kp);
      const TensorView wv = TensorView::contiguous(w.data(), DType::f32, {n, kp});
      layers.push_back({name, n, kp, weight_quantization_error(wv, pc),
                        weight_quantization_error(wv, g128)});
    }
  const GranularityPlan plan = plan_w4a4_granularity(layers, rho, budget);
  std::printf("%s | %s\n%s\n", m.path.c_str(), c.describe().c_str(), plan.describe().c_str());
  return 0;
}

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
