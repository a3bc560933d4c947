#include "cuda/dispatch/int8_mma.h"

#include <cstdlib>
#include <string>

#include "common/check.h"
#include "common/env.h"
#include "cuda/launch/sm90_w4a8_gemm.h"
#include "nibble/device.h"

namespace nibble::cuda {

namespace {

// Which family runs a call on Hopper, for the formats the wgmma kernel implements.
//
// int4 weights (measured on the H100, 2026-11-24, commit 135b213, each kernel forced on ten
// shapes from 2048x2048 to 8192x28672, M = 1..32; sm80_w4a8_gemm's thin tiles reduce split-K in
// a thread-block cluster since 276b250):
//   - M ≤ 16: sm80_w4a8_gemm won or tied on every shape (4096x4096 at M = 16: 7.4 vs 12.0 us,
//     10240x8192: 18.3 vs 24.0 us); the weight stream is all there is, and its split-K tiles
//     start streaming sooner than the wgmma kernel's 64-token tiles.
//   - M = 17..32 (sm80's 32-token tile, twice the MMA work per weight byte): sm80 won on the
//     layers of at most 2^25 weights (4096x4096 at M = 32: 9.2 vs 12.4 us; 2048x2048 .. 6144x4096)
//     and sm90 on the larger ones (4096x14336: 17.7 vs 19.5 us; 13824x5120, 10240x8192,
//     8192x28672), where the stream runs long enough for wgmma's throughput to matter.
//   - M ≥ 33: sm90 (at M = 64 it was 1.5–3x faster on every shape, 2026-11-23).
// int8 weights (W8A8; its thin tiles reduce through a workspace, not a cluster) keep the rule
// measured on 2026-11-23 for the int4 kernel before the cluster reduction: sm90 at M ≥ 17 and
// at M = 9..16 when its grid fits in one wave.
// Other GPUs run the sm80 family.
constexpr int64_t kSm90MinTokens = 17;
constexpr int64_t kSm90MinTokensSmallW4 = 33;
constexpr int64_t kSmallW4Weights = int64_t(1) << 25;
constexpr int64_t kSm90MinTokensOneWaveW8 = 9;

}  // namespace

const char* to_string(W4AFp8Kernel kernel) {
  switch (kernel) {
    case W4AFp8Kernel::sm80_w4afp8_gemm: return "sm80_w4afp8_gemm";
    case W4AFp8Kernel::sm90_w4afp8_gemm: return "sm90_w4afp8_gemm";
    case W4AFp8Kernel::simt_linear: return "simt_linear";
  }
  return "?";
}

W4AFp8Kernel w4afp8_kernel(int device, int64_t m, sm80::W4A8Epilogue epilogue, int group) {
  // The tensor-core kernels take the formats whose weights they decode to e4m3 (the int4 values
  // themselves, scaled per channel or per 128-wide group).
  const bool mma_format = sm90_w4a8_handles(epilogue, group, true);
  const bool sm80 = mma_format && sm80_w4afp8_available(device);
  const bool sm90 = mma_format && sm90_w4a8_available(device);
  const int forced = nibble::detail::env_choice(
      "NIBBLE_W4AFP8_KERNEL", {"sm80_w4afp8_gemm", "sm90_w4afp8_gemm", "simt_linear"});
  if (forced >= 0) {
    const auto k = static_cast<W4AFp8Kernel>(forced);  // the names in the enum's order
    const bool runs = k == W4AFp8Kernel::simt_linear ||
                      (k == W4AFp8Kernel::sm80_w4afp8_gemm ? sm80 : sm90);
    if (!runs)
      nibble::detail::fail(ErrorCode::invalid_argument,
                           std::string("NIBBLE_W4AFP8_KERNEL=") + to_string(k) +
                               ": that kernel cannot run this call here (it needs per-channel "
                               "or g128 weights and " +
                               (k == W4AFp8Kernel::sm80_w4afp8_gemm
                                    ? "sm_89+ code built for this GPU)"
                                    : "an sm_90a build on an sm_90 GPU)"));
    return k;
  }
  // On Hopper sm80_w4afp8_gemm runs the fp8 products as f16 MMAs (no fp8 mma.sync there), twice
  // the MMA work per weight byte of int8 and more conversion, so it wins only where the weight
  // stream is all there is: below M = 17 (H200, 2026-11-29, six layers 4096x4096..8192x28672:
  // M = 1 and 16 0.71-0.99x the wgmma kernel's time except 8192x28672, 0.96-1.08x; at M = 32 it
  // lost on the layers of at most 2^25 weights, 1.10-1.28x, where int4 W4A8 keeps sm80).
  if (sm90 && (!sm80 || m >= kSm90MinTokens)) return W4AFp8Kernel::sm90_w4afp8_gemm;
  if (sm80) return W4AFp8Kernel::sm80_w4afp8_gemm;
  return W4AFp8Kernel::simt_linear;
}

bool use_sm90_int8_mma(int device, int64_t m, int64_t n_pad, int64_t k_pad,
                       sm80::W4A8Epilogue epilogue, int group, int weight_bits) {
  const bool w8 = weight_bits == 8;
  // Read first, so that a misspelt name is an error on every GPU.
  const int forced = w8 ? nibble::detail::env_choice("NIBBLE_W8A8_KERNEL",
                                                     {"sm80_w8a8_gemm", "sm90_w8a8_gemm"})
                        : nibble::detail::env_choice("NIBBLE_W4A8_KERNEL",
                                                     {"sm80_w4a8_gemm", "sm90_w4a8_gemm"});
  if (!sm90_w4a8_available(device) || !sm90_w4a8_handles(epilogue, group)) return false;
  if (forced >= 0) return forced == 1;
  if (!w8) {
    const bool small = n_pad * k_pad <= kSmallW4Weights;
    return m >= (small ? kSm90MinTokensSmallW4 : kSm90MinTokens);
  }
  if (m >= kSm90MinTokens) return true;
  if (m < kSm90MinTokensOneWaveW8) return false;
  const int sms = cuda_device_info(device).sm_count;
  const W4A8WgmmaPlan plan = plan_sm90_w4a8(m, n_pad, k_pad, epilogue, device, weight_bits);
  return int64_t(plan.tiles_m) * plan.tiles_n * plan.splits <= sms;
}

void launch_int8_mma(const W4A8Launch& l, Stream stream) {
  if (!l.a4 && use_sm90_int8_mma(l.device, l.m, l.n_pad, l.k_pad, l.epilogue, l.group, l.weight_bits))
    return launch_sm90_w4a8(l, stream);
  launch_sm80_w4a8(l, stream);
}

std::string describe_int8_mma(int device, int64_t m, int64_t n, int64_t k,
                              sm80::W4A8Epilogue epilogue, int group, int weight_bits, bool a4) {
  const DeviceInfo info = cuda_device_info(device);
  const std::string sms = " on " + std::to_string(info.sm_count) + " SMs";
  if (a4) {
    const int64_t k_pad = (k / 2 + 127) / 128 * 128;  // bytes
    return describe(plan_sm80_w4a8(m, n, k, k_pad, epilogue, group, info.sm_count,
                                   info.cc_major >= 9, 4, true)) +
           sms +
           (info.cc_major >= 9 ? " (no int4 tensor cores here: two int8 MMAs per int4 step)"
                               : " (native int4 MMA)");
  }
  // int4 weights are padded to whole 8-channel blocks; int8 weights are used as they are.
  const int64_t n_pad = weight_bits == 8 ? n : (n + 7) / 8 * 8;
  const int64_t k_pad = (k + 127) / 128 * 128;
  if (use_sm90_int8_mma(device, m, n_pad, k_pad, epilogue, group, weight_bits))
    return describe(plan_sm90_w4a8(m, n_pad, k_pad, epilogue, device, weight_bits)) +
           sms + " (Hopper: M >= " + std::to_string(kSm90MinTokens) +
           (weight_bits == 8 ? ", or M >= " + std::to_string(kSm90MinTokensOneWaveW8) +
                                   " when the grid is one wave)"
                             : ", or M >= " + std::to_string(kSm90MinTokensSmallW4) +
                                   " for layers of at most 2^25 weights)");
  return describe(plan_sm80_w4a8(m, n_pad, k, k_pad, epilogue, group, info.sm_count,
                                 info.cc_major >= 9, weight_bits)) +
         sms;
}

std::string w4a4_granularity_note(int device) {
  const DeviceInfo info = cuda_device_info(device);
  const int rho = tensor_core_ratio(info.cc_major, info.cc_minor);
  if (rho == 0) return "W4A4 granularity: rho unknown for this GPU";
  // Per 128 k a g128 rescale adds an int→float conversion and an FMA per accumulator (on the
  // CUDA cores) to 256 MMA operations (on the tensor cores): about rho/128 of the MMA time in
  // FMAs alone, more with the conversions (quarter rate). APEX4 measured g128 W4A4 losing to
  // 16-bit at rho = 64 and winning at rho <= 16.
  return "W4A4 granularity: rho = " + std::to_string(rho) +
         " (tensor-core int" + (info.cc_major >= 9 ? "8" : "4") +
         " : f32 CUDA-core throughput per SM), a g128 rescale costs at least " +
         std::to_string(100 * rho / 128) + "% of the MMA time; suggested: " +
         (rho <= 16 ? "w4a4_g128 (cheap rescale)"
                    : "w4a4_pc (the per-group rescale would throttle the tensor cores)") +
         "; or per layer within a time budget (plan_w4a4_granularity, nibble.torch's "
         "W4A4MixedConfig)";
}

bool rows_aligned16(const TensorView& t) {
  if (t.rank != 2 || t.stride(1) != 1) return false;
  const int64_t pitch_bits = t.stride(0) * dtype_bits(t.dtype);
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && pitch_bits % 128 == 0;
}

namespace {

bool cc80(const LinearProblem& p, std::string* why_not) {
  if (p.cc >= 80) return true;
  *why_not = "int8 tensor-core GEMMs need sm_80+";
  return false;
}

bool w4a4_supports(const LinearProblem& p, std::string* why_not) {
  const LinearFormat& f = p.format;
  if (f.weight.scheme != WeightScheme::s4_sym || f.act != ActScheme::s4_per_token ||
      !(f.weight.per_channel() || f.weight.group_size == 128)) {
    *why_not = "W4A4 per channel or g128 only";
    return false;
  }
  if (!cc80(p, why_not)) return false;
  if (p.k % 32 != 0) {
    *why_not = "K % 32 != 0";
    return false;
  }
  if (!f.weight.per_channel() && p.k % 256 != 0) {
    *why_not = "K % 256 != 0 (a K block's two g128 scales are copied as one aligned pair)";
    return false;
  }
  if (p.cc >= 90 && p.k > max_int32_accumulation_k(DType::s8, DType::s8)) {
    *why_not = "K > 131071 on a GPU without int4 tensor cores (the int8 emulation's bound)";
    return false;
  }
  if (!p.aligned16) {
    *why_not = "operand rows not 16-byte aligned";
    return false;
  }
  return true;
}

bool w8a8_supports(const LinearProblem& p, std::string* why_not) {
  const LinearFormat& f = p.format;
  if (f.weight.scheme != WeightScheme::s8_sym || !f.weight.per_channel() ||
      (f.act != ActScheme::s8_per_token && f.act != ActScheme::s8_per_tensor)) {
    *why_not = "W8A8 formats only";
    return false;
  }
  if (!cc80(p, why_not)) return false;
  if (p.k % 16 != 0) {
    *why_not = "K % 16 != 0";
    return false;
  }
  if (!p.aligned16) {
    *why_not = "operand rows not 16-byte aligned";
    return false;
  }
  return true;
}

int64_t pitch_bytes(const TensorView& t) { return t.stride(0) * dtype_bits(t.dtype) / 8; }

// The launch for logical row-major operands: s8 × s8 (W8A8) or s4 × s4 (W4A4, a4).
W4A8Launch row_major_launch(const TensorView& a, const TensorView& w, const TensorView& d) {
  W4A8Launch l;
  l.device = a.device.index;
  l.a4 = a.dtype == DType::s4;
  l.weight_bits = l.a4 ? 4 : 8;
  l.m = a.size(0);
  l.n = w.size(0);
  l.k = a.size(1);
  l.n_pad = l.n;
  const int64_t k_bytes = l.a4 ? l.k / 2 : l.k;
  l.k_pad = (k_bytes + 127) / 128 * 128;  // W4A4: in bytes (see W4A8Launch::a4)
  l.a = a.data;
  l.lda = pitch_bytes(a);
  l.w = w.data;
  l.ldw = pitch_bytes(w);
  l.d = d.data;
  l.ldd = d.stride(0);
  l.d_dtype = d.dtype;
  return l;
}

// A registry call on logical row-major operands (W8A8 or W4A4): per channel, or g128 (W4A4).
void row_major_linear_launch(const LinearProblem&, const LinearCall& call, Stream stream) {
  const QuantizedActivationView& a = *call.a;
  const QuantizedWeightView& w = *call.w;
  W4A8Launch l = row_major_launch(a.q, w.q, *call.d);
  l.epilogue =
      w.format.per_channel() ? sm80::W4A8Epilogue::per_channel : sm80::W4A8Epilogue::group;
  l.group = w.format.group_size;
  l.a_scales = static_cast<const float*>(a.scales.data);
  l.a_per_tensor = a.scheme == ActScheme::s8_per_tensor;
  l.w_scales = static_cast<const float*>(w.scales.data);  // read as w_scale_dtype
  l.w_scale_dtype = w.scales.dtype;
  if (call.bias != nullptr) {
    l.bias = call.bias->data;
    l.bias_dtype = call.bias->dtype;
  }
  launch_int8_mma(l, stream);
}

}  // namespace

LinearKernel w4a4_int8_mma_entry() {
  return {"sm80_w4a4_gemm (int4 tensor cores on sm_80/86/89, int8 ones on sm_90+; fused "
          "per-token x per-channel epilogue)",
          w4a4_supports, row_major_linear_launch};
}

LinearKernel w8a8_int8_mma_entry() {
  return {"sm80_w8a8_gemm / sm90_w8a8_gemm (int8 tensor cores, fused per-token x per-channel "
          "epilogue)",
          w8a8_supports, row_major_linear_launch};
}

bool int8_mma_handles_s32(const TensorView& a, const TensorView& w) {
  const bool s8 = a.dtype == DType::s8 && w.dtype == DType::s8;
  const bool s4 = a.dtype == DType::s4 && w.dtype == DType::s4;
  if (!s8 && !s4) return false;
  const DeviceInfo info = cuda_device_info(a.device.index);
  const int64_t k = a.size(1);
  // s4 on GPUs without int4 tensor cores: the int8 emulation bounds K (see w4a4_supports).
  if (s4 && info.cc_major >= 9 && k > max_int32_accumulation_k(DType::s8, DType::s8))
    return false;
  return info.cc_major >= 8 && k % (s4 ? 32 : 16) == 0 && rows_aligned16(a) && rows_aligned16(w);
}

void launch_int8_mma_s32(const TensorView& a, const TensorView& w, const TensorView& d,
                         Stream stream) {
  W4A8Launch l = row_major_launch(a, w, d);
  l.epilogue = sm80::W4A8Epilogue::s32;
  launch_int8_mma(l, stream);
}

}  // namespace nibble::cuda
