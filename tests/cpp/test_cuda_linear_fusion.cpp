// GPU tests of LinearFusion (include/nibble/gemm.h): the RMSNorm from granule sums in
// sm80_w4a8_gemm's fused-quantization prologue, and the residual add and granule sums in its
// epilogue (the kResidual instances), or the small kernels around the unfused path
// (cuda/generic/residual_norm.cu) where those do not run. Both must store the bits of the same
// steps done one by one with the same GEMM kernel; the granule sums must equal the host
// definition on the stored values; the output stays within the CPU reference's tolerance.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "common/residual_norm.h"
#include "cuda_test_util.h"
#include "nibble/nibble.h"

namespace nibble {
namespace {

// Granule sums of the rows of x (M, K) f32 on the host, as the linear that wrote x would.
Tensor host_granule_sums(const Tensor& x) {
  const int64_t m = x.view().size(0), k = x.view().size(1);
  Tensor s = Tensor::empty(DType::f64, {m, sumsq_granules(k)});
  for (int64_t r = 0; r < m; ++r)
    detail::granule_sums(static_cast<const float*>(x.data()) + r * x.view().stride(0), k,
                         static_cast<double*>(s.data()) + r * s.view().stride(0));
  return s;
}

// The normalized rows y (M, K) f32 on the host.
Tensor host_normalized(const Tensor& x, const Tensor& sums, const Tensor& w, float eps) {
  const int64_t m = x.view().size(0), k = x.view().size(1);
  Tensor y = Tensor::empty(DType::f32, {m, k});
  for (int64_t r = 0; r < m; ++r) {
    const float inv = detail::rms_inverse(static_cast<const double*>(sums.data()) +
                                              r * sums.view().stride(0),
                                          sums.view().size(1), k, eps);
    for (int64_t c = 0; c < k; ++c)
      test::put_float(y.view(), r, c,
                      detail::rms_apply(static_cast<float>(test::float_at(x.view(), r, c)), inv,
                                        static_cast<float>(test::float_at(w.view(), 0, c))));
  }
  return y;
}

struct FusionCase {
  bool norm, accumulate, out_sums;
  /// The LinearFusion of this case over the given sums, norm weights and output sums.
  LinearFusion fusion(const Tensor& in_sums, const Tensor& w, float eps, Tensor& sums_out) const {
    LinearFusion f;
    if (norm) {
      f.in_sumsq = in_sums.view();
      f.norm_weight = test::as_vector(w);
      f.norm_eps = eps;
    }
    f.accumulate = accumulate;
    if (out_sums) f.out_sumsq = sums_out.view();
    return f;
  }
};

TEST(CudaLinearFusion, EqualsTheStepsOneByOneBitForBit) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;  // fresh seed, printed on failure
  const float eps = 1e-5f;
  // {1000, 1536}, {256, 4096}, {4096, 4096}: split K (a cluster on sm_90); {17000, 2048}: one
  // wave without splits; {136, 512}, {40, 256}: few tiles, N not a multiple of 128 (or 16).
  const std::tuple<int64_t, int64_t> nk[] = {{1000, 1536}, {256, 4096}, {4096, 4096},
                                             {17000, 2048}, {136, 512}, {40, 256}};
  const FusionCase cases[] = {{true, false, false}, {false, true, true}, {true, true, true},
                              {false, false, true}};
  for (const char* fmt : {"w4a8_pc", "w4a8_g128", "w4a8_g128_2level"}) {
    const LinearFormat f = parse_linear_format(fmt);
    for (auto [n, k] : nk) {
      const QuantizedWeight qw = test::random_quantized_weight(f.weight, n, k, rng);
      const PackedWeight wd = pack_weight(qw.view(), Device::cuda());
      const PackedWeight wh = pack_weight(qw.view(), Device::cpu());
      const Tensor w = test::random_rms_weight(DType::f32, k, rng);
      const Tensor wdev = w.to(Device::cuda());
      for (int64_t m : {1, 2, 3, 4, 5, 17}) {
        if (n > 4096 && m > 3) continue;  // the CPU reference is slow there
        Tensor x = test::random_activations(DType::f32, m, k, rng);
        test::put_float(x.view(), m - 1, k - 7, 400.0);  // an outlier in the last split
        const Tensor sums = host_granule_sums(x);
        const Tensor y = host_normalized(x, sums, w, eps);
        const Tensor d0 = test::random_normal(DType::f32, m, n, rng, 3.0);
        const Tensor xd = x.to(Device::cuda()), yd = y.to(Device::cuda());
        const Tensor sums_d = sums.to(Device::cuda());
        for (const FusionCase& c : cases) {
          SCOPED_TRACE(std::string(fmt) + " M=" + std::to_string(m) + " N=" + std::to_string(n) +
                       " K=" + std::to_string(k) + " norm=" + std::to_string(c.norm) +
                       " accumulate=" + std::to_string(c.accumulate) +
                       " sums=" + std::to_string(c.out_sums));
          // The steps: the plain linear of x (or of y, normalized on the host) to f32 with the
          // same kernel, then the add and the sums on the host.
          const ScopedEnv force("NIBBLE_W4A8_KERNEL", "sm80_w4a8_gemm");
          Tensor t = Tensor::empty(DType::f32, {m, n}, Device::cuda());
          linear((c.norm ? yd : xd).view(), wd.view(), nullptr, t.view());
          synchronize(Device::cuda());
          const Tensor th = t.to(Device::cpu());
          Tensor want = Tensor::empty(DType::f32, {m, n});
          for (int64_t r = 0; r < m; ++r)
            for (int64_t col = 0; col < n; ++col) {
              const auto tv = static_cast<float>(test::float_at(th.view(), r, col));
              test::put_float(want.view(), r, col,
                              c.accumulate ? static_cast<float>(test::float_at(d0.view(), r, col)) + tv
                                           : tv);
            }
          const Tensor want_sums = host_granule_sums(want);
          for (const char* fuse : {"1", "0"}) {
            const ScopedEnv fused_or_not("NIBBLE_FUSED_ACT_QUANT", fuse);
            SCOPED_TRACE(std::string("NIBBLE_FUSED_ACT_QUANT=") + fuse);
            Tensor d = c.accumulate ? d0.to(Device::cuda()) : Tensor::empty(DType::f32, {m, n}, Device::cuda());
            if (!c.accumulate) d.fill_bytes(0xFF);  // NaN: every element must be written
            Tensor out_sums = Tensor::empty(DType::f64, {m, sumsq_granules(n)}, Device::cuda());
            out_sums.fill_bytes(0xFF);
            linear(xd.view(), wd.view(), nullptr, d.view(), c.fusion(sums_d, wdev, eps, out_sums));
            synchronize(Device::cuda());
            ASSERT_TRUE(same_bytes(d, want));
            if (c.out_sums) {
              ASSERT_TRUE(same_bytes(out_sums, want_sums));
            }
          }
          // And the CPU reference, within the f32 output's tolerance (its epilogue rounds
          // differently from the kernel's in the last bits).
          if (m <= 3 && n <= 1000) {
            Tensor ref = d0.to(Device::cpu());
            Tensor ref_sums = Tensor::empty(DType::f64, {m, sumsq_granules(n)});
            linear(x.view(), wh.view(), nullptr, ref.view(), c.fusion(sums, w, eps, ref_sums));
            ASSERT_LE(rel_error(want, ref), kRelTolF32Out);
          }
        }
      }
    }
  }
}

#if NIBBLE_WITH_CUDA
// A Llama block's residual stream at M = 1: x += o(a); h = norm(x) through the fused linears
// only, replayed in a CUDA graph: one node per linear, and the bits of eager launches.
TEST(CudaLinearFusion, ResidualStreamReplaysInACudaGraph) {
  NIBBLE_REQUIRE_GPU();
  test::Rng rng;
  const int64_t m = 1, d_model = 4096, hidden = 6144;
  const WeightFormat wf = parse_weight_format("w4_pc");
  const PackedWeight w_o = pack_weight(test::random_quantized_weight(wf, d_model, hidden, rng).view(),
                                       Device::cuda());
  const PackedWeight w_up = pack_weight(test::random_quantized_weight(wf, hidden, d_model, rng).view(),
                                        Device::cuda());
  const Tensor a = test::random_activations(DType::f32, m, hidden, rng).to(Device::cuda());
  const Tensor resid0 = test::random_normal(DType::f32, m, d_model, rng, 2.0).to(Device::cuda());
  const Tensor g = test::random_rms_weight(DType::f32, d_model, rng).to(Device::cuda());
  Tensor sums = Tensor::empty(DType::f64, {m, sumsq_granules(d_model)}, Device::cuda());
  Tensor resid = resid0.to(Device::cuda());
  Tensor eager = Tensor::empty(DType::f32, {m, hidden}, Device::cuda());
  Tensor replay = Tensor::empty(DType::f32, {m, hidden}, Device::cuda());
  size_t nodes = 0;
  expect_graph_replay_matches(
      [&](cudaStream_t stream, Tensor& out) {
        ASSERT_EQ(cudaMemcpyAsync(resid.data(), resid0.data(), size_t(d_model) * 4,
                                  cudaMemcpyDeviceToDevice, stream),
                  cudaSuccess);
        LinearFusion add;
        add.accumulate = true;
        add.out_sumsq = sums.view();
        linear(a.view(), w_o.view(), nullptr, resid.view(), add, stream);
        LinearFusion norm;
        norm.in_sumsq = sums.view();
        norm.norm_weight = test::as_vector(g);
        linear(resid.view(), w_up.view(), nullptr, out.view(), norm, stream);
      },
      eager, replay, &nodes);
  EXPECT_EQ(nodes, 3u);  // the copy and one kernel per linear
}
#endif

}  // namespace
}  // namespace nibble
