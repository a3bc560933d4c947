#include "llm/cuda/gpu_linear.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "llm/cuda/cublas_check.h"
#include "llm/linear.h"
#include "nibble/nibble.h"

namespace nibble::llm::cuda {

TensorView strided(void* data, DType dtype, int64_t rows, int64_t cols, int64_t ld,
                   Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = 2;
  v.shape = {rows, cols, 0, 0};
  v.strides = {ld, 1, 0, 0};
  v.device = device;
  return v;
}

namespace {

// The variance of int4 values uniform on [-8, 7] and int8 values uniform on [-128, 127]:
// (16² − 1)/12 and (256² − 1)/12 (their means, −0.5, are negligible here). Random weights get
// scales that make the dequantized weights' variance 1/K, like the host's random bf16 weights.
constexpr double kInt4Variance = 21.25;
constexpr double kInt8Variance = 5461.25;
// E[g_s²] of the device's random two-level group scales, uniform on 9..16.
constexpr double kTwoLevelGroupScaleSquare = 161.5;

/// The first `cols` columns of the first `rows` rows of a (·, ≥ cols) view.
TensorView sub_view(const TensorView& t, int64_t rows, int64_t cols) {
  return strided(t.data, t.dtype, rows, cols, t.stride(0), t.device);
}

// Fills a (small) scale or zero buffer on the device with one value, through the host.
void fill_buffer(Tensor& t, double value) {
  if (!t.defined()) return;
  Tensor host(t.view().dtype, std::vector<int64_t>(t.view().shape.begin(),
                                                   t.view().shape.begin() + t.view().rank));
  const int64_t count = host.view().numel();
  for (int64_t i = 0; i < count; ++i) {
    if (is_float(host.view().dtype))
      store_float(host.data(), host.view().dtype, i, static_cast<float>(value));
    else
      store_int(host.data(), host.view().dtype, i, static_cast<int32_t>(value));
  }
  t.copy_from(host);
}

}  // namespace

void GpuLinear::check_mode(const std::string& mode) {
  check_weight_mode(mode);
  if (mode == "f32")
    detail::fail(ErrorCode::unsupported,
                 "nibble::llm: the CUDA backend runs bf16 and nibble formats; f32 is the CPU "
                 "backend's reference mode (use --device cpu, or --format bf16)");
  if (mode.rfind(kSimPrefix, 0) == 0)
    detail::fail(ErrorCode::unsupported,
                 "nibble::llm: '" + mode +
                     "' is the CPU backend's simulated study mode (docs/accuracy.md); the CUDA "
                     "backend runs the formats themselves (--format " +
                     mode.substr(sizeof kSimPrefix - 1) + ")");
}

GpuLinear::Path GpuLinear::choose_path(const std::string& mode, int64_t k_padded) {
  if (mode == "bf16") return Path::cublas_bf16;
  const LinearFormat f = parse_linear_format(mode);
  // The packed kernels' K granularity: k32 steps of the 8-bit MMAs for W4A8 and W4A-FP8,
  // 16-byte rows of the bf16 activations for the weight-only kernel.
  if (has_packed_layout(f)) {
    if (f.act == ActScheme::none && k_padded % 8 == 0) return Path::packed_a16;
    if ((f.act == ActScheme::s8_per_token || f.act == ActScheme::e4m3_per_token) &&
        k_padded % 32 == 0)
      return Path::packed_a8;
  }
  return f.act == ActScheme::none ? Path::weight_only : Path::quantized_act;
}

GpuLinear::GpuLinear(const std::string& mode, int64_t n, int64_t k)
    : mode_(mode), n_(n), k_(k) {
  check_mode(mode);
  if (n <= 0 || k <= 0 || n > INT32_MAX || k > INT32_MAX)
    detail::fail(ErrorCode::invalid_argument, "nibble::llm: a linear layer of " +
                                                  std::to_string(n) + "×" + std::to_string(k) +
                                                  " does not fit the CUDA runner");
  kp_ = padded_k(mode, k);
  if (mode != "bf16") format_ = parse_linear_format(mode);
  path_ = choose_path(mode, kp_);
}

void GpuLinear::set_quantized(const QuantizedWeight& host_qw, Device device) {
  if (packed())
    packed_ = pack_weight(host_qw.view(), packed_layout(format_), device);
  else
    qw_ = host_qw.to(device);
}

std::unique_ptr<GpuLinear> GpuLinear::from_floats(const std::string& mode,
                                                  const std::vector<float>& w, int64_t n,
                                                  int64_t k, Device device) {
  std::unique_ptr<GpuLinear> l(new GpuLinear(mode, n, k));
  if (static_cast<int64_t>(w.size()) != n * k)
    detail::fail(ErrorCode::internal, "GpuLinear::from_floats: weight size is not n·k");
  if (l->path_ == Path::cublas_bf16) {
    std::vector<uint16_t> bits(w.size());
    for (size_t i = 0; i < w.size(); ++i) bits[i] = f32_to_bf16_bits(w[i]);
    l->bf16_ = Tensor(DType::bf16, {n, k}, device);
    NIBBLE_CUDA_CHECK(cudaMemcpy(l->bf16_.data(), bits.data(), bits.size() * 2,
                                 cudaMemcpyHostToDevice));
    return l;
  }
  // Zero columns pad K to the group (as the CPU backend's NibbleLinear does).
  Tensor padded = Tensor::empty(DType::f32, {n, l->kp_});
  float* dst = padded.view().ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(dst + r * l->kp_, w.data() + r * k, static_cast<size_t>(k) * 4);
    std::fill(dst + r * l->kp_ + k, dst + (r + 1) * l->kp_, 0.0f);
  }
  QuantizedWeight qw(l->format_.weight, n, l->kp_);
  quantize_weight(padded.view(), qw.view());
  l->set_quantized(qw, device);
  return l;
}

std::unique_ptr<GpuLinear> GpuLinear::from_quantized(const std::string& mode,
                                                     const QuantizedWeight& qw, int64_t k,
                                                     Device device) {
  std::unique_ptr<GpuLinear> l(new GpuLinear(mode, qw.n, k));
  if (mode == "bf16" || !(qw.format == l->format_.weight) || qw.k != l->kp_)
    detail::fail(ErrorCode::invalid_argument,
                 "nibble::llm: pre-quantized weights of format " + to_string(qw.format) +
                     " with K = " + std::to_string(qw.k) + " do not fit " + mode + " with K = " +
                     std::to_string(k) + " (padded " + std::to_string(l->kp_) + ")");
  l->set_quantized(qw, device);
  return l;
}

std::unique_ptr<GpuLinear> GpuLinear::random(const std::string& mode, int64_t n, int64_t k,
                                             uint64_t seed, Device device, Stream stream) {
  std::unique_ptr<GpuLinear> l(new GpuLinear(mode, n, k));
  const double kd = static_cast<double>(k);
  if (l->path_ == Path::cublas_bf16) {
    l->bf16_ = Tensor(DType::bf16, {n, k}, device);
    launch_fill_uniform_bf16(static_cast<uint16_t*>(l->bf16_.data()), n * k,
                             static_cast<float>(std::sqrt(3.0 / kd)), seed, stream);
    return l;
  }
  const WeightFormat& wf = l->format_.weight;
  const double int4_scale = 1.0 / std::sqrt(kInt4Variance * kd);
  const double int8_scale = 1.0 / std::sqrt(kInt8Variance * kd);
  if (l->packed()) {
    l->packed_ = allocate_packed_weight(wf, n, l->kp_, device, packed_layout(l->format_));
    PackedWeight& p = l->packed_;
    launch_fill_random_bytes(static_cast<uint8_t*>(p.q.data()), p.q.nbytes(), seed, stream);
    double scale = wf.scheme == WeightScheme::s8_sym ? int8_scale : int4_scale;
    if (wf.scheme == WeightScheme::s4_two_level)
      scale = 1.0 / std::sqrt(kTwoLevelGroupScaleSquare * kInt4Variance * kd);
    launch_fill_f32(static_cast<float*>(p.scales.data()), p.scales.view().numel(),
                    static_cast<float>(scale), stream);
    if (wf.scheme == WeightScheme::s4_two_level)
      launch_fill_two_level_params(static_cast<uint8_t*>(p.group_params.data()),
                                   p.group_params.nbytes() / 2, seed + 1, stream);
    // Zeros (f32 in the packed layouts): the integer zero 8 of u4_asym (w = s·(q − 8)), the
    // float zero 0 of u4_fzp (w = s·(q − 8) + 0).
    if (wf.scheme == WeightScheme::u4_asym || wf.scheme == WeightScheme::u4_fzp)
      launch_fill_f32(static_cast<float*>(p.zeros.data()), p.zeros.view().numel(),
                      wf.scheme == WeightScheme::u4_asym ? 8.0f : 0.0f, stream);
    return l;
  }
  // Logical weights (the generic kernels' formats): random values; scales and zeros are small,
  // filled through the host.
  l->qw_ = QuantizedWeight(wf, n, l->kp_, device);
  QuantizedWeight& q = l->qw_;
  launch_fill_random_bytes(static_cast<uint8_t*>(q.q.data()), q.q.nbytes(), seed, stream);
  NIBBLE_CUDA_CHECK(cudaStreamSynchronize(stream));
  switch (wf.scheme) {
    case WeightScheme::s4_sym: fill_buffer(q.scales, int4_scale); break;
    case WeightScheme::u4_asym:
      fill_buffer(q.scales, int4_scale);
      fill_buffer(q.zeros, 8);
      break;
    case WeightScheme::u4_fzp:
      fill_buffer(q.scales, int4_scale);
      fill_buffer(q.zeros, 0.0);
      break;
    case WeightScheme::s8_sym: fill_buffer(q.scales, int8_scale); break;
    case WeightScheme::s4_two_level:  // w8 = 16·(q − 8) ∈ [−128, 112]
      fill_buffer(q.scales, int4_scale / 16.0);
      fill_buffer(q.group_scales, 16);
      fill_buffer(q.zeros, 8);
      break;
  }
  return l;
}

std::unique_ptr<GpuLinear> GpuLinear::bf16_shared(Tensor w) {
  const TensorView& v = w.view();
  if (v.rank != 2 || v.dtype != DType::bf16 || v.device.type != DeviceType::cuda)
    detail::fail(ErrorCode::internal, "GpuLinear::bf16_shared: expected a (n, k) bf16 CUDA tensor");
  std::unique_ptr<GpuLinear> l(new GpuLinear("bf16", v.size(0), v.size(1)));
  l->bf16_ = std::move(w);
  return l;
}

bool GpuLinear::quantizes_in_linear(bool fuse_int8, int64_t m) const {
  // NIBBLE_DECODE_INT8=producer keeps the producers' int8 at decode size too (A/B measurements).
  static const bool producer = [] {
    const char* v = std::getenv("NIBBLE_DECODE_INT8");
    return v != nullptr && std::string_view(v) == "producer";
  }();
  return fuse_int8 && !producer && path_ == Path::packed_a8 &&
         format_.act == ActScheme::s8_per_token && m <= kQuantizeInLinearMaxTokens;
}

bool GpuLinear::norm_in_linear(bool fuse_int8, int64_t m) const {
  static const bool kernel = [] {
    const char* v = std::getenv("NIBBLE_DECODE_NORM");
    return v != nullptr && std::string_view(v) == "kernel";
  }();
  return !kernel && kp_ == k_ && quantizes_in_linear(fuse_int8, m);
}

ActKind GpuLinear::input_kind(bool fuse_int8, int64_t m) const {
  switch (path_) {
    case Path::cublas_bf16:
    case Path::packed_a16:
    case Path::weight_only: return ActKind::bf16;  // as the CPU backend feeds A16 formats
    case Path::packed_a8:
    case Path::quantized_act:
      if (quantizes_in_linear(fuse_int8, m)) return ActKind::f32;
      return fuse_int8 && format_.act == ActScheme::s8_per_token ? ActKind::s8_per_token
                                                                 : ActKind::f32;
  }
  return ActKind::f32;
}

void GpuLinear::forward(const LinearInput& in, const LinearScratch& scratch, int64_t m,
                        const TensorView& y, Stream stream, cublasHandle_t blas) const {
  const TensorView out = sub_view(y, m, n_);
  switch (path_) {
    case Path::cublas_bf16: {
      // Row-major y (m, n) = x (m, k) · Wᵀ is column-major yᵀ (n, m) = W · xᵀ: W (n, k)
      // row-major is a column-major (k, n) matrix, transposed by OP_T.
      const float one = 1.0f, zero = 0.0f;
      NIBBLE_CUBLAS_CHECK(cublasGemmEx(
          blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_), static_cast<int>(m),
          static_cast<int>(k_), &one, bf16_.data(), CUDA_R_16BF, static_cast<int>(k_), in.x.data,
          CUDA_R_16BF, static_cast<int>(in.x.stride(0)), &zero, out.data, CUDA_R_32F,
          static_cast<int>(out.stride(0)), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return;
    }
    case Path::weight_only:
      linear(sub_view(in.x, m, kp_), qw_.view(), nullptr, out, stream);
      return;
    case Path::packed_a16:
      linear(sub_view(in.x, m, kp_), packed_.view(), nullptr, out, stream);
      return;
    case Path::packed_a8:
    case Path::quantized_act: {
      if (in.quantize_in_linear && path_ == Path::packed_a8) {
        linear(sub_view(in.x, m, kp_), packed_.view(), nullptr, out, in.fusion, stream);
        return;
      }
      QuantizedActivationView qa;
      if (in.quantized) {
        qa = in.qa;
      } else {
        const DType qdt = act_value_dtype(format_.act);
        qa.scheme = format_.act;
        qa.q = strided(scratch.q, qdt, m, kp_, scratch.ld * 8 / dtype_bits(qdt), y.device);
        qa.scales = TensorView::contiguous(scratch.scales, DType::f32, {m}, y.device);
        quantize_activation(sub_view(in.x, m, kp_), qa, stream);
      }
      if (path_ == Path::packed_a8)
        linear(qa, packed_.view(), nullptr, out, stream);
      else
        linear(qa, qw_.view(), nullptr, out, stream);
      return;
    }
  }
}

int64_t GpuLinear::weight_bytes() const {
  auto bytes = [](const Tensor& t) { return t.defined() ? t.nbytes() : int64_t{0}; };
  switch (path_) {
    case Path::cublas_bf16: return bf16_.nbytes();
    case Path::packed_a8:
    case Path::packed_a16:
      return bytes(packed_.q) + bytes(packed_.scales) + bytes(packed_.group_params) +
             bytes(packed_.zeros);
    case Path::quantized_act:
    case Path::weight_only:
      return bytes(qw_.q) + bytes(qw_.scales) + bytes(qw_.zeros) + bytes(qw_.group_scales);
  }
  return 0;
}

std::string GpuLinear::describe(int64_t m) const {
  if (path_ == Path::cublas_bf16) return "bf16 (cuBLAS cublasGemmEx, bf16 × bf16, f32 compute)";
  const Device device = packed() ? packed_.q.view().device : qw_.q.view().device;
  const std::string e = explain(format_, m, n_, kp_, device);
  // explain() names the logical-weight kernel, then the packed one; keep the one that runs.
  const auto at = e.find("packed weights (pack_weight");
  const auto runs = at == std::string::npos ? at : e.find("): ", at);
  if (packed() && runs != std::string::npos)
    return mode_ + " (packed " + to_string(packed_.layout) + ", " + e.substr(runs + 3) + ")";
  const auto logical = e.find("logical weights: ");
  std::string what = logical == std::string::npos ? e : e.substr(logical + 17);
  what = what.substr(0, what.find(';'));
  return mode_ + " (logical weights" +
         (path_ == Path::weight_only ? ", bf16 activations, " : ", ") + what + ")";
}

}  // namespace nibble::llm::cuda
