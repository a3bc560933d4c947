// Every error path of every public entry point (src/api/): each case changes one thing about a
// valid call and asserts the documented ErrorCode, that the message names the function, the
// argument and the problem, and that no output byte was written (outputs are poisoned first).
//
// CUDA requests: in this CPU-only environment a call on a CUDA device is `unsupported`. Views
// tagged cuda:0 here point at host memory, so the cases that would reach a real GPU are skipped
// where one exists (test::cuda_requests_are_unsupported()).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "nibble/nibble.h"
#include "test_util.h"

namespace nibble {
namespace {

using test::arg;
using test::Poisoned;
using test::Rng;
using test::throws_error;

const Device kCuda = Device::cuda(0);
constexpr ErrorCode kInvalid = ErrorCode::invalid_argument;
constexpr ErrorCode kUnsupported = ErrorCode::unsupported;
constexpr ErrorCode kOutOfRange = ErrorCode::out_of_range;

// ---- view mutations -----------------------------------------------------------------------------

TensorView null_data(TensorView v) {
  v.data = nullptr;
  return v;
}
TensorView with_rank(TensorView v, int rank) {
  for (int d = v.rank; d < rank; ++d) {
    v.shape[static_cast<size_t>(d)] = 1;
    v.strides[static_cast<size_t>(d)] = 1;
  }
  v.rank = rank;
  return v;
}
TensorView with_dtype(TensorView v, DType t) {
  v.dtype = t;
  return v;
}
TensorView with_size(TensorView v, int dim, int64_t size) {
  v.shape[static_cast<size_t>(dim)] = size;
  return v;
}
TensorView with_stride(TensorView v, int dim, int64_t stride) {
  v.strides[static_cast<size_t>(dim)] = stride;
  return v;
}
TensorView on(TensorView v, Device d) {
  v.device = d;
  return v;
}

// ---- the runner ---------------------------------------------------------------------------------

template <class Args>
struct ErrorCase {
  std::string what;                   // the one thing changed
  std::function<void(Args&)> mutate;  // applies it to a copy of the valid arguments
  ErrorCode code;
  std::string arg;     // the argument the message must name ("" for messages without one)
  std::string detail;  // what the message must say about it
  bool reaches_cuda_backend = false;  // a valid CUDA request: skipped where a GPU exists
};

// Runs `call` on the valid arguments (it must succeed: each failure below is then due to its
// one change), then on each case with the outputs poisoned.
template <class Args>
void expect_every_error(const std::string& function, const Args& valid,
                        const std::vector<ErrorCase<Args>>& cases,
                        std::initializer_list<Tensor*> outputs,
                        const std::function<void(const Args&)>& call) {
  ASSERT_NO_THROW(call(valid)) << "the unmodified arguments must be valid";
  for (const ErrorCase<Args>& c : cases) {
    SCOPED_TRACE(function + ": " + c.what);
    if (c.reaches_cuda_backend && !test::cuda_requests_are_unsupported()) continue;
    Args x = valid;
    c.mutate(x);
    const Poisoned guard(outputs);
    if (c.arg.empty()) {
      EXPECT_TRUE(throws_error([&] { call(x); }, c.code, {"nibble::" + function + ": ", c.detail}));
    } else {
      EXPECT_TRUE(throws_error([&] { call(x); }, c.code,
                               {"nibble::" + function + ": ", arg(c.arg), c.detail}));
    }
    EXPECT_TRUE(guard.unchanged());
  }
}

// Messages of the shared checks (src/common/check.cpp).
constexpr const char* kNull = "got a null pointer";
constexpr const char* kRank1 = "must have rank 1";
constexpr const char* kRank2 = "must have rank 2";
constexpr const char* kPositive = "must have positive sizes";
constexpr const char* kStride = "must have a contiguous last dimension";
constexpr const char* kEvenLast = "needs an even last dimension";
constexpr const char* kEvenStride = "needs even strides";
constexpr const char* kSameDevice = "like the other tensors";
constexpr const char* kNoCuda = "CUDA";

// ---- gemm_s32 -----------------------------------------------------------------------------------

struct GemmArgs {
  TensorView a, w, d;
};

TEST(ValidateGemmS32, EveryErrorPath) {
  Rng rng;
  const int64_t m = 3, n = 5, k = 64;
  const Tensor a8 = test::random_int(DType::s8, m, k, rng),
               a4 = test::random_int(DType::s4, m, k, rng);
  const Tensor w8 = test::random_int(DType::s8, n, k, rng),
               w4 = test::random_int(DType::s4, n, k, rng);
  Tensor d = Tensor::empty(DType::s32, {m, n});
  using C = ErrorCase<GemmArgs>;
  const std::vector<C> cases = {
      {"a null", [](GemmArgs& x) { x.a = null_data(x.a); }, kInvalid, "a", kNull},
      {"a rank 1", [](GemmArgs& x) { x.a = with_rank(x.a, 1); }, kInvalid, "a", kRank2},
      {"a rank 3", [](GemmArgs& x) { x.a = with_rank(x.a, 3); }, kInvalid, "a", kRank2},
      {"a no rows", [](GemmArgs& x) { x.a = with_size(x.a, 0, 0); }, kInvalid, "a", kPositive},
      {"a f32", [](GemmArgs& x) { x.a = with_dtype(x.a, DType::f32); }, kInvalid, "a",
       "must have dtype s8 or s4, got f32"},
      {"a u8", [](GemmArgs& x) { x.a = with_dtype(x.a, DType::u8); }, kInvalid, "a", "got u8"},
      {"a u4", [&](GemmArgs& x) { x.a = with_dtype(a4.view(), DType::u4); }, kInvalid, "a",
       "got u4"},
      {"a column stride 2", [](GemmArgs& x) { x.a = with_stride(x.a, 1, 2); }, kInvalid, "a",
       kStride},
      {"a s4, odd K", [&](GemmArgs& x) { x.a = with_size(a4.view(), 1, k - 1); }, kInvalid, "a",
       kEvenLast},
      {"a s4, odd row stride",
       [&](GemmArgs& x) { x.a = with_stride(with_size(a4.view(), 1, k - 2), 0, k - 1); }, kInvalid,
       "a", kEvenStride},
      {"w null", [](GemmArgs& x) { x.w = null_data(x.w); }, kInvalid, "w", kNull},
      {"w rank 1", [](GemmArgs& x) { x.w = with_rank(x.w, 1); }, kInvalid, "w", kRank2},
      {"w s32", [](GemmArgs& x) { x.w = with_dtype(x.w, DType::s32); }, kInvalid, "w",
       "must have dtype s8 or s4, got s32"},
      {"w e4m3", [](GemmArgs& x) { x.w = with_dtype(x.w, DType::e4m3); }, kInvalid, "w",
       "got e4m3"},
      {"w column stride 2", [](GemmArgs& x) { x.w = with_stride(x.w, 1, 2); }, kInvalid, "w",
       kStride},
      {"w s4, odd K",
       [](GemmArgs& x) {
         x.a = with_size(x.a, 1, k - 1);
         x.w = with_size(x.w, 1, k - 1);
       },
       kInvalid, "w", kEvenLast},
      {"w s4, odd row stride",
       [](GemmArgs& x) { x.w = with_stride(with_size(x.w, 1, k - 2), 0, k - 1); }, kInvalid, "w",
       kEvenStride},
      {"s4 × s8",
       [&](GemmArgs& x) {
         x.a = a4.view();
         x.w = w8.view();
       },
       kInvalid, "a", "supported pairs are s8×s8, s8×s4 and s4×s4"},
      {"w on another device", [](GemmArgs& x) { x.w = on(x.w, kCuda); }, kInvalid, "w",
       kSameDevice},
      {"w with another K", [](GemmArgs& x) { x.w = with_size(x.w, 1, k - 2); }, kInvalid, "w",
       "must have K = 64 columns like a, got 62"},
      {"d null", [](GemmArgs& x) { x.d = null_data(x.d); }, kInvalid, "d", kNull},
      {"d rank 1", [](GemmArgs& x) { x.d = with_rank(x.d, 1); }, kInvalid, "d", kRank2},
      {"d f32", [](GemmArgs& x) { x.d = with_dtype(x.d, DType::f32); }, kInvalid, "d",
       "must have dtype s32, got f32"},
      {"d with N − 1 columns", [](GemmArgs& x) { x.d = with_size(x.d, 1, n - 1); }, kInvalid, "d",
       "must have shape [3, 5], got [3, 4]"},
      {"d with M − 1 rows", [](GemmArgs& x) { x.d = with_size(x.d, 0, m - 1); }, kInvalid, "d",
       "must have shape [3, 5], got [2, 5]"},
      {"d column stride 2",
       [](GemmArgs& x) {
         x.d = with_stride(with_size(x.d, 1, 2), 1, 2);
         x.w = with_size(x.w, 0, 2);
       },
       kInvalid, "d", kStride},
      {"d on another device", [](GemmArgs& x) { x.d = on(x.d, kCuda); }, kInvalid, "d",
       kSameDevice},
      {"all on CUDA",
       [](GemmArgs& x) {
         x.a = on(x.a, kCuda);
         x.w = on(x.w, kCuda);
         x.d = on(x.d, kCuda);
       },
       kUnsupported, "device", kNoCuda, true},
  };
  expect_every_error<GemmArgs>("gemm_s32", {a8.view(), w4.view(), d.view()}, cases, {&d},
                               [](const GemmArgs& x) { gemm_s32(x.a, x.w, x.d); });
}

// K one past the documented limit is out_of_range, for each operand pair (the largest K itself
// runs in test_gemm.cpp). 4-bit K must be even, so the s4×s4 limit 33554431 is first exceeded
// by the even 33554432.
TEST(ValidateGemmS32, KAboveTheInt32LimitIsOutOfRange) {
  const struct {
    DType a, w;
  } pairs[] = {{DType::s8, DType::s8}, {DType::s8, DType::s4}, {DType::s4, DType::s4}};
  for (auto p : pairs) {
    const int64_t limit = max_int32_accumulation_k(p.a, p.w);
    const int64_t k = (limit + 2) / 2 * 2;  // the first K above the limit that is valid otherwise
    SCOPED_TRACE(std::string(to_string(p.a)) + "×" + to_string(p.w) + " K=" + std::to_string(k));
    Tensor a = test::filled_int(p.a, 1, k, 1), w = test::filled_int(p.w, 1, k, 1);
    Tensor d = Tensor::empty(DType::s32, {1, 1});
    const Poisoned guard({&d});
    EXPECT_TRUE(throws_error([&] { gemm_s32(a.view(), w.view(), d.view()); }, kOutOfRange,
                             {"nibble::gemm_s32: ", arg("k"), "at most " + std::to_string(limit),
                              "got " + std::to_string(k)}));
    EXPECT_TRUE(guard.unchanged());
  }
}

// ---- linear with quantized activations ----------------------------------------------------------

struct LinearArgs {
  QuantizedActivationView a;
  QuantizedWeightView w;
  TensorView d;
  TensorView bias;
  bool has_bias = true;
};

void call_linear(const LinearArgs& x) { linear(x.a, x.w, x.has_bias ? &x.bias : nullptr, x.d); }

// Valid operands of a format, quantized from random data.
struct LinearFixture {
  LinearFixture(const char* format, int64_t m_, int64_t n_, int64_t k_, Rng& rng)
      : f(parse_linear_format(format)), m(m_), n(n_), k(k_), w(f.weight, n, k) {
    quantize_weight(test::random_normal(DType::f32, n, k, rng, 0.02).view(), w.view());
    const Tensor x_f = test::random_normal(DType::bf16, m, k, rng);
    if (f.act == ActScheme::none) {
      x = x_f;
    } else {
      a = QuantizedActivation(f.act, m, k);
      if (f.act == ActScheme::s8_per_tensor)
        quantize_activation_static(x_f.view(), 0.05f, a.view());
      else
        quantize_activation(x_f.view(), a.view());
    }
    d = Tensor::empty(DType::f32, {m, n});
    bias = test::random_normal(DType::f32, 1, n, rng);
  }
  LinearArgs args() const { return {a.view(), w.view(), d.view(), test::as_vector(bias), true}; }

  LinearFormat f;
  int64_t m, n, k;
  QuantizedWeight w;
  QuantizedActivation a;
  Tensor x, d, bias;
};

TEST(ValidateLinear, EveryErrorPathWithQuantizedActivations) {
  Rng rng;
  LinearFixture g64("w4a8_g64", 3, 5, 128, rng);  // the valid call
  const LinearFixture two("w4a8_g64_2level", 3, 5, 128, rng);
  const LinearFixture asym("w4a16_g64_asym", 3, 5, 128, rng);
  const LinearFixture a4("w4a4_g64", 3, 5, 128, rng);
  const Tensor scales_1 = Tensor::empty(DType::f32, {1});
  using C = ErrorCase<LinearArgs>;
  const std::vector<C> cases = {
      {"a.scheme none", [](LinearArgs& x) { x.a.scheme = ActScheme::none; }, kInvalid, "a.scheme",
       "got none"},
      {"a.q null", [](LinearArgs& x) { x.a.q = null_data(x.a.q); }, kInvalid, "a.q", kNull},
      {"a.q rank 1", [](LinearArgs& x) { x.a.q = with_rank(x.a.q, 1); }, kInvalid, "a.q", kRank2},
      {"a.q no rows", [](LinearArgs& x) { x.a.q = with_size(x.a.q, 0, 0); }, kInvalid, "a.q",
       kPositive},
      {"a.q s4 for s8 activations", [&](LinearArgs& x) { x.a.q = a4.a.q.view(); }, kInvalid, "a.q",
       "must have dtype s8, got s4"},
      {"a.q s8 for s4 activations", [&](LinearArgs& x) { x.a.scheme = ActScheme::s4_per_token; },
       kInvalid, "a.q", "must have dtype s4, got s8"},
      {"a.q column stride 2", [](LinearArgs& x) { x.a.q = with_stride(x.a.q, 1, 2); }, kInvalid,
       "a.q", kStride},
      {"a.q s4, odd row stride",
       [&](LinearArgs& x) {
         x.a = a4.a.view();
         x.a.q = with_stride(x.a.q, 0, 127);
       },
       kInvalid, "a.q", kEvenStride},
      {"a.scales null", [](LinearArgs& x) { x.a.scales = null_data(x.a.scales); }, kInvalid,
       "a.scales", kNull},
      {"a.scales rank 2", [](LinearArgs& x) { x.a.scales = with_rank(x.a.scales, 2); }, kInvalid,
       "a.scales", kRank1},
      {"a.scales bf16", [](LinearArgs& x) { x.a.scales = with_dtype(x.a.scales, DType::bf16); },
       kInvalid, "a.scales", "must have dtype f32, got bf16"},
      {"a.scales M − 1", [](LinearArgs& x) { x.a.scales = with_size(x.a.scales, 0, 2); }, kInvalid,
       "a.scales", "must have shape [3], got [2]"},
      {"a.scales (M) for per-tensor", [](LinearArgs& x) { x.a.scheme = ActScheme::s8_per_tensor; },
       kInvalid, "a.scales", "must have shape [1], got [3]"},
      {"a.scales (1) for per-token", [&](LinearArgs& x) { x.a.scales = scales_1.view(); }, kInvalid,
       "a.scales", "must have shape [3], got [1]"},
      {"a.scales on another device", [](LinearArgs& x) { x.a.scales = on(x.a.scales, kCuda); },
       kInvalid, "a.scales", kSameDevice},
      {"a.q on another device", [](LinearArgs& x) { x.a.q = on(x.a.q, kCuda); }, kInvalid,
       "a.scales", kSameDevice},
      {"w.format.group_size 100", [](LinearArgs& x) { x.w.format.group_size = 100; }, kInvalid,
       "w.format.group_size", "got 100"},
      {"w.format.scale_dtype e4m3", [](LinearArgs& x) { x.w.format.scale_dtype = DType::e4m3; },
       kInvalid, "w.format.scale_dtype", "got e4m3"},
      {"w.format u4_asym per channel",
       [](LinearArgs& x) {
         x.w.format = {WeightScheme::u4_asym, 0, DType::bf16};
       },
       kInvalid, "w.format", "needs a group size"},
      {"w.n 0", [](LinearArgs& x) { x.w.n = 0; }, kInvalid, "w.n", "must be positive, got 0"},
      {"w.k −128", [](LinearArgs& x) { x.w.k = -128; }, kInvalid, "w.k",
       "must be positive, got -128"},
      {"w.k odd", [](LinearArgs& x) { x.w.k = 127; }, kInvalid, "w.k",
       "must be even for 4-bit weights, got 127"},
      {"w.k not a multiple of the group", [](LinearArgs& x) { x.w.k = 96; }, kInvalid, "w.k",
       "must be a multiple of the group size 64, got 96"},
      {"w.q null", [](LinearArgs& x) { x.w.q = null_data(x.w.q); }, kInvalid, "w.q", kNull},
      {"w.q rank 1", [](LinearArgs& x) { x.w.q = with_rank(x.w.q, 1); }, kInvalid, "w.q", kRank2},
      {"w.q u4 for s4_sym", [](LinearArgs& x) { x.w.q = with_dtype(x.w.q, DType::u4); }, kInvalid,
       "w.q", "must have dtype s4, got u4"},
      {"w.q N − 1 rows", [](LinearArgs& x) { x.w.q = with_size(x.w.q, 0, 4); }, kInvalid, "w.q",
       "must have shape [5, 128], got [4, 128]"},
      {"w.q column stride 2", [](LinearArgs& x) { x.w.q = with_stride(x.w.q, 1, 2); }, kInvalid,
       "w.q", kStride},
      {"w.q odd row stride", [](LinearArgs& x) { x.w.q = with_stride(x.w.q, 0, 129); }, kInvalid,
       "w.q", kEvenStride},
      {"w.q on another device", [](LinearArgs& x) { x.w.q = on(x.w.q, kCuda); }, kInvalid, "w.q",
       kSameDevice},
      {"w.scales null", [](LinearArgs& x) { x.w.scales = null_data(x.w.scales); }, kInvalid,
       "w.scales", kNull},
      {"w.scales rank 1", [](LinearArgs& x) { x.w.scales = with_rank(x.w.scales, 1); }, kInvalid,
       "w.scales", kRank2},
      {"w.scales f16 for bf16 scales",
       [](LinearArgs& x) { x.w.scales = with_dtype(x.w.scales, DType::f16); }, kInvalid, "w.scales",
       "must have dtype bf16, got f16"},
      {"w.scales one group", [](LinearArgs& x) { x.w.scales = with_size(x.w.scales, 1, 1); },
       kInvalid, "w.scales", "must have shape [5, 2], got [5, 1]"},
      {"w.scales column stride 2",
       [](LinearArgs& x) { x.w.scales = with_stride(x.w.scales, 1, 2); }, kInvalid, "w.scales",
       kStride},
      {"w.scales on another device", [](LinearArgs& x) { x.w.scales = on(x.w.scales, kCuda); },
       kInvalid, "w.scales", kSameDevice},
      {"w.zeros given for s4_sym", [&](LinearArgs& x) { x.w.zeros = two.w.zeros.view(); }, kInvalid,
       "w.zeros", "must be empty for this format"},
      {"w.group_scales given for s4_sym",
       [&](LinearArgs& x) { x.w.group_scales = two.w.group_scales.view(); }, kInvalid,
       "w.group_scales", "must be empty for this format"},
      {"two-level w.group_scales null",
       [&](LinearArgs& x) {
         x.w = two.w.view();
         x.w.group_scales = null_data(x.w.group_scales);
       },
       kInvalid, "w.group_scales", kNull},
      {"two-level w.zeros f32",
       [&](LinearArgs& x) {
         x.w = two.w.view();
         x.w.zeros = with_dtype(x.w.zeros, DType::f32);
       },
       kInvalid, "w.zeros", "must have dtype u8, got f32"},
      {"two-level w.scales (N, G)",
       [&](LinearArgs& x) {
         x.w = two.w.view();
         x.w.scales = g64.w.scales.view();
       },
       kInvalid, "w.scales", kRank1},
      {"u4_asym weights with int8 activations", [&](LinearArgs& x) { x.w = asym.w.view(); },
       kInvalid, "w.format", "is not a format in the catalogue"},
      {"s4 activations with two-level weights",
       [&](LinearArgs& x) {
         x.a = a4.a.view();
         x.w = two.w.view();
       },
       kInvalid, "w.format", "is not a format in the catalogue"},
      {"a.q with another K", [](LinearArgs& x) { x.a.q = with_size(x.a.q, 1, 64); }, kInvalid,
       "a.q", "must have K = 128 columns like the weights, got 64"},
      {"d null", [](LinearArgs& x) { x.d = null_data(x.d); }, kInvalid, "d", kNull},
      {"d rank 3", [](LinearArgs& x) { x.d = with_rank(x.d, 3); }, kInvalid, "d", kRank2},
      {"d s32", [](LinearArgs& x) { x.d = with_dtype(x.d, DType::s32); }, kInvalid, "d",
       "must have dtype f32 or f16 or bf16, got s32"},
      {"d e4m3", [](LinearArgs& x) { x.d = with_dtype(x.d, DType::e4m3); }, kInvalid, "d",
       "got e4m3"},
      {"d N − 1 columns", [](LinearArgs& x) { x.d = with_size(x.d, 1, 4); }, kInvalid, "d",
       "must have shape [3, 5], got [3, 4]"},
      {"d column stride 2", [](LinearArgs& x) { x.d = with_stride(x.d, 1, 2); }, kInvalid, "d",
       kStride},
      {"d on another device", [](LinearArgs& x) { x.d = on(x.d, kCuda); }, kInvalid, "d",
       kSameDevice},
      {"bias null data", [](LinearArgs& x) { x.bias = null_data(x.bias); }, kInvalid, "bias",
       kNull},
      {"bias rank 2", [](LinearArgs& x) { x.bias = with_rank(x.bias, 2); }, kInvalid, "bias",
       kRank1},
      {"bias s8", [](LinearArgs& x) { x.bias = with_dtype(x.bias, DType::s8); }, kInvalid, "bias",
       "must have dtype f32 or f16 or bf16, got s8"},
      {"bias N − 1", [](LinearArgs& x) { x.bias = with_size(x.bias, 0, 4); }, kInvalid, "bias",
       "must have shape [5], got [4]"},
      {"bias on another device", [](LinearArgs& x) { x.bias = on(x.bias, kCuda); }, kInvalid,
       "bias", kSameDevice},
      {"all on CUDA",
       [](LinearArgs& x) {
         for (TensorView* v : {&x.a.q, &x.a.scales, &x.w.q, &x.w.scales, &x.d, &x.bias})
           *v = on(*v, kCuda);
       },
       kUnsupported, "device", kNoCuda, true},
  };
  expect_every_error<LinearArgs>("linear", g64.args(), cases, {&g64.d}, call_linear);
}

// K beyond the int32 bound of the integer accumulation: whole-K formats (per channel,
// two-level) are out_of_range just past max_int32_accumulation_k; group-wise formats only
// bound the group, and fp8 activations accumulate in f32 without a bound.
TEST(ValidateLinear, KAboveTheInt32LimitIsOutOfRange) {
  // clang-format off
  const struct { const char* format; int64_t limit; } cases[] = {
      {"w8a8", 131071}, {"w8a8_static", 131071}, {"w4a8_pc", 2097151},
      {"w4a8_g128_2level", 131071}, {"w4a4_pc", 33554431},
  };
  // clang-format on
  for (const auto& c : cases) {
    const LinearFormat f = parse_linear_format(c.format);
    const int64_t k = c.limit + 1;  // 2^17, 2^21 or 2^25: even and a multiple of every group
    SCOPED_TRACE(std::string(c.format) + " K=" + std::to_string(k));
    QuantizedWeight w(f.weight, 1, k);
    QuantizedActivation a(f.act, 1, k);
    Tensor d = Tensor::empty(DType::f32, {1, 1});
    const Poisoned guard({&d});
    EXPECT_TRUE(throws_error(
        [&] { linear(a.view(), w.view(), nullptr, d.view()); }, kOutOfRange,
        {"nibble::linear: ", arg("k"), "K must be at most " + std::to_string(c.limit)}));
    EXPECT_TRUE(guard.unchanged());
  }
  // Past every whole-K bound: accepted, because only the group (or nothing) accumulates in int32.
  const int64_t k = 2097152 + 256;
  for (const char* name : {"w4a8_g256", "w4afp8_pc"}) {
    SCOPED_TRACE(name);
    const LinearFormat f = parse_linear_format(name);
    QuantizedWeight w(f.weight, 1, k);
    QuantizedActivation a(f.act, 1, k);
    w.q.fill_bytes(0x11);
    w.scales.fill_bytes(0);
    a.q.fill_bytes(0x10);
    a.scales.fill_bytes(0);
    Tensor d = Tensor::empty(DType::f32, {1, 1});
    EXPECT_NO_THROW(linear(a.view(), w.view(), nullptr, d.view()));
  }
}

// ---- linear with float activations (A16) --------------------------------------------------------

struct LinearA16Args {
  TensorView x;
  QuantizedWeightView w;
  TensorView d;
  TensorView bias;
  bool has_bias = true;
};

TEST(ValidateLinear, EveryErrorPathWithFloatActivations) {
  Rng rng;
  LinearFixture fzp("w4a16_g64_fzp", 3, 5, 128, rng);
  const LinearFixture two("w4a8_g64_2level", 3, 5, 128, rng);
  using C = ErrorCase<LinearA16Args>;
  const std::vector<C> cases = {
      {"x null", [](LinearA16Args& a) { a.x = null_data(a.x); }, kInvalid, "x", kNull},
      {"x rank 1", [](LinearA16Args& a) { a.x = with_rank(a.x, 1); }, kInvalid, "x", kRank2},
      {"x no columns", [](LinearA16Args& a) { a.x = with_size(a.x, 1, 0); }, kInvalid, "x",
       kPositive},
      {"x s8", [](LinearA16Args& a) { a.x = with_dtype(a.x, DType::s8); }, kInvalid, "x",
       "must have dtype f32 or f16 or bf16, got s8"},
      {"x e4m3", [](LinearA16Args& a) { a.x = with_dtype(a.x, DType::e4m3); }, kInvalid, "x",
       "got e4m3"},
      {"x column stride 2", [](LinearA16Args& a) { a.x = with_stride(a.x, 1, 2); }, kInvalid, "x",
       kStride},
      {"x on another device", [](LinearA16Args& a) { a.x = on(a.x, kCuda); }, kInvalid, "w.q",
       kSameDevice},
      {"w.q s4 for u4_fzp", [](LinearA16Args& a) { a.w.q = with_dtype(a.w.q, DType::s4); },
       kInvalid, "w.q", "must have dtype u4, got s4"},
      {"w.zeros missing", [](LinearA16Args& a) { a.w.zeros = TensorView{}; }, kInvalid, "w.zeros",
       kNull},
      {"w.zeros u8 for float zeros",
       [](LinearA16Args& a) { a.w.zeros = with_dtype(a.w.zeros, DType::u8); }, kInvalid, "w.zeros",
       "must have dtype bf16, got u8"},
      {"w.scales (N) for groups", [](LinearA16Args& a) { a.w.scales = with_rank(a.w.scales, 1); },
       kInvalid, "w.scales", kRank2},
      {"w.k odd", [](LinearA16Args& a) { a.w.k = 129; }, kInvalid, "w.k", "must be even"},
      {"two-level weights with float activations", [&](LinearA16Args& a) { a.w = two.w.view(); },
       kInvalid, "w.format", "with unquantized activations is not a format in the catalogue"},
      {"x with another K", [](LinearA16Args& a) { a.x = with_size(a.x, 1, 126); }, kInvalid, "x",
       "must have K = 128 columns like the weights, got 126"},
      {"d null", [](LinearA16Args& a) { a.d = null_data(a.d); }, kInvalid, "d", kNull},
      {"d s8", [](LinearA16Args& a) { a.d = with_dtype(a.d, DType::s8); }, kInvalid, "d", "got s8"},
      {"d M − 1 rows", [](LinearA16Args& a) { a.d = with_size(a.d, 0, 2); }, kInvalid, "d",
       "must have shape [3, 5], got [2, 5]"},
      {"d column stride 2", [](LinearA16Args& a) { a.d = with_stride(a.d, 1, 2); }, kInvalid, "d",
       kStride},
      {"d on another device", [](LinearA16Args& a) { a.d = on(a.d, kCuda); }, kInvalid, "d",
       kSameDevice},
      {"bias rank 2", [](LinearA16Args& a) { a.bias = with_rank(a.bias, 2); }, kInvalid, "bias",
       kRank1},
      {"bias u8", [](LinearA16Args& a) { a.bias = with_dtype(a.bias, DType::u8); }, kInvalid,
       "bias", "got u8"},
      {"bias N − 1", [](LinearA16Args& a) { a.bias = with_size(a.bias, 0, 4); }, kInvalid, "bias",
       "must have shape [5], got [4]"},
      {"bias on another device", [](LinearA16Args& a) { a.bias = on(a.bias, kCuda); }, kInvalid,
       "bias", kSameDevice},
      {"all on CUDA",
       [](LinearA16Args& a) {
         for (TensorView* v : {&a.x, &a.w.q, &a.w.scales, &a.w.zeros, &a.d, &a.bias})
           *v = on(*v, kCuda);
       },
       kUnsupported, "device", kNoCuda, true},
  };
  const LinearA16Args valid{fzp.x.view(), fzp.w.view(), fzp.d.view(), test::as_vector(fzp.bias),
                            true};
  expect_every_error<LinearA16Args>("linear", valid, cases, {&fzp.d}, [](const LinearA16Args& a) {
    linear(a.x, a.w, a.has_bias ? &a.bias : nullptr, a.d);
  });
}

// ---- linear and gemm_s32 with packed weights ----------------------------------------------------

struct PackedLinearArgs {
  QuantizedActivationView a;
  PackedWeightView w;
  TensorView d;
  TensorView bias;
};

TEST(ValidateLinear, EveryErrorPathWithPackedWeights) {
  Rng rng;
  const LinearFixture g128("w4a8_g128", 3, 5, 256, rng);
  LinearFixture a4("w4a4_pc", 3, 5, 256, rng);
  LinearFixture fp8("w4afp8_g128", 3, 5, 256, rng);
  const LinearFixture two("w4a8_g128_2level", 3, 5, 256, rng);
  const PackedWeight packed_two = pack_weight(two.w.view());
  const PackedWeight packed = pack_weight(g128.w.view());
  const PackedWeight raw = pack_s4_matrix(g128.w.q.view());
  Tensor d = Tensor::empty(DType::bf16, {3, 5});
  const Tensor bias2 = Tensor::empty(DType::f32, {1, 10});
  using C = ErrorCase<PackedLinearArgs>;
  const std::vector<C> cases = {
      {"a.scheme s4_per_token", [&](PackedLinearArgs& x) { x.a = a4.a.view(); }, kInvalid,
       "a.scheme", "must be s8_per_token, s8_per_tensor or e4m3_per_token"},
      {"e4m3 activations with two-level weights",
       [&](PackedLinearArgs& x) {
         x.a = fp8.a.view();
         x.w = packed_two.view();
       },
       kInvalid, "w.format", "must be s4_sym with e4m3 activations"},
      {"a.q null", [](PackedLinearArgs& x) { x.a.q = null_data(x.a.q); }, kInvalid, "a.q", kNull},
      {"w.version 2", [](PackedLinearArgs& x) { x.w.version = 2; }, kInvalid, "w",
       "use pack_weight"},
      {"w.format u4_asym", [](PackedLinearArgs& x) { x.w.format.scheme = WeightScheme::u4_asym; },
       kInvalid, "w.format", "must be a scheme that layout w4_mma_k128 holds"},
      {"w.n_pad inconsistent", [](PackedLinearArgs& x) { x.w.n_pad = 16; }, kInvalid, "w",
       "inconsistent sizes"},
      {"w.k not a multiple of 32", [](PackedLinearArgs& x) { x.w.k = 240; }, kInvalid, "w.k",
       "multiple of 32"},
      {"w.q null", [](PackedLinearArgs& x) { x.w.q = null_data(x.w.q); }, kInvalid, "w.q", kNull},
      {"w.q s8", [](PackedLinearArgs& x) { x.w.q = with_dtype(x.w.q, DType::s8); }, kInvalid, "w.q",
       "must have dtype u8, got s8"},
      {"w.q on another device", [](PackedLinearArgs& x) { x.w.q = on(x.w.q, kCuda); }, kInvalid,
       "w.q", kSameDevice},
      {"raw s4 matrix without scales", [&](PackedLinearArgs& x) { x.w = raw.view(); }, kInvalid,
       "w", "without scales"},
      {"w.scales null", [](PackedLinearArgs& x) { x.w.scales = null_data(x.w.scales); }, kInvalid,
       "w.scales", kNull},
      {"w.scales bf16",
       [](PackedLinearArgs& x) { x.w.scales = with_dtype(x.w.scales, DType::bf16); }, kInvalid,
       "w.scales", "must have dtype f32, got bf16"},
      {"a.q with another K", [](PackedLinearArgs& x) { x.a.q = with_size(x.a.q, 1, 128); },
       kInvalid, "a.q", "must have K = 256 columns"},
      {"d s32", [](PackedLinearArgs& x) { x.d = with_dtype(x.d, DType::s32); }, kInvalid, "d",
       "got s32"},
      {"d N − 1 columns", [](PackedLinearArgs& x) { x.d = with_size(x.d, 1, 4); }, kInvalid, "d",
       "must have shape [3, 5], got [3, 4]"},
      {"d on another device", [](PackedLinearArgs& x) { x.d = on(x.d, kCuda); }, kInvalid, "d",
       kSameDevice},
      {"bias N − 1", [](PackedLinearArgs& x) { x.bias = with_size(x.bias, 0, 4); }, kInvalid,
       "bias", "must have shape [5], got [4]"},
      {"bias with stride 2",
       [&](PackedLinearArgs& x) {
         x.bias = with_stride(with_size(test::as_vector(bias2), 0, 5), 0, 2);
       },
       kInvalid, "bias", "contiguous"},
      {"all on CUDA",
       [](PackedLinearArgs& x) {
         for (TensorView* v :
              {&x.a.q, &x.a.scales, &x.w.q, &x.w.scales, &x.w.group_params, &x.d, &x.bias})
           *v = on(*v, kCuda);
       },
       kUnsupported, "device", kNoCuda, true},
  };
  const PackedLinearArgs valid{g128.a.view(), packed.view(), d.view(), test::as_vector(g128.bias)};
  expect_every_error<PackedLinearArgs>("linear", valid, cases, {&d}, [](const PackedLinearArgs& x) {
    linear(x.a, x.w, &x.bias, x.d);
  });
}

struct PackedGemmArgs {
  TensorView a;
  PackedWeightView w;
  TensorView d;
};

TEST(ValidateGemmS32, EveryErrorPathWithPackedWeights) {
  Rng rng;
  const int64_t m = 3, n = 5, k = 256;
  const Tensor a = test::random_int(DType::s8, m, k, rng),
               a4 = test::random_int(DType::s4, m, k, rng);
  const PackedWeight w = pack_s4_matrix(test::random_int(DType::s4, n, k, rng).view());
  const LinearFixture two("w4a8_g128_2level", m, n, k, rng);
  const PackedWeight w_two = pack_weight(two.w.view());
  Tensor d = Tensor::empty(DType::s32, {m, n});
  using C = ErrorCase<PackedGemmArgs>;
  const std::vector<C> cases = {
      {"a null", [](PackedGemmArgs& x) { x.a = null_data(x.a); }, kInvalid, "a", kNull},
      {"a s4", [&](PackedGemmArgs& x) { x.a = a4.view(); }, kInvalid, "a",
       "must have dtype s8, got s4"},
      {"a column stride 2", [](PackedGemmArgs& x) { x.a = with_stride(x.a, 1, 2); }, kInvalid, "a",
       kStride},
      {"w.version 0", [](PackedGemmArgs& x) { x.w.version = 0; }, kInvalid, "w", "use pack_weight"},
      {"w.q null", [](PackedGemmArgs& x) { x.w.q = null_data(x.w.q); }, kInvalid, "w.q", kNull},
      {"two-level weights", [&](PackedGemmArgs& x) { x.w = w_two.view(); }, kInvalid, "w.format",
       "must be s4_sym for a raw s8×s4 GEMM"},
      {"a with another K", [](PackedGemmArgs& x) { x.a = with_size(x.a, 1, 128); }, kInvalid, "a",
       "must have K = 256 columns"},
      {"d f32", [](PackedGemmArgs& x) { x.d = with_dtype(x.d, DType::f32); }, kInvalid, "d",
       "must have dtype s32, got f32"},
      {"d M − 1 rows", [](PackedGemmArgs& x) { x.d = with_size(x.d, 0, m - 1); }, kInvalid, "d",
       "must have shape [3, 5], got [2, 5]"},
      {"d on another device", [](PackedGemmArgs& x) { x.d = on(x.d, kCuda); }, kInvalid, "d",
       kSameDevice},
      {"all on CUDA",
       [](PackedGemmArgs& x) {
         x.a = on(x.a, kCuda);
         x.w.q = on(x.w.q, kCuda);
         x.d = on(x.d, kCuda);
       },
       kUnsupported, "device", kNoCuda, true},
  };
  expect_every_error<PackedGemmArgs>("gemm_s32", {a.view(), w.view(), d.view()}, cases, {&d},
                                     [](const PackedGemmArgs& x) { gemm_s32(x.a, x.w, x.d); });
  // K above max_int32_accumulation_k(s8, s4) is out_of_range here too.
  const int64_t k_big = max_int32_accumulation_k(DType::s8, DType::s4) + 1;
  const PackedWeight w_big = pack_s4_matrix(test::filled_int(DType::s4, 1, k_big, 1).view());
  const Tensor a_big = test::filled_int(DType::s8, 1, k_big, 1);
  Tensor d_big = Tensor::empty(DType::s32, {1, 1});
  const Poisoned guard({&d_big});
  EXPECT_TRUE(throws_error([&] { gemm_s32(a_big.view(), w_big.view(), d_big.view()); }, kOutOfRange,
                           {"nibble::gemm_s32: ", arg("k"), "at most 2097151"}));
  EXPECT_TRUE(guard.unchanged());
}

// ---- quantize_weight / dequantize_weight --------------------------------------------------------

struct QuantizeWeightArgs {
  TensorView w;
  QuantizedWeightView out;
};

TEST(ValidateQuantizeWeight, EveryErrorPath) {
  Rng rng;
  const int64_t n = 5, k = 128;
  const Tensor w = test::random_normal(DType::f32, n, k, rng, 0.02);
  QuantizedWeight out(parse_weight_format("w4_g64_asym"), n, k);
  const QuantizedWeight two(parse_weight_format("w4_g64_2level"), n, k);
  using C = ErrorCase<QuantizeWeightArgs>;
  const std::vector<C> cases = {
      {"w null", [](QuantizeWeightArgs& a) { a.w = null_data(a.w); }, kInvalid, "w", kNull},
      {"w rank 1", [](QuantizeWeightArgs& a) { a.w = with_rank(a.w, 1); }, kInvalid, "w", kRank2},
      {"w s8", [](QuantizeWeightArgs& a) { a.w = with_dtype(a.w, DType::s8); }, kInvalid, "w",
       "must have dtype f32 or f16 or bf16, got s8"},
      {"w column stride 2", [](QuantizeWeightArgs& a) { a.w = with_stride(a.w, 1, 2); }, kInvalid,
       "w", kStride},
      {"w on CUDA", [](QuantizeWeightArgs& a) { a.w = on(a.w, kCuda); }, kUnsupported, "w",
       "must be on the CPU"},
      {"w N − 1 rows", [](QuantizeWeightArgs& a) { a.w = with_size(a.w, 0, n - 1); }, kInvalid, "w",
       "must have shape [5, 128], got [4, 128]"},
      {"out.format.group_size 48", [](QuantizeWeightArgs& a) { a.out.format.group_size = 48; },
       kInvalid, "out.format.group_size", "got 48"},
      {"out.format.scale_dtype s32",
       [](QuantizeWeightArgs& a) { a.out.format.scale_dtype = DType::s32; }, kInvalid,
       "out.format.scale_dtype", "got s32"},
      {"out.n 0", [](QuantizeWeightArgs& a) { a.out.n = 0; }, kInvalid, "out.n",
       "must be positive"},
      {"out.k odd", [](QuantizeWeightArgs& a) { a.out.k = 127; }, kInvalid, "out.k",
       "must be even"},
      {"out.q null", [](QuantizeWeightArgs& a) { a.out.q = null_data(a.out.q); }, kInvalid, "out.q",
       kNull},
      {"out.q s4 for u4_asym",
       [](QuantizeWeightArgs& a) { a.out.q = with_dtype(a.out.q, DType::s4); }, kInvalid, "out.q",
       "must have dtype u4, got s4"},
      {"out.q on another device", [](QuantizeWeightArgs& a) { a.out.q = on(a.out.q, kCuda); },
       kInvalid, "out.q", kSameDevice},
      {"out.scales (N, 1)",
       [](QuantizeWeightArgs& a) { a.out.scales = with_size(a.out.scales, 1, 1); }, kInvalid,
       "out.scales", "must have shape [5, 2], got [5, 1]"},
      {"out.zeros missing", [](QuantizeWeightArgs& a) { a.out.zeros = TensorView{}; }, kInvalid,
       "out.zeros", kNull},
      {"out.zeros bf16 for integer zeros",
       [](QuantizeWeightArgs& a) { a.out.zeros = with_dtype(a.out.zeros, DType::bf16); }, kInvalid,
       "out.zeros", "must have dtype u8, got bf16"},
      {"out.group_scales given for u4_asym",
       [&](QuantizeWeightArgs& a) { a.out.group_scales = two.group_scales.view(); }, kInvalid,
       "out.group_scales", "must be empty for this format"},
  };
  // The output buffers are poisoned together; quantize_weight must not write any of them.
  expect_every_error<QuantizeWeightArgs>(
      "quantize_weight", {w.view(), out.view()}, cases, {&out.q, &out.scales, &out.zeros},
      [](const QuantizeWeightArgs& a) { quantize_weight(a.w, a.out); });
}

// Values that cannot be quantized are found before anything is written, wherever they are: a
// NaN or infinity (invalid_argument), or a range whose scale overflows f16 (out_of_range).
TEST(ValidateQuantizeWeight, UnquantizableValuesAreRejectedBeforeAnyWrite) {
  Rng rng;
  const int64_t n = 6, k = 128;
  const float inf = std::numeric_limits<float>::infinity(),
              nan = std::numeric_limits<float>::quiet_NaN();
  const struct {
    const char* what;
    const char* format;
    int64_t row, col;
    float value;
    ErrorCode code;
    const char* detail;
  } cases[] = {
      {"NaN in the last row", "w4_g64_asym", n - 1, 100, nan, kInvalid, "must be finite"},
      {"+inf in the first row", "w4_g64", 0, 3, inf, kInvalid, "must be finite"},
      {"−inf in the middle", "w4_g64_2level", 2, 64, -inf, kInvalid, "must be finite"},
      {"NaN in the last element", "w8_pc", n - 1, k - 1, nan, kInvalid, "must be finite"},
      {"f16 scale overflow in the last row", "w4_pc_sf16", n - 1, 7, 1e6f, kOutOfRange,
       "too large for f16 scales"},
      {"f16 scale overflow, two-level", "w4_g64_2level_sf16", n - 1, 70, 1e8f, kOutOfRange,
       "too large for f16 scales"},
      {"f16 scale overflow in a later group", "w4_g32_fzp_sf16", n - 1, 100, 1e6f, kOutOfRange,
       "too large for f16 scales"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    Tensor w = test::random_normal(DType::f32, n, k, rng, 0.02);
    static_cast<float*>(w.data())[c.row * k + c.col] = c.value;
    QuantizedWeight out(parse_weight_format(c.format), n, k);
    const Poisoned guard({&out.q, &out.scales, &out.zeros, &out.group_scales});
    EXPECT_TRUE(throws_error([&] { quantize_weight(w.view(), out.view()); }, c.code,
                             {"nibble::quantize_weight: ", arg("w"), c.detail}));
    EXPECT_TRUE(guard.unchanged());
  }
}

TEST(ValidateQuantizeActivation, NonFiniteActivationsAreRejectedBeforeAnyWrite) {
  Rng rng;
  const int64_t m = 3, k = 64;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ActScheme scheme : {ActScheme::s8_per_token, ActScheme::s4_per_token,
                           ActScheme::e4m3_per_token, ActScheme::s8_per_tensor}) {
    SCOPED_TRACE(to_string(scheme));
    Tensor x = test::random_normal(DType::f32, m, k, rng, 1.0);
    static_cast<float*>(x.data())[(m - 1) * k + 5] = nan;
    QuantizedActivation out(scheme, m, k);
    const Poisoned guard({&out.q, &out.scales});
    if (scheme == ActScheme::s8_per_tensor)
      EXPECT_TRUE(throws_error([&] { quantize_activation_static(x.view(), 0.1f, out.view()); },
                               kInvalid, {"nibble::quantize_activation_static: ", arg("x"),
                                          "must be finite", "(2, 5)"}));
    else
      EXPECT_TRUE(throws_error([&] { quantize_activation(x.view(), out.view()); }, kInvalid,
                               {"nibble::quantize_activation: ", arg("x"), "must be finite",
                                "(2, 5)"}));
    EXPECT_TRUE(guard.unchanged());
  }
}

TEST(ValidatePackWeight, MessagesNameTheFunctionAndTheField) {
  QuantizedWeightView v;
  v.format = parse_weight_format("w4_g128");
  v.n = 8;
  v.k = 96;  // not a multiple of the group
  EXPECT_TRUE(throws_error([&] { pack_weight(v); }, kInvalid,
                           {"nibble::pack_weight: ", arg("w.k")}));
}

struct DequantizeWeightArgs {
  QuantizedWeightView w;
  TensorView out;
};

TEST(ValidateDequantizeWeight, EveryErrorPath) {
  Rng rng;
  const int64_t n = 5, k = 128;
  QuantizedWeight w(parse_weight_format("w4_g64_asym"), n, k);
  quantize_weight(test::random_normal(DType::f32, n, k, rng, 0.02).view(), w.view());
  Tensor out = Tensor::empty(DType::f32, {n, k});
  using C = ErrorCase<DequantizeWeightArgs>;
  const std::vector<C> cases = {
      {"out null", [](DequantizeWeightArgs& a) { a.out = null_data(a.out); }, kInvalid, "out",
       kNull},
      {"out rank 1", [](DequantizeWeightArgs& a) { a.out = with_rank(a.out, 1); }, kInvalid, "out",
       kRank2},
      {"out bf16", [](DequantizeWeightArgs& a) { a.out = with_dtype(a.out, DType::bf16); },
       kInvalid, "out", "must have dtype f32, got bf16"},
      {"out on CUDA", [](DequantizeWeightArgs& a) { a.out = on(a.out, kCuda); }, kUnsupported,
       "out", "must be on the CPU"},
      {"out K − 2 columns", [](DequantizeWeightArgs& a) { a.out = with_size(a.out, 1, k - 2); },
       kInvalid, "out", "must have shape [5, 128], got [5, 126]"},
      {"out column stride 2",
       [](DequantizeWeightArgs& a) {
         a.out = with_stride(with_size(a.out, 1, 64), 1, 2);
         a.w.k = 64;
         a.w.q = with_size(a.w.q, 1, 64);
       },
       kInvalid, "out", kStride},
      {"w.format.group_size 0 for u4_asym",
       [](DequantizeWeightArgs& a) { a.w.format.group_size = 0; }, kInvalid, "w.format",
       "needs a group size"},
      {"w.k not a multiple of the group",
       [](DequantizeWeightArgs& a) {
         a.w.k = 96;
         a.out = with_size(a.out, 1, 96);
       },
       kInvalid, "w.k", "multiple of the group size 64"},
      {"w.q null", [](DequantizeWeightArgs& a) { a.w.q = null_data(a.w.q); }, kInvalid, "w.q",
       kNull},
      {"w.q on CUDA", [](DequantizeWeightArgs& a) { a.w.q = on(a.w.q, kCuda); }, kInvalid, "w.q",
       kSameDevice},
      {"w.scales f32 for bf16 scales",
       [](DequantizeWeightArgs& a) { a.w.scales = with_dtype(a.w.scales, DType::f32); }, kInvalid,
       "w.scales", "must have dtype bf16, got f32"},
      {"w.zeros missing", [](DequantizeWeightArgs& a) { a.w.zeros = TensorView{}; }, kInvalid,
       "w.zeros", kNull},
      {"w.zeros (N, 1)", [](DequantizeWeightArgs& a) { a.w.zeros = with_size(a.w.zeros, 1, 1); },
       kInvalid, "w.zeros", "must have shape [5, 2], got [5, 1]"},
  };
  expect_every_error<DequantizeWeightArgs>(
      "dequantize_weight", {w.view(), out.view()}, cases, {&out},
      [](const DequantizeWeightArgs& a) { dequantize_weight(a.w, a.out); });
}

// ---- activations --------------------------------------------------------------------------------

struct QuantizeActArgs {
  TensorView x;
  QuantizedActivationView out;
  float scale = 0.05f;  // quantize_activation_static only
};

TEST(ValidateQuantizeActivation, EveryErrorPath) {
  Rng rng;
  const int64_t m = 3, k = 128;
  const Tensor x = test::random_normal(DType::bf16, m, k, rng);
  QuantizedActivation out(ActScheme::s8_per_token, m, k);
  const QuantizedActivation q4(ActScheme::s4_per_token, m, k);
  const Tensor scales_1 = Tensor::empty(DType::f32, {1});
  using C = ErrorCase<QuantizeActArgs>;
  const std::vector<C> cases = {
      {"x null", [](QuantizeActArgs& a) { a.x = null_data(a.x); }, kInvalid, "x", kNull},
      {"x rank 3", [](QuantizeActArgs& a) { a.x = with_rank(a.x, 3); }, kInvalid, "x", kRank2},
      {"x s8", [](QuantizeActArgs& a) { a.x = with_dtype(a.x, DType::s8); }, kInvalid, "x",
       "got s8"},
      {"x column stride 2", [](QuantizeActArgs& a) { a.x = with_stride(a.x, 1, 2); }, kInvalid, "x",
       kStride},
      {"x no rows", [](QuantizeActArgs& a) { a.x = with_size(a.x, 0, 0); }, kInvalid, "x",
       kPositive},
      {"out.scheme none", [](QuantizeActArgs& a) { a.out.scheme = ActScheme::none; }, kInvalid,
       "out.scheme", "got none"},
      {"out.scheme s8_per_tensor",
       [&](QuantizeActArgs& a) {
         a.out.scheme = ActScheme::s8_per_tensor;
         a.out.scales = scales_1.view();
       },
       kInvalid, "out.scheme", "use quantize_activation_static"},
      {"out.q null", [](QuantizeActArgs& a) { a.out.q = null_data(a.out.q); }, kInvalid, "out.q",
       kNull},
      {"out.q rank 1", [](QuantizeActArgs& a) { a.out.q = with_rank(a.out.q, 1); }, kInvalid,
       "out.q", kRank2},
      {"out.q s4 for s8 activations", [&](QuantizeActArgs& a) { a.out.q = q4.q.view(); }, kInvalid,
       "out.q", "must have dtype s8, got s4"},
      {"out.q e4m3 for s4 activations",
       [&](QuantizeActArgs& a) {
         a.out.scheme = ActScheme::s4_per_token;
         a.out.q = with_dtype(a.out.q, DType::e4m3);
       },
       kInvalid, "out.q", "must have dtype s4, got e4m3"},
      {"out.q K − 2 columns", [](QuantizeActArgs& a) { a.out.q = with_size(a.out.q, 1, k - 2); },
       kInvalid, "out.q", "must have shape [3, 128], got [3, 126]"},
      {"out.q column stride 2",
       [](QuantizeActArgs& a) {
         a.out.q = with_stride(with_size(a.out.q, 1, 64), 1, 2);
         a.x = with_size(a.x, 1, 64);
       },
       kInvalid, "out.q", kStride},
      {"out.q s4, odd row stride",
       [&](QuantizeActArgs& a) {
         a.out = q4.view();
         a.out.q = with_stride(a.out.q, 0, 129);
       },
       kInvalid, "out.q", kEvenStride},
      {"out.q on another device", [](QuantizeActArgs& a) { a.out.q = on(a.out.q, kCuda); },
       kInvalid, "out.q", kSameDevice},
      {"out.scales null", [](QuantizeActArgs& a) { a.out.scales = null_data(a.out.scales); },
       kInvalid, "out.scales", kNull},
      {"out.scales rank 2", [](QuantizeActArgs& a) { a.out.scales = with_rank(a.out.scales, 2); },
       kInvalid, "out.scales", kRank1},
      {"out.scales f16",
       [](QuantizeActArgs& a) { a.out.scales = with_dtype(a.out.scales, DType::f16); }, kInvalid,
       "out.scales", "must have dtype f32, got f16"},
      {"out.scales (1)", [&](QuantizeActArgs& a) { a.out.scales = scales_1.view(); }, kInvalid,
       "out.scales", "must have shape [3], got [1]"},
      {"out.scales on another device",
       [](QuantizeActArgs& a) { a.out.scales = on(a.out.scales, kCuda); }, kInvalid, "out.scales",
       kSameDevice},
      {"all on CUDA",
       [](QuantizeActArgs& a) {
         a.x = on(a.x, kCuda);
         a.out.q = on(a.out.q, kCuda);
         a.out.scales = on(a.out.scales, kCuda);
       },
       kUnsupported, "device", kNoCuda, true},
  };
  expect_every_error<QuantizeActArgs>(
      "quantize_activation", {x.view(), out.view()}, cases, {&out.q, &out.scales},
      [](const QuantizeActArgs& a) { quantize_activation(a.x, a.out); });
}

TEST(ValidateQuantizeActivationStatic, EveryErrorPath) {
  Rng rng;
  const int64_t m = 3, k = 128;
  const Tensor x = test::random_normal(DType::f16, m, k, rng);
  QuantizedActivation out(ActScheme::s8_per_tensor, m, k);
  const QuantizedActivation per_token(ActScheme::s8_per_token, m, k);
  const QuantizedActivation fp8(ActScheme::e4m3_per_token, m, k);
  using C = ErrorCase<QuantizeActArgs>;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<C> cases = {
      {"scale 0", [](QuantizeActArgs& a) { a.scale = 0.0f; }, kInvalid, "scale",
       "must be a positive finite calibrated scale"},
      {"scale −0.1", [](QuantizeActArgs& a) { a.scale = -0.1f; }, kInvalid, "scale",
       "positive finite"},
      {"scale NaN", [](QuantizeActArgs& a) { a.scale = std::numeric_limits<float>::quiet_NaN(); },
       kInvalid, "scale", "positive finite"},
      {"scale +inf", [&](QuantizeActArgs& a) { a.scale = inf; }, kInvalid, "scale",
       "positive finite"},
      {"scale −inf", [&](QuantizeActArgs& a) { a.scale = -inf; }, kInvalid, "scale",
       "positive finite"},
      {"x null", [](QuantizeActArgs& a) { a.x = null_data(a.x); }, kInvalid, "x", kNull},
      {"x u8", [](QuantizeActArgs& a) { a.x = with_dtype(a.x, DType::u8); }, kInvalid, "x",
       "got u8"},
      {"x column stride 2", [](QuantizeActArgs& a) { a.x = with_stride(a.x, 1, 2); }, kInvalid, "x",
       kStride},
      {"out.scheme s8_per_token", [&](QuantizeActArgs& a) { a.out = per_token.view(); }, kInvalid,
       "out.scheme", "must be s8_per_tensor, got s8_per_token"},
      {"out.scheme e4m3_per_token", [&](QuantizeActArgs& a) { a.out = fp8.view(); }, kInvalid,
       "out.scheme", "must be s8_per_tensor, got e4m3_per_token"},
      {"out.scheme none", [](QuantizeActArgs& a) { a.out.scheme = ActScheme::none; }, kInvalid,
       "out.scheme", "got none"},
      {"out.scales (M) for a per-tensor scale",
       [&](QuantizeActArgs& a) { a.out.scales = per_token.scales.view(); }, kInvalid, "out.scales",
       "must have shape [1], got [3]"},
      {"out.q null", [](QuantizeActArgs& a) { a.out.q = null_data(a.out.q); }, kInvalid, "out.q",
       kNull},
      {"out.q M − 1 rows", [](QuantizeActArgs& a) { a.out.q = with_size(a.out.q, 0, m - 1); },
       kInvalid, "out.q", "must have shape [3, 128], got [2, 128]"},
      {"out.q on another device", [](QuantizeActArgs& a) { a.out.q = on(a.out.q, kCuda); },
       kInvalid, "out.q", kSameDevice},
      {"all on CUDA",
       [](QuantizeActArgs& a) {
         a.x = on(a.x, kCuda);
         a.out.q = on(a.out.q, kCuda);
         a.out.scales = on(a.out.scales, kCuda);
       },
       kUnsupported, "device", kNoCuda, true},
  };
  expect_every_error<QuantizeActArgs>(
      "quantize_activation_static", {x.view(), out.view(), 0.05f}, cases, {&out.q, &out.scales},
      [](const QuantizeActArgs& a) { quantize_activation_static(a.x, a.scale, a.out); });
}

struct FusedActArgs {
  TensorView x;
  QuantizedActivationView out;
  ActQuantFusion fusion;
};

// Every error of the fusion arguments, for both quantizers; every output (normed included)
// stays untouched.
TEST(ValidateQuantizeActivation, EveryFusionErrorPath) {
  Rng rng;
  const int64_t m = 3, k = 128;
  Tensor x = test::random_normal(DType::bf16, m, k, rng);
  for (int64_t c = 0; c < k; ++c) test::put_float(x.view(), 1, c, 1.0);  // x·r = 1 in row 1
  test::put_float(x.view(), 0, 9, 0.0);  // so that only (1, 9) overflows with smooth_tiny
  test::put_float(x.view(), 2, 9, 0.0);
  Tensor w = test::random_rms_weight(DType::bf16, k, rng);
  test::put_float(w.view(), 0, 9, 2.0);  // y[1, 9] = 2, v = 2 / 1e-39
  const Tensor w_f16 = test::random_rms_weight(DType::f16, k, rng);
  const Tensor smooth = test::random_smooth(DType::f32, k, rng);
  const Tensor wide = Tensor::empty(DType::f32, {1, 2 * k});
  Tensor normed = Tensor::empty(DType::bf16, {m, k});
  Tensor bad_values = test::random_smooth(DType::f32, k, rng);  // mutated per case
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const auto with_value = [&](float v, int64_t at) {
    Tensor t = bad_values.to(Device::cpu());
    static_cast<float*>(t.data())[at] = v;
    return t;
  };
  const Tensor smooth_zero = with_value(0.0f, 5), smooth_negative = with_value(-1.0f, 6),
               smooth_nan = with_value(nan, 7), smooth_tiny = with_value(1e-39f, 9),
               weight_inf = with_value(inf, 8);
  using C = ErrorCase<FusedActArgs>;
  const std::vector<C> cases = {
      {"rms_weight null with rank 1",
       [](FusedActArgs& a) { a.fusion.rms_weight = null_data(a.fusion.rms_weight); }, kInvalid,
       "fusion.rms_weight", kNull},
      {"rms_weight rank 2",
       [](FusedActArgs& a) { a.fusion.rms_weight = with_rank(a.fusion.rms_weight, 2); }, kInvalid,
       "fusion.rms_weight", kRank1},
      {"rms_weight f16 for bf16 x", [&](FusedActArgs& a) { a.fusion.rms_weight = test::as_vector(w_f16); },
       kInvalid, "fusion.rms_weight", "must have dtype bf16 or f32, got f16"},
      {"rms_weight K − 1",
       [](FusedActArgs& a) { a.fusion.rms_weight = with_size(a.fusion.rms_weight, 0, k - 1); },
       kInvalid, "fusion.rms_weight", "must have shape [128], got [127]"},
      {"rms_weight stride 2",
       [&](FusedActArgs& a) {
         a.fusion.rms_weight = with_stride(with_size(test::as_vector(wide), 0, k), 0, 2);
       },
       kInvalid, "fusion.rms_weight", kStride},
      {"rms_weight on another device",
       [](FusedActArgs& a) { a.fusion.rms_weight = on(a.fusion.rms_weight, kCuda); }, kInvalid,
       "fusion.rms_weight", kSameDevice},
      {"rms_eps 0", [](FusedActArgs& a) { a.fusion.rms_eps = 0.0f; }, kInvalid, "fusion.rms_eps",
       "must be positive and finite"},
      {"rms_eps −1e-6", [](FusedActArgs& a) { a.fusion.rms_eps = -1e-6f; }, kInvalid,
       "fusion.rms_eps", "positive and finite"},
      {"rms_eps NaN", [&](FusedActArgs& a) { a.fusion.rms_eps = nan; }, kInvalid,
       "fusion.rms_eps", "positive and finite"},
      {"rms_eps inf", [&](FusedActArgs& a) { a.fusion.rms_eps = inf; }, kInvalid,
       "fusion.rms_eps", "positive and finite"},
      {"rms_weight with an infinity",
       [&](FusedActArgs& a) { a.fusion.rms_weight = test::as_vector(weight_inf); }, kInvalid,
       "fusion.rms_weight", "must be finite, got a NaN or infinity at 8"},
      {"smooth rank 2", [](FusedActArgs& a) { a.fusion.smooth = with_rank(a.fusion.smooth, 2); },
       kInvalid, "fusion.smooth", kRank1},
      {"smooth s8", [](FusedActArgs& a) { a.fusion.smooth = with_dtype(a.fusion.smooth, DType::s8); },
       kInvalid, "fusion.smooth", "must have dtype f32 or f16 or bf16, got s8"},
      {"smooth 2K", [&](FusedActArgs& a) { a.fusion.smooth = test::as_vector(wide); }, kInvalid,
       "fusion.smooth", "must have shape [128], got [256]"},
      {"smooth stride 2",
       [&](FusedActArgs& a) {
         a.fusion.smooth = with_stride(with_size(test::as_vector(wide), 0, k), 0, 2);
       },
       kInvalid, "fusion.smooth", kStride},
      {"smooth on another device",
       [](FusedActArgs& a) { a.fusion.smooth = on(a.fusion.smooth, kCuda); }, kInvalid,
       "fusion.smooth", kSameDevice},
      {"smooth with a zero", [&](FusedActArgs& a) { a.fusion.smooth = test::as_vector(smooth_zero); },
       kInvalid, "fusion.smooth", "must be positive and finite, got 0.000000 at 5"},
      {"smooth with a negative value",
       [&](FusedActArgs& a) { a.fusion.smooth = test::as_vector(smooth_negative); }, kInvalid,
       "fusion.smooth", "at 6"},
      {"smooth with a NaN", [&](FusedActArgs& a) { a.fusion.smooth = test::as_vector(smooth_nan); },
       kInvalid, "fusion.smooth", "at 7"},
      {"smooth so small that v overflows",
       [&](FusedActArgs& a) { a.fusion.smooth = test::as_vector(smooth_tiny); }, kInvalid, "x",
       "must give finite values after the fused RMSNorm and smooth divide, got inf at (1, 9)"},
      {"normed without rms_weight", [](FusedActArgs& a) { a.fusion.rms_weight = {}; }, kInvalid,
       "fusion.normed", "needs fusion.rms_weight"},
      {"normed rank 1", [](FusedActArgs& a) { a.fusion.normed = with_rank(a.fusion.normed, 1); },
       kInvalid, "fusion.normed", kRank2},
      {"normed f32 for bf16 x",
       [](FusedActArgs& a) { a.fusion.normed = with_dtype(a.fusion.normed, DType::f32); }, kInvalid,
       "fusion.normed", "must have dtype bf16, got f32"},
      {"normed M − 1 rows",
       [](FusedActArgs& a) { a.fusion.normed = with_size(a.fusion.normed, 0, m - 1); }, kInvalid,
       "fusion.normed", "must have shape [3, 128], got [2, 128]"},
      {"normed column stride 2",
       [](FusedActArgs& a) { a.fusion.normed = with_stride(a.fusion.normed, 1, 2); }, kInvalid,
       "fusion.normed", kStride},
      {"normed on another device",
       [](FusedActArgs& a) { a.fusion.normed = on(a.fusion.normed, kCuda); }, kInvalid,
       "fusion.normed", kSameDevice},
      {"all on CUDA",
       [](FusedActArgs& a) {
         for (TensorView* v : {&a.x, &a.out.q, &a.out.scales, &a.fusion.rms_weight,
                               &a.fusion.smooth, &a.fusion.normed})
           *v = on(*v, kCuda);
       },
       kUnsupported, "device", kNoCuda, true},
  };
  ActQuantFusion fusion;
  fusion.rms_weight = test::as_vector(w);
  fusion.smooth = test::as_vector(smooth);
  fusion.normed = normed.view();
  for (ActScheme scheme : {ActScheme::s8_per_token, ActScheme::s8_per_tensor}) {
    QuantizedActivation out(scheme, m, k);
    if (scheme == ActScheme::s8_per_tensor)
      expect_every_error<FusedActArgs>(
          "quantize_activation_static", {x.view(), out.view(), fusion}, cases,
          {&out.q, &out.scales, &normed}, [](const FusedActArgs& a) {
            quantize_activation_static(a.x, 0.05f, a.out, a.fusion);
          });
    else
      expect_every_error<FusedActArgs>(
          "quantize_activation", {x.view(), out.view(), fusion}, cases,
          {&out.q, &out.scales, &normed},
          [](const FusedActArgs& a) { quantize_activation(a.x, a.out, a.fusion); });
  }
}

struct DequantizeActArgs {
  QuantizedActivationView a;
  TensorView out;
};

TEST(ValidateDequantizeActivation, EveryErrorPath) {
  Rng rng;
  const int64_t m = 3, k = 128;
  QuantizedActivation a(ActScheme::s8_per_token, m, k);
  quantize_activation(test::random_normal(DType::f32, m, k, rng).view(), a.view());
  Tensor out = Tensor::empty(DType::f32, {m, k});
  using C = ErrorCase<DequantizeActArgs>;
  const std::vector<C> cases = {
      {"out null", [](DequantizeActArgs& x) { x.out = null_data(x.out); }, kInvalid, "out", kNull},
      {"out rank 1", [](DequantizeActArgs& x) { x.out = with_rank(x.out, 1); }, kInvalid, "out",
       kRank2},
      {"out f16", [](DequantizeActArgs& x) { x.out = with_dtype(x.out, DType::f16); }, kInvalid,
       "out", "must have dtype f32, got f16"},
      {"out on CUDA", [](DequantizeActArgs& x) { x.out = on(x.out, kCuda); }, kUnsupported, "out",
       "must be on the CPU"},
      {"out K − 2 columns", [](DequantizeActArgs& x) { x.out = with_size(x.out, 1, k - 2); },
       kInvalid, "out", "must have shape [3, 128], got [3, 126]"},
      {"out column stride 2",
       [](DequantizeActArgs& x) {
         x.out = with_stride(with_size(x.out, 1, 64), 1, 2);
         x.a.q = with_size(x.a.q, 1, 64);
       },
       kInvalid, "out", kStride},
      {"a.scheme none", [](DequantizeActArgs& x) { x.a.scheme = ActScheme::none; }, kInvalid,
       "a.scheme", "got none"},
      {"a.q null", [](DequantizeActArgs& x) { x.a.q = null_data(x.a.q); }, kInvalid, "a.q", kNull},
      {"a.q u8", [](DequantizeActArgs& x) { x.a.q = with_dtype(x.a.q, DType::u8); }, kInvalid,
       "a.q", "must have dtype s8, got u8"},
      {"a.q on CUDA", [](DequantizeActArgs& x) { x.a.q = on(x.a.q, kCuda); }, kInvalid, "a.q",
       kSameDevice},
      {"a.scales M − 1", [](DequantizeActArgs& x) { x.a.scales = with_size(x.a.scales, 0, m - 1); },
       kInvalid, "a.scales", "must have shape [3], got [2]"},
      {"a.scales s32",
       [](DequantizeActArgs& x) { x.a.scales = with_dtype(x.a.scales, DType::s32); }, kInvalid,
       "a.scales", "got s32"},
  };
  expect_every_error<DequantizeActArgs>(
      "dequantize_activation", {a.view(), out.view()}, cases, {&out},
      [](const DequantizeActArgs& x) { dequantize_activation(x.a, x.out); });
}

// ---- pack_int4 / unpack_int4 --------------------------------------------------------------------

struct PackArgs {
  TensorView from, to;
};

TEST(ValidatePackInt4, EveryErrorPath) {
  Rng rng;
  const int64_t r = 3, c = 64;
  Tensor unpacked = test::random_int(DType::s8, r, c, rng, -8, 7);
  Tensor u8 = test::random_int(DType::u8, r, c, rng, 0, 15);
  Tensor packed = Tensor::empty(DType::s4, {r, c});
  using C = ErrorCase<PackArgs>;
  const std::vector<C> cases = {
      {"unpacked null", [](PackArgs& a) { a.from = null_data(a.from); }, kInvalid, "unpacked",
       kNull},
      {"unpacked rank 1", [](PackArgs& a) { a.from = with_rank(a.from, 1); }, kInvalid, "unpacked",
       kRank2},
      {"unpacked s4", [](PackArgs& a) { a.from = with_dtype(a.from, DType::s4); }, kInvalid,
       "unpacked", "must have dtype s8 or u8, got s4"},
      {"unpacked s32", [](PackArgs& a) { a.from = with_dtype(a.from, DType::s32); }, kInvalid,
       "unpacked", "got s32"},
      {"unpacked column stride 2",
       [](PackArgs& a) {
         a.from = with_stride(with_size(a.from, 1, 32), 1, 2);
         a.to = with_size(a.to, 1, 32);
       },
       kInvalid, "unpacked", kStride},
      {"unpacked on CUDA", [](PackArgs& a) { a.from = on(a.from, kCuda); }, kUnsupported,
       "unpacked", "must be on the CPU"},
      {"packed null", [](PackArgs& a) { a.to = null_data(a.to); }, kInvalid, "packed", kNull},
      {"packed rank 3", [](PackArgs& a) { a.to = with_rank(a.to, 3); }, kInvalid, "packed", kRank2},
      {"packed u4 for s8 values", [](PackArgs& a) { a.to = with_dtype(a.to, DType::u4); }, kInvalid,
       "packed", "must have dtype s4, got u4"},
      {"packed s4 for u8 values", [&](PackArgs& a) { a.from = u8.view(); }, kInvalid, "packed",
       "must have dtype u4, got s4"},
      {"packed K − 2 columns", [](PackArgs& a) { a.to = with_size(a.to, 1, c - 2); }, kInvalid,
       "packed", "must have shape [3, 64], got [3, 62]"},
      {"packed odd columns",
       [](PackArgs& a) {
         a.from = with_size(a.from, 1, c - 1);
         a.to = with_size(a.to, 1, c - 1);
       },
       kInvalid, "packed", kEvenLast},
      {"packed odd row stride",
       [](PackArgs& a) {
         a.from = with_size(a.from, 1, c - 2);
         a.to = with_stride(with_size(a.to, 1, c - 2), 0, c - 1);
       },
       kInvalid, "packed", kEvenStride},
      {"packed on CUDA", [](PackArgs& a) { a.to = on(a.to, kCuda); }, kUnsupported, "packed",
       "must be on the CPU"},
  };
  expect_every_error<PackArgs>("pack_int4", {unpacked.view(), packed.view()}, cases, {&packed},
                               [](const PackArgs& a) { pack_int4(a.from, a.to); });
}

// A value outside the 4-bit range, anywhere, is reported with its position; nothing is packed.
TEST(ValidatePackInt4, ValuesOutsideTheInt4RangeAreRejected) {
  Rng rng;
  const struct {
    DType from;
    int value;
    const char* range;
  } cases[] = {
      {DType::s8, 8, "[-8, 7], got 8"},       {DType::s8, -9, "[-8, 7], got -9"},
      {DType::s8, -128, "[-8, 7], got -128"}, {DType::u8, 16, "[0, 15], got 16"},
      {DType::u8, 255, "[0, 15], got 255"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.range);
    const auto [lo, hi] = test::int_range(c.from == DType::s8 ? DType::s4 : DType::u4);
    Tensor from = test::random_int(c.from, 3, 64, rng, lo, hi);
    test::put_int(from.view(), 2, 63, c.value);  // the very last element
    Tensor packed = Tensor::empty(c.from == DType::s8 ? DType::s4 : DType::u4, {3, 64});
    const Poisoned guard({&packed});
    EXPECT_TRUE(throws_error([&] { pack_int4(from.view(), packed.view()); }, kInvalid,
                             {"nibble::pack_int4: ", arg("unpacked"), c.range, "at (2, 63)"}));
    EXPECT_TRUE(guard.unchanged());
  }
}

TEST(ValidateUnpackInt4, EveryErrorPath) {
  Rng rng;
  const int64_t r = 3, c = 64;
  const Tensor packed = test::random_int(DType::s4, r, c, rng);
  Tensor unpacked = Tensor::empty(DType::s8, {r, c});
  using C = ErrorCase<PackArgs>;
  const std::vector<C> cases = {
      {"packed null", [](PackArgs& a) { a.from = null_data(a.from); }, kInvalid, "packed", kNull},
      {"packed rank 1", [](PackArgs& a) { a.from = with_rank(a.from, 1); }, kInvalid, "packed",
       kRank2},
      {"packed s8", [](PackArgs& a) { a.from = with_dtype(a.from, DType::s8); }, kInvalid, "packed",
       "must have dtype s4 or u4, got s8"},
      {"packed odd columns",
       [](PackArgs& a) {
         a.from = with_size(a.from, 1, c - 1);
         a.to = with_size(a.to, 1, c - 1);
       },
       kInvalid, "packed", kEvenLast},
      {"packed odd row stride",
       [](PackArgs& a) {
         a.from = with_stride(with_size(a.from, 1, c - 2), 0, c - 1);
         a.to = with_size(a.to, 1, c - 2);
       },
       kInvalid, "packed", kEvenStride},
      {"packed column stride 2", [](PackArgs& a) { a.from = with_stride(a.from, 1, 2); }, kInvalid,
       "packed", kStride},
      {"packed on CUDA", [](PackArgs& a) { a.from = on(a.from, kCuda); }, kUnsupported, "packed",
       "must be on the CPU"},
      {"unpacked null", [](PackArgs& a) { a.to = null_data(a.to); }, kInvalid, "unpacked", kNull},
      {"unpacked rank 1", [](PackArgs& a) { a.to = with_rank(a.to, 1); }, kInvalid, "unpacked",
       kRank2},
      {"unpacked u8 for s4", [](PackArgs& a) { a.to = with_dtype(a.to, DType::u8); }, kInvalid,
       "unpacked", "must have dtype s8, got u8"},
      {"unpacked s8 for u4", [](PackArgs& a) { a.from = with_dtype(a.from, DType::u4); }, kInvalid,
       "unpacked", "must have dtype u8, got s8"},
      {"unpacked M − 1 rows", [](PackArgs& a) { a.to = with_size(a.to, 0, r - 1); }, kInvalid,
       "unpacked", "must have shape [3, 64], got [2, 64]"},
      {"unpacked column stride 2",
       [](PackArgs& a) {
         a.to = with_stride(with_size(a.to, 1, 32), 1, 2);
         a.from = with_size(a.from, 1, 32);
       },
       kInvalid, "unpacked", kStride},
      {"unpacked on CUDA", [](PackArgs& a) { a.to = on(a.to, kCuda); }, kUnsupported, "unpacked",
       "must be on the CPU"},
  };
  expect_every_error<PackArgs>("unpack_int4", {packed.view(), unpacked.view()}, cases, {&unpacked},
                               [](const PackArgs& a) { unpack_int4(a.from, a.to); });
}

// ---- weight_storage, explain, Tensor and the other constructors ---------------------------------

TEST(ValidateWeightStorage, EveryErrorPath) {
  const auto fmt = [](WeightScheme s, int g, DType d = DType::bf16) {
    return WeightFormat{s, g, d};
  };
  using WS = WeightScheme;
  struct Case {
    const char* what;
    WeightFormat f;
    int64_t n, k;
    const char* arg;
    const char* detail;
  };
  // clang-format off
  const Case cases[] = {
      {"group 100",        fmt(WS::s4_sym, 100), 4, 200, "format.group_size", "got 100"},
      {"group −32",        fmt(WS::s4_sym, -32), 4, 128, "format.group_size", "got -32"},
      {"group 512",        fmt(WS::s8_sym, 512), 4, 512, "format.group_size", "got 512"},
      {"scale e4m3",       fmt(WS::s4_sym, 128, DType::e4m3), 4, 128, "format.scale_dtype", "e4m3"},
      {"scale s8",         fmt(WS::s4_sym, 0, DType::s8), 4, 128, "format.scale_dtype", "got s8"},
      {"u4_asym per channel", fmt(WS::u4_asym, 0), 4, 128, "format", "u4_asym, which needs a"},
      {"u4_fzp per channel", fmt(WS::u4_fzp, 0), 4, 128, "format", "u4_fzp, which needs a"},
      {"two-level per channel", fmt(WS::s4_two_level, 0, DType::f32), 4, 128, "format",
       "s4_two_level, which needs a group size"},
      {"n 0",              fmt(WS::s4_sym, 0), 0, 128, "n", "must be positive, got 0"},
      {"n −1",             fmt(WS::s4_sym, 0), -1, 128, "n", "must be positive, got -1"},
      {"k 0",              fmt(WS::s8_sym, 0), 4, 0, "k", "must be positive, got 0"},
      {"k −2",             fmt(WS::s8_sym, 0), 4, -2, "k", "must be positive, got -2"},
      {"k odd for s4",     fmt(WS::s4_sym, 0), 4, 127, "k", "must be even for 4-bit weights"},
      {"k odd for u4",     fmt(WS::u4_asym, 32), 4, 33, "k", "must be even"},
      {"k not a multiple of 128", fmt(WS::s4_sym, 128), 4, 192, "k",
       "must be a multiple of the group size 128, got 192"},
      {"k not a multiple of 32 (s8)", fmt(WS::s8_sym, 32), 4, 48, "k",
       "must be a multiple of the group size 32, got 48"},
  };
  // clang-format on
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_TRUE(throws_error([&] { weight_storage(c.f, c.n, c.k); }, kInvalid,
                             {"nibble::weight_storage: ", arg(c.arg), c.detail}));
  }
  // int8 weights have no even-K requirement.
  EXPECT_NO_THROW(weight_storage(fmt(WeightScheme::s8_sym, 0, DType::f32), 3, 7));
}

TEST(ValidateExplain, EveryErrorPath) {
  const LinearFormat ok = parse_linear_format("w4a8_g128");
  const std::string s = explain(ok, 16, 4096, 4096, Device::cpu());
  EXPECT_NE(s.find("w4a8_g128 M=16 N=4096 K=4096 on cpu"), std::string::npos) << s;
  EXPECT_NE(s.find("CPU reference"), std::string::npos) << s;
  const LinearFormat bad{{WeightScheme::u4_asym, 128, DType::bf16}, ActScheme::s8_per_token};
  EXPECT_TRUE(throws_error(
      [&] { explain(bad, 16, 64, 128, Device::cpu()); }, kInvalid,
      {"nibble::explain: ", arg("format"), "must be in the catalogue, got w4a8_g128_asym"}));
  for (auto [m, n, k] :
       {std::tuple<int64_t, int64_t, int64_t>{0, 64, 128}, {16, -1, 128}, {16, 64, 0}}) {
    SCOPED_TRACE(std::to_string(m) + " " + std::to_string(n) + " " + std::to_string(k));
    EXPECT_TRUE(throws_error([&] { explain(ok, m, n, k, Device::cpu()); }, kInvalid,
                             {"nibble::explain: ", arg("m, n, k"), "must be positive"}));
  }
  if (test::cuda_requests_are_unsupported()) {
    EXPECT_TRUE(throws_error([&] { explain(ok, 16, 64, 128, kCuda); }, kUnsupported,
                             {"nibble::explain: ", arg("device"), kNoCuda}));
  }
}

TEST(ValidateTensor, ConstructorErrorPaths) {
  EXPECT_TRUE(throws_error(
      [] {
        Tensor(DType::f32, {1, 2, 3, 4, 5});
      },
      kInvalid, {"nibble::Tensor: ", arg("shape"), "at most 4 dimensions, got 5"}));
  EXPECT_TRUE(throws_error(
      [] {
        Tensor(DType::f32, {4, -1});
      },
      kInvalid, {"nibble::Tensor: ", arg("shape"), "non-negative sizes, got -1"}));
  EXPECT_TRUE(throws_error(
      [] {
        Tensor(DType::s4, {4, 7});
      },
      kInvalid, {"nibble::Tensor: ", arg("shape"), "even last dimension for s4"}));
  EXPECT_TRUE(throws_error([] { Tensor(DType::u4, {3}); }, kInvalid,
                           {"nibble::Tensor: ", arg("shape"), "even last dimension for u4"}));
  // 2^50 bytes exceed any address space this runs in.
  EXPECT_TRUE(throws_error([] { Tensor(DType::u8, {int64_t{1} << 50}); }, kInvalid,
                           {"nibble::Tensor: ", "cannot allocate"}));
  if (test::cuda_requests_are_unsupported()) {
    EXPECT_TRUE(throws_error([] { Tensor(DType::f32, {4}, Device::cuda()); }, kUnsupported,
                             {"nibble::Tensor: ", arg("device"), kNoCuda}));
  }
  // The edge cases that are valid: rank 0, empty dimensions, even 4-bit rows.
  EXPECT_NO_THROW(Tensor(DType::f32, {}));
  EXPECT_NO_THROW(Tensor(DType::s4, {0, 2}));
  EXPECT_NO_THROW(Tensor(DType::f32, {1, 2, 3, 4}));
}

TEST(ValidateTensor, CopyFromAndOtherConstructors) {
  Tensor a = Tensor::empty(DType::f32, {2, 3});
  const Tensor wrong_shape = Tensor::empty(DType::f32, {3, 2});
  const Tensor wrong_dtype = Tensor::empty(DType::s32, {2, 3});
  const Poisoned guard({&a});
  EXPECT_TRUE(throws_error(
      [&] { a.copy_from(wrong_shape); }, kInvalid,
      {"nibble::Tensor::copy_from: ", arg("src"), "must match f32[2, 3] cpu, got f32[3, 2] cpu"}));
  EXPECT_TRUE(throws_error([&] { a.copy_from(wrong_dtype); }, kInvalid,
                           {"nibble::Tensor::copy_from: ", arg("src"), "got s32[2, 3] cpu"}));
  EXPECT_TRUE(guard.unchanged());
  EXPECT_TRUE(throws_error(
      [] { QuantizedActivation(ActScheme::none, 2, 4); }, kInvalid,
      {"nibble::QuantizedActivation: ", arg("scheme"), "quantized activation scheme"}));
  EXPECT_TRUE(throws_error([] { QuantizedActivation(ActScheme::s4_per_token, 2, 5); }, kInvalid,
                           {arg("shape"), "even last dimension for s4"}));
  EXPECT_TRUE(throws_error([] { QuantizedWeight(parse_weight_format("w4_g128"), 4, 96); }, kInvalid,
                           {arg("k"), "multiple of the group size 128"}));
  int dummy = 0;
  EXPECT_TRUE(throws_error(
      [&] {
        TensorView::contiguous(&dummy, DType::f32, {1, 1, 1, 1, 1});
      },
      kInvalid, {"nibble::TensorView::contiguous", "rank 5 exceeds the maximum of 4"}));
  EXPECT_TRUE(throws_error(
      [] { parse_dtype("f128"); }, kInvalid,
      {"nibble::parse_dtype", "unknown dtype 'f128'", "f32 f16 bf16 e4m3 s8 u8 s4 u4 s32 f64"}));
  EXPECT_TRUE(throws_error([] { parse_dtype(""); }, kInvalid, {"unknown dtype ''"}));
  EXPECT_TRUE(throws_error([] { parse_dtype("S8"); }, kInvalid, {"unknown dtype 'S8'"}));
}

// capture() turns the same failures into a Status for callers without exceptions.
TEST(ValidateStatus, CaptureReturnsTheErrorAsAStatus) {
  const Status ok = capture([] { parse_linear_format("w8a8"); });
  EXPECT_TRUE(ok.ok());
  const Status bad = capture([] { parse_linear_format("w8a3"); });
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.code, kInvalid);
  EXPECT_NE(bad.message.find("unknown activation 'a3'"), std::string::npos) << bad.message;
  EXPECT_STREQ(to_string(ErrorCode::out_of_range), "out_of_range");
  EXPECT_STREQ(to_string(ErrorCode::unsupported), "unsupported");
  EXPECT_STREQ(to_string(ErrorCode::invalid_argument), "invalid_argument");
}

}  // namespace
}  // namespace nibble
