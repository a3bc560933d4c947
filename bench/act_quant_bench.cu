// `nibble bench act-quant`: activation quantization (src/cuda/generic/act_quant.cu) against the
// device-to-device copy ceiling, for each variant (scheme × fusion) on Llama-sized rows.
//
// Method (docs/kernels.md "act_quant"): each variant is captured `iters` times (at least as
// many times as there are buffer copies) into a CUDA graph that cycles through enough copies of
// x, q and normed to exceed 3× L2 where that fits in 1024 copies (`working_set` in the JSON
// says how much each cell touched), so x streams from HBM; the graph is replayed `reps` times
// and the median per-call time is reported. GB/s counts bytes read (x, and the RMSNorm weight
// and smooth vectors once per call) plus bytes written (q, scales, normed). Two references in
// the same run: the copy ceiling (1 GiB, read + write; the faster of a cudaMemcpy and a copy kernel) and a cudaMemcpy moving the
// same number of bytes as the cell, rotated the same way (what a copy achieves at that size).
// --sweep also times the planner's alternatives (chunks per thread × block size, and with a
// smooth divisor, v recomputed instead of kept on chip).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "bench/act_quant_bench.h"
#include "bench/bench_util.h"
#include "cuda/generic/act_quant.h"
#include "cuda/launch/pdl_launch.h"
#include "nibble/nibble.h"

namespace nibble::bench {

namespace {

struct Variant {
  std::string name;
  ActScheme scheme = ActScheme::s8_per_token;
  bool norm = false, smooth = false, normed = false;
};

Variant parse_variant(const std::string& name) {
  Variant v{name};
  std::string rest = name;
  const auto take = [&](const std::string& suffix) {
    if (rest.size() < suffix.size() || rest.compare(rest.size() - suffix.size(), suffix.size(), suffix) != 0)
      return false;
    rest.resize(rest.size() - suffix.size());
    return true;
  };
  v.normed = take("_normed");
  v.smooth = take("_smooth");
  v.norm = take("_rmsnorm");
  if (rest == "s8") v.scheme = ActScheme::s8_per_token;
  else if (rest == "s4") v.scheme = ActScheme::s4_per_token;
  else if (rest == "e4m3") v.scheme = ActScheme::e4m3_per_token;
  else if (rest == "static") v.scheme = ActScheme::s8_per_tensor;
  else rest.clear();
  bool known = false;
  for (const auto& k : act_quant_variants()) known = known || k == name;
  if (rest.empty() || !known) {
    std::string list;
    for (const auto& k : act_quant_variants()) list += " " + k;
    throw Error(ErrorCode::invalid_argument,
                "nibble bench act-quant: unknown variant '" + name + "' (known:" + list + ")");
  }
  return v;
}

// Values uniform in [lo, hi) of a float dtype, written on the host and copied up.
void fill_floats(void* dst, DType t, size_t count, float lo, float hi, uint64_t seed) {
  std::vector<uint8_t> host(count * size_t(dtype_bits(t) / 8));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < count; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    store_float(host.data(), t, int64_t(i), lo + (hi - lo) * static_cast<float>(x >> 40) * 0x1p-24f);
  }
  BENCH_CUDA(cudaMemcpy(dst, host.data(), host.size(), cudaMemcpyHostToDevice));
}

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

struct Record {
  std::string variant, kernel, error;
  int64_t m = 0, k = 0;
  bool default_plan = true;
  double us = 0, bytes_read = 0, bytes_written = 0, working_set = 0, memcpy_us = 0;
  double gbps() const { return (bytes_read + bytes_written) / (us * 1e3); }
  double memcpy_gbps() const { return (bytes_read + bytes_written) / (memcpy_us * 1e3); }
};

}  // namespace

int run_act_quant_bench(const ActQuantBenchOptions& opt) {
  const DType xd = parse_dtype(opt.dtype);
  if (xd != DType::bf16 && xd != DType::f16 && xd != DType::f32)
    throw Error(ErrorCode::invalid_argument,
                "nibble bench act-quant: --dtype must be bf16, f16 or f32, got " + opt.dtype);
  std::vector<Variant> variants;
  for (const auto& name : opt.variants) variants.push_back(parse_variant(name));

  BENCH_CUDA(cudaSetDevice(0));
  const DeviceInfo dev = cuda_device_info(0);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const CopyCeiling copy = copy_ceiling(stream);
  const double copy_gbps = copy.gbps();
  std::printf("# %s, %d SMs, L2 %lld MiB; copy ceiling %.0f GB/s (read+write; memcpy node %.0f, "
              "copy kernel %.0f); x %s\n",
              dev.name.c_str(), dev.sm_count, static_cast<long long>(dev.l2_bytes >> 20),
              copy_gbps, copy.memcpy_gbps, copy.kernel_gbps, to_string(xd));

  const size_t xb = size_t(dtype_bits(xd) / 8);
  std::vector<Record> records;
  for (const int64_t k : opt.ks) {
    // The RMSNorm weight and the smooth vector: one per layer, read by every row (from L2).
    DeviceBuffer w(k * xb), sm(k * 4);
    fill_floats(w.p, xd, size_t(k), 0.5f, 1.5f, 21);
    fill_floats(sm.p, DType::f32, size_t(k), 0.5f, 2.0f, 22);
    for (const int64_t m : opt.ms) {
      const size_t x_bytes = size_t(m) * k * xb, q_bytes = size_t(m) * k;
      const size_t x_stride = round_up(x_bytes), q_stride = round_up(q_bytes);
      const int copies = copies_for(x_bytes + q_bytes + x_bytes, dev.l2_bytes, 1024);
      const int iters = std::max(opt.iters, copies);
      DeviceBuffer xs(x_stride * copies), qs(q_stride * copies), ys(x_stride * copies);
      DeviceBuffer scales(size_t(m) * 4);
      fill_floats(xs.p, xd, x_stride * copies / xb, -4.0f, 4.0f, 23);
      // The memcpy reference: up to half of the largest cell's bytes each way.
      const size_t half = round_up(x_bytes + (q_bytes + x_bytes) / 2 + 4096);
      DeviceBuffer cs(half * copies), cd(half * copies);
      BENCH_CUDA(cudaMemset(cs.p, 1, half * copies));

      for (const Variant& v : variants) {
        const auto x_view = [&](int i) {
          return TensorView::contiguous(static_cast<uint8_t*>(xs.p) + size_t(i) * x_stride, xd,
                                        {m, k}, Device::cuda());
        };
        const auto out_view = [&](int i) {
          QuantizedActivationView out;
          out.scheme = v.scheme;
          out.q = TensorView::contiguous(static_cast<uint8_t*>(qs.p) + size_t(i) * q_stride,
                                         act_value_dtype(v.scheme), {m, k}, Device::cuda());
          out.scales = TensorView::contiguous(
              scales.p, DType::f32, {v.scheme == ActScheme::s8_per_tensor ? 1 : m}, Device::cuda());
          return out;
        };
        const auto fusion = [&](int i) {
          ActQuantFusion f;
          if (v.norm) f.rms_weight = TensorView::contiguous(w.p, xd, {k}, Device::cuda());
          if (v.smooth) f.smooth = TensorView::contiguous(sm.p, DType::f32, {k}, Device::cuda());
          if (v.normed)
            f.normed = TensorView::contiguous(static_cast<uint8_t*>(ys.p) + size_t(i) * x_stride,
                                              xd, {m, k}, Device::cuda());
          return f;
        };
        const bool is_static = v.scheme == ActScheme::s8_per_tensor;
        const float static_scale = is_static ? 4.0f / 127.0f : 0.0f;
        Record base;
        base.variant = v.name;
        base.m = m;
        base.k = k;
        base.bytes_read = double(x_bytes) + (v.norm ? double(k * xb) : 0) + (v.smooth ? 4.0 * k : 0);
        base.bytes_written = double(v.scheme == ActScheme::s4_per_token ? q_bytes / 2 : q_bytes) +
                             (is_static ? 4.0 : 4.0 * m) + (v.normed ? double(x_bytes) : 0);
        base.working_set = double(std::min(iters, copies)) *
                           (double(x_bytes) + double(q_bytes) + (v.normed ? double(x_bytes) : 0));
        const size_t copy_bytes = size_t((base.bytes_read + base.bytes_written) / 2);
        try {
          base.memcpy_us = time_graph(stream, iters, opt.reps, [&](int i) {
            const size_t off = size_t(i % copies) * half;
            BENCH_CUDA(cudaMemcpyAsync(static_cast<uint8_t*>(cd.p) + off,
                                       static_cast<uint8_t*>(cs.p) + off, copy_bytes,
                                       cudaMemcpyDeviceToDevice, stream));
          });
        } catch (const Error&) {
          abandon_capture(stream);
        }

        // The library's own plan through the public API, then (--sweep) the alternatives.
        const cuda::ActQuantArgs args0 = cuda::act_quant_args(x_view(0), out_view(0), fusion(0), static_scale);
        const cuda::ActQuantPlan chosen = cuda::plan_act_quant(args0, dev);
        std::vector<cuda::ActQuantPlanOptions> alternatives;
        if (opt.sweep) {
          for (int chunks : {1, 2, 4, 8})
            for (int threads : {128, 256, 512}) alternatives.push_back({chunks, threads});
          cuda::ActQuantPlanOptions recompute_v;  // the planner's split, v = y / smooth redone
          recompute_v.keep_smoothed = false;
          alternatives.push_back(recompute_v);
        }
        std::vector<std::string> seen = {cuda::describe(chosen, args0)};
        for (int a = -1; a < static_cast<int>(alternatives.size()); ++a) {
          Record r = base;
          cuda::ActQuantPlan plan = chosen;
          if (a >= 0) {
            plan = cuda::plan_act_quant(args0, dev, alternatives[size_t(a)]);
            const std::string d = cuda::describe(plan, args0);
            if (std::find(seen.begin(), seen.end(), d) != seen.end()) continue;
            seen.push_back(d);
            r.default_plan = false;
          }
          r.kernel = cuda::describe(plan, args0);
          try {
            r.us = time_graph(stream, iters, opt.reps, [&](int i) {
              const int c = i % copies;
              if (a < 0 && is_static)
                quantize_activation_static(x_view(c), static_scale, out_view(c), fusion(c), stream);
              else if (a < 0)
                quantize_activation(x_view(c), out_view(c), fusion(c), stream);
              else
                cuda::launch_act_quant(cuda::act_quant_args(x_view(c), out_view(c), fusion(c), static_scale),
                                       plan, stream, cuda::overlapping_launch_allowed(dev.cc_major));
            });
          } catch (const Error& e) {
            r.error = e.what();
            abandon_capture(stream);
          }
          records.push_back(r);
        }
      }
    }
  }

  // ---- report ----------------------------------------------------------------------------------
  std::printf("%-26s %6s %6s %9s %8s %7s %9s %8s  %s\n", "variant", "M", "K", "us", "GB/s",
              "%copy", "memcpy us", "x memcpy", "kernel");
  for (const Record& r : records) {
    if (!r.error.empty()) {
      std::printf("%-26s %6lld %6lld  error: %s\n", r.variant.c_str(), (long long)r.m,
                  (long long)r.k, r.error.c_str());
      continue;
    }
    std::printf("%-26s %6lld %6lld %9.2f %8.0f %6.0f%% %9.2f %8.2f  %s%s\n", r.variant.c_str(),
                (long long)r.m, (long long)r.k, r.us, r.gbps(), 100.0 * r.gbps() / copy_gbps,
                r.memcpy_us, r.memcpy_us > 0 ? r.memcpy_us / r.us : 0.0, r.kernel.c_str(),
                r.default_plan ? "" : "  (sweep)");
  }
  if (!opt.json_path.empty()) {
    std::ofstream f(opt.json_path);
    f << "{\n \"bench\": \"act-quant\",\n \"device\": \"" << dev.name << "\",\n \"date\": \""
      << today() << "\",\n \"commit\": \"" << opt.commit << "\",\n \"cuda_runtime\": \""
      << build_info().cuda_runtime << "\",\n \"sm_count\": " << dev.sm_count
      << ",\n \"l2_bytes\": " << dev.l2_bytes << ",\n \"sm_clock_khz\": " << dev.clock_khz
      << ",\n " << copy.json_fields() << ",\n \"x_dtype\": \"" << to_string(xd)
      << "\",\n \"method\": \"CUDA-graph replay of max(" << opt.iters
      << ", copies) calls over buffer copies exceeding 3x L2 where 1024 copies allow, median of "
      << opt.reps << " replays; GB/s = (bytes read + bytes written) / time\",\n \"records\": [\n";
    for (size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      f << "  {\"variant\": \"" << r.variant << "\", \"M\": " << r.m << ", \"K\": " << r.k
        << ", \"default_plan\": " << (r.default_plan ? "true" : "false") << ", \"kernel\": \""
        << r.kernel << "\", \"bytes_read\": " << r.bytes_read
        << ", \"bytes_written\": " << r.bytes_written << ", \"working_set\": " << r.working_set;
      if (r.error.empty())
        f << ", \"us\": " << r.us << ", \"GBps\": " << r.gbps()
          << ", \"pct_copy\": " << 100.0 * r.gbps() / copy_gbps << ", \"memcpy_us\": " << r.memcpy_us
          << ", \"memcpy_GBps\": " << (r.memcpy_us > 0 ? r.memcpy_gbps() : 0.0);
      else
        f << ", \"error\": \"" << r.error << "\"";
      f << "}" << (i + 1 < records.size() ? "," : "") << "\n";
    }
    f << " ]\n}\n";
    std::printf("wrote %s\n", opt.json_path.c_str());
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace nibble::bench
