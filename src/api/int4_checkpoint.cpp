// Unpacking the 4-bit layers of GPTQ and AWQ checkpoints into nibble's u4_asym weights with f16
// group scales (quantize.h, Int4Packing, has the three layouts). Both tools store w = s·(q − z)
// per group, which is u4_asym's dequantization, so the codes, zeros and scales move over as they
// are: nothing is rounded again. Used by the runner's Hugging Face loader (llm/model_files.cpp)
// and the Python package (nibble.torch.load_int4_checkpoint).
#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>

#include "api/validate.h"
#include "nibble/quantize.h"

namespace nibble {

using detail::ArgCheck;

namespace {

// AutoAWQ packs eight columns into a word in this order: nibble i holds column 8c + kAwqOrder[i].
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

}  // namespace

const char* to_string(Int4Packing p) {
  switch (p) {
    case Int4Packing::gptq:
      return "gptq";
    case Int4Packing::gptq_v2:
      return "gptq_v2";
    case Int4Packing::awq:
      return "awq";
  }
  return "?";
}

Int4Packing parse_int4_packing(std::string_view name) {
  for (Int4Packing p : {Int4Packing::gptq, Int4Packing::gptq_v2, Int4Packing::awq})
    if (name == to_string(p)) return p;
  ArgCheck("parse_int4_packing")
      .fail("name", "gptq, gptq_v2 or awq, got '" + std::string(name) + "'");
}

Int4Packing int4_packing_of(const Int4CheckpointConfig& config) {
  const ArgCheck check("int4_packing_of");
  auto lower = [](std::string t) {
    std::transform(t.begin(), t.end(), t.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    return t;
  };
  const std::string method = lower(config.quant_method);
  const auto unsupported = ErrorCode::unsupported;
  check.condition(method == "gptq" || method == "awq", "quant_method",
                  "must be gptq or awq (AWQ with GEMM packing) for nibble to import it, got '" +
                      config.quant_method + "': use the unquantized model and nibble's formats",
                  unsupported);
  check.condition(config.bits == 4, "bits",
                  "must be 4 (nibble imports 4-bit " + method + " checkpoints), got " +
                      std::to_string(config.bits),
                  unsupported);
  const int64_t g = config.group_size;
  check.condition(g == 32 || g == 64 || g == 128 || g == 256, "group_size",
                  "must be 32, 64, 128 or 256 (nibble's group formats), got " + std::to_string(g),
                  unsupported);
  check.condition(!config.lm_head, "lm_head",
                  "must be false: nibble imports quantized block linears, not the output layer",
                  unsupported);
  if (method == "gptq") {
    check.condition(config.checkpoint_format == "gptq" || config.checkpoint_format == "gptq_v2",
                    "checkpoint_format",
                    "must be gptq or gptq_v2, got '" + config.checkpoint_format + "'",
                    unsupported);
    return config.checkpoint_format == "gptq" ? Int4Packing::gptq : Int4Packing::gptq_v2;
  }
  check.condition(lower(config.version) == "gemm", "version",
                  "must be gemm (AutoAWQ's GEMM packing), got '" + config.version + "'",
                  unsupported);
  check.condition(config.zero_point, "zero_point", "must be true (AWQ with zero points)",
                  unsupported);
  return Int4Packing::awq;
}

void unpack_int4_checkpoint(Int4Packing packing, const TensorView& qweight,
                            const TensorView& qzeros, const TensorView& scales,
                            const TensorView& g_idx, const QuantizedWeightView& out) {
  const ArgCheck check("unpack_int4_checkpoint");
  const WeightFormat& f = out.format;
  check.condition(f.scheme == WeightScheme::u4_asym && f.group_size > 0 &&
                      f.scale_dtype == DType::f16,
                  "out", "must be a weight of format w4_g<G>_asym_sf16 (u4_asym, f16 group scales)");
  detail::check_weight(check, out, Device::cpu(), "out");
  for (const TensorView* t : {&out.q, &out.scales, &out.zeros})
    check.condition(t->is_contiguous(), "out", "must have contiguous buffers");
  check.tensor(scales, "scales", 2);
  check.dtype(scales, "scales", {DType::f16});
  const int64_t groups = scales.size(0), n = scales.size(1), g = f.group_size, k = groups * g;
  check.condition(n == out.n, "scales", "must be (k/G, n) with n = out.n = " + std::to_string(out.n) +
                                            ", got n = " + std::to_string(n));
  check.condition(n % 8 == 0, "scales", "must have n a multiple of 8 (eight zeros share a word)");
  check.condition(k <= out.k, "out", "must have at least k = " + std::to_string(k) + " columns, has " +
                                         std::to_string(out.k));
  const bool gptq = packing != Int4Packing::awq;
  for (const auto& [t, name, rows, cols] :
       {std::tuple{&qweight, "qweight", gptq ? k / 8 : k, gptq ? n : n / 8},
        std::tuple{&qzeros, "qzeros", groups, n / 8}}) {
    check.tensor(*t, name, 2);
    check.dtype(*t, name, {DType::s32});
    check.shape(*t, name, {rows, cols});
    check.contiguous(*t, name);
  }
  check.device(qweight, "qweight", Device::cpu());
  check.device(qzeros, "qzeros", Device::cpu());
  check.device(scales, "scales", Device::cpu());
  check.contiguous(scales, "scales");
  const auto* qw = static_cast<const uint32_t*>(qweight.data);
  const auto* qz = static_cast<const uint32_t*>(qzeros.data);
  const auto* sc = static_cast<const uint16_t*>(scales.data);
  if (g_idx.data != nullptr) {
    check.tensor(g_idx, "g_idx", 1);
    check.dtype(g_idx, "g_idx", {DType::s32});
    check.shape(g_idx, "g_idx", {k});
    check.contiguous(g_idx, "g_idx");
    check.device(g_idx, "g_idx", Device::cpu());
    const auto* gi = static_cast<const int32_t*>(g_idx.data);
    for (int64_t i = 0; i < k; ++i)
      check.condition(gi[i] == i / g, "g_idx",
                      "must hold k / G for every input (g_idx[" + std::to_string(i) + "] is " +
                          std::to_string(gi[i]) +
                          "): act-order (desc_act) checkpoints permute the input channels, "
                          "which nibble's formats do not",
                      ErrorCode::unsupported);
  }
  // Nibble i of a word packed along n holds column 8c + position(i).
  auto along_n = [&](uint32_t word, int64_t col) {
    int i = static_cast<int>(col % 8);
    if (!gptq) i = static_cast<int>(std::find(kAwqOrder, kAwqOrder + 8, i) - kAwqOrder);
    return static_cast<int>((word >> (4 * i)) & 0xFu);
  };
  // Validate every zero before writing anything, so a refused layer leaves `out` untouched.
  const int zero_offset = packing == Int4Packing::gptq ? 1 : 0;
  for (int64_t j = 0; j < groups; ++j)
    for (int64_t r = 0; r < n; ++r)
      check.condition(along_n(qz[j * (n / 8) + r / 8], r) + zero_offset <= 15, "qzeros",
                      "must hold zeros in 0..15: group " + std::to_string(j) + " of output " +
                          std::to_string(r) + " stores 15, which the gptq (v1) format reads as "
                          "z − 1 = 15, so z = 16",
                      ErrorCode::unsupported);
  const int64_t kp = out.k, gp = kp / g;
  auto* q = static_cast<uint8_t*>(out.q.data);
  auto* s = static_cast<uint16_t*>(out.scales.data);
  auto* z = static_cast<uint8_t*>(out.zeros.data);
  std::memset(q, 0, static_cast<size_t>(n * kp / 2));
  std::memset(s, 0, static_cast<size_t>(n * gp) * 2);
  std::memset(z, 0, static_cast<size_t>(n * gp));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int code = gptq ? static_cast<int>((qw[(c / 8) * n + r] >> (4 * (c % 8))) & 0xFu)
                            : along_n(qw[c * (n / 8) + r / 8], r);
      q[(r * kp + c) / 2] |= static_cast<uint8_t>(code << (4 * (c % 2)));
    }
    for (int64_t j = 0; j < groups; ++j) {
      z[r * gp + j] = static_cast<uint8_t>(along_n(qz[j * (n / 8) + r / 8], r) + zero_offset);
      s[r * gp + j] = sc[j * n + r];
    }
  }
}

}  // namespace nibble
