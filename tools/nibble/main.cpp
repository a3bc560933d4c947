// nibble — command-line entry point: `nibble info`, `nibble formats`, `nibble demo`, and the
// LLM runner's `nibble info MODEL`, `nibble generate`, `nibble perplexity`.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli.h"
#if NIBBLE_HAVE_BENCH
#include "bench/act_quant_bench.h"
#include "bench/gemm_bench.h"
#endif
#include "nibble/nibble.h"

namespace nibble::cli {

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = options.find(name);
  return it == options.end() ? fallback : it->second;
}

long long Args::get_int(const std::string& name, long long fallback) const {
  auto it = options.find(name);
  if (it == options.end()) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (end == it->second.c_str() || *end != '\0')
    throw Error(ErrorCode::invalid_argument,
                "nibble: option --" + name + " needs an integer, got '" + it->second + "'");
  return v;
}

Args parse_args(int argc, char** argv, int first, const std::vector<std::string>& known) {
  Args args;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0)
      throw Error(ErrorCode::invalid_argument, "nibble: unexpected argument '" + a + "'");
    std::string name = a.substr(2), value = "1";
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      value = argv[++i];
    }
    bool ok = false;
    for (const auto& k : known) ok = ok || k == name;
    if (!ok) {
      std::string list;
      for (const auto& k : known) list += " --" + k;
      throw Error(ErrorCode::invalid_argument,
                  "nibble: unknown option --" + name + " (known:" + list + ")");
    }
    args.options[name] = value;
  }
  return args;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t pos = s.find(',', start);
    if (pos == std::string::npos) pos = s.size();
    if (pos > start) out.push_back(s.substr(start, pos - start));
    start = pos + 1;
  }
  return out;
}

namespace {

int run_info() {
  const BuildInfo b = build_info();
  std::printf("nibble %s (%s build, %s)\n", b.version.c_str(), b.build_type.c_str(),
              b.compiler.c_str());
  if (!b.cuda) {
    std::printf("CUDA backend: not built (CPU reference backend only)\n");
    return 0;
  }
  std::printf("CUDA backend: built for %s, runtime %s\n", b.cuda_archs.c_str(),
              b.cuda_runtime.c_str());
  const int count = cuda_device_count();
  if (count == 0) {
    std::printf("GPU: none found (%s)\n", cuda_unavailable_reason().c_str());
    return 0;
  }
  for (int i = 0; i < count; ++i) {
    const DeviceInfo d = cuda_device_info(i);
    std::printf("GPU %d: %s, sm_%d%d, %d SMs, L2 %lld MiB, %lld GiB, %d-bit bus\n", i,
                d.name.c_str(), d.cc_major, d.cc_minor, d.sm_count,
                static_cast<long long>(d.l2_bytes >> 20),
                static_cast<long long>(d.global_mem_bytes >> 30), d.mem_bus_bits);
  }
  return 0;
}

int run_formats() {
  const char* names[] = {"w4a8_pc",    "w4a8_g128",       "w4a8_g128_2level", "w4afp8_pc",
                         "w4afp8_g128", "w8a8",           "w8a8_static",      "w4a16_pc",
                         "w4a16_g128", "w4a16_g128_asym", "w4a16_g128_fzp",   "w8a16",
                         "w4a4_pc",    "w4a4_g128"};
  std::printf("%-18s %-14s %-15s %-6s %s\n", "format", "weights", "activations", "scale",
              "bits/weight (K=4096)");
  for (const char* n : names) {
    const LinearFormat f = parse_linear_format(n);
    std::printf("%-18s %-14s %-15s %-6s %.3f\n", to_string(f).c_str(), to_string(f.weight.scheme),
                to_string(f.act), to_string(f.weight.scale_dtype),
                effective_bits_per_weight(f.weight, 4096));
  }
  return 0;
}

#if NIBBLE_HAVE_BENCH
std::vector<int64_t> int_list(const Args& args, const std::string& name) {
  std::vector<int64_t> out;
  for (const auto& s : split_list(args.get(name, ""))) out.push_back(std::stoll(s));
  return out;
}

int run_bench_gemm(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 3, {"m", "shapes", "formats", "json", "iters", "reps",
                                               "commit", "peers", "bf16-in"});
  bench::GemmBenchOptions opt;
  if (args.has("m")) opt.ms = int_list(args, "m");
  if (args.has("shapes")) {
    std::vector<bench::Shape> chosen;
    for (const auto& s : split_list(args.get("shapes", ""))) {
      bool found = false;
      for (const auto& sh : bench::llama_shapes())
        if (sh.name == s) chosen.push_back(sh), found = true;
      if (!found && s.find('x') != std::string::npos)  // "NxK"
        chosen.push_back({s, std::stoll(s.substr(0, s.find('x'))), std::stoll(s.substr(s.find('x') + 1))}), found = true;
      if (!found)
        throw Error(ErrorCode::invalid_argument, "nibble bench: unknown shape '" + s + "' (a Llama layer name or NxK)");
    }
    opt.shapes = chosen;
  }
  if (args.has("formats")) opt.formats = split_list(args.get("formats", ""));
  opt.json_path = args.get("json", "");
  opt.commit = args.get("commit", "unknown");
  opt.iters = static_cast<int>(args.get_int("iters", opt.iters));
  opt.reps = static_cast<int>(args.get_int("reps", opt.reps));
  opt.peers = args.get("peers", opt.peers);
  if (opt.peers != "all" && opt.peers != "bf16" && opt.peers != "none")
    throw Error(ErrorCode::invalid_argument,
                "nibble bench: --peers must be all, bf16 or none, got '" + opt.peers + "'");
  const std::string bf16_in = args.get("bf16-in", "yes");
  if (bf16_in != "yes" && bf16_in != "no")
    throw Error(ErrorCode::invalid_argument,
                "nibble bench: --bf16-in must be yes or no, got '" + bf16_in + "'");
  opt.bf16_in = bf16_in == "yes";
  return bench::run_gemm_bench(opt);
}

int run_bench_act_quant(int argc, char** argv) {
  const Args args = parse_args(argc, argv, 3, {"m", "k", "variants", "dtype", "sweep", "json",
                                               "iters", "reps", "commit"});
  bench::ActQuantBenchOptions opt;
  if (args.has("m")) opt.ms = int_list(args, "m");
  if (args.has("k")) opt.ks = int_list(args, "k");
  if (args.has("variants")) opt.variants = split_list(args.get("variants", ""));
  if (args.get("variants", "") == "all") opt.variants = bench::act_quant_variants();
  opt.dtype = args.get("dtype", opt.dtype);
  opt.sweep = args.has("sweep");
  opt.json_path = args.get("json", "");
  opt.commit = args.get("commit", "unknown");
  opt.iters = static_cast<int>(args.get_int("iters", opt.iters));
  opt.reps = static_cast<int>(args.get_int("reps", opt.reps));
  return bench::run_act_quant_bench(opt);
}
#endif

int run_bench(int argc, char** argv) {
  const std::string what = argc >= 3 ? argv[2] : "";
  if (what != "gemm" && what != "act-quant")
    throw Error(ErrorCode::invalid_argument,
                "nibble bench: expected 'nibble bench gemm [options]' or 'nibble bench act-quant "
                "[options]'");
#if NIBBLE_HAVE_BENCH
  return what == "gemm" ? run_bench_gemm(argc, argv) : run_bench_act_quant(argc, argv);
#else
  (void)argv;
  throw Error(ErrorCode::unsupported, "nibble bench: this build has no CUDA backend");
#endif
}

int run_layout(const Args& args) {
  const std::string name = args.get("print", "w4_mma_k128");
  if (name != "w4_mma_k128" && name != "1")
    throw Error(ErrorCode::invalid_argument,
                "nibble layout: unknown layout '" + name + "' (known: w4_mma_k128)");
  std::printf("%s", describe_layout(WeightLayout::w4_mma_k128).c_str());
  return 0;
}

void usage() {
  std::printf(
      "usage: nibble <command> [options]\n"
      "  info                 build, compiled CUDA archs, GPUs found\n"
      "  granularity MODEL [--rho R] [--budget 0.1] [--layers N]\n"
      "                       W4A4 mixed granularity: w4a4_pc or w4a4_g128 per block linear\n"
      "                       for a GPU of ratio R (default: this GPU's), within a time budget\n"
      "  info MODEL [--load [--format FMT]]\n"
      "                       a model's config, weights and tokenizer (.gguf or HF directory)\n"
      "  generate MODEL [--prompt TEXT | --prompt-ids 1,2,...] [-n 32] [--chat [--system TEXT]]\n"
      "       [--format bf16|f32|w4a8_pc|w4a8_g128|w8a8|w4a16_g128|...[,more]]\n"
      "       (sim:FORMAT: the format simulated in f32, for accuracy studies)\n"
      "       [--prefill-format F --decode-format F] [--device cpu|cuda] [--temperature T]\n"
      "       [--top-k K] [--top-p P] [--seed S] [--threads N] [--ctx-size N] [--ids]\n"
      "       [--random-weights --arch llama3-8b|smollm2-135m|qwen2.5-7b|qwen3-8b [--layers L]]\n"
      "       [--head-format bf16|FMT] [--no-cuda-graph] [--no-fused-quant]   (the last three: GPU)\n"
      "                       generate text; prints TTFT, decode tokens/s, sizes, memory\n"
      "  bench-model (MODEL | --random-weights --arch A) [--format bf16,w4a8_pc,P:D,...]\n"
      "       [--head-formats bf16,same] [--prompt-len 2048] [--short-prompt-len 16] [-n 64]\n"
      "       [--device cuda] [--json FILE] [--commit SHA] [--profile-decode]\n"
      "                       every format in one process: TTFT, attention share of the\n"
      "                       prefill, decode tokens/s, GPU size and peak memory, weight GB/s\n"
      "                       (--profile-decode: a decode step's GPU time op by op)\n"
      "  perplexity MODEL --text FILE [--format FMT] [--ctx 512] [--max-tokens N]\n"
      "                       perplexity of a text in non-overlapping windows\n"
      "  tokenize MODEL (--text TEXT | --file FILE | --jsonl FILE [--pieces]) [--no-bos]\n"
      "                       the token ids of a text, comma-separated (--jsonl: one JSON\n"
      "                       string per line, one line of ids each; --pieces: the\n"
      "                       pre-tokenizer's pieces of each string, as a JSON array)\n"
      "  quantize MODEL --format FMT --out DIR [--method rtn|rtn-mse|gptq|smoothquant-rtn|\n"
      "       smoothquant-gptq] [--calib TEXT] [--calib-samples 8] [--calib-len 512] [--seed S]\n"
      "       [--alpha 0.5] [--bits 4|3|2|8] [--damp 0.01] [--block-size 128] [--act-order]\n"
      "       [--head-format bf16|f32] [--quiet]\n"
      "                       quantize with an algorithm (calibrated on TEXT) and write a\n"
      "                       pre-quantized nibble checkpoint (safetensors + config.json +\n"
      "                       tokenizer.json) that generate/perplexity load without requantizing\n"
      "  quantize-model MODEL --format FMT --out DIR   the same with --method rtn\n"
      "  formats              the format catalogue with effective bits per weight\n"
      "  demo [--device cpu|cuda] [--m 16] [--n 4096] [--k 4096] [--formats a,b,...]\n"
      "       [--seed S] [--reps R]\n"
      "                       quantize random Llama-shaped weights, run each format, print\n"
      "                       its error against the float product and its time\n"
      "  layout --print [w4_mma_k128]\n"
      "                       which (n, k) each lane's bytes hold in a packed weight block\n"
      "  bench gemm [--m 1,16,...] [--shapes llama3-8b.o,4096x4096,...] [--formats ...]\n"
      "       [--json FILE] [--iters N] [--reps R] [--commit SHA] [--peers all|bf16|none]\n"
      "       [--bf16-in yes|no]  (no: skip the int8 formats' runs from bf16 activations)\n"
      "                       time W4A8 against cuBLAS bf16 and cuBLASLt int8 (GPU)\n"
      "  bench act-quant [--m 1,16,...] [--k 4096,14336] [--variants s8,s8_rmsnorm,...|all]\n"
      "       [--dtype bf16|f16|f32] [--sweep] [--json FILE] [--iters N] [--reps R] [--commit SHA]\n"
      "                       activation quantization (+ RMSNorm, smooth) against the copy\n"
      "                       ceiling; --sweep also times the planner's alternatives (GPU)\n");
}

}  // namespace
}  // namespace nibble::cli

int main(int argc, char** argv) {
  using namespace nibble::cli;
  if (argc < 2) {
    usage();
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "info") return argc > 2 ? run_model_info(argc, argv) : run_info();
    if (cmd == "generate") return run_generate(argc, argv);
    if (cmd == "perplexity") return run_perplexity(argc, argv);
    if (cmd == "tokenize") return run_tokenize(argc, argv);
    if (cmd == "quantize-model") return run_quantize_model(argc, argv);
    if (cmd == "quantize") return run_quantize(argc, argv);
    if (cmd == "bench-model") return run_bench_model(argc, argv);
    if (cmd == "granularity") return run_granularity(argc, argv);
    if (cmd == "formats") return run_formats();
    if (cmd == "bench") return run_bench(argc, argv);
    if (cmd == "layout") return run_layout(parse_args(argc, argv, 2, {"print"}));
    if (cmd == "demo")
      return run_demo(parse_args(argc, argv, 2, {"device", "m", "n", "k", "formats", "seed", "reps"}));
    if (cmd == "help" || cmd == "--help" || cmd == "-h") {
      usage();
      return 0;
    }
    std::fprintf(stderr, "nibble: unknown command '%s'\n", cmd.c_str());
    usage();
    return 2;
  } catch (const nibble::Error& e) {
    std::fprintf(stderr, "error (%s): %s\n", nibble::to_string(e.code()), e.what());
    return 1;
  }
}
