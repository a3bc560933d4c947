// GPU tests of activation quantization with its fusions (src/cuda/generic/act_quant.cu)
// against the CPU reference: q, the scales and the normalized rows bit for bit, for every
// input dtype, scheme and fusion, odd shapes, rows held on chip and rows streamed from
// global memory, strided and unaligned rows, in place; outputs are poisoned first so that
// every byte must be written. Each test skips, saying why, without a usable GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "nibble/nibble.h"
#if NIBBLE_WITH_CUDA
#include "cuda/generic/act_quant.h"
#endif

namespace nibble {
namespace {

using test::as_vector;
using test::Rng;

constexpr float kStaticScale = 0.02f;  // clips the outlier channel, not the bulk

// Which fusion a case runs; the vectors' dtypes rotate so that every pairing is covered.
enum class Fusion { none, smooth, norm, norm_smooth, norm_smooth_normed };
const Fusion kFusions[] = {Fusion::none, Fusion::smooth, Fusion::norm, Fusion::norm_smooth,
                           Fusion::norm_smooth_normed};
const char* name_of(Fusion f) {
  switch (f) {
    case Fusion::none: return "none";
    case Fusion::smooth: return "smooth";
    case Fusion::norm: return "rmsnorm";
    case Fusion::norm_smooth: return "rmsnorm+smooth";
    case Fusion::norm_smooth_normed: return "rmsnorm+smooth+normed";
  }
  return "?";
}
const ActScheme kSchemes[] = {ActScheme::s8_per_token, ActScheme::s4_per_token,
                              ActScheme::e4m3_per_token, ActScheme::s8_per_tensor};

// Activations with structure: row 0 zero, row 1 a single non-zero, row 2 huge, row 3 tiny
// (when M allows), the rest Gaussian with an outlier channel (30×).
Tensor structured(DType dtype, int64_t m, int64_t k, Rng& rng) {
  Tensor x = test::random_activations(dtype, m, k, rng);
  const int64_t pick = rng.uniform_int(0, k - 1);
  for (int64_t c = 0; c < k; ++c) {
    if (m > 1) test::put_float(x.view(), 0, c, 0.0);
    if (m > 2) test::put_float(x.view(), 1, c, c == pick ? -1.5 : 0.0);
    if (m > 3) test::put_float(x.view(), 2, c, rng.normal(dtype == DType::f16 ? 1e3 : 1e6));
    if (m > 4) test::put_float(x.view(), 3, c, rng.normal(1e-3));
  }
  return x;
}

// Host operands of one case and their device copies.
struct Case {
  Tensor x, w, smooth;  // w, smooth: (1, K), undefined when unused
  ActQuantFusion host, device;
  Tensor x_dev, w_dev, smooth_dev;
};

Case make_case(DType dtype, int64_t m, int64_t k, Fusion f, int variant, Rng& rng) {
  Case c;
  c.x = structured(dtype, m, k, rng);
  c.x_dev = c.x.to(Device::cuda());
  const DType float_types[] = {DType::f32, DType::f16, DType::bf16};
  if (f == Fusion::norm || f == Fusion::norm_smooth || f == Fusion::norm_smooth_normed) {
    c.w = test::random_rms_weight(variant % 2 == 0 ? dtype : DType::f32, k, rng);
    c.w_dev = c.w.to(Device::cuda());
    c.host.rms_weight = as_vector(c.w);
    c.device.rms_weight = as_vector(c.w_dev);
    c.host.rms_eps = c.device.rms_eps = variant % 3 == 0 ? 1e-5f : 1e-6f;
  }
  if (f == Fusion::smooth || f == Fusion::norm_smooth || f == Fusion::norm_smooth_normed) {
    c.smooth = test::random_smooth(float_types[variant % 3], k, rng);
    c.smooth_dev = c.smooth.to(Device::cuda());
    c.host.smooth = as_vector(c.smooth);
    c.device.smooth = as_vector(c.smooth_dev);
  }
  return c;
}

void run(const TensorView& x, const QuantizedActivationView& out, const ActQuantFusion& f) {
  if (out.scheme == ActScheme::s8_per_tensor)
    quantize_activation_static(x, kStaticScale, out, f);
  else
    quantize_activation(x, out, f);
}

// One case on both devices; every output compared byte for byte.
// How the device side runs a case (the default: the public API, as run() does).
using DeviceRun = std::function<void(const Case&, const QuantizedActivationView&)>;

void expect_bit_exact(DType dtype, ActScheme scheme, Fusion fusion, int64_t m, int64_t k,
                      int variant, Rng& rng, const DeviceRun& run_device = {}) {
  SCOPED_TRACE(std::string(to_string(dtype)) + " " + to_string(scheme) + " " +
               name_of(fusion) + " M=" + std::to_string(m) + " K=" + std::to_string(k));
  Case c = make_case(dtype, m, k, fusion, variant, rng);
  const bool normed = fusion == Fusion::norm_smooth_normed;
  Tensor y_ref, y_got;
  if (normed) {
    y_ref = Tensor::empty(dtype, {m, k});
    y_got = Tensor::empty(dtype, {m, k}, Device::cuda());
    y_got.fill_bytes(0xA5);
    c.host.normed = y_ref.view();
    c.device.normed = y_got.view();
  }
  QuantizedActivation ref(scheme, m, k);
  run(c.x.view(), ref.view(), c.host);
  QuantizedActivation got(scheme, m, k, Device::cuda());
  got.q.fill_bytes(0xA5);
  got.scales.fill_bytes(0xA5);
  if (run_device)
    run_device(c, got.view());
  else
    run(c.x_dev.view(), got.view(), c.device);
  synchronize(Device::cuda());
  EXPECT_TRUE(same_bytes(got.q, ref.q)) << "q";
  EXPECT_TRUE(same_bytes(got.scales, ref.scales)) << "scales";
  if (normed) {
    EXPECT_TRUE(same_bytes(y_got, y_ref)) << "normed";
  }
}

// Every dtype × scheme × fusion on the odd shapes (rows held on chip).
void check_every_variant_on_odd_shapes() {
  Rng rng;  // fresh seed, printed on failure
  int variant = 0;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (ActScheme scheme : kSchemes)
      for (Fusion fusion : kFusions) {
        for (int64_t m : {1, 3, 17, 100})
          for (int64_t k : {2, 34, 4096, 4098}) expect_bit_exact(dtype, scheme, fusion, m, k, variant++, rng);
        expect_bit_exact(dtype, scheme, fusion, 17, 14336, variant++, rng);
      }
}

TEST(CudaActQuant, EveryVariantIsBitExactOnOddShapes) {
  NIBBLE_REQUIRE_GPU();
  check_every_variant_on_odd_shapes();
}

// Rows too long to hold on chip are streamed from global memory once per pass: K = 65536 for
// every dtype (and the first K past the on-chip limit), every scheme, with and without fusion.
TEST(CudaActQuant, LongRowsStreamedFromGlobalMemoryAreBitExact) {
  NIBBLE_REQUIRE_GPU();
  Rng rng;
#if NIBBLE_WITH_CUDA
  const DeviceInfo dev = cuda_device_info();
  for (DType dtype : {DType::f32, DType::bf16}) {  // the plan takes this path for these
    cuda::ActQuantArgs a;
    a.m = 3;
    a.k = 65536;
    a.x.dtype = dtype;
    EXPECT_EQ(cuda::plan_act_quant(a, dev).chunks_per_thread, 0) << to_string(dtype);
    a.k = dtype == DType::f32 ? 16384 : 32768;  // the largest rows held on chip
    EXPECT_GT(cuda::plan_act_quant(a, dev).chunks_per_thread, 0) << to_string(dtype);
  }
#endif
  int variant = 0;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (ActScheme scheme : kSchemes)
      for (Fusion fusion : {Fusion::none, Fusion::norm_smooth_normed}) {
        for (int64_t m : {1, 3, 17}) expect_bit_exact(dtype, scheme, fusion, m, 65536, variant++, rng);
        expect_bit_exact(dtype, scheme, fusion, 5, dtype == DType::f32 ? 16392 : 32776, variant++,
                         rng);
      }
  expect_bit_exact(DType::bf16, ActScheme::s8_per_token, Fusion::norm_smooth_normed, 100, 65536,
                   0, rng);
  expect_bit_exact(DType::f16, ActScheme::s4_per_token, Fusion::norm, 100, 65536, 1, rng);
}

#if NIBBLE_WITH_CUDA
// The planner alone (no GPU needed): v is kept on chip for a dynamic scale with a smooth divisor
// when the row holds at most 4 chunks a thread and the device's shared memory per block allows
// the extra planes; never for a static scale (v is needed once) or rows streamed from memory.
TEST(CudaActQuantPlan, KeepsSmoothedValuesWhereSharedMemoryAllows) {
  DeviceInfo big, small;
  big.sm_count = small.sm_count = 132;
  big.smem_per_block_optin = 227 * 1024;   // H100
  small.smem_per_block_optin = 64 * 1024;  // less than 512 threads x 4 chunks x 48 bytes
  int dummy = 0;
  const auto args = [&](DType x, int64_t m, int64_t k, float static_scale) {
    cuda::ActQuantArgs a;
    a.m = m;
    a.k = k;
    a.x.dtype = x;
    a.smooth.data = &dummy;
    a.smooth.dtype = DType::f32;
    a.static_scale = static_scale;
    return a;
  };
  struct Want {
    DType x;
    int64_t m, k;
    float static_scale;
    int threads, chunks, planes_big, planes_small;
  };
  const Want wants[] = {
      {DType::bf16, 4096, 4096, 0.0f, 128, 4, 2, 2},   // 256-thread blocks: 48 KiB
      {DType::bf16, 4096, 14336, 0.0f, 512, 4, 2, 0},  // 96 KiB
      {DType::bf16, 4096, 28672, 0.0f, 512, 8, 0, 0},  // 8 chunks: v recomputed
      {DType::bf16, 4096, 65536, 0.0f, 512, 0, 0, 0},  // streamed
      {DType::bf16, 4096, 4096, 0.02f, 128, 4, 0, 0},  // static: v needed once
      {DType::f32, 4096, 4096, 0.0f, 256, 4, 1, 1},    // f32 x: v fits one plane
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(std::string(to_string(w.x)) + " M=" + std::to_string(w.m) + " K=" +
                 std::to_string(w.k) + (w.static_scale > 0 ? " static" : " dynamic"));
    const cuda::ActQuantArgs a = args(w.x, w.m, w.k, w.static_scale);
    const cuda::ActQuantPlan on_big = cuda::plan_act_quant(a, big);
    EXPECT_EQ(on_big.threads_per_row, w.threads);
    EXPECT_EQ(on_big.chunks_per_thread, w.chunks);
    EXPECT_EQ(on_big.smoothed_planes, w.planes_big) << cuda::describe(on_big, a);
    const cuda::ActQuantPlan on_small = cuda::plan_act_quant(a, small);
    EXPECT_EQ(on_small.smoothed_planes, w.planes_small) << cuda::describe(on_small, a);
    EXPECT_LE(on_small.shared_bytes(), small.smem_per_block_optin);
    cuda::ActQuantPlanOptions recompute;
    recompute.keep_smoothed = false;
    EXPECT_EQ(cuda::plan_act_quant(a, big, recompute).smoothed_planes, 0);
  }
}
#endif

// A dynamic scale with a smooth divisor needs v = y / smooth in two passes: the plan keeps v on
// chip where shared memory allows (plan.smoothed_planes) and otherwise the quantizing pass divides
// again. Both give the reference's bytes, rows of one chunk to 8 chunks a thread.
TEST(CudaActQuant, SmoothedValuesKeptOrRecomputedAreBitExact) {
  NIBBLE_REQUIRE_GPU();
#if NIBBLE_WITH_CUDA
  Rng rng;
  const DeviceInfo dev = cuda_device_info();
  int variant = 0;
  for (DType dtype : {DType::f32, DType::bf16})
    for (ActScheme scheme :
         {ActScheme::s8_per_token, ActScheme::s4_per_token, ActScheme::e4m3_per_token})
      for (int64_t k : {34, 4096, 14336})
        for (bool keep : {true, false}) {
          SCOPED_TRACE(keep ? "v kept" : "v recomputed");
          expect_bit_exact(
              dtype, scheme, Fusion::norm_smooth_normed, 17, k, variant++, rng,
              [&](const Case& c, const QuantizedActivationView& out) {
                const cuda::ActQuantArgs args =
                    cuda::act_quant_args(c.x_dev.view(), out, c.device, 0.0f);
                cuda::ActQuantPlanOptions options;
                options.keep_smoothed = keep;
                const cuda::ActQuantPlan plan = cuda::plan_act_quant(args, dev, options);
                // Kept where the row holds at most 4 chunks a thread (f32 x at K = 14336: 8).
                const bool kept = keep && plan.chunks_per_thread > 0 && plan.chunks_per_thread <= 4;
                EXPECT_GT(plan.chunks_per_thread, 0);
                EXPECT_EQ(plan.smoothed_planes, kept ? plan.vec / 4 : 0)
                    << cuda::describe(plan, args);
                cuda::launch_act_quant(args, plan, nullptr);
              });
        }
#endif
}

// Row strides: aligned ones (16-byte multiples, vector accesses), unaligned ones and a
// misaligned start (element accesses); the gaps between rows are never written.
void check_strided_and_unaligned_rows() {
  Rng rng;
  struct Layout {
    int64_t x_pad, q_pad, y_pad, offset;  // pads in elements; offset: x view starts this late
  };
  const Layout layouts[] = {{8, 16, 8, 0}, {3, 6, 5, 0}, {8, 16, 8, 1}};
  int variant = 0;
  for (DType dtype : {DType::f32, DType::bf16})
    for (ActScheme scheme : kSchemes)
      for (const Layout& L : layouts)
        for (int64_t k : {34, 4096}) {
          const int64_t m = 7;
          SCOPED_TRACE(std::string(to_string(dtype)) + " " + to_string(scheme) + " K=" +
                       std::to_string(k) + " pads " + std::to_string(L.x_pad) + "/" +
                       std::to_string(L.q_pad) + "/" + std::to_string(L.y_pad) + " offset " +
                       std::to_string(L.offset));
          Case c = make_case(dtype, m, k, Fusion::norm_smooth_normed, variant++, rng);
          Tensor y_ref = Tensor::empty(dtype, {m, k});
          c.host.normed = y_ref.view();
          QuantizedActivation ref(scheme, m, k);
          run(c.x.view(), ref.view(), c.host);

          // x with a pad and possibly an offset start, on the device.
          const int64_t x_pitch = k + L.x_pad;
          const test::Strided xs = test::strided_copy(c.x, x_pitch, 0x7E);
          Tensor x_store = Tensor::empty(dtype, {m + 1, x_pitch});
          x_store.fill_bytes(0x7E);
          std::memcpy(static_cast<uint8_t*>(x_store.data()) + L.offset * dtype_bits(dtype) / 8,
                      xs.storage.data(), static_cast<size_t>(xs.storage.nbytes()));
          const Tensor x_dev = x_store.to(Device::cuda());
          TensorView xv = xs.view;
          xv.data = static_cast<uint8_t*>(x_dev.data()) + L.offset * dtype_bits(dtype) / 8;
          xv.device = Device::cuda();

          const DType qd = ref.q.view().dtype;
          test::Strided qs = test::strided_empty(qd, m, k, k + L.q_pad, 0x5A);
          test::Strided ys = test::strided_empty(dtype, m, k, k + L.y_pad, 0x5A);
          const Tensor q_dev = qs.storage.to(Device::cuda()), y_dev = ys.storage.to(Device::cuda());
          TensorView qv = qs.view, yv = ys.view;
          qv.data = q_dev.data();
          qv.device = Device::cuda();
          yv.data = y_dev.data();
          yv.device = Device::cuda();
          QuantizedActivation got(scheme, m, k, Device::cuda());
          got.scales.fill_bytes(0xA5);
          c.device.normed = yv;
          run(xv, {scheme, qv, got.scales.view()}, c.device);
          synchronize(Device::cuda());
          EXPECT_TRUE(same_bytes(got.scales, ref.scales));

          const Tensor q_host = q_dev.to(Device::cpu()), y_host = y_dev.to(Device::cpu());
          const auto check_rows = [&](const Tensor& store, const Tensor& want, DType t,
                                      int64_t pad, const char* what) {
            const int64_t row = dtype_storage_bytes(t, k), pitch = dtype_storage_bytes(t, k + pad);
            for (int64_t r = 0; r < m; ++r) {
              const auto* g = static_cast<const uint8_t*>(store.data()) + r * pitch;
              const auto* w = static_cast<const uint8_t*>(want.data()) + r * row;
              ASSERT_EQ(std::memcmp(g, w, static_cast<size_t>(row)), 0) << what << " row " << r;
              for (int64_t b = row; b < pitch; ++b)
                ASSERT_EQ(g[b], 0x5A) << what << " gap written in row " << r;
            }
          };
          check_rows(q_host, ref.q, qd, L.q_pad, "q");
          check_rows(y_host, y_ref, dtype, L.y_pad, "normed");
        }
}

TEST(CudaActQuant, StridedAndUnalignedRowsAreBitExactAndGapsStayUntouched) {
  NIBBLE_REQUIRE_GPU();
  check_strided_and_unaligned_rows();
}

// normed may be x itself: the row is read before it is overwritten (on chip and streamed).
void check_normed_in_place() {
  Rng rng;
  for (int64_t k : {4096, 65536}) {
    SCOPED_TRACE("K=" + std::to_string(k));
    const int64_t m = 9;
    Case c = make_case(DType::bf16, m, k, Fusion::norm_smooth, 0, rng);
    Tensor y_ref = Tensor::empty(DType::bf16, {m, k});
    c.host.normed = y_ref.view();
    QuantizedActivation ref(ActScheme::s8_per_token, m, k);
    run(c.x.view(), ref.view(), c.host);
    c.device.normed = c.x_dev.view();
    QuantizedActivation got(ActScheme::s8_per_token, m, k, Device::cuda());
    run(c.x_dev.view(), got.view(), c.device);
    synchronize(Device::cuda());
    EXPECT_TRUE(same_bytes(got.q, ref.q));
    EXPECT_TRUE(same_bytes(got.scales, ref.scales));
    EXPECT_TRUE(same_bytes(c.x_dev, y_ref));
  }
}

TEST(CudaActQuant, NormedInPlaceOverwritesXWithY) {
  NIBBLE_REQUIRE_GPU();
  check_normed_in_place();
}

// Rows at the edges of each dtype's range (subnormal, tiny, huge) and RMSNorm weights whose
// products with the normalized row fall among T's subnormals: the 16-bit sum of squares takes
// its f64 path for rows below 2^-96, and every rounding of y must still be the reference's.
void check_extreme_row_magnitudes() {
  Rng rng;
  const int64_t k = 4096;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    const std::vector<double> sigma =
        dtype == DType::f16 ? std::vector<double>{3e-8, 1e-6, 6e-5, 1.0, 2e2}
                            : std::vector<double>{1e-40, 1e-38, 1e-33, 0x1p-97, 1.0, 1e36};
    const auto m = static_cast<int64_t>(sigma.size());
    Tensor x = Tensor::empty(dtype, {m, k});
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < k; ++c)
        test::put_float(x.view(), r, c, rng.normal(sigma[size_t(r)]) * (c == 7 ? 30.0 : 1.0));
    const Tensor x_dev = x.to(Device::cuda());
    for (bool tiny_weight : {false, true}) {
      Tensor w = test::random_rms_weight(dtype, k, rng);
      if (tiny_weight)
        for (int64_t c = 0; c < k; ++c)
          test::put_float(w.view(), 0, c,
                          test::float_at(w.view(), 0, c) * (dtype == DType::f16 ? 0x1p-13 : 0x1p-128));
      const Tensor w_dev = w.to(Device::cuda());
      for (ActScheme scheme : kSchemes) {
        SCOPED_TRACE(std::string(to_string(dtype)) + " " + to_string(scheme) +
                     (tiny_weight ? " tiny weights" : ""));
        Tensor y_ref = Tensor::empty(dtype, {m, k});
        Tensor y_got = Tensor::empty(dtype, {m, k}, Device::cuda());
        y_got.fill_bytes(0xA5);
        ActQuantFusion host, device;
        host.rms_weight = as_vector(w);
        device.rms_weight = as_vector(w_dev);
        host.rms_eps = device.rms_eps = 1e-6f;
        host.normed = y_ref.view();
        device.normed = y_got.view();
        QuantizedActivation ref(scheme, m, k);
        run(x.view(), ref.view(), host);
        QuantizedActivation got(scheme, m, k, Device::cuda());
        got.q.fill_bytes(0xA5);
        got.scales.fill_bytes(0xA5);
        run(x_dev.view(), got.view(), device);
        synchronize(Device::cuda());
        EXPECT_TRUE(same_bytes(got.q, ref.q)) << "q";
        EXPECT_TRUE(same_bytes(got.scales, ref.scales)) << "scales";
        EXPECT_TRUE(same_bytes(y_got, y_ref)) << "normed";
      }
    }
  }
}

TEST(CudaActQuant, ExtremeRowMagnitudesAreBitExact) {
  NIBBLE_REQUIRE_GPU();
  check_extreme_row_magnitudes();
}

// A NaN in a row gives that row a NaN scale on the GPU (the CPU rejects it): the max keeps it.
TEST(CudaActQuant, NonFiniteRowGetsANonFiniteScale) {
  NIBBLE_REQUIRE_GPU();
  Rng rng;
  Tensor x = test::random_activations(DType::bf16, 4, 4096, rng);
  test::put_float(x.view(), 2, 777, std::numeric_limits<double>::quiet_NaN());
  const Tensor xd = x.to(Device::cuda());
  QuantizedActivation got(ActScheme::s8_per_token, 4, 4096, Device::cuda());
  quantize_activation(xd.view(), got.view());
  synchronize(Device::cuda());
  const Tensor scales = got.scales.to(Device::cpu());
  const auto* s = static_cast<const float*>(scales.data());
  EXPECT_TRUE(std::isfinite(s[0]) && std::isfinite(s[1]) && std::isfinite(s[3]));
  EXPECT_TRUE(std::isnan(s[2])) << s[2];
}

}  // namespace
}  // namespace nibble
