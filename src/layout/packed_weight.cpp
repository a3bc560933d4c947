// Host side of the packed weight layouts (include/nibble/layout.h): index(), repack, inverse.
#include <cstring>
#include <string>

#include "api/validate.h"
#include "common/check.h"
#include "common/parallel.h"
#include "cpu/view_access.h"
#include "layout/w4_mma_k128_index.h"
#include "nibble/layout.h"

namespace nibble {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

bool layout_holds(WeightLayout layout, WeightScheme s) {
  switch (layout) {
    case WeightLayout::w4_mma_k128:
      return s == WeightScheme::s4_sym || s == WeightScheme::s4_two_level;
    case WeightLayout::w4_mma16_k128:
      return s == WeightScheme::s4_sym || s == WeightScheme::u4_asym || s == WeightScheme::u4_fzp;
    case WeightLayout::w8_mma16_k128: return s == WeightScheme::s8_sym;
  }
  return false;
}

// The stored unsigned value u of a logical integer (and back): symmetric formats are offset
// to unsigned so that every layout's kernels decode one way.
int stored_offset(WeightScheme s) {
  switch (s) {
    case WeightScheme::s4_sym: return 8;
    case WeightScheme::s8_sym: return 128;
    default: return 0;  // u4_asym, u4_fzp, s4_two_level store q as it is
  }
}

bool has_zeros(const WeightFormat& f) {
  return f.scheme == WeightScheme::u4_asym || f.scheme == WeightScheme::u4_fzp;
}

int64_t group_count(const WeightFormat& f, int64_t k_pad) {
  return f.per_channel() ? 0 : (k_pad + f.group_size - 1) / f.group_size;
}

// An empty packed weight of the right sizes: every value the stored zero (u = 8 or 128),
// scales, zeros and group parameters zero.
PackedWeight allocate_packed(WeightLayout layout, const WeightFormat& f, bool has_scales,
                             int64_t n, int64_t k, Device device = Device::cpu()) {
  PackedWeight p;
  p.layout = layout;
  p.version = layout_version(layout);
  p.format = f;
  p.has_scales = has_scales;
  p.n = n;
  p.k = k;
  p.n_pad = round_up(n, 8);
  p.k_pad = round_up(k, 128);
  const int bits = layout_weight_bits(layout);
  p.q = Tensor(DType::u8, {p.n_pad * p.k_pad * bits / 8}, device);
  p.q.fill_bytes(bits == 4 ? 0x88 : 0x80);
  if (!has_scales) return p;
  const bool two_level = f.scheme == WeightScheme::s4_two_level;
  const int64_t groups = group_count(f, p.k_pad);
  p.scales = f.per_channel() || two_level ? Tensor(DType::f32, {p.n_pad}, device)
                                          : Tensor(DType::f32, {groups, p.n_pad}, device);
  p.scales.fill_bytes(0);
  if (two_level) {
    p.group_params = Tensor(DType::u8, {groups, p.n_pad * 2}, device);  // (g_s, offset) pairs
    p.group_params.fill_bytes(0);
  }
  if (layout != WeightLayout::w4_mma_k128 && has_zeros(f)) {
    p.zeros = Tensor(DType::f32, {groups, p.n_pad}, device);
    p.zeros.fill_bytes(0);
  }
  return p;
}

void put_value(const PackedWeight& p, int64_t n, int64_t k, int u) {
  const NibbleIndex at = packed_weight_index(p.layout, n, k, p.k_pad);
  uint8_t& byte = static_cast<uint8_t*>(p.q.data())[at.byte];
  if (layout_weight_bits(p.layout) == 8) byte = static_cast<uint8_t>(u);
  else byte = static_cast<uint8_t>((byte & ~(0xF << at.shift)) | ((u & 0xF) << at.shift));
}

int get_value(const PackedWeightView& w, int64_t n, int64_t k) {
  const NibbleIndex at = packed_weight_index(w.layout, n, k, w.k_pad);
  const uint8_t byte = static_cast<const uint8_t*>(w.q.data)[at.byte];
  return layout_weight_bits(w.layout) == 8 ? byte : (byte >> at.shift) & 0xF;
}

void check_cpu_matrix(const detail::ArgCheck& check, const TensorView& t, const char* arg,
                      const BufferSpec& spec) {
  check.tensor(t, arg, spec.rank);
  check.dtype(t, arg, {spec.dtype});
  if (spec.rank == 1) check.shape(t, arg, {spec.shape[0]});
  else check.shape(t, arg, {spec.shape[0], spec.shape[1]});
  check.rows_packed(t, arg);
  check.condition(t.device.type == DeviceType::cpu, arg,
                  "must be on the CPU (weights are packed on the host), got " + to_string(t.device));
}

// Two-level weights: the kernel computes u·g_s + (128 − g_s·g_z) in one byte; it must stay in
// [0, 255], i.e. w8 = g_s·(u − g_z) must be an int8, for every stored value.
void check_two_level_value(const detail::ArgCheck& check, const QuantizedWeightView& w, int64_t n,
                           int64_t k, int v) {
  const int64_t gi = k / w.format.group_size;
  const int w8 = cpu::get_int(w.group_scales, n, gi) * (v - cpu::get_int(w.zeros, n, gi));
  if (w8 < -128 || w8 > 127)  // (the message is built only on failure: this runs per weight)
    check.fail("w.group_scales", "and w.zeros must make every w8 = g_s·(q − g_z) an int8, got " +
                                     std::to_string(w8) + " at (" + std::to_string(n) + ", " +
                                     std::to_string(k) + ")");
}

void pack_two_level_params(const detail::ArgCheck& check, const QuantizedWeightView& w,
                           const PackedWeight& p) {
  auto* params = static_cast<uint8_t*>(p.group_params.data());
  for (int64_t gi = 0; gi < w.k / w.format.group_size; ++gi)
    for (int64_t n = 0; n < w.n; ++n) {
      const int gs = cpu::get_int(w.group_scales, n, gi), gz = cpu::get_int(w.zeros, n, gi);
      const int offset = 128 - gs * gz;  // u·g_s + offset = w8 + 128, one byte per value
      if (!(gs >= 1 && gz >= 0 && gz <= 15 && offset >= 0 && offset <= 255))
        check.fail("w.group_scales",
                   "and w.zeros must be g_s ≥ 1, g_z ∈ [0, 15], 128 − g_s·g_z ∈ [0, 255], got g_s=" +
                       std::to_string(gs) + " g_z=" + std::to_string(gz) + " at (" +
                       std::to_string(n) + ", group " + std::to_string(gi) + ")");
      params[(gi * p.n_pad + n) * 2] = static_cast<uint8_t>(gs);
      params[(gi * p.n_pad + n) * 2 + 1] = static_cast<uint8_t>(offset);
    }
}

}  // namespace

PackedWeight allocate_packed_weight(const WeightFormat& f, int64_t n, int64_t k, Device device,
                                    WeightLayout layout) {
  const detail::ArgCheck check("allocate_packed_weight");
  check.condition(layout_holds(layout, f.scheme), "format",
                  std::string("must be a weight scheme that layout ") + to_string(layout) +
                      " holds, got " + to_string(f.scheme),
                  ErrorCode::unsupported);
  return allocate_packed(layout, f, true, n, k, device);
}

const char* to_string(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::w4_mma_k128: return "w4_mma_k128";
    case WeightLayout::w4_mma16_k128: return "w4_mma16_k128";
    case WeightLayout::w8_mma16_k128: return "w8_mma16_k128";
  }
  return "?";
}

WeightLayout parse_weight_layout(std::string_view s) {
  for (WeightLayout l : {WeightLayout::w4_mma_k128, WeightLayout::w4_mma16_k128,
                         WeightLayout::w8_mma16_k128})
    if (s == to_string(l)) return l;
  detail::fail(ErrorCode::invalid_argument,
               "parse_weight_layout: unknown layout '" + std::string(s) +
                   "' (expected w4_mma_k128, w4_mma16_k128 or w8_mma16_k128)");
}

int layout_version(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::w4_mma_k128: return kW4MmaK128Version;
    case WeightLayout::w4_mma16_k128: return kW4Mma16K128Version;
    case WeightLayout::w8_mma16_k128: return kW8Mma16K128Version;
  }
  return 0;
}

int layout_weight_bits(WeightLayout layout) {
  return layout == WeightLayout::w8_mma16_k128 ? 8 : 4;
}

bool has_packed_layout(const LinearFormat& f) {
  if (!is_valid(f)) return false;
  switch (f.act) {
    case ActScheme::s8_per_token:
    case ActScheme::s8_per_tensor: return layout_holds(WeightLayout::w4_mma_k128, f.weight.scheme);
    case ActScheme::e4m3_per_token: return f.weight.scheme == WeightScheme::s4_sym;
    case ActScheme::none:
      return layout_holds(WeightLayout::w4_mma16_k128, f.weight.scheme) ||
             layout_holds(WeightLayout::w8_mma16_k128, f.weight.scheme);
    default: return false;
  }
}

WeightLayout packed_layout(const LinearFormat& f) {
  if (!has_packed_layout(f))
    detail::fail(ErrorCode::unsupported, "packed_layout: format " + to_string(f) +
                                             " has no packed layout; use its logical weights");
  if (f.act != ActScheme::none) return WeightLayout::w4_mma_k128;
  return f.weight.scheme == WeightScheme::s8_sym ? WeightLayout::w8_mma16_k128
                                                 : WeightLayout::w4_mma16_k128;
}

NibbleIndex w4_mma_k128_index(int64_t n, int64_t k, int64_t k_pad) {
  return detail::w4_mma_k128_position(n, k, k_pad);
}

NibbleIndex packed_weight_index(WeightLayout layout, int64_t n, int64_t k, int64_t k_pad) {
  if (layout == WeightLayout::w4_mma_k128) return w4_mma_k128_index(n, k, k_pad);
  const int64_t nb = n / 8, g = n % 8, kb = k / 128, kr = k % 128;
  const int64_t block = nb * (k_pad / 128) + kb;
  const int64_t step = kr / 16, r = kr % 16;  // k16 step, position inside it
  const int64_t c = (r % 8) / 2, odd = r % 2, upper = r / 8;  // k = 2c + odd + 8·upper
  const int64_t lane = 4 * g + c;
  if (layout == WeightLayout::w8_mma16_k128)  // word `step`, byte odd + 2·upper
    return {block * 1024 + lane * 32 + step * 4 + odd + 2 * upper, 0};
  // w4: word step/2, nibble i with (i>>1)&1 = step%2, i&1 = upper, i>>2 = odd
  const int64_t i = 4 * odd + 2 * (step % 2) + upper;
  return {block * 512 + lane * 16 + (step / 2) * 4 + i / 2, static_cast<int>((i % 2) * 4)};
}

PackedWeight pack_weight(const QuantizedWeightView& w, Device device) {
  return pack_weight(w, WeightLayout::w4_mma_k128, device);
}

PackedWeight pack_weight(const QuantizedWeightView& w, WeightLayout layout, Device device) {
  const detail::ArgCheck check("pack_weight");
  check.condition(layout_holds(layout, w.format.scheme), "w.format",
                  std::string("must be a weight scheme that layout ") + to_string(layout) +
                      " holds, got " + to_string(w.format.scheme),
                  ErrorCode::unsupported);
  const WeightStorage st = detail::checked_weight_storage(check, w.format, w.n, w.k, "w.");
  check_cpu_matrix(check, w.q, "w.q", st.q);
  check_cpu_matrix(check, w.scales, "w.scales", st.scales);
  const WeightFormat& f = w.format;
  const bool two_level = f.scheme == WeightScheme::s4_two_level;
  if (two_level || has_zeros(f)) check_cpu_matrix(check, w.zeros, "w.zeros", st.zeros);
  if (two_level) check_cpu_matrix(check, w.group_scales, "w.group_scales", st.group_scales);
  PackedWeight p = allocate_packed(layout, f, true, w.n, w.k);
  const int offset = stored_offset(f.scheme);
  // Every packed byte holds values of one row only (docs/layouts.md): row ranges in parallel.
  detail::parallel_rows(w.n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n)
      for (int64_t k = 0; k < w.k; ++k) {
        const int v = cpu::get_int(w.q, n, k);
        if (two_level) check_two_level_value(check, w, n, k, v);
        put_value(p, n, k, v + offset);
      }
  });
  float* scales = static_cast<float*>(p.scales.data());
  if (f.per_channel() || two_level) {
    for (int64_t n = 0; n < w.n; ++n) scales[n] = cpu::get_float(w.scales, n, 0);
  } else {
    for (int64_t gi = 0; gi < w.k / f.group_size; ++gi)
      for (int64_t n = 0; n < w.n; ++n) {
        scales[gi * p.n_pad + n] = cpu::get_float(w.scales, n, gi);
        if (p.zeros.defined())  // u4_asym: integer z; u4_fzp: the float zero
          static_cast<float*>(p.zeros.data())[gi * p.n_pad + n] =
              f.scheme == WeightScheme::u4_asym ? float(cpu::get_int(w.zeros, n, gi))
                                                : cpu::get_float(w.zeros, n, gi);
      }
  }
  if (two_level) pack_two_level_params(check, w, p);
  return device.type == DeviceType::cpu ? p : p.to(device);
}

PackedWeight pack_s4_matrix(const TensorView& w, Device device) {
  const detail::ArgCheck check("pack_s4_matrix");
  check.tensor(w, "w", 2);
  check.dtype(w, "w", {DType::s4});
  check.rows_packed(w, "w");
  check.condition(w.device.type == DeviceType::cpu, "w",
                  "must be on the CPU (weights are packed on the host), got " + to_string(w.device));
  const WeightFormat f{WeightScheme::s4_sym, 0, DType::f32};
  PackedWeight p = allocate_packed(WeightLayout::w4_mma_k128, f, false, w.size(0), w.size(1));
  for (int64_t n = 0; n < w.size(0); ++n)
    for (int64_t k = 0; k < w.size(1); ++k) put_value(p, n, k, cpu::get_int(w, n, k) + 8);
  return device.type == DeviceType::cpu ? p : p.to(device);
}

int packed_weight_value(const PackedWeightView& w, int64_t n, int64_t k) {
  return get_value(w, n, k) - stored_offset(w.format.scheme);
}

QuantizedWeight unpack_weight(const PackedWeightView& w) {
  QuantizedWeight q(w.format, w.n, w.k);
  const QuantizedWeightView v = q.view();
  const bool two_level = w.format.scheme == WeightScheme::s4_two_level;
  const auto* scales = static_cast<const float*>(w.scales.data);
  for (int64_t n = 0; n < w.n; ++n) {
    for (int64_t k = 0; k < w.k; ++k) cpu::set_int(v.q, n, k, packed_weight_value(w, n, k));
    if (w.format.per_channel() || two_level) cpu::set_float(v.scales, n, 0, scales[n]);
  }
  if (w.format.per_channel()) return q;
  const auto* params = static_cast<const uint8_t*>(w.group_params.data);
  const auto* zeros = static_cast<const float*>(w.zeros.data);
  for (int64_t gi = 0; gi < w.k / w.format.group_size; ++gi)
    for (int64_t n = 0; n < w.n; ++n) {
      const int64_t at = gi * w.n_pad + n;
      if (two_level) {
        const int gs = params[at * 2], offset = params[at * 2 + 1];
        cpu::set_int(v.group_scales, n, gi, gs);
        cpu::set_int(v.zeros, n, gi, (128 - offset) / gs);
        continue;
      }
      cpu::set_float(v.scales, n, gi, scales[at]);
      if (w.format.scheme == WeightScheme::u4_asym)
        cpu::set_int(v.zeros, n, gi, static_cast<int>(zeros[at]));
      else if (w.format.scheme == WeightScheme::u4_fzp)
        cpu::set_float(v.zeros, n, gi, zeros[at]);
    }
  return q;
}

PackedWeightView PackedWeight::view() const {
  PackedWeightView v;
  v.layout = layout;
  v.version = version;
  v.format = format;
  v.has_scales = has_scales;
  v.n = n;
  v.k = k;
  v.n_pad = n_pad;
  v.k_pad = k_pad;
  v.q = q.defined() ? q.view() : TensorView{};
  v.scales = scales.defined() ? scales.view() : TensorView{};
  v.group_params = group_params.defined() ? group_params.view() : TensorView{};
  v.zeros = zeros.defined() ? zeros.view() : TensorView{};
  return v;
}

PackedWeight PackedWeight::to(Device device) const {
  PackedWeight p = *this;
  p.q = q.to(device);
  if (scales.defined()) p.scales = scales.to(device);
  if (group_params.defined()) p.group_params = group_params.to(device);
  if (zeros.defined()) p.zeros = zeros.to(device);
  return p;
}

std::string describe_layout(WeightLayout layout) {
  std::string s = std::string("layout ") + to_string(layout) + " v" +
                  std::to_string(layout_version(layout)) + ": a block is 8 rows (n) x 128 " +
                  "columns (k) = " + (layout_weight_bits(layout) == 8 ? "1024" : "512") +
                  " bytes; lane l = 4g+c owns its 1/32 of it\n";
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, c = lane % 4;
    s += "lane " + std::string(lane < 10 ? " " : "") + std::to_string(lane) + "  n=" +
         std::to_string(g) + "  ";
    switch (layout) {
      case WeightLayout::w4_mma_k128:
        s += "word j (k32 step j, add 32j), byte b: low nibble k=" + std::to_string(4 * c) +
             "+b, high k=" + std::to_string(16 + 4 * c) + "+b\n";
        break;
      case WeightLayout::w4_mma16_k128:
        s += "word j (add 32j), nibble i: k=16((i>>1)&1) + 8(i&1) + " + std::to_string(2 * c) +
             " + (i>>2)\n";
        break;
      case WeightLayout::w8_mma16_k128:
        s += "word t (k16 step t, add 16t), byte b: k=" + std::to_string(2 * c) +
             " + (b&1) + 8(b>>1)\n";
        break;
    }
  }
  return s;
}

}  // namespace nibble
