// GPU tests of the runner's CUDA backend (src/llm/cuda/): each kernel against a host reference
// written here from the formulas, on odd sizes; the backend against the CPU backend on tiny
// synthetic models (logits, greedy tokens, prefill vs decode, graph vs eager, fused vs
// quantize_activation, long prompts, formats and strategies, device-made random weights,
// errors); and, when NIBBLE_LLM_MODEL names it, SmolLM2's greedy tokens against the CPU's.
// Every test skips, saying why, without a usable GPU.
//
// Tolerances (GPU vs CPU logits, relative Frobenius over all logits of a 24-token prompt): the
// GPU keeps its KV cache in bf16 and rounds q and the softmax probabilities to bf16 in the
// prefill attention, the CPU keeps f32. Emulating exactly those roundings on the CPU gave
// 3.3e-3 / 3.9e-3 (bf16, the two tiny models) and 1.2e-2 / 1.6e-2 (w4a8_pc, where a changed
// activation can move an int8 rounding step); the bounds below leave a factor of about 3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "llm/backend.h"
#include "llm/model_files.h"
#include "llm/runner.h"
#include "nibble/nibble.h"
#include "test_llm_util.h"
#if NIBBLE_WITH_CUDA
#include "llm/cuda/kernels.h"
#endif

namespace nibble::llm {
namespace {

constexpr double kGpuCpuTolBf16 = 1.2e-2;
constexpr double kGpuCpuTolInt8 = 5e-2;
// Two GPU computations of the same logits through different attention kernels (prefill's
// bf16 P vs decode's f32) or different GEMM shapes: summation order and P rounding only.
constexpr double kGpuPathTol = 1e-2;

double rel_frob(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

[[maybe_unused]] double rel_frob(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// ---- tiny models -------------------------------------------------------------------------------

// Tied embeddings (unit-variance rows) make logits of size ~√dim with wide gaps between the
// top two, so greedy tokens are stable under rounding differences. GQA 2, head_dim 64,
// ffn 200 (w4a8_pc keeps K = 200: not a multiple of 32, so it takes the logical-weight path;
// g128 formats pad it to 256 and pack).
ModelConfig tied_config() {
  ModelConfig c;
  c.name = "gpu-tiny";
  c.vocab_size = 300, c.dim = 256, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2;
  c.head_dim = 64, c.ffn_dim = 200, c.max_context = 128, c.rope_theta = 10000.0;
  c.norm_eps = 1e-5, c.tied_embeddings = true;
  return c;
}

// Separate output projection, head_dim 128, GQA 4 (Llama-3-8B's head shape).
ModelConfig untied_config() {
  ModelConfig c;
  c.name = "gpu-tiny-untied";
  c.vocab_size = 500, c.dim = 512, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 1;
  c.head_dim = 128, c.ffn_dim = 384, c.max_context = 128, c.rope_theta = 500000.0;
  c.norm_eps = 1e-5, c.tied_embeddings = false;
  return c;
}

BackendOptions options(const std::string& prefill, const std::string& decode = "") {
  BackendOptions o;
  o.strategy = {prefill, decode.empty() ? prefill : decode};
  o.threads = 2;
  return o;
}

std::unique_ptr<Backend> backend(const std::string& device, const ModelConfig& c,
                                 const BackendOptions& o, uint64_t seed = 11) {
  ModelFiles m = random_model(c, seed);
  return make_backend(device, m, o);
}

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, int64_t salt = 5) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + salt) % vocab));
  return p;
}

std::vector<float> logits_of(Backend& be, const std::vector<int32_t>& tokens, int64_t pos,
                             bool all) {
  std::vector<float> l;
  be.forward(tokens, pos, all, l);
  return l;
}

// ---- kernels -------------------------------------------------------------------------------------

#if NIBBLE_WITH_CUDA
using cuda::ActKind;
using cuda::ActOutput;
using cuda::AttentionShape;

template <class T>
Tensor device_copy(const std::vector<T>& v, DType dtype) {
  Tensor host(dtype, {static_cast<int64_t>(v.size())});
  std::memcpy(host.data(), v.data(), v.size() * sizeof(T));
  return host.to(Device::cuda());
}

template <class T>
std::vector<T> host_copy(const Tensor& t) {
  const Tensor h = t.to(Device::cpu());
  std::vector<T> v(static_cast<size_t>(h.nbytes() / static_cast<int64_t>(sizeof(T))));
  std::memcpy(v.data(), h.data(), v.size() * sizeof(T));
  return v;
}

std::vector<float> normals(size_t n, nibble::test::Rng& rng, double sigma = 1.0) {
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.normal(sigma));
  return v;
}

std::vector<uint16_t> bf16_normals(size_t n, nibble::test::Rng& rng) {
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16_bits(static_cast<float>(rng.normal()));
  return v;
}

ActOutput act_out(ActKind kind, Tensor& data, int64_t ld, Tensor* scales = nullptr) {
  ActOutput o;
  o.kind = kind;
  o.data = data.data();
  o.ld = ld;
  o.scales = scales != nullptr ? static_cast<float*>(scales->data()) : nullptr;
  return o;
}

// The int8 form of a producer must equal quantize_activation of its f32 form, byte for byte.
void expect_int8_matches_quantize_activation(const Tensor& f32_out, int64_t m, int64_t width,
                                             int64_t ld, const Tensor& q, const Tensor& scales) {
  TensorView x = f32_out.view();
  x.rank = 2;
  x.shape = {m, width, 0, 0};
  x.strides = {ld, 1, 0, 0};
  QuantizedActivation ref(ActScheme::s8_per_token, m, width, Device::cuda());
  quantize_activation(x, ref.view());
  synchronize(Device::cuda());
  const auto ref_q = host_copy<int8_t>(ref.q), got_q = host_copy<int8_t>(q);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < width; ++i)
      ASSERT_EQ(got_q[static_cast<size_t>(r * ld + i)], ref_q[static_cast<size_t>(r * width + i)])
          << "row " << r << " column " << i;
  const auto ref_s = host_copy<float>(ref.scales), got_s = host_copy<float>(scales);
  for (int64_t r = 0; r < m; ++r) ASSERT_EQ(got_s[static_cast<size_t>(r)], ref_s[static_cast<size_t>(r)]);
}

TEST(LlmCudaKernels, EmbeddingCopiesRows) {
  NIBBLE_REQUIRE_GPU();
  nibble::test::Rng rng;
  const int64_t vocab = 50, d = 70, m = 5;
  const auto table = bf16_normals(static_cast<size_t>(vocab * d), rng);
  const std::vector<int32_t> tokens = {3, 49, 0, 3, 17};
  Tensor t = device_copy(table, DType::bf16), ids = device_copy(tokens, DType::s32);
  Tensor x(DType::f32, {m, d}, Device::cuda());
  cuda::launch_embedding(static_cast<uint16_t*>(t.data()), static_cast<int32_t*>(ids.data()), m, d,
                         static_cast<float*>(x.data()), nullptr);
  const auto got = host_copy<float>(x);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < d; ++i)
      ASSERT_EQ(got[static_cast<size_t>(r * d + i)],
                bf16_bits_to_f32(table[static_cast<size_t>(tokens[static_cast<size_t>(r)] * d + i)]));
}

// The device argmax picks what llm::argmax picks: the lowest index of the largest value, NaNs
// skipped except at index 0, −0 equal to +0; its workspace is left zero for the next launch,
// and with `step` it feeds the token to the next decode step at the next position.
TEST(LlmCudaKernels, ArgmaxMatchesTheHostArgmaxOnTiesNansAndSignedZeros) {
  NIBBLE_REQUIRE_GPU();
  nibble::test::Rng rng;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Tensor ws = device_copy(
      std::vector<int32_t>(static_cast<size_t>(cuda::argmax_workspace_ints()), 0), DType::s32);
  std::vector<std::vector<float>> rows;
  for (int64_t n : {1, 2, 5, 4095, 4096, 4097, 100003, 128256}) {
    auto v = normals(static_cast<size_t>(n), rng, 3.0);
    rows.push_back(v);
    if (n < 5) continue;
    const auto pick = [&] { return static_cast<size_t>(rng.uniform_int(1, n - 1)); };
    auto tie = v;  // the maximum at several indices, one of them after the first
    const size_t a = pick(), b = pick();
    tie[a] = tie[b] = 1e4f;
    rows.push_back(tie);
    auto nans = v;  // NaNs everywhere but index 0 (never picked), the largest value beside one
    for (int i = 0; i < 50; ++i) nans[pick()] = nan;
    nans[a] = 5e4f;
    rows.push_back(nans);
    auto nan0 = v;  // a NaN at index 0 wins, as the host loop lets it
    nan0[0] = nan;
    rows.push_back(nan0);
    auto zeros = std::vector<float>(static_cast<size_t>(n), -1.0f);  // −0 before +0: the first
    zeros[std::min(a, b)] = -0.0f;
    zeros[std::max(a, b)] = 0.0f;
    rows.push_back(zeros);
    rows.push_back(std::vector<float>(static_cast<size_t>(n), -inf));
    auto infs = v;
    infs[b] = inf;
    rows.push_back(infs);
  }
  Tensor token(DType::s32, {1}, Device::cuda());
  for (const auto& v : rows) {
    const int32_t want = argmax(v);
    Tensor logits = device_copy(v, DType::f32);
    cuda::launch_argmax(static_cast<float*>(logits.data()), static_cast<int64_t>(v.size()),
                        static_cast<int32_t*>(token.data()), /*advance_position=*/false,
                        static_cast<int*>(ws.data()), nullptr);
    ASSERT_EQ(host_copy<int32_t>(token)[0], want) << "n = " << v.size();
    for (const int32_t w : host_copy<int32_t>(ws)) ASSERT_EQ(w, 0) << "workspace not reset";
  }
  // With the decode step: step = {token, position + 1}.
  const std::vector<int32_t> start = {7, 41};
  Tensor step = device_copy(start, DType::s32);
  const auto& v = rows.back();
  Tensor logits = device_copy(v, DType::f32);
  auto* d_step = static_cast<int32_t*>(step.data());
  for (int i = 0; i < 3; ++i)
    cuda::launch_argmax(static_cast<float*>(logits.data()), static_cast<int64_t>(v.size()), d_step,
                        /*advance_position=*/true, static_cast<int*>(ws.data()), nullptr);
  const auto got = host_copy<int32_t>(step);
  EXPECT_EQ(got[0], argmax(v));
  EXPECT_EQ(got[1], 44);
}

TEST(LlmCudaKernels, AddRmsNormMatchesTheCpuFormulaInEveryOutputForm) {
  NIBBLE_REQUIRE_GPU();
  nibble::test::Rng rng;
  for (int64_t m : {1, 3, 17})
    for (int64_t d : {64, 576, 1000, 4096})
      for (bool with_delta : {false, true}) {
        SCOPED_TRACE("m=" + std::to_string(m) + " d=" + std::to_string(d) +
                     (with_delta ? " with delta" : ""));
        const auto x0 = normals(static_cast<size_t>(m * d), rng, 3.0);
        const auto delta = normals(static_cast<size_t>(m * d), rng);
        const auto g = normals(static_cast<size_t>(d), rng);
        // The CPU backend's arithmetic: x += delta in f32, mean of squares in double.
        std::vector<float> xs = x0, ref(static_cast<size_t>(m * d));
        for (int64_t r = 0; r < m; ++r) {
          double ss = 0;
          for (int64_t i = 0; i < d; ++i) {
            float& v = xs[static_cast<size_t>(r * d + i)];
            if (with_delta) v += delta[static_cast<size_t>(r * d + i)];
            ss += static_cast<double>(v) * v;
          }
          const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + 1e-5));
          for (int64_t i = 0; i < d; ++i)
            ref[static_cast<size_t>(r * d + i)] = xs[static_cast<size_t>(r * d + i)] * inv * g[static_cast<size_t>(i)];
        }
        const int64_t ld = d + 13;  // a row stride wider than d
        Tensor dd = device_copy(delta, DType::f32), gd = device_copy(g, DType::f32);
        Tensor f32_out(DType::f32, {m, ld}, Device::cuda()), b_out(DType::bf16, {m, ld}, Device::cuda());
        Tensor q_out(DType::s8, {m, ld}, Device::cuda()), scales(DType::f32, {m}, Device::cuda());
        for (ActKind kind : {ActKind::f32, ActKind::bf16, ActKind::s8_per_token}) {
          Tensor xd = device_copy(x0, DType::f32);
          Tensor& out = kind == ActKind::f32 ? f32_out : kind == ActKind::bf16 ? b_out : q_out;
          cuda::launch_add_rmsnorm(static_cast<float*>(xd.data()),
                                   with_delta ? static_cast<float*>(dd.data()) : nullptr, m, d,
                                   static_cast<float*>(gd.data()), 1e-5,
                                   act_out(kind, out, ld, &scales), nullptr);
          EXPECT_EQ(host_copy<float>(xd), xs);  // the residual add, exactly
        }
        const auto got = host_copy<float>(f32_out);
        const auto got_b = host_copy<uint16_t>(b_out);
        for (int64_t r = 0; r < m; ++r)
          for (int64_t i = 0; i < d; ++i) {
            const float want = ref[static_cast<size_t>(r * d + i)];
            const float have = got[static_cast<size_t>(r * ld + i)];
            // Equal up to the order of the double sum: an ulp of inv at most.
            ASSERT_NEAR(have, want, 4e-7 * std::fabs(want) + 1e-30) << r << "," << i;
            ASSERT_EQ(got_b[static_cast<size_t>(r * ld + i)], f32_to_bf16_bits(have));
          }
        expect_int8_matches_quantize_activation(f32_out, m, d, ld, q_out, scales);
      }
}

TEST(LlmCudaKernels, SwiGluMatchesTheCpuFormulaInEveryOutputForm) {
  NIBBLE_REQUIRE_GPU();
  nibble::test::Rng rng;
  for (int64_t m : {1, 3, 17})
    // 14336 and 28672: Llama-3-8B and 70B (the sm_90 cluster kernel with 8 and 16 values a
    // thread); 40000: wider than the cluster kernel takes; 9: blocks of the cluster with nothing.
    for (int64_t f : {1, 9, 200, 1536, 14336, 28672, 40000}) {
      SCOPED_TRACE("m=" + std::to_string(m) + " f=" + std::to_string(f));
      auto gu = normals(static_cast<size_t>(m * 2 * f), rng, 2.0);
      // An outlier per row at a row-dependent place, so that the row's maximum lies in a
      // different block of the cluster from row to row.
      for (int64_t r = 0; r < m; ++r) {
        const int64_t i = (r * 7919 + f / 2) % f;
        gu[static_cast<size_t>(r * 2 * f + i)] = 40.0f;
        gu[static_cast<size_t>(r * 2 * f + f + i)] = r % 2 == 0 ? 9.0f : -9.0f;
      }
      const int64_t ld = f + 3;
      Tensor gd = device_copy(gu, DType::f32);
      Tensor f32_out(DType::f32, {m, ld}, Device::cuda()), b_out(DType::bf16, {m, ld}, Device::cuda());
      Tensor q_out(DType::s8, {m, ld}, Device::cuda()), scales(DType::f32, {m}, Device::cuda());
      for (ActKind kind : {ActKind::f32, ActKind::bf16, ActKind::s8_per_token}) {
        Tensor& out = kind == ActKind::f32 ? f32_out : kind == ActKind::bf16 ? b_out : q_out;
        cuda::launch_swiglu(static_cast<float*>(gd.data()), m, f, act_out(kind, out, ld, &scales),
                            nullptr);
      }
      const auto got = host_copy<float>(f32_out);
      const auto got_b = host_copy<uint16_t>(b_out);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t i = 0; i < f; ++i) {
          const float g = gu[static_cast<size_t>(r * 2 * f + i)];
          const float u = gu[static_cast<size_t>(r * 2 * f + f + i)];
          const float want = g / (1.0f + std::exp(-g)) * u;  // the CPU backend's expression
          const float have = got[static_cast<size_t>(r * ld + i)];
          ASSERT_NEAR(have, want, 1e-6 * std::fabs(want) + 1e-30) << r << "," << i;
          ASSERT_EQ(got_b[static_cast<size_t>(r * ld + i)], f32_to_bf16_bits(have));
        }
      expect_int8_matches_quantize_activation(f32_out, m, f, ld, q_out, scales);
    }
}

struct HeadShape {
  int n_heads, n_kv_heads, head_dim;
};
// GQA ratios 1, 3, 4 and 8 at head_dim 64 and 128, SmolLM2's (9/3 × 64) and Llama-3-8B's.
const HeadShape kHeadShapes[] = {{2, 2, 64},  {6, 2, 64},   {9, 3, 64},  {8, 2, 128},
                                 {16, 2, 128}, {4, 4, 128}, {32, 8, 128}};

AttentionShape shape_of(const HeadShape& h, int64_t max_ctx) {
  AttentionShape s;
  s.n_heads = h.n_heads;
  s.n_kv_heads = h.n_kv_heads;
  s.head_dim = h.head_dim;
  s.max_ctx = max_ctx;
  return s;
}

// RoPE tables exactly as both backends build them.
void rope_tables(int64_t max_ctx, int hd, double theta, std::vector<float>& cs,
                 std::vector<float>& sn) {
  const int half = hd / 2;
  cs.resize(static_cast<size_t>(max_ctx * half));
  sn.resize(cs.size());
  for (int64_t p = 0; p < max_ctx; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = static_cast<double>(p) * std::pow(theta, -2.0 * i / hd);
      cs[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(a));
      sn[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(a));
    }
}

// The CPU backend's rope() on one head vector.
void rope_head(float* v, int hd, const float* cs, const float* sn) {
  const int half = hd / 2;
  for (int i = 0; i < half; ++i) {
    const float a = v[i], b = v[i + half];
    v[i] = a * cs[i] - b * sn[i];
    v[i + half] = b * cs[i] + a * sn[i];
  }
}

constexpr uint16_t kBf16NaN = 0x7FC0;

TEST(LlmCudaKernels, RopeQkvStoreMatchesTheCpuRotationBitForBit) {
  NIBBLE_REQUIRE_GPU();
  nibble::test::Rng rng;
  for (const HeadShape& h : kHeadShapes)
    for (int64_t m : {1, 17})
      for (int32_t pos0 : {0, 37}) {
        SCOPED_TRACE(std::to_string(h.n_heads) + "/" + std::to_string(h.n_kv_heads) + "x" +
                     std::to_string(h.head_dim) + " m=" + std::to_string(m) + " pos0=" +
                     std::to_string(pos0));
        const int64_t max_ctx = 64, hd = h.head_dim, qd = h.n_heads * hd, kvd = h.n_kv_heads * hd;
        const AttentionShape s = shape_of(h, max_ctx);
        std::vector<float> cs, sn;
        rope_tables(max_ctx, h.head_dim, 10000.0, cs, sn);
        const auto qkv = normals(static_cast<size_t>(m * s.qkv_ld()), rng);
        const std::vector<uint16_t> nan_cache(static_cast<size_t>(kvd * max_ctx), kBf16NaN);
        Tensor qkv_d = device_copy(qkv, DType::f32), cs_d = device_copy(cs, DType::f32),
               sn_d = device_copy(sn, DType::f32), pos_d = device_copy(std::vector<int32_t>{pos0}, DType::s32);
        Tensor kc = device_copy(nan_cache, DType::bf16), vc = device_copy(nan_cache, DType::bf16);
        Tensor q_out(DType::bf16, {m, qd}, Device::cuda());
        cuda::launch_rope_qkv_store(static_cast<float*>(qkv_d.data()), m, static_cast<int32_t*>(pos_d.data()),
                                    s, static_cast<float*>(cs_d.data()), static_cast<float*>(sn_d.data()),
                                    static_cast<uint16_t*>(q_out.data()), static_cast<uint16_t*>(kc.data()),
                                    static_cast<uint16_t*>(vc.data()), nullptr);
        const auto q_got = host_copy<uint16_t>(q_out), k_got = host_copy<uint16_t>(kc),
                   v_got = host_copy<uint16_t>(vc);
        for (int64_t t = 0; t < m; ++t) {
          const int64_t p = pos0 + t;
          std::vector<float> row(qkv.begin() + t * s.qkv_ld(), qkv.begin() + (t + 1) * s.qkv_ld());
          for (int head = 0; head < h.n_heads + h.n_kv_heads; ++head)
            rope_head(row.data() + head * hd, h.head_dim, cs.data() + p * hd / 2, sn.data() + p * hd / 2);
          for (int64_t i = 0; i < qd; ++i)
            ASSERT_EQ(q_got[static_cast<size_t>(t * qd + i)], f32_to_bf16_bits(row[static_cast<size_t>(i)]));
          for (int kvh = 0; kvh < h.n_kv_heads; ++kvh)
            for (int64_t i = 0; i < hd; ++i) {
              const size_t at = static_cast<size_t>((kvh * max_ctx + p) * hd + i);
              ASSERT_EQ(k_got[at], f32_to_bf16_bits(row[static_cast<size_t>(qd + kvh * hd + i)]));
              ASSERT_EQ(v_got[at], f32_to_bf16_bits(row[static_cast<size_t>(qd + kvd + kvh * hd + i)]));
            }
        }
        // Rows of other positions are untouched.
        for (int kvh = 0; kvh < h.n_kv_heads; ++kvh)
          for (int64_t p = 0; p < max_ctx; ++p)
            if (p < pos0 || p >= pos0 + m) {
              ASSERT_EQ(k_got[static_cast<size_t>((kvh * max_ctx + p) * hd)], kBf16NaN);
            }
      }
}

// out[t, h] = softmax over keys 0..q_pos[t] of q·K/√hd, times V; K/V bf16 as floats, in double.
std::vector<double> attention_reference(const std::vector<float>& q, int64_t m,
                                        const std::vector<int64_t>& q_pos, const HeadShape& h,
                                        const std::vector<uint16_t>& kc,
                                        const std::vector<uint16_t>& vc, int64_t max_ctx) {
  const int hd = h.head_dim, group = h.n_heads / h.n_kv_heads;
  const int64_t qd = int64_t{h.n_heads} * hd;
  std::vector<double> out(static_cast<size_t>(m * qd), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> w;
  for (int64_t t = 0; t < m; ++t)
    for (int head = 0; head < h.n_heads; ++head) {
      const int kvh = head / group;
      const int64_t n = q_pos[static_cast<size_t>(t)] + 1;
      w.assign(static_cast<size_t>(n), 0.0);
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int i = 0; i < hd; ++i)
          dot += static_cast<double>(q[static_cast<size_t>(t * qd + head * hd + i)]) *
                 bf16_bits_to_f32(kc[static_cast<size_t>((kvh * max_ctx + j) * hd + i)]);
        w[static_cast<size_t>(j)] = dot * scale;
        mx = std::max(mx, dot * scale);
      }
      double sum = 0;
      for (auto& x : w) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < n; ++j)
        for (int i = 0; i < hd; ++i)
          out[static_cast<size_t>(t * qd + head * hd + i)] +=
              w[static_cast<size_t>(j)] / sum *
              bf16_bits_to_f32(vc[static_cast<size_t>((kvh * max_ctx + j) * hd + i)]);
    }
  return out;
}

// Both decode kernels (the split-KV one, and on sm_90+ the cluster one) on lengths that leave
// most of a cluster's CTAs without keys (1, 3), end inside a ring stage (17, 100), and need
// the ring to refill after the wait (5000: > 16·5·32 keys a kv head).
// The attention extras (attention_extras.cu) against the CPU backend's add_bias and per-head
// rmsnorm, written out here: the bias exactly, the norm up to the order of its double sum; q and
// k heads take their own weights; v columns stay untouched.
TEST(LlmCudaKernels, AddBiasAndHeadRmsNormMatchTheCpuFormulas) {
  NIBBLE_REQUIRE_GPU();
  nibble::test::Rng rng;
  for (const HeadShape& h : kHeadShapes)
    for (int64_t m : {1, 3, 17}) {
      SCOPED_TRACE(std::to_string(h.n_heads) + "/" + std::to_string(h.n_kv_heads) + "x" +
                   std::to_string(h.head_dim) + " m=" + std::to_string(m));
      const AttentionShape s = shape_of(h, 16);
      const int64_t ld = s.qkv_ld(), hd = h.head_dim;
      auto qkv = normals(static_cast<size_t>(m * ld), rng, 2.0);
      // An outlier column and a head of tiny values (where eps matters).
      const auto outlier = static_cast<size_t>(rng.uniform_int(0, ld - 1));
      for (int64_t r = 0; r < m; ++r) qkv[static_cast<size_t>(r) * ld + outlier] *= 300.0f;
      for (int64_t i = 0; i < hd; ++i) qkv[static_cast<size_t>(hd + i) % qkv.size()] *= 1e-4f;
      const auto bias = normals(static_cast<size_t>(ld), rng, 0.5);
      const auto qw = normals(static_cast<size_t>(hd), rng), kw = normals(static_cast<size_t>(hd), rng);

      std::vector<float> want = qkv;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t i = 0; i < ld; ++i) want[static_cast<size_t>(r * ld + i)] += bias[static_cast<size_t>(i)];
      Tensor y = device_copy(qkv, DType::f32), b = device_copy(bias, DType::f32);
      cuda::launch_add_bias(static_cast<float*>(y.data()), m, ld, static_cast<const float*>(b.data()),
                            nullptr);
      ASSERT_EQ(host_copy<float>(y), want);

      const std::vector<float> biased = want;
      for (int64_t r = 0; r < m; ++r)
        for (int head = 0; head < h.n_heads + h.n_kv_heads; ++head) {
          float* v = want.data() + r * ld + head * hd;
          const std::vector<float>& w = head < h.n_heads ? qw : kw;
          double ss = 0;
          for (int64_t i = 0; i < hd; ++i) ss += static_cast<double>(v[i]) * v[i];
          const auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(hd) + 1e-6));
          for (int64_t i = 0; i < hd; ++i) v[i] = v[i] * inv * w[static_cast<size_t>(i)];
        }
      Tensor qwd = device_copy(qw, DType::f32), kwd = device_copy(kw, DType::f32);
      cuda::launch_head_rmsnorm(static_cast<float*>(y.data()), m, s, static_cast<const float*>(qwd.data()),
                                static_cast<const float*>(kwd.data()), 1e-6, nullptr);
      const auto got = host_copy<float>(y);
      const int64_t v0 = (h.n_heads + h.n_kv_heads) * hd;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t i = 0; i < ld; ++i) {
          const auto e = static_cast<size_t>(r * ld + i);
          if (i >= v0)
            ASSERT_EQ(got[e], biased[e]) << "v column " << i << " changed";
          else
            ASSERT_NEAR(got[e], want[e], 4e-7 * std::fabs(want[e]) + 1e-30) << r << "," << i;
        }
    }
}

// compact_heads moves each padded head's model columns (the halves at [0, h/2) and
// [H/2, H/2 + h/2)) back side by side, in every output form, and writes nothing past them.
TEST(LlmCudaKernels, CompactHeadsCopiesTheModelsColumnsInEveryForm) {
  NIBBLE_REQUIRE_GPU();
  nibble::test::Rng rng;
  for (const auto& [h, H] : {std::pair{96, 128}, std::pair{80, 128}, std::pair{32, 64}, std::pair{50, 64}})
    for (int64_t m : {1, 5}) {
      SCOPED_TRACE(std::to_string(h) + " in " + std::to_string(H) + ", m=" + std::to_string(m));
      AttentionShape s;
      s.n_heads = 3, s.n_kv_heads = 1, s.head_dim = H, s.logical_head_dim = h, s.max_ctx = 8;
      const int64_t pld = 3 * H + 8, old = 3 * h + 24;  // row strides wider than the rows
      const auto vals = normals(static_cast<size_t>(m * pld), rng);
      std::vector<float> want(static_cast<size_t>(m * old), -7.0f);  // -7: the poison
      for (int64_t t = 0; t < m; ++t)
        for (int head = 0; head < 3; ++head)
          for (int j = 0; j < h; ++j) {
            const int from = head * H + (j < h / 2 ? j : j - h / 2 + H / 2);
            want[static_cast<size_t>(t * old + head * h + j)] = vals[static_cast<size_t>(t * pld + from)];
          }
      // f32
      Tensor pf = device_copy(vals, DType::f32);
      Tensor of = device_copy(std::vector<float>(static_cast<size_t>(m * old), -7.0f), DType::f32);
      cuda::launch_compact_heads(act_out(ActKind::f32, pf, pld), act_out(ActKind::f32, of, old), m, s,
                                 nullptr);
      EXPECT_EQ(host_copy<float>(of), want);
      // bf16 and int8: the same moves of 2- and 1-byte elements
      std::vector<uint16_t> vb(vals.size()), wb(want.size());
      std::vector<int8_t> vq(vals.size()), wq(want.size());
      for (size_t i = 0; i < vals.size(); ++i) {
        vb[i] = f32_to_bf16_bits(vals[i]);
        vq[i] = static_cast<int8_t>(std::lrint(std::clamp(vals[i] * 40.0f, -127.0f, 127.0f)));
      }
      for (int64_t t = 0; t < m; ++t)
        for (int64_t e = 0; e < old; ++e) {
          const auto i = static_cast<size_t>(t * old + e);
          wb[i] = f32_to_bf16_bits(-7.0f);
          wq[i] = -7;
        }
      for (int64_t t = 0; t < m; ++t)
        for (int head = 0; head < 3; ++head)
          for (int j = 0; j < h; ++j) {
            const auto from = static_cast<size_t>(t * pld + head * H + (j < h / 2 ? j : j - h / 2 + H / 2));
            const auto to = static_cast<size_t>(t * old + head * h + j);
            wb[to] = vb[from];
            wq[to] = vq[from];
          }
      std::vector<uint16_t> poison_b(wb.size(), f32_to_bf16_bits(-7.0f));
      Tensor pb = device_copy(vb, DType::bf16), ob = device_copy(poison_b, DType::bf16);
      cuda::launch_compact_heads(act_out(ActKind::bf16, pb, pld), act_out(ActKind::bf16, ob, old), m,
                                 s, nullptr);
      EXPECT_EQ(host_copy<uint16_t>(ob), wb);
      Tensor pq = device_copy(vq, DType::s8);
      Tensor oq = device_copy(std::vector<int8_t>(wq.size(), -7), DType::s8);
      cuda::launch_compact_heads(act_out(ActKind::s8_per_token, pq, pld),
                                 act_out(ActKind::s8_per_token, oq, old), m, s, nullptr);
      EXPECT_EQ(host_copy<int8_t>(oq), wq);
    }
}

TEST(LlmCudaKernels, AttentionDecodeMatchesAFloat64Reference) {
  NIBBLE_REQUIRE_GPU();
  nibble::test::Rng rng;
  const int64_t max_ctx = 5120;
  std::vector<std::string> kernels = {"splitkv"};
  if (nibble::cuda_device_info(0).cc_major >= 9) kernels.push_back("cluster");
  for (const std::string& kernel : kernels) {
    for (const HeadShape& h : kHeadShapes)
      for (int64_t len : {1, 3, 17, 100, 1000, 5000}) {
        const ScopedEnv force("NIBBLE_DECODE_ATTENTION_KERNEL", kernel);
        SCOPED_TRACE(kernel + " " + std::to_string(h.n_heads) + "/" + std::to_string(h.n_kv_heads) +
                     "x" + std::to_string(h.head_dim) + " length " + std::to_string(len));
        const int64_t hd = h.head_dim, qd = h.n_heads * hd, kvd = h.n_kv_heads * hd, pos = len - 1;
        const AttentionShape s = shape_of(h, max_ctx);
        std::vector<float> cs, sn;
        rope_tables(max_ctx, h.head_dim, 500000.0, cs, sn);
        const auto qkv = normals(static_cast<size_t>(s.qkv_ld()), rng);
        // Keys and values before the new position are random; from it on NaN, which the kernel
        // must overwrite (row pos) or never read (beyond).
        std::vector<uint16_t> kc(static_cast<size_t>(kvd * max_ctx), kBf16NaN), vc = kc;
        for (int kvh = 0; kvh < h.n_kv_heads; ++kvh)
          for (int64_t j = 0; j < pos; ++j)
            for (int64_t i = 0; i < hd; ++i) {
              kc[static_cast<size_t>((kvh * max_ctx + j) * hd + i)] = f32_to_bf16_bits(static_cast<float>(rng.normal()));
              vc[static_cast<size_t>((kvh * max_ctx + j) * hd + i)] = f32_to_bf16_bits(static_cast<float>(rng.normal()));
            }
        // The host's RoPE of q and k, and the expected new cache rows.
        std::vector<float> row = qkv;
        for (int head = 0; head < h.n_heads + h.n_kv_heads; ++head)
          rope_head(row.data() + head * hd, h.head_dim, cs.data() + pos * hd / 2, sn.data() + pos * hd / 2);
        std::vector<uint16_t> kc_ref = kc, vc_ref = vc;
        for (int kvh = 0; kvh < h.n_kv_heads; ++kvh)
          for (int64_t i = 0; i < hd; ++i) {
            kc_ref[static_cast<size_t>((kvh * max_ctx + pos) * hd + i)] = f32_to_bf16_bits(row[static_cast<size_t>(qd + kvh * hd + i)]);
            vc_ref[static_cast<size_t>((kvh * max_ctx + pos) * hd + i)] = f32_to_bf16_bits(row[static_cast<size_t>(qd + kvd + kvh * hd + i)]);
          }
        const std::vector<float> q_rot(row.begin(), row.begin() + qd);
        const auto ref = attention_reference(q_rot, 1, {pos}, h, kc_ref, vc_ref, max_ctx);

        Tensor qkv_d = device_copy(qkv, DType::f32), cs_d = device_copy(cs, DType::f32),
               sn_d = device_copy(sn, DType::f32), pos_d = device_copy(std::vector<int32_t>{static_cast<int32_t>(pos)}, DType::s32);
        Tensor kc_d = device_copy(kc, DType::bf16), vc_d = device_copy(vc, DType::bf16);
        Tensor partials(DType::f32, {cuda::decode_attention_partial_floats(s)}, Device::cuda());
        Tensor row_f32(DType::f32, {qd}, Device::cuda());
        Tensor counters = device_copy(std::vector<int32_t>(static_cast<size_t>(cuda::decode_attention_counter_ints(s)), 0), DType::s32);
        cuda::DecodeAttentionWorkspace ws;
        ws.partials = static_cast<float*>(partials.data());
        ws.row_f32 = static_cast<float*>(row_f32.data());
        ws.counters = static_cast<int*>(counters.data());
        const int64_t ld = qd + 16;
        Tensor f32_out(DType::f32, {1, ld}, Device::cuda()), f32_again(DType::f32, {1, ld}, Device::cuda());
        Tensor b_out(DType::bf16, {1, ld}, Device::cuda()), q_out(DType::s8, {1, ld}, Device::cuda());
        Tensor scales(DType::f32, {1}, Device::cuda());
        auto run = [&](ActKind kind, Tensor& out) {
          cuda::launch_attention_decode(static_cast<float*>(qkv_d.data()), static_cast<int32_t*>(pos_d.data()), s,
                                        static_cast<float*>(cs_d.data()), static_cast<float*>(sn_d.data()),
                                        static_cast<uint16_t*>(kc_d.data()), static_cast<uint16_t*>(vc_d.data()),
                                        ws, act_out(kind, out, ld, &scales), nullptr);
        };
        // The same poison in both: the 16 columns past qd are never written and must match too.
        f32_out.fill_bytes(0xFF);
        f32_again.fill_bytes(0xFF);
        run(ActKind::f32, f32_out);
        run(ActKind::f32, f32_again);
        run(ActKind::bf16, b_out);
        run(ActKind::s8_per_token, q_out);
        EXPECT_EQ(host_copy<uint16_t>(kc_d), kc_ref);
        EXPECT_EQ(host_copy<uint16_t>(vc_d), vc_ref);
        const auto got = host_copy<float>(f32_out);
        EXPECT_EQ(host_copy<uint32_t>(f32_out), host_copy<uint32_t>(f32_again)) << "not deterministic";
        const std::vector<float> head_out(got.begin(), got.begin() + qd);
        EXPECT_LT(rel_frob(head_out, ref), 2e-5);
        const auto got_b = host_copy<uint16_t>(b_out);
        for (int64_t i = 0; i < qd; ++i) ASSERT_EQ(got_b[static_cast<size_t>(i)], f32_to_bf16_bits(got[static_cast<size_t>(i)]));
        expect_int8_matches_quantize_activation(f32_out, 1, qd, ld, q_out, scales);
        for (int32_t c : host_copy<int32_t>(counters)) EXPECT_EQ(c, 0) << "arrival counters not reset";
      }
  }
}

TEST(LlmCudaKernels, AttentionPrefillMatchesAFloat64Reference) {
  NIBBLE_REQUIRE_GPU();
  nibble::test::Rng rng;
  struct Case {
    int64_t m, pos0;
  };
  const Case cases[] = {{1, 0}, {17, 0}, {17, 50}, {100, 0}, {100, 3}, {1000, 0}, {1, 999}};
  const int64_t max_ctx = 1024;
  for (const HeadShape& h : kHeadShapes) {
    if (h.n_heads > 16) continue;  // the float64 reference is the slow part
    for (const Case& c : cases) {
      if (c.m >= 1000 && h.n_heads > 8) continue;
      SCOPED_TRACE(std::to_string(h.n_heads) + "/" + std::to_string(h.n_kv_heads) + "x" +
                   std::to_string(h.head_dim) + " m=" + std::to_string(c.m) + " pos0=" +
                   std::to_string(c.pos0));
      const int64_t hd = h.head_dim, qd = h.n_heads * hd, kvd = h.n_kv_heads * hd;
      const int64_t kv_len = c.pos0 + c.m;
      const AttentionShape s = shape_of(h, max_ctx);
      std::vector<uint16_t> kc(static_cast<size_t>(kvd * max_ctx), kBf16NaN), vc = kc;
      for (int kvh = 0; kvh < h.n_kv_heads; ++kvh)
        for (int64_t j = 0; j < kv_len; ++j)
          for (int64_t i = 0; i < hd; ++i) {
            kc[static_cast<size_t>((kvh * max_ctx + j) * hd + i)] = f32_to_bf16_bits(static_cast<float>(rng.normal()));
            vc[static_cast<size_t>((kvh * max_ctx + j) * hd + i)] = f32_to_bf16_bits(static_cast<float>(rng.normal()));
          }
      const auto q_bits = bf16_normals(static_cast<size_t>(c.m * qd), rng);
      std::vector<float> q(q_bits.size());
      for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_bits_to_f32(q_bits[i]);
      std::vector<int64_t> q_pos;
      for (int64_t t = 0; t < c.m; ++t) q_pos.push_back(c.pos0 + t);
      const auto ref = attention_reference(q, c.m, q_pos, h, kc, vc, max_ctx);

      Tensor q_d = device_copy(q_bits, DType::bf16), kc_d = device_copy(kc, DType::bf16),
             vc_d = device_copy(vc, DType::bf16),
             pos_d = device_copy(std::vector<int32_t>{static_cast<int32_t>(c.pos0)}, DType::s32);
      const int64_t ld = qd + 6;
      Tensor f32_out(DType::f32, {c.m, ld}, Device::cuda()), b_out(DType::bf16, {c.m, ld}, Device::cuda());
      for (ActKind kind : {ActKind::f32, ActKind::bf16})
        cuda::launch_attention_prefill(static_cast<uint16_t*>(q_d.data()), c.m, static_cast<int32_t*>(pos_d.data()),
                                       s, static_cast<uint16_t*>(kc_d.data()), static_cast<uint16_t*>(vc_d.data()),
                                       act_out(kind, kind == ActKind::f32 ? f32_out : b_out, ld), nullptr);
      const auto got = host_copy<float>(f32_out);
      const auto got_b = host_copy<uint16_t>(b_out);
      std::vector<float> dense(static_cast<size_t>(c.m * qd));
      for (int64_t t = 0; t < c.m; ++t)
        for (int64_t i = 0; i < qd; ++i) {
          dense[static_cast<size_t>(t * qd + i)] = got[static_cast<size_t>(t * ld + i)];
          ASSERT_EQ(got_b[static_cast<size_t>(t * ld + i)], f32_to_bf16_bits(got[static_cast<size_t>(t * ld + i)]));
        }
      // P is rounded to bf16 for the tensor-core P·V (relative 2^-9 per probability).
      EXPECT_LT(rel_frob(dense, ref), 4e-3);
    }
  }
}

TEST(LlmCudaKernels, RandomFillsAreDeterministicAndInRange) {
  NIBBLE_REQUIRE_GPU();
  const int64_t n = 1 << 20;
  Tensor a(DType::bf16, {n}, Device::cuda()), b(DType::bf16, {n}, Device::cuda()), c(DType::bf16, {n}, Device::cuda());
  cuda::launch_fill_uniform_bf16(static_cast<uint16_t*>(a.data()), n, 0.5f, 42, nullptr);
  cuda::launch_fill_uniform_bf16(static_cast<uint16_t*>(b.data()), n, 0.5f, 42, nullptr);
  cuda::launch_fill_uniform_bf16(static_cast<uint16_t*>(c.data()), n, 0.5f, 43, nullptr);
  const auto va = host_copy<uint16_t>(a);
  EXPECT_EQ(va, host_copy<uint16_t>(b));
  EXPECT_NE(va, host_copy<uint16_t>(c));
  double sum = 0, sq = 0;
  for (uint16_t bits : va) {
    const double x = bf16_bits_to_f32(bits);
    ASSERT_LE(std::fabs(x), 0.5);
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.005);
  EXPECT_NEAR(sq / n, 0.25 / 3, 0.002);  // variance of U(-a, a) = a²/3

  Tensor bytes(DType::u8, {n + 5}, Device::cuda());
  cuda::launch_fill_random_bytes(static_cast<uint8_t*>(bytes.data()), n + 5, 7, nullptr);
  std::vector<int64_t> hist(256, 0);
  for (uint8_t v : host_copy<uint8_t>(bytes)) ++hist[v];
  for (int v = 0; v < 256; ++v) EXPECT_GT(hist[static_cast<size_t>(v)], n / 256 / 2) << v;

  Tensor params(DType::u8, {2000}, Device::cuda());
  cuda::launch_fill_two_level_params(static_cast<uint8_t*>(params.data()), 1000, 9, nullptr);
  const auto p = host_copy<uint8_t>(params);
  for (size_t i = 0; i < p.size(); i += 2) {
    ASSERT_GE(p[i], 9);
    ASSERT_LE(p[i], 16);
    ASSERT_EQ(p[i + 1], 128 - 8 * p[i]);
  }
}
#else
TEST(LlmCudaKernels, NeedTheCudaBackend) {
  GTEST_SKIP() << "this build of nibble has no CUDA backend";
}
#endif  // NIBBLE_WITH_CUDA

// ---- the backend against the CPU -----------------------------------------------------------------

TEST(LlmCudaBackend, MatchesTheCpuLogitsInBf16AndW4a8) {
  NIBBLE_REQUIRE_GPU();
  for (const ModelConfig& c : {tied_config(), untied_config()})
    for (const char* mode : {"bf16", "w4a8_pc", "w4a8_g128"}) {
      SCOPED_TRACE(c.name + " " + mode);
      const auto prompt = prompt_of(24, c.vocab_size);
      auto gpu = backend("cuda", c, options(mode));
      auto cpu = backend("cpu", c, options(mode));
      const auto g = logits_of(*gpu, prompt, 0, true), r = logits_of(*cpu, prompt, 0, true);
      ASSERT_EQ(g.size(), r.size());
      const double err = rel_frob(g, r);
      std::printf("%s %s: GPU vs CPU logits, relative Frobenius %.2e\n", c.name.c_str(), mode, err);
      EXPECT_LT(err, std::string(mode) == "bf16" ? kGpuCpuTolBf16 : kGpuCpuTolInt8);
    }
}

// RoPE scaling (Llama 3.1's llama3 rule) reaches the GPU through the shared host tables: the
// GPU's logits follow the CPU's, and differ from the unscaled model's.
TEST(LlmCudaBackend, Llama3RopeScalingMatchesTheCpu) {
  NIBBLE_REQUIRE_GPU();
  ModelConfig c = untied_config();
  c.set_rope_scaling({"llama3", 8.0, 1.0, 4.0, 16}, "test");  // original context 16: all kinds
  const auto prompt = prompt_of(40, c.vocab_size);
  auto gpu = backend("cuda", c, options("bf16"));
  auto cpu = backend("cpu", c, options("bf16"));
  const auto g = logits_of(*gpu, prompt, 0, true), r = logits_of(*cpu, prompt, 0, true);
  const double err = rel_frob(g, r);
  EXPECT_LT(err, kGpuCpuTolBf16);
  // The scaling moves these logits by 0.22 (relative, on the CPU, 2026-11-28): far more than
  // the GPU's distance from the CPU, so a GPU that ignored it would fail.
  auto plain = backend("cpu", untied_config(), options("bf16"));
  EXPECT_GT(rel_frob(logits_of(*plain, prompt, 0, true), r), 10 * err);
}

// Heads whose total width is not the hidden size (Qwen3-0.6B, Mistral-NeMo: head_dim · n_heads ≠
// dim): q and the attention output are qd wide, o maps qd back to dim.
TEST(LlmCudaBackend, HeadsWiderThanTheHiddenSizeMatchTheCpu) {
  NIBBLE_REQUIRE_GPU();
  ModelConfig c = tied_config();
  c.head_dim = 128;  // 4 heads × 128 = 512 against dim 256
  for (const char* mode : {"bf16", "w4a8_g128"}) {
    SCOPED_TRACE(mode);
    const auto prompt = prompt_of(24, c.vocab_size);
    auto gpu = backend("cuda", c, options(mode));
    auto cpu = backend("cpu", c, options(mode));
    const auto g = logits_of(*gpu, prompt, 0, true), r = logits_of(*cpu, prompt, 0, true);
    EXPECT_LT(rel_frob(g, r), std::string(mode) == "bf16" ? kGpuCpuTolBf16 : kGpuCpuTolInt8);
  }
}

// Random weights whose q and k projections come out 4× too large, as q/k-norm models (Qwen3)
// may have them, and whose q/k norm weights are not all ones: the norm then changes the
// attention a lot, so a backend that skipped or misapplied it could not pass as the CPU.
class QkScaledSource final : public WeightSource {
 public:
  explicit QkScaledSource(std::unique_ptr<WeightSource> inner) : inner_(std::move(inner)) {}
  std::vector<float> load(const std::string& name, std::initializer_list<int64_t> shape) override {
    std::vector<float> w = inner_->load(name, shape);
    if (name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight"))
      for (float& x : w) x *= 4.0f;
    if (name.ends_with("attn_q_norm.weight") || name.ends_with("attn_k_norm.weight"))
      for (size_t i = 0; i < w.size(); ++i)
        w[i] = 0.5f + static_cast<float>((i * 37 + name.size()) % 64) / 64.0f;
    return w;
  }
  bool has(const std::string& name) const override { return inner_->has(name); }
  std::string describe() const override { return "q/k-scaled " + inner_->describe(); }

 private:
  std::unique_ptr<WeightSource> inner_;
};

std::unique_ptr<Backend> qk_scaled_backend(const std::string& device, const ModelConfig& c,
                                           const BackendOptions& o) {
  ModelFiles m = random_model(c, 11);
  m.weights = std::make_unique<QkScaledSource>(std::move(m.weights));
  return make_backend(device, m, o);
}

// Qwen2's q/k/v biases, Llama's attention_bias (q/k/v and o) and Qwen3's per-head q/k norms
// (with heads wider than the hidden size, as Qwen3-0.6B): prompt logits (prefill path) and the
// logits of decode steps after it (decode path, through the graph) follow the CPU's, and differ
// from those of the same weights without the extras by far more.
TEST(LlmCudaBackend, AttentionBiasesAndQkNormsMatchTheCpu) {
  NIBBLE_REQUIRE_GPU();
  struct Variant {
    const char* name;
    bool qkv_bias, o_bias, qk_norm;
  };
  for (const Variant& v : {Variant{"qwen2", true, false, false}, Variant{"llama", true, true, false},
                           Variant{"qwen3", false, false, true}})
    for (const char* mode : {"bf16", "w4a8_g128"}) {
      SCOPED_TRACE(std::string(v.name) + (v.o_bias ? " attention_bias " : " ") + mode);
      ModelConfig c = tied_config();
      c.arch = v.name;
      c.qkv_bias = v.qkv_bias, c.o_bias = v.o_bias, c.qk_norm = v.qk_norm;
      if (v.qk_norm) c.head_dim = 128;  // 4 heads × 128 against dim 256
      auto make = [&](const std::string& device, const ModelConfig& cfg) {
        return v.qk_norm ? qk_scaled_backend(device, cfg, options(mode))
                         : backend(device, cfg, options(mode));
      };
      const auto prompt = prompt_of(24, c.vocab_size);
      auto gpu = make("cuda", c);
      auto cpu = make("cpu", c);
      const double tol = std::string(mode) == "bf16" ? kGpuCpuTolBf16 : kGpuCpuTolInt8;
      const auto g = logits_of(*gpu, prompt, 0, true), r = logits_of(*cpu, prompt, 0, true);
      const double err = rel_frob(g, r);
      ModelConfig plain = c;
      plain.arch = "llama";  // the same weights, without the extras
      plain.qkv_bias = plain.o_bias = plain.qk_norm = false;
      const double extras = rel_frob(logits_of(*make("cpu", plain), prompt, 0, true), r);
      std::printf("%s%s %s: GPU vs CPU prompt logits %.2e; without the extras %.2e\n", v.name,
                  v.o_bias ? " attention_bias" : "", mode, err, extras);
      EXPECT_LT(err, tol);
      EXPECT_GT(extras, 5 * err);
      for (int32_t step = 0; step < 3; ++step) {
        const std::vector<int32_t> t{static_cast<int32_t>((step * 101 + 7) % c.vocab_size)};
        const auto gd = logits_of(*gpu, t, 24 + step, false);
        const auto rd = logits_of(*cpu, t, 24 + step, false);
        EXPECT_LT(rel_frob(gd, rd), tol) << "decode step " << step;
      }
    }
}

// Heads the attention kernels do not take (Phi-3's 96; 80, 32) run zero-padded to 64 or 128:
// prompt logits and decode steps follow the CPU's, with attention biases and q/k norms too, and
// in the three linear-input forms (bf16; f32 into a W4A8 GEMM; int8 from the attention).
TEST(LlmCudaBackend, PaddedHeadsMatchTheCpu) {
  NIBBLE_REQUIRE_GPU();
  struct Variant {
    const char* name;
    int64_t head_dim, n_heads;
    bool qkv_bias, o_bias, qk_norm;
  };
  for (const Variant& v : {Variant{"llama", 96, 4, false, false, false},
                           Variant{"llama", 32, 8, false, false, false},
                           Variant{"llama", 80, 4, true, true, false},
                           Variant{"qwen3", 96, 4, false, false, true}})
    for (const char* mode : {"bf16", "w4a8_g128", "w8a8"}) {
      SCOPED_TRACE(std::string(v.name) + " head_dim " + std::to_string(v.head_dim) + " " + mode);
      ModelConfig c = tied_config();
      c.arch = v.name;
      c.head_dim = v.head_dim, c.n_heads = v.n_heads;
      c.qkv_bias = v.qkv_bias, c.o_bias = v.o_bias, c.qk_norm = v.qk_norm;
      auto make = [&](const std::string& device) {
        return v.qk_norm ? qk_scaled_backend(device, c, options(mode))
                         : backend(device, c, options(mode));
      };
      auto gpu = make("cuda");
      auto cpu = make("cpu");
      EXPECT_NE(gpu->describe().find("zero-padded"), std::string::npos) << gpu->describe();
      const double tol = std::string(mode) == "bf16" ? kGpuCpuTolBf16 : kGpuCpuTolInt8;
      const auto prompt = prompt_of(24, c.vocab_size);
      const auto g = logits_of(*gpu, prompt, 0, true), r = logits_of(*cpu, prompt, 0, true);
      const double err = rel_frob(g, r);
      std::printf("head_dim %lld %s %s: GPU vs CPU prompt logits %.2e\n",
                  static_cast<long long>(v.head_dim), v.name, mode, err);
      EXPECT_LT(err, tol);
      for (int32_t step = 0; step < 3; ++step) {
        const std::vector<int32_t> t{static_cast<int32_t>((step * 101 + 7) % c.vocab_size)};
        const auto gd = logits_of(*gpu, t, 24 + step, false);
        const auto rd = logits_of(*cpu, t, 24 + step, false);
        EXPECT_LT(rel_frob(gd, rd), tol) << "decode step " << step;
      }
    }
}

TEST(LlmCudaBackend, GreedyTokensMatchTheCpu) {
  NIBBLE_REQUIRE_GPU();
  const ModelConfig c = tied_config();
  for (const char* mode : {"bf16", "w4a8_pc", "w4a8_g128_2level"}) {
    SCOPED_TRACE(mode);
    const auto prompt = prompt_of(7, c.vocab_size);
    auto gpu = backend("cuda", c, options(mode));
    auto cpu = backend("cpu", c, options(mode));
    const GenerateResult g = generate(*gpu, prompt, 40, {});
    const GenerateResult r = generate(*cpu, prompt, 40, {});
    EXPECT_EQ(g.tokens, r.tokens);
  }
}

// decode_greedy on the GPU (argmax on the device, steps queued ahead of the host) gives the
// tokens of forward + llm::argmax step by step, with and without the graph; a run that ends
// early (on_token returns false while later steps are queued) leaves a backend that continues
// exactly where it stopped.
TEST(LlmCudaBackend, DeviceGreedyDecodeEqualsForwardAndHostArgmax) {
  NIBBLE_REQUIRE_GPU();
  const ModelConfig c = untied_config();
  for (const char* mode : {"bf16", "w4a8_pc"})
    for (const bool graph : {true, false}) {
      SCOPED_TRACE(std::string(mode) + (graph ? " graph" : " eager"));
      BackendOptions opt = options(mode);
      opt.cuda_graph = graph;
      const auto prompt = prompt_of(7, c.vocab_size);
      const int64_t np = static_cast<int64_t>(prompt.size()), steps = 20;
      auto ref = backend("cuda", c, opt);
      std::vector<float> logits;
      ref->forward(prompt, 0, false, logits);
      const int32_t first = argmax(logits);
      std::vector<int32_t> want;
      int32_t t = first;
      for (int64_t i = 0; i < steps; ++i) {
        const int32_t one[1] = {t};
        ref->forward(one, np + i, false, logits);
        want.push_back(t = argmax(logits));
      }
      auto dev = backend("cuda", c, opt);
      dev->forward(prompt, 0, false, logits);
      std::vector<int32_t> got;
      dev->decode_greedy(first, np, steps, [&](int32_t x) {
        got.push_back(x);
        return true;
      });
      EXPECT_EQ(got, want);
      // Stop after 5 tokens, then go on from there in a second call.
      auto split = backend("cuda", c, opt);
      split->forward(prompt, 0, false, logits);
      got.clear();
      split->decode_greedy(first, np, steps, [&](int32_t x) {
        got.push_back(x);
        return got.size() < 5;
      });
      ASSERT_EQ(got.size(), 5u);
      split->decode_greedy(got.back(), np + 5, steps - 5, [&](int32_t x) {
        got.push_back(x);
        return true;
      });
      EXPECT_EQ(got, want);
    }
}

TEST(LlmCudaBackend, PrefillThenDecodeMatchesTokenByToken) {
  NIBBLE_REQUIRE_GPU();
  for (const ModelConfig& c : {tied_config(), untied_config()})
    for (const char* mode : {"bf16", "w4a8_pc"}) {
      SCOPED_TRACE(c.name + " " + mode);
      const auto tokens = prompt_of(25, c.vocab_size, 9);
      // The prompt in one pass, then decode steps; against one token per call throughout.
      auto a = backend("cuda", c, options(mode));
      auto b = backend("cuda", c, options(mode));
      std::vector<float> la, lb;
      a->forward(std::span(tokens).first(20), 0, false, la);
      for (int64_t p = 20; p < 25; ++p) a->forward(std::span(tokens).subspan(p, 1), p, false, la);
      for (int64_t p = 0; p < 25; ++p) b->forward(std::span(tokens).subspan(p, 1), p, false, lb);
      EXPECT_LT(rel_frob(la, lb), kGpuPathTol);
      // A prompt in two passes (the second at position 10) against one pass.
      auto whole = backend("cuda", c, options(mode));
      const auto one = logits_of(*whole, std::vector<int32_t>(tokens.begin(), tokens.begin() + 20), 0, true);
      std::vector<float> first, second;
      a->forward(std::span(tokens).first(10), 0, true, first);
      a->forward(std::span(tokens).subspan(10, 10), 10, true, second);
      const std::vector<float> tail(one.begin() + 10 * c.vocab_size, one.end());
      EXPECT_LT(rel_frob(second, tail), kGpuPathTol);
    }
}

TEST(LlmCudaBackend, GraphReplayEqualsEagerLaunches) {
  NIBBLE_REQUIRE_GPU();
  const ModelConfig c = untied_config();
  for (const char* mode : {"bf16", "w4a8_pc", "w4a8_g128"}) {
    SCOPED_TRACE(mode);
    BackendOptions eager_opt = options(mode);
    eager_opt.cuda_graph = false;
    auto graph = backend("cuda", c, options(mode));
    auto eager = backend("cuda", c, eager_opt);
    EXPECT_NE(graph->describe().find("CUDA graph"), std::string::npos) << graph->describe();
    const auto prompt = prompt_of(9, c.vocab_size);
    EXPECT_EQ(logits_of(*graph, prompt, 0, false), logits_of(*eager, prompt, 0, false));
    for (int64_t p = 9; p < 17; ++p) {
      const std::vector<int32_t> one = {static_cast<int32_t>((p * 13) % c.vocab_size)};
      const auto g = logits_of(*graph, one, p, false), e = logits_of(*eager, one, p, false);
      // nibble's kernels and the runner's are deterministic: the graph replays them bit for
      // bit. cuBLAS promises the same only for the same algorithm, which it picks again at
      // capture; allow it summation-order differences.
      if (std::string(mode) == "bf16")
        ASSERT_LT(rel_frob(g, e), 1e-5) << "step " << p;
      else
        ASSERT_EQ(g, e) << "step " << p;
    }
  }
}

TEST(LlmCudaBackend, ProfiledDecodeStepTimesEveryOpAndLeavesTheStateAsADecodeStep) {
  NIBBLE_REQUIRE_GPU();
  const ModelConfig c = untied_config();
  auto profiled = backend("cuda", c, options("w4a8_pc"));
  auto plain = backend("cuda", c, options("w4a8_pc"));
  const auto prompt = prompt_of(9, c.vocab_size);
  logits_of(*profiled, prompt, 0, true);
  logits_of(*plain, prompt, 0, true);
  const int32_t token = 5;
  const auto ops = profiled->profile_decode_step(token, 9);
  const int64_t layers = profiled->n_layers();
  // Two add_rmsnorm: the first block's attention norm (of the embedding row) and the bf16
  // head's. The other norms run inside the W4A8 qkv and gate_up linears, and the o and down
  // linears add into the residual stream (LinearFusion; NIBBLE_DECODE_NORM=kernel would give
  // 2 · layers + 1).
  const std::map<std::string, int64_t> want = {
      {"embedding", 1},      {"add_rmsnorm", 2}, {"qkv", layers},
      {"attention", layers}, {"o", layers},      {"gate_up", layers},
      {"swiglu", layers},    {"down", layers},   {"head", 1}};
  ASSERT_EQ(ops.size(), want.size());
  for (const auto& op : ops) {
    ASSERT_TRUE(want.count(op.op)) << op.op;
    EXPECT_EQ(op.calls, want.at(op.op)) << op.op;
    EXPECT_GT(op.seconds, 0.0) << op.op;
    EXPECT_LT(op.seconds, 0.04) << op.op << ": the GPU-side wait leaked into the first op?";
  }
  // The profiled step wrote the KV cache at position 9 as a decode step does.
  logits_of(*plain, {token}, 9, true);
  const std::vector<int32_t> next = {11};
  EXPECT_EQ(logits_of(*profiled, next, 10, true), logits_of(*plain, next, 10, true));
  EXPECT_THROW(profiled->profile_decode_step(token, profiled->max_context()), Error);
  EXPECT_THROW(profiled->profile_decode_step(-1, 9), Error);
}

TEST(LlmCudaBackend, FusedInt8QuantizationEqualsQuantizeActivation) {
  NIBBLE_REQUIRE_GPU();
  const ModelConfig c = tied_config();
  for (const char* mode : {"w4a8_pc", "w4a8_g128", "w8a8"}) {
    SCOPED_TRACE(mode);
    BackendOptions unfused = options(mode);
    unfused.fuse_activation_quant = false;
    auto fused = backend("cuda", c, options(mode));
    auto plain = backend("cuda", c, unfused);
    const auto prompt = prompt_of(11, c.vocab_size);
    EXPECT_EQ(logits_of(*fused, prompt, 0, true), logits_of(*plain, prompt, 0, true));
    // The packed W4A8 decode steps also take their RMSNorm inside the linear (LinearFusion:
    // the mean of squares from 16-column granule sums and an f32 tail, where the runner's norm
    // kernel sums in double in its own order): the same norm to an ulp, so an int8 rounding
    // step can move; W8A8 stays bit-identical.
    const bool norm_in_linear = std::string(mode) != "w8a8";
    for (int64_t p = 11; p < 15; ++p) {
      const std::vector<int32_t> one = {static_cast<int32_t>((p * 29) % c.vocab_size)};
      const auto f = logits_of(*fused, one, p, false), u = logits_of(*plain, one, p, false);
      if (norm_in_linear) EXPECT_LT(rel_frob(f, u), kGpuCpuTolInt8) << "step " << p;
      else ASSERT_EQ(f, u) << "step " << p;
    }
  }
}

TEST(LlmCudaBackend, PromptsLongerThanOnePassMatchTheCpu) {
  NIBBLE_REQUIRE_GPU();
  ModelConfig c = tied_config();
  c.max_context = 2304;  // the GPU runs prompts in passes of 2048 tokens
  BackendOptions o = options("bf16");
  o.max_context = 2200;
  const auto prompt = prompt_of(2100, c.vocab_size, 1);
  auto gpu = backend("cuda", c, o);
  auto cpu = backend("cpu", c, o);
  const auto g = logits_of(*gpu, prompt, 0, true), r = logits_of(*cpu, prompt, 0, true);
  const std::vector<float> g_tail(g.end() - 100 * c.vocab_size, g.end()),
      r_tail(r.end() - 100 * c.vocab_size, r.end());
  EXPECT_LT(rel_frob(g, r), kGpuCpuTolBf16);
  EXPECT_LT(rel_frob(g_tail, r_tail), kGpuCpuTolBf16);  // the second pass's rows
  // The last row alone (an M = 1 output GEMM instead of M = 52): summation order only.
  EXPECT_LT(rel_frob(logits_of(*gpu, prompt, 0, false),
                     std::vector<float>(g.end() - c.vocab_size, g.end())),
            1e-5);
}

TEST(LlmCudaBackend, EveryKindOfLayerAndStrategyRunsCloseToTheCpu) {
  NIBBLE_REQUIRE_GPU();
  const ModelConfig c = untied_config();
  struct Run {
    std::string prefill, decode, head;
  };
  const Run runs[] = {{"w4a8_g128", "w4a8_pc", "bf16"},       {"bf16", "w4a16_g128", "bf16"},
                      {"w4a8_g128_2level", "w4a8_g128_2level", "w4a8_pc"},
                      {"w8a8", "w8a8", "bf16"},               {"w4a16_g128_asym", "w4a16_g128_asym", "bf16"},
                      {"w4afp8_pc", "w4afp8_pc", "bf16"},     {"w4a8_g64", "w4a8_g64", "w4a8_g128"}};
  for (const Run& run : runs) {
    SCOPED_TRACE(run.prefill + " / " + run.decode + ", output " + run.head);
    BackendOptions o = options(run.prefill, run.decode);
    o.head_mode = run.head;
    auto gpu = backend("cuda", c, o);
    // The CPU keeps the output projection in bf16 (or f32); against a quantized GPU output
    // layer only the int4 quantization noise bound applies.
    BackendOptions cpu_o = o;
    cpu_o.head_mode = "bf16";
    auto cpu = backend("cpu", c, cpu_o);
    // fp8 activations have 3 mantissa bits: a GPU/CPU difference moves a rounding step of up to
    // 12.5% of a value, where an int8 step is about 3%.
    const double tol = run.head != "bf16"               ? nibble::test::kQuantNoiseW4
                       : run.prefill.find("fp8") != std::string::npos ? 0.1
                                                                     : kGpuCpuTolInt8;
    const auto prompt = prompt_of(10, c.vocab_size);
    EXPECT_LT(rel_frob(logits_of(*gpu, prompt, 0, true), logits_of(*cpu, prompt, 0, true)), tol);
    const std::vector<int32_t> one = {3};
    EXPECT_LT(rel_frob(logits_of(*gpu, one, 10, false), logits_of(*cpu, one, 10, false)), tol);
    const MemoryReport mem = gpu->memory();
    EXPECT_GT(mem.device_allocated_bytes, mem.resident_weight_bytes);
    EXPECT_GE(mem.device_peak_bytes, 0);
    if (run.prefill != run.decode) {
      EXPECT_LT(mem.decode_weight_bytes, mem.resident_weight_bytes);
    }
  }
}

TEST(LlmCudaBackend, RandomWeightsMadeOnTheDeviceRun) {
  NIBBLE_REQUIRE_GPU();
  for (const char* mode : {"bf16", "w4a8_pc", "w4a8_g128", "w4a8_g128_2level", "w4a16_g128", "w8a8"}) {
    SCOPED_TRACE(mode);
    BackendOptions o = options(mode);
    o.random_weights_on_device = true;
    auto gpu = backend("cuda", untied_config(), o);
    EXPECT_NE(gpu->describe().find("random"), std::string::npos);
    const GenerateResult r = generate(*gpu, prompt_of(12, 500), 4, {});
    EXPECT_EQ(r.tokens.size(), 4u);
    for (float v : logits_of(*gpu, {1, 2, 3}, 0, true)) ASSERT_TRUE(std::isfinite(v));
  }
}

// A random model of config c written as a nibble checkpoint in format fmt, opened and run,
// gives the logits of the same model quantized at load, bit for bit.
void expect_checkpoint_runs_like_quantizing_at_load(const ModelConfig& c, const char* fmt,
                                                    const std::string& dir) {
  SCOPED_TRACE(fmt);
  ModelFiles m = random_model(c, 11);
  m.tokenizer = Tokenizer::from_hf_json(
      R"({"pre_tokenizer": {"type": "ByteLevel"}, "added_tokens": [],
          "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}})",
      "tiny");
  write_nibble_checkpoint(m, fmt, "bf16", dir);
  ModelFiles q = open_model(dir);
  auto from_ckpt = make_backend("cuda", q, options(fmt));
  auto at_load = backend("cuda", c, options(fmt));
  const auto prompt = prompt_of(8, 300);
  EXPECT_EQ(logits_of(*from_ckpt, prompt, 0, true), logits_of(*at_load, prompt, 0, true));
}

TEST(LlmCudaBackend, PreQuantizedCheckpointRunsLikeQuantizingAtLoad) {
  NIBBLE_REQUIRE_GPU();
  const std::string dir = test::unique_temp_path("nibble_cuda_ckpt_test");
  // The _sf16 ones: what GPTQ / AWQ checkpoints import as (f16 group scales).
  for (const char* fmt :
       {"w4a8_g128", "w4a16_g128_asym", "w4a16_g128_asym_sf16", "w4a16_g64_asym_sf16"})
    expect_checkpoint_runs_like_quantizing_at_load(tied_config(), fmt, dir);
  std::filesystem::remove_all(dir);
}

// A pre-quantized checkpoint of a model with padded heads: its q/k/v rows are padded as
// quantized rows (zero bytes: a zero weight in every format), which is what quantizing the
// padded float rows at load gives, byte for byte.
TEST(LlmCudaBackend, PreQuantizedCheckpointWithPaddedHeadsRunsLikeQuantizingAtLoad) {
  NIBBLE_REQUIRE_GPU();
  const std::string dir = test::unique_temp_path("nibble_cuda_padded_ckpt_test");
  ModelConfig c = tied_config();
  c.head_dim = 96;
  for (const char* fmt : {"w4a8_g128", "w4a16_g128_asym_sf16"})
    expect_checkpoint_runs_like_quantizing_at_load(c, fmt, dir);
  std::filesystem::remove_all(dir);
}

TEST(LlmCudaBackend, RejectsWhatItCannotRunWithClearErrors) {
  NIBBLE_REQUIRE_GPU();
  auto expect_error = [](auto&& fn, ErrorCode code, const std::string& words) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << words << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  ModelConfig odd = tied_config();
  odd.head_dim = 256, odd.n_heads = 2;  // heads wider than the kernels' 128 (Gemma's)
  expect_error([&] { backend("cuda", odd, options("bf16")); }, ErrorCode::unsupported, "head_dim");
  ModelConfig wide = untied_config();
  wide.n_heads = 16, wide.n_kv_heads = 1, wide.head_dim = 64;  // 16 query heads per kv head
  wide.dim = 1024;
  expect_error([&] { backend("cuda", wide, options("bf16")); }, ErrorCode::unsupported, "query heads");
  expect_error([&] { backend("cuda", tied_config(), options("f32")); }, ErrorCode::unsupported, "f32");
  expect_error([&] { backend("cuda", tied_config(), options("w8a8_static")); }, ErrorCode::unsupported,
               "calibrated");
  auto be = backend("cuda", tied_config(), options("bf16"));
  std::vector<float> l;
  expect_error([&] { be->forward(prompt_of(4, 300), 126, false, l); }, ErrorCode::out_of_range,
               "context");
  expect_error([&] { be->forward(std::vector<int32_t>{300}, 0, false, l); },
               ErrorCode::invalid_argument, "vocabulary");
  expect_error([&] { ModelFiles m = random_model(tied_config(), 1); make_backend("cuda:x", m, options("bf16")); },
               ErrorCode::invalid_argument, "cuda:N");
}

// ---- the real model -----------------------------------------------------------------------------

// The issue's acceptance check: SmolLM2's greedy continuation on the GPU (bf16) is the CPU's
// (bf16 mode), token for token, for 32 tokens. Greedy agreement between two implementations is
// only meaningful away from near-ties of the top two logits; emulating the GPU's roundings (bf16
// KV cache, bf16 q and P in the prefill attention) on the CPU, the asserted prompt keeps the
// top-two gap ≥ 6× its change at every one of the 32 steps (smallest gap 0.35), while "The
// capital of France is" (the CPU reference check's prompt) comes within 2.5× at one step (gap
// 0.26 vs a change of 0.10), so its agreement is printed, not asserted.
TEST(LlmCudaSmolLM2, GreedyTokensMatchTheCpuInBf16) {
  NIBBLE_REQUIRE_GPU();
  if (test::real_model_path().empty())
    GTEST_SKIP() << "NIBBLE_LLM_MODEL is not set (the SmolLM2 GGUF file)";
  const int64_t n = 32;
  ModelFiles cpu_files = open_model(test::real_model_path());
  ModelFiles gpu_files = open_model(test::real_model_path());
  BackendOptions o;
  o.max_context = 256;
  auto cpu = make_backend("cpu", cpu_files, o);
  auto gpu = make_backend("cuda", gpu_files, o);
  const Tokenizer& tok = *cpu_files.tokenizer;
  for (const char* text : {"What is the capital of France?", "The capital of France is"}) {
    const auto prompt = tok.encode(text);
    const auto want = generate(*cpu, prompt, n, {}).tokens;
    const auto got = generate(*gpu, prompt, n, {}).tokens;
    size_t same = 0;
    while (same < want.size() && same < got.size() && want[same] == got[same]) ++same;
    std::printf("prompt \"%s\": %zu of %lld greedy tokens equal\n  cpu:  %s\n  cuda: %s\n", text,
                same, static_cast<long long>(n), tok.decode(want).c_str(), tok.decode(got).c_str());
    if (std::string(text) == "What is the capital of France?") {
      ASSERT_EQ(want.size(), static_cast<size_t>(n));
      EXPECT_EQ(got, want);
    }
  }
}

}  // namespace
}  // namespace nibble::llm
