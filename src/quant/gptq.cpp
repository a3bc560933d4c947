// GPTQ (Frantar, Ashkboos, Hoefler, Alistarh 2022, "GPTQ: Accurate Post-Training Quantization for
// Generative Pre-trained Transformers", Algorithm 1) on the CPU, with the GPU doing the
// factorisation and the lazy batch updates when opt.device is CUDA.
//
// For W (N, K) and the layer-input Hessian H = 2/n Σ x xᵀ (K, K):
//
//   dead columns (H_kk = 0): H_kk = 1, W[:, k] = 0
//   act_order: permute the columns of W and the rows/columns of H by decreasing H_kk
//   H += λ·I, λ = damp · mean(diag H);   U = upper Cholesky of H⁻¹ (Uᵀ·U = H⁻¹)
//   for each block [b0, b1) of block_size columns, for each row n (rows are independent):
//     for i in [b0, b1):  (at a group start, the group's scale from the current W)
//       q = quantize_int(W[n,i], s, −qmax, qmax);  e = (W[n,i] − s·q) / U_ii
//       W[n, i+1:b1] −= e · U[i, i+1:b1];          E[n, i−b0] = e
//     W[:, b1:] −= E · U[b0:b1, b1:]                (the lazy batch update: a GEMM)
//
// W and U are f64; each column is rounded exactly as quantize_weight_rtn rounds (its f32 value,
// one f32 division), so H = I reproduces round to nearest bit for bit.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>

#include "api/validate.h"
#include "cpu/gemm_f32.h"
#include "cpu/reference.h"
#include "cpu/view_access.h"
#include "quant/quant_internal.h"

namespace nibble {

namespace {

// y[0:n] −= a · x[0:n] (f64), vectorized; the order of each element's update is fixed.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void axpy_sub(double a, const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] -= a * x[i];
}

// Rows of x per f32 chunk of a Hessian update: bounds the f32 sums before they reach f64.
constexpr int64_t kHessianChunk = 512;

}  // namespace

GptqHessian::GptqHessian(int64_t k) : k_(k) {
  if (k <= 0 || k > (int64_t{1} << 16))
    detail::fail(
        ErrorCode::invalid_argument,
        "nibble::GptqHessian: argument 'k' must be in [1, 65536], got " + std::to_string(k));
  sum_.assign(static_cast<size_t>(k * k), 0.0);
}

void GptqHessian::add(const TensorView& x) {
  const detail::ArgCheck check("GptqHessian::add");
  check.tensor(x, "x", 2);
  check.dtype(x, "x", {DType::f32});
  check.contiguous(x, "x");
  check.condition(x.size(1) == k_, "x",
                  "must have K = " + std::to_string(k_) + " columns, got " + x.describe());
  if (x.device.type == DeviceType::cuda) {
#if NIBBLE_WITH_CUDA
    quant::hessian_add_cuda(x, sum_);
    n_ += x.size(0);
    return;
#else
    check.fail("x", "is on a CUDA device, but this build has no CUDA backend",
               ErrorCode::unsupported);
#endif
  }
  const int64_t m = x.size(0);
  const float* xp = x.ptr<float>();
  for (int64_t i = 0; i < m * k_; ++i)
    if (!std::isfinite(xp[i]))
      check.fail("x", "must be finite, got a NaN or infinity at row " + std::to_string(i / k_));
  // Σ x xᵀ = Xᵀ·X per chunk: the chunk transposed (K, rows), then the f32 product of its rows,
  // whose outputs are dot products over the chunk's rows in a fixed order.
  std::vector<float> xt, g(static_cast<size_t>(k_ * k_));
  for (int64_t r0 = 0; r0 < m; r0 += kHessianChunk) {
    const int64_t rows = std::min(kHessianChunk, m - r0);
    xt.resize(static_cast<size_t>(k_ * rows));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < k_; ++c)
        xt[static_cast<size_t>(c * rows + r)] = xp[(r0 + r) * k_ + c];
    // Lower triangle by row blocks of 64 (the upper one is its mirror).
    for (int64_t i0 = 0; i0 < k_; i0 += 64) {
      const int64_t i1 = std::min(k_, i0 + 64);
      cpu::gemm_f32_nt(xt.data() + i0 * rows, rows, i1 - i0, xt.data(), rows, i1, rows,
                       g.data() + i0 * k_, k_);
    }
    for (int64_t i = 0; i < k_; ++i)
      for (int64_t j = 0; j <= i; ++j)
        sum_[static_cast<size_t>(i * k_ + j)] += g[static_cast<size_t>(i * k_ + j)];
  }
  for (int64_t i = 0; i < k_; ++i)
    for (int64_t j = i + 1; j < k_; ++j)
      sum_[static_cast<size_t>(i * k_ + j)] = sum_[static_cast<size_t>(j * k_ + i)];
  n_ += m;
}

std::vector<double> GptqHessian::matrix() const {
  std::vector<double> h(sum_.size(), 0.0);
  if (n_ == 0) return h;
  const double f = 2.0 / static_cast<double>(n_);
  for (size_t i = 0; i < h.size(); ++i) h[i] = f * sum_[i];
  return h;
}

GptqResult quantize_weight_gptq(const TensorView& w, const GptqHessian& hessian,
                                const QuantizedWeightView& out, const GptqOptions& opt) {
  const detail::ArgCheck check("quantize_weight_gptq");
  const int qmax = quant::check_weight_quantizer(check, w, out, opt);
  check.condition(hessian.k() == out.k, "h",
                  "must be a Hessian of K = " + std::to_string(out.k) +
                      " inputs, got K = " + std::to_string(hessian.k()));
  check.condition(hessian.samples() > 0, "h", "has no calibration rows (add() was never called)");
  check.condition(std::isfinite(opt.damp) && opt.damp >= 0.0, "opt.damp",
                  "must be a finite number >= 0, got " + std::to_string(opt.damp));
  check.condition(opt.block_size >= 1, "opt.block_size",
                  "must be >= 1, got " + std::to_string(opt.block_size));
  if (opt.device.type != DeviceType::cpu) detail::check_backend(check, opt.device);
  const WeightFormat& f = out.format;
  const int64_t n_rows = out.n, k = out.k;
  const int64_t g = f.per_channel() ? k : f.group_size, groups = k / g;
  const auto at = [k](int64_t r, int64_t c) { return static_cast<size_t>(r * k + c); };

  std::vector<float> w0(static_cast<size_t>(n_rows * k));  // the original weights
  for (int64_t n = 0; n < n_rows; ++n)
    for (int64_t c = 0; c < k; ++c) w0[at(n, c)] = cpu::get_float(w, n, c);
  std::vector<double> h = hessian.matrix();
  GptqResult result;
  std::vector<bool> dead(static_cast<size_t>(k), false);
  for (int64_t c = 0; c < k; ++c)
    if (h[at(c, c)] == 0.0) {
      h[at(c, c)] = 1.0;
      dead[static_cast<size_t>(c)] = true;
      ++result.dead_columns;
    }
  // perm[i] = the original column quantized i-th.
  std::vector<int64_t> perm(static_cast<size_t>(k));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (opt.act_order)
    std::stable_sort(perm.begin(), perm.end(),
                     [&](int64_t a, int64_t b) { return h[at(a, a)] > h[at(b, b)]; });
  // Scales fixed in advance (per channel, and every group under act_order) come from the
  // original weights; the others are chosen at their group's first column.
  const bool static_scales = f.per_channel() || opt.act_order;
  std::vector<float> scales(static_cast<size_t>(n_rows * groups), 0.0f);
  if (static_scales)
    for (int64_t n = 0; n < n_rows; ++n)
      for (int64_t gi = 0; gi < groups; ++gi)
        scales[static_cast<size_t>(n * groups + gi)] =
            quant::choose_scale(&w0[at(n, gi * g)], g, qmax, f.scale_dtype, opt, n);
  // The working copy in quantization order, and H permuted and dampened.
  std::vector<double> wk(static_cast<size_t>(n_rows * k)), hp(h.size());
  for (int64_t n = 0; n < n_rows; ++n)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t c = perm[static_cast<size_t>(i)];
      wk[at(n, i)] = dead[static_cast<size_t>(c)] ? 0.0 : w0[at(n, c)];
    }
  double mean_diag = 0;
  for (int64_t c = 0; c < k; ++c) mean_diag += h[at(c, c)];
  const double lambda = opt.damp * mean_diag / static_cast<double>(k);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < k; ++j)
      hp[at(i, j)] = h[at(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)])] +
                     (i == j ? lambda : 0.0);

  std::vector<double> u;
  bool pd = false;
#if NIBBLE_WITH_CUDA
  std::unique_ptr<quant::GptqDevice> dev;
  if (opt.device.type == DeviceType::cuda) {
    dev = std::make_unique<quant::GptqDevice>(wk, n_rows, k, opt.device);
    pd = dev->upper_cholesky_of_inverse(hp, u);
  } else {
    pd = quant::upper_cholesky_of_inverse(hp, k, u);
  }
#else
  pd = quant::upper_cholesky_of_inverse(hp, k, u);
#endif
  if (!pd)
    check.fail("h", "is not positive definite after dampening (damp = " + std::to_string(opt.damp) +
                        "): raise opt.damp or add calibration rows");

  std::vector<int32_t> q(static_cast<size_t>(n_rows * k));  // in original column order
  std::vector<float> grp(static_cast<size_t>(g));
  std::vector<double> e;
  for (int64_t b0 = 0; b0 < k; b0 += opt.block_size) {
    const int64_t b1 = std::min(k, b0 + opt.block_size), bw = b1 - b0;
#if NIBBLE_WITH_CUDA
    // The column loop reads this block and, at a group start, the rest of the group.
    if (dev) dev->fetch_columns(b0, std::min(k, std::max(b1, b0 + g)), wk);
#endif
    e.assign(static_cast<size_t>(n_rows * bw), 0.0);
    for (int64_t n = 0; n < n_rows; ++n) {
      double* row = &wk[at(n, 0)];
      for (int64_t i = b0; i < b1; ++i) {
        const int64_t c = perm[static_cast<size_t>(i)], gi = c / g;
        float& s = scales[static_cast<size_t>(n * groups + gi)];
        if (!static_scales && c % g == 0) {  // without act_order, perm is the identity
          for (int64_t t = 0; t < g; ++t)
            grp[static_cast<size_t>(t)] = static_cast<float>(row[c + t]);
          s = quant::choose_scale(grp.data(), g, qmax, f.scale_dtype, opt, n);
        }
        const int qi = cpu::quantize_int(static_cast<float>(row[i]), s, -qmax, qmax);
        q[at(n, c)] = qi;
        const double diff = row[i] - static_cast<double>(s * static_cast<float>(qi));
        const double uii = u[at(i, i)];
        const double err = diff / uii;
        result.loss += diff * diff / (uii * uii) / 2.0;
        axpy_sub(err, &u[at(i, i + 1)], row + i + 1, b1 - i - 1);
        e[static_cast<size_t>(n * bw + (i - b0))] = err;
      }
    }
    if (b1 == k) break;
#if NIBBLE_WITH_CUDA
    if (dev) {
      dev->lazy_update(e, b0, b1);
      continue;
    }
#endif
    for (int64_t n = 0; n < n_rows; ++n)
      for (int64_t i = b0; i < b1; ++i)
        axpy_sub(e[static_cast<size_t>(n * bw + (i - b0))], &u[at(i, b1)], &wk[at(n, b1)], k - b1);
  }
  for (int64_t n = 0; n < n_rows; ++n) {
    for (int64_t gi = 0; gi < groups; ++gi)
      cpu::set_float(out.scales, n, f.per_channel() ? 0 : gi,
                     scales[static_cast<size_t>(n * groups + gi)]);
    for (int64_t c = 0; c < k; ++c) cpu::set_int(out.q, n, c, q[at(n, c)]);
  }
  return result;
}

}  // namespace nibble
