// `nibble bench gemm`: times nibble's linears (packed W4A8 with int8 activations in, packed
// W4A-FP8 with e4m3 ones; packed W4A16 and W8A16 with bf16 activations in; W8A8 on its logical
// int8 weights) against cuBLAS bf16 (cublasGemmEx), cuBLASLt int8 (s8×s8→s32), cuBLASLt int8
// followed by a separate rescale kernel to bf16 (what an unfused W8A8 costs: the int32 product
// makes a round trip to memory) and, on sm_89+, cuBLASLt FP8 (e4m3×e4m3→bf16, with and without
// fast accumulation) on Llama layer shapes, in one run. At M <= 16 it also times a plain
// read-only kernel over exactly the int4 and the int8 weight bytes (read_int4_bytes,
// read_int8_bytes): the rate a stream of that size reaches, against which the decode cells'
// "% of the copy ceiling" of small layers can be judged.
//
// Method (docs/kernels.md): every timed op is captured `iters` times into a CUDA graph that
// cycles through enough weight copies to exceed 3× L2, so weights stream from HBM as in real
// decoding; the graph is replayed `reps` times and the median per-call time is reported. The
// device-to-device copy ceiling (the faster of a memcpy node and a copy kernel) is measured in
// the same run. Data are random, never zeros.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/gemm_bench.h"
#include "nibble/nibble.h"

namespace nibble::bench {

namespace {

#define BENCH_CUBLAS(call)                                                                 \
  do {                                                                                     \
    cublasStatus_t s_ = (call);                                                            \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                                       \
      throw Error(ErrorCode::cuda_error, std::string(#call) + ": cuBLAS status " +         \
                                             std::to_string(static_cast<int>(s_)));        \
  } while (0)

struct Record {
  std::string op, kernel, error;
  int64_t m, n, k;
  double us = 0, weight_bytes = 0;
};

// One packed weight in device memory, in the layout the format's kernels read, with random
// contents in the layout's valid range.
PackedWeight random_packed(const LinearFormat& lf, int64_t n, int64_t k, uint64_t seed) {
  const WeightFormat& f = lf.weight;
  PackedWeight p = allocate_packed_weight(f, n, k, Device::cuda(), packed_layout(lf));
  fill_random(p.q.data(), p.q.nbytes(), seed);
  fill_f32(p.scales.data(), p.scales.view().numel(), 1e-3f, 2e-3f, seed + 1);
  if (p.zeros.defined()) {  // u4_asym: an integer zero point; u4_fzp: a float zero
    std::vector<float> host(static_cast<size_t>(p.zeros.view().numel()));
    std::mt19937 rng(static_cast<uint32_t>(seed + 2));
    for (float& z : host)
      z = f.scheme == WeightScheme::u4_asym ? float(rng() % 16) : float(rng() % 1000) * 1e-5f;
    BENCH_CUDA(cudaMemcpy(p.zeros.data(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  }
  const bool two_level = f.scheme == WeightScheme::s4_two_level;
  if (two_level) {
    std::vector<uint8_t> host(static_cast<size_t>(p.group_params.nbytes()));
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (size_t i = 0; i < host.size(); i += 2) {
      const int gs = 1 + static_cast<int>(rng() % 8), gz = static_cast<int>(rng() % 16);
      const int gz_ok = std::max(gz, 15 - 127 / gs);  // keep (15 − g_z)·g_s ≤ 127
      host[i] = static_cast<uint8_t>(gs);
      host[i + 1] = static_cast<uint8_t>(128 - gs * gz_ok);
    }
    BENCH_CUDA(cudaMemcpy(p.group_params.data(), host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  return p;
}

// A logical W8A8 weight in device memory: random int8 values, per-channel f32 scales.
QuantizedWeight random_logical(const LinearFormat& lf, int64_t n, int64_t k, uint64_t seed) {
  QuantizedWeight w(lf.weight, n, k, Device::cuda());
  fill_random(w.q.data(), w.q.nbytes(), seed);
  fill_f32(w.scales.data(), w.scales.view().numel(), 1e-3f, 2e-3f, seed + 1);
  return w;
}

double logical_bytes(const QuantizedWeight& w) {
  return double(w.q.nbytes()) + double(w.scales.nbytes());
}

// The unfused W8A8 epilogue a cuBLASLt int8 user runs after the GEMM: D = s_a[m]·s_w[n]·acc,
// bf16 out, 8 outputs per thread with 16-byte loads where the row allows.
__global__ void rescale_s32_to_bf16(const int32_t* acc, const float* s_a, const float* s_w,
                                    __nv_bfloat16* d, int64_t m, int64_t n) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (i >= m * n) return;
  const int64_t row = i / n, col = i % n;
  if (n % 8 == 0) {
    const int4 lo = *reinterpret_cast<const int4*>(acc + i);
    const int4 hi = *reinterpret_cast<const int4*>(acc + i + 4);
    const int32_t v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    __nv_bfloat16 out[8];
    for (int e = 0; e < 8; ++e) out[e] = __float2bfloat16_rn(s_a[row] * (s_w[col + e] * float(v[e])));
    *reinterpret_cast<int4*>(d + i) = *reinterpret_cast<const int4*>(out);
    return;
  }
  for (int64_t j = i; j < i + 8 && j < m * n; ++j)
    d[j] = __float2bfloat16_rn(s_a[j / n] * (s_w[j % n] * float(acc[j])));
}

// One cuBLASLt matmul D (M, N) row-major = A (M, K) · W (N, K)ᵀ, computed as the column-major
// Dᵀ = W·Aᵀ with W transposed (the "TN" form int8 and FP8 need): its descriptor, layouts and
// the heuristic's first algorithm. alpha = 1, beta = 0 in the scale type.
struct LtGemm {
  cublasLtHandle_t lt;
  size_t ws_bytes;
  cudaDataType_t scale_type;
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t la{}, lb{}, lc{};
  cublasLtMatmulHeuristicResult_t heur{};
  bool found = false;

  LtGemm(cublasLtHandle_t handle, size_t workspace_bytes, cublasComputeType_t compute,
         cudaDataType_t scale, cudaDataType_t in, cudaDataType_t out, int64_t m, int64_t n,
         int64_t k, bool fast_accum)
      : lt(handle), ws_bytes(workspace_bytes), scale_type(scale) {
    BENCH_CUBLAS(cublasLtMatmulDescCreate(&desc, compute, scale));
    const cublasOperation_t opT = CUBLAS_OP_T;
    BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT));
    if (fast_accum) {
      const int8_t on = 1;
      BENCH_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof on));
    }
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&la, in, k, n, k));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&lb, in, k, m, k));
    BENCH_CUBLAS(cublasLtMatrixLayoutCreate(&lc, out, n, m, n));
    cublasLtMatmulPreference_t pref;
    BENCH_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    BENCH_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    int count = 0;
    found = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &heur, &count) ==
                CUBLAS_STATUS_SUCCESS &&
            count > 0;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  ~LtGemm() {
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  void run(const void* w, const void* a, void* d, void* ws, cudaStream_t stream) const {
    const int32_t alpha_i = 1, beta_i = 0;
    const float alpha_f = 1.0f, beta_f = 0.0f;
    const bool f32 = scale_type == CUDA_R_32F;
    BENCH_CUBLAS(cublasLtMatmul(lt, desc, f32 ? static_cast<const void*>(&alpha_f) : &alpha_i, w, la,
                                a, lb, f32 ? static_cast<const void*>(&beta_f) : &beta_i, d, lc, d,
                                lc, &heur.algo, ws, ws_bytes, stream));
  }
};

double packed_bytes(const PackedWeight& p) {
  return double(p.q.nbytes()) + double(p.scales.nbytes()) +
         (p.group_params.defined() ? double(p.group_params.nbytes()) : 0.0) +
         (p.zeros.defined() ? double(p.zeros.nbytes()) : 0.0);
}

}  // namespace

int run_gemm_bench(const GemmBenchOptions& opt) {
  BENCH_CUDA(cudaSetDevice(0));
  const DeviceInfo dev = cuda_device_info(0);
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasHandle_t blas;
  BENCH_CUBLAS(cublasCreate(&blas));
  BENCH_CUBLAS(cublasSetStream(blas, stream));
  cublasLtHandle_t lt;
  BENCH_CUBLAS(cublasLtCreate(&lt));
  const size_t lt_ws_bytes = 32 << 20;
  DeviceBuffer lt_ws(lt_ws_bytes);

  // Ceiling: device-to-device copy, bytes read + written.
  const CopyCeiling copy = copy_ceiling(stream);
  const double copy_gbps = copy.gbps();
  std::printf("# %s, %d SMs, L2 %lld MiB; copy ceiling %.0f GB/s (read+write; memcpy node %.0f, "
              "copy kernel %.0f)\n",
              dev.name.c_str(), dev.sm_count, static_cast<long long>(dev.l2_bytes >> 20), copy_gbps,
              copy.memcpy_gbps, copy.kernel_gbps);

  std::vector<Record> records;
  // The JSON is rewritten after every shape, so a run cut short (the device tool's time limit)
  // still leaves the shapes it finished.
  auto write_json = [&](bool final) {
    if (opt.json_path.empty()) return;
    std::ofstream f(opt.json_path);
    f << "{\n \"device\": \"" << dev.name << "\",\n \"date\": \"" << today() << "\",\n \"commit\": \""
      << opt.commit << "\",\n \"cuda_runtime\": \"" << build_info().cuda_runtime
      << "\",\n \"sm_count\": " << dev.sm_count << ",\n \"l2_bytes\": " << dev.l2_bytes
      << ",\n \"sm_clock_khz\": " << dev.clock_khz << ",\n " << copy.json_fields()
      << ",\n \"method\": \"CUDA-graph replay of " << opt.iters << " calls, median of " << opt.reps
      << " replays, weights rotated over >= 3x L2\",\n \"records\": [\n";
    for (size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      f << "  {\"op\": \"" << r.op << "\", \"M\": " << r.m << ", \"N\": " << r.n << ", \"K\": " << r.k;
      if (r.error.empty()) {
        f << ", \"us\": " << r.us << ", \"TOPS\": " << 2.0 * r.m * r.n * r.k / (r.us * 1e6)
          << ", \"wGBps\": " << r.weight_bytes / (r.us * 1e3) << ", \"kernel\": \"" << r.kernel << "\"";
      } else {
        f << ", \"error\": \"" << r.error << "\"";
      }
      f << "}" << (i + 1 < records.size() ? "," : "") << "\n";
    }
    f << " ]\n}\n";
    if (final) std::printf("wrote %s\n", opt.json_path.c_str());
  };

  for (const auto& shape : opt.shapes) {
    const int64_t n = shape.n, k = shape.k;
    const int64_t max_m = *std::max_element(opt.ms.begin(), opt.ms.end());
    // Activations: one buffer, reused (they are small and live in L2 in real inference too).
    DeviceBuffer a_s8(size_t(max_m) * k), a_bf16(size_t(max_m) * k * 2);
    DeviceBuffer a_scales(size_t(max_m) * 4), d_out(size_t(max_m) * n * 4);
    DeviceBuffer acc_s32(size_t(max_m) * n * 4), w_scales(size_t(n) * 4);
    DeviceBuffer a_e4m3(size_t(max_m) * k);
    fill_e4m3(a_e4m3.p, size_t(max_m) * k, 15);
    fill_f32(w_scales.p, size_t(n), 1e-3f, 2e-3f, 14);
    fill_random(a_s8.p, size_t(max_m) * k, 11);
    fill_bf16(a_bf16.p, size_t(max_m) * k, 12);
    fill_f32(a_scales.p, size_t(max_m), 0.01f, 0.02f, 13);
    // Peers' weights, rotated like ours.
    const int bf16_copies = copies_for(size_t(n) * k * 2, dev.l2_bytes);
    const int s8_copies = copies_for(size_t(n) * k, dev.l2_bytes);
    std::vector<std::unique_ptr<DeviceBuffer>> w_bf16, w_s8;
    for (int i = 0; i < bf16_copies; ++i) {
      w_bf16.push_back(std::make_unique<DeviceBuffer>(size_t(n) * k * 2));
      fill_bf16(w_bf16.back()->p, size_t(n) * k, 100 + i);
    }
    for (int i = 0; i < s8_copies; ++i) {
      w_s8.push_back(std::make_unique<DeviceBuffer>(size_t(n) * k));
      fill_random(w_s8.back()->p, size_t(n) * k, 200 + i);
    }
    // FP8 tensor cores: sm_89 and newer.
    const bool fp8_peers = dev.cc_major * 10 + dev.cc_minor >= 89;
    std::vector<std::unique_ptr<DeviceBuffer>> w_e4m3;
    for (int i = 0; fp8_peers && i < s8_copies; ++i) {
      w_e4m3.push_back(std::make_unique<DeviceBuffer>(size_t(n) * k));
      fill_e4m3(w_e4m3.back()->p, size_t(n) * k, 250 + i);
    }
    // Ours: packed weights where the format has a packed layout, else the logical weights
    // (W8A8, whose kernels read the row-major int8 matrix).
    struct Ours {
      std::string format;
      std::vector<PackedWeight> packed;
      std::vector<QuantizedWeight> logical;
    };
    std::vector<Ours> ours;
    for (const auto& fname : opt.formats) {
      const LinearFormat f = parse_linear_format(fname);
      Ours o{fname, {}, {}};
      if (has_packed_layout(f)) {
        o.packed.push_back(random_packed(f, n, k, 300));
        const int c = copies_for(static_cast<size_t>(packed_bytes(o.packed[0])), dev.l2_bytes);
        for (int i = 1; i < c; ++i) o.packed.push_back(random_packed(f, n, k, 300 + i));
      } else {
        o.logical.push_back(random_logical(f, n, k, 300));
        const int c = copies_for(static_cast<size_t>(logical_bytes(o.logical[0])), dev.l2_bytes);
        for (int i = 1; i < c; ++i) o.logical.push_back(random_logical(f, n, k, 300 + i));
      }
      ours.push_back(std::move(o));
    }

    for (int64_t m : opt.ms) {
      auto add = [&](const std::string& op, double wbytes, const std::string& kernel,
                     const std::function<void(int)>& fn) {
        Record r{op, kernel, "", m, n, k};
        r.weight_bytes = wbytes;
        try {
          r.us = time_graph(stream, opt.iters, opt.reps, fn);
        } catch (const Error& e) {
          r.error = e.what();
          abandon_capture(stream);
        }
        records.push_back(r);
      };
      // nibble: W4A8 / W8A8 with int8 activations in, W4A16 / W8A16 with bf16 activations in;
      // bf16 out.
      for (const Ours& o : ours) {
        const LinearFormat f = parse_linear_format(o.format);
        QuantizedActivationView qa;
        // int8 activations, int4 ones for W4A4 (the random bytes are valid codes either way), or
        // finite e4m3 codes for W4A-FP8.
        const bool a4 = f.act == ActScheme::s4_per_token, fp8 = f.act == ActScheme::e4m3_per_token;
        qa.scheme = a4 ? ActScheme::s4_per_token : fp8 ? ActScheme::e4m3_per_token : ActScheme::s8_per_token;
        qa.q = TensorView::contiguous(fp8 ? a_e4m3.p : a_s8.p,
                                      a4 ? DType::s4 : fp8 ? DType::e4m3 : DType::s8, {m, k},
                                      Device::cuda());
        qa.scales = TensorView::contiguous(a_scales.p, DType::f32, {m}, Device::cuda());
        const TensorView d = TensorView::contiguous(d_out.p, DType::bf16, {m, n}, Device::cuda());
        std::string kernel = explain(f, m, n, k, Device::cuda());
        const size_t runs = o.packed.empty() ? kernel.find("runs ") : kernel.rfind("runs ");
        kernel = kernel.substr(runs != std::string::npos ? runs + 5 : 0);
        const TensorView x = TensorView::contiguous(a_bf16.p, DType::bf16, {m, k}, Device::cuda());
        const bool weight_only = f.act == ActScheme::none;
        if (o.packed.empty()) {
          add(o.format, logical_bytes(o.logical[0]), kernel, [&, d, qa](int i) {
            linear(qa, o.logical[static_cast<size_t>(i) % o.logical.size()].view(), nullptr, d,
                   stream);
          });
          continue;
        }
        add(o.format, packed_bytes(o.packed[0]), kernel, [&, d, qa, x, weight_only](int i) {
          const PackedWeightView w = o.packed[static_cast<size_t>(i) % o.packed.size()].view();
          if (weight_only) linear(x, w, nullptr, d, stream);
          else linear(qa, w, nullptr, d, stream);
        });
        // W4A8 with bf16 activations in, the per-token quantization included: what linear(x,
        // packed) runs by default (the activation kernel + the int8 GEMM), and where the GEMM can
        // quantize inside (fused_quant_fits), that one launch (NIBBLE_FUSED_ACT_QUANT=1, the
        // default under a LinearFusion; read by each call, so it is set around the timing).
        if (opt.bf16_in && !weight_only && f.act == ActScheme::s8_per_token) {
          auto bf16_in = [&, d, x](int i) {
            linear(x, o.packed[static_cast<size_t>(i) % o.packed.size()].view(), nullptr, d,
                   stream);
          };
          const std::string two_launches = "act_quant kernel + " + kernel;
          const bool fused_default = kernel.find("fused into") != std::string::npos;
          add(o.format + ".bf16_in", packed_bytes(o.packed[0]),
              fused_default ? "sm80_w4a8_gemm with fused per-token quantization" : two_launches,
              bf16_in);
          setenv("NIBBLE_FUSED_ACT_QUANT", "1", 1);
          if (!fused_default &&
              explain(f, m, n, k, Device::cuda()).find("fused into") != std::string::npos)
            add(o.format + ".bf16_in_fused", packed_bytes(o.packed[0]),
                "sm80_w4a8_gemm with fused per-token quantization", bf16_in);
          unsetenv("NIBBLE_FUSED_ACT_QUANT");
        }
      }
      if (opt.peers == "none") continue;
      // Decode rows: a plain read of exactly the int4 and the int8 weight bytes (N·K/2, N·K),
      // rotated over the int8 peers' buffers (both halves of each for int4: the same >= 3× L2
      // working set). At small sizes launch and memory latency keep any stream below the 1 GiB
      // copy ceiling; these rows say how far (bench_util.h, stream_read).
      if (m <= 16 && (n * k) % 32 == 0) {
        add("read_int4_bytes", double(n) * k / 2, "read-only kernel over N*K/2 bytes", [&](int i) {
          const auto& buf = w_s8[static_cast<size_t>(i / 2) % w_s8.size()];
          stream_read(static_cast<const uint8_t*>(buf->p) + (i % 2) * (size_t(n) * k / 2),
                      size_t(n) * k / 2, stream);
        });
        add("read_int8_bytes", double(n) * k, "read-only kernel over N*K bytes", [&](int i) {
          stream_read(w_s8[static_cast<size_t>(i) % w_s8.size()]->p, size_t(n) * k, stream);
        });
      }
      // cuBLAS bf16: D (M, N) row-major = A (M, K) · W (N, K)ᵀ, i.e. column-major Dᵀ = W·Aᵀ.
      add("cublas_bf16", double(n) * k * 2, "cublasGemmEx bf16, f32 accumulate", [&](int i) {
        const float alpha = 1.0f, beta = 0.0f;
        BENCH_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                                  static_cast<int>(m), static_cast<int>(k), &alpha,
                                  w_bf16[static_cast<size_t>(i) % w_bf16.size()]->p, CUDA_R_16BF,
                                  static_cast<int>(k), a_bf16.p, CUDA_R_16BF, static_cast<int>(k),
                                  &beta, d_out.p, CUDA_R_16BF, static_cast<int>(n),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      if (opt.peers == "bf16") continue;
      // cuBLASLt int8: s8×s8 → s32, the same layout trick (TN: the weights transposed).
      LtGemm s8gemm(lt, lt_ws_bytes, CUBLAS_COMPUTE_32I, CUDA_R_32I, CUDA_R_8I, CUDA_R_32I, m, n,
                    k, false);
      if (!s8gemm.found) {
        records.push_back({"cublaslt_s8", "", "no cuBLASLt int8 algorithm for this shape", m, n, k});
      } else {
        auto lt_matmul = [&](int i) {
          s8gemm.run(w_s8[static_cast<size_t>(i) % w_s8.size()]->p, a_s8.p, acc_s32.p, lt_ws.p,
                     stream);
        };
        add("cublaslt_s8", double(n) * k, "cublasLtMatmul s8s8s32", lt_matmul);
        add("cublaslt_s8_rescale", double(n) * k,
            "cublasLtMatmul s8s8s32 + rescale kernel to bf16", [&](int i) {
              lt_matmul(i);
              const int64_t groups = (m * n + 7) / 8;
              rescale_s32_to_bf16<<<static_cast<unsigned>((groups + 255) / 256), 256, 0, stream>>>(
                  static_cast<const int32_t*>(acc_s32.p), static_cast<const float*>(a_scales.p),
                  static_cast<const float*>(w_scales.p), static_cast<__nv_bfloat16*>(d_out.p), m,
                  n);
              BENCH_CUDA(cudaGetLastError());
            });
      }
      // cuBLASLt FP8 (sm_89+): e4m3×e4m3 → bf16 with f32 accumulation, unit scales; with the
      // default accumulation (partial sums promoted to f32 on the CUDA cores, like torch's
      // _scaled_mm default) and with CUBLASLT_MATMUL_DESC_FAST_ACCUM (tensor-core accumulation
      // only).
      if (fp8_peers) {
        for (bool fast : {false, true}) {
          const char* op = fast ? "cublaslt_fp8_fastaccum" : "cublaslt_fp8";
          LtGemm f8(lt, lt_ws_bytes, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_16BF,
                    m, n, k, fast);
          if (!f8.found) {
            records.push_back({op, "", "no cuBLASLt FP8 algorithm for this shape", m, n, k});
            continue;
          }
          add(op, double(n) * k,
              fast ? "cublasLtMatmul e4m3 x e4m3 -> bf16, fast accumulation"
                   : "cublasLtMatmul e4m3 x e4m3 -> bf16",
              [&](int i) {
                f8.run(w_e4m3[static_cast<size_t>(i) % w_e4m3.size()]->p, a_e4m3.p, d_out.p,
                       lt_ws.p, stream);
              });
        }
      }
    }
    write_json(false);
  }

  // ---- report ----------------------------------------------------------------------------------
  auto peer_us = [&](const Record& r, const char* op) {
    for (const auto& p : records)
      if (p.op == op && p.m == r.m && p.n == r.n && p.k == r.k && p.error.empty()) return p.us;
    return 0.0;
  };
  std::printf("%-22s %6s %6s %6s %9s %8s %8s %7s %8s %8s %8s %8s  %s\n", "op", "M", "N", "K",
              "us", "TOPS", "wGB/s", "%copy", "x bf16", "x s8", "x s8+rs", "x fp8", "kernel");
  for (const auto& r : records) {
    if (!r.error.empty()) {
      std::printf("%-22s %6lld %6lld %6lld  error: %s\n", r.op.c_str(), (long long)r.m,
                  (long long)r.n, (long long)r.k, r.error.c_str());
      continue;
    }
    const double tops = 2.0 * r.m * r.n * r.k / (r.us * 1e6);
    const double gbps = r.weight_bytes / (r.us * 1e3);
    const double bf = peer_us(r, "cublas_bf16"), s8 = peer_us(r, "cublaslt_s8"),
                 s8rs = peer_us(r, "cublaslt_s8_rescale");
    // The fastest FP8 peer of the two accumulation modes.
    const double f8a = peer_us(r, "cublaslt_fp8"), f8b = peer_us(r, "cublaslt_fp8_fastaccum");
    const double f8 = f8a > 0 && f8b > 0 ? std::min(f8a, f8b) : std::max(f8a, f8b);
    std::printf("%-22s %6lld %6lld %6lld %9.2f %8.1f %8.0f %6.0f%% %8.2f %8.2f %8.2f %8.2f  %s\n",
                r.op.c_str(), (long long)r.m, (long long)r.n, (long long)r.k, r.us, tops, gbps,
                100.0 * gbps / copy_gbps, bf > 0 ? bf / r.us : 0.0, s8 > 0 ? s8 / r.us : 0.0,
                s8rs > 0 ? s8rs / r.us : 0.0, f8 > 0 ? f8 / r.us : 0.0, r.kernel.c_str());
  }
  write_json(true);
  cublasLtDestroy(lt);
  cublasDestroy(blas);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace nibble::bench
