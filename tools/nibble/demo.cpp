// `nibble demo`: quantize random Llama-shaped weights to several formats, run the quantized
// linear on the chosen backend, and print each format's error against the float product and
// its time. Weights are Gaussian; activations are Gaussian with a few outlier channels, as in
// real LLM activations, so per-token activation quantization is exercised honestly.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "nibble/nibble.h"

namespace nibble::cli {

namespace {

double rel_frobenius(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> to_f32(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  std::vector<float> out(static_cast<size_t>(host.view().numel()));
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = load_float(host.data(), host.view().dtype, static_cast<int64_t>(i));
  return out;
}

}  // namespace

int run_demo(const Args& args) {
  const bool have_gpu = build_info().cuda && cuda_device_count() > 0;
  const std::string dev_name = args.get("device", have_gpu ? "cuda" : "cpu");
  if (dev_name != "cpu" && dev_name != "cuda")
    throw Error(ErrorCode::invalid_argument, "nibble demo: --device must be cpu or cuda, got '" + dev_name + "'");
  const Device device = dev_name == "cuda" ? Device::cuda(0) : Device::cpu();
  const int64_t m = args.get_int("m", 16), n = args.get_int("n", 4096), k = args.get_int("k", 4096);
  const int reps = static_cast<int>(args.get_int("reps", device.type == DeviceType::cpu ? 1 : 20));
  const unsigned seed = static_cast<unsigned>(args.get_int("seed", std::random_device{}()));
  const auto formats = split_list(args.get(
      "formats", "w4a8_pc,w4a8_g128,w4a8_g128_2level,w8a8,w4a16_g128,w4a16_g128_asym"));
  if (m <= 0 || n <= 0 || k <= 0 || reps <= 0)
    throw Error(ErrorCode::invalid_argument, "nibble demo: --m, --n, --k and --reps must be positive");

  std::printf("nibble demo: D[%lld,%lld] = X[%lld,%lld] · W[%lld,%lld]ᵀ on %s, seed %u\n",
              static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(m),
              static_cast<long long>(k), static_cast<long long>(n), static_cast<long long>(k),
              to_string(device).c_str(), seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor w = Tensor::empty(DType::f32, {n, k});
  Tensor x_f32 = Tensor::empty(DType::f32, {m, k});
  for (int64_t i = 0; i < n * k; ++i) w.view().ptr<float>()[i] = 0.02f * normal(rng);
  std::vector<int64_t> outlier_channels;
  for (int i = 0; i < 8; ++i) outlier_channels.push_back(static_cast<int64_t>(rng() % k));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c) {
      float v = normal(rng);
      if (std::find(outlier_channels.begin(), outlier_channels.end(), c) != outlier_channels.end()) v *= 20.0f;
      x_f32.view().ptr<float>()[r * k + c] = v;
    }
  // Activations enter as bf16, as they would from the previous layer.
  Tensor x_bf16 = Tensor::empty(DType::bf16, {m, k});
  for (int64_t i = 0; i < m * k; ++i)
    store_float(x_bf16.data(), DType::bf16, i, x_f32.view().ptr<float>()[i]);
  std::vector<double> ref(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c) {
      double s = 0;
      for (int64_t i = 0; i < k; ++i)
        s += double(load_float(x_bf16.data(), DType::bf16, r * k + i)) * w.view().ptr<float>()[c * k + i];
      ref[static_cast<size_t>(r * n + c)] = s;
    }

  const Tensor x_dev = x_bf16.to(device);
  float static_amax = 0.0f;
  for (int64_t i = 0; i < m * k; ++i)
    static_amax = std::max(static_amax, std::fabs(load_float(x_bf16.data(), DType::bf16, i)));
  std::printf("%-18s %8s %9s %10s %11s  %s\n", "format", "bits/w", "weight MB", "rel. error",
              "time (us)", "kernel");
  for (const std::string& name : formats) {
    const LinearFormat f = parse_linear_format(name);
    QuantizedWeight qw_host(f.weight, n, k);
    quantize_weight(w.view(), qw_host.view());
    const QuantizedWeight qw = qw_host.to(device);
    // On a GPU, formats with a packed layout (W4A8, W4A16, W8A16) run from packed weights, as a
    // deployment would; W8A8 and W4A4 kernels read the logical weights.
    const bool packed = device.type == DeviceType::cuda && has_packed_layout(f) && k % 32 == 0;
    const PackedWeight pw = packed ? pack_weight(qw_host.view(), packed_layout(f), device) : PackedWeight();
    Tensor d = Tensor::empty(DType::bf16, {m, n}, device);
    QuantizedActivation qa;
    if (f.act != ActScheme::none) qa = QuantizedActivation(f.act, m, k, device);
    // One call = activation quantization (if any) + the quantized linear.
    auto call = [&] {
      if (f.act == ActScheme::none)
        return packed ? linear(x_dev.view(), pw.view(), nullptr, d.view())
                      : linear(x_dev.view(), qw.view(), nullptr, d.view());
      if (f.act == ActScheme::s8_per_tensor)  // "calibrated" on this very input: max|x| / 127
        quantize_activation_static(x_dev.view(), static_amax / 127.0f, qa.view());
      else
        quantize_activation(x_dev.view(), qa.view());
      if (packed) return linear(qa.view(), pw.view(), nullptr, d.view());
      linear(qa.view(), qw.view(), nullptr, d.view());
    };
    call();
    synchronize(device);
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      call();
      synchronize(device);
      times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double bits = effective_bits_per_weight(f.weight, k);
    // explain() describes the logical-weight path, then the packed one; show the one this call
    // took: the text after "runs " of that part, up to the next "; ".
    const std::string text = explain(f, m, n, k, device);
    const size_t part = packed ? text.find("packed weights") : 0;
    const size_t runs = text.find("runs ", part == std::string::npos ? 0 : part);
    std::string kernel = runs == std::string::npos ? text : text.substr(runs + 5);
    if (kernel.find("; ") != std::string::npos) kernel.resize(kernel.find("; "));
    std::printf("%-18s %8.3f %9.2f %10.2e %11.1f  %s\n", to_string(f).c_str(), bits,
                bits * double(n * k) / 8e6, rel_frobenius(to_f32(d), ref), times[times.size() / 2],
                kernel.c_str());
  }
  std::printf("rel. error: ‖D − D_float‖/‖D_float‖ against the f64 product of the bf16 inputs; "
              "time: median wall time of one call (activation quantization included), "
              "host-synchronised, not a benchmark (see bench/)\n");
  return 0;
}

}  // namespace nibble::cli
