// Host side of the w4_mma_k128 layout (include/nibble/layout.h): index(), repack, inverse.
#include <cstring>
#include <string>

#include "api/validate.h"
#include "common/check.h"
#include "cpu/view_access.h"
#include "nibble/layout.h"

namespace nibble {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// An empty packed weight of the right sizes: every nibble u = 8 (weight 0), scales zero.
PackedWeight allocate_packed(const WeightFormat& f, bool has_scales, int64_t n, int64_t k,
                             Device device = Device::cpu()) {
  PackedWeight p;
  p.layout = WeightLayout::w4_mma_k128;
  p.version = kW4MmaK128Version;
  p.format = f;
  p.has_scales = has_scales;
  p.n = n;
  p.k = k;
  p.n_pad = round_up(n, 8);
  p.k_pad = round_up(k, 128);
  p.q = Tensor(DType::u8, {p.n_pad * p.k_pad / 2}, device);
  p.q.fill_bytes(0x88);
  if (!has_scales) return p;
  const bool two_level = f.scheme == WeightScheme::s4_two_level;
  const int64_t groups = f.per_channel() ? 0 : (p.k_pad + f.group_size - 1) / f.group_size;
  p.scales = f.per_channel() || two_level ? Tensor(DType::f32, {p.n_pad}, device)
                                          : Tensor(DType::f32, {groups, p.n_pad}, device);
  p.scales.fill_bytes(0);
  if (two_level) {
    p.group_params = Tensor(DType::u8, {groups, p.n_pad * 2}, device);  // (g_s, offset) pairs
    p.group_params.fill_bytes(0);
  }
  return p;
}

void put_nibble(const PackedWeight& p, int64_t n, int64_t k, int u) {
  const NibbleIndex at = w4_mma_k128_index(n, k, p.k_pad);
  uint8_t& byte = static_cast<uint8_t*>(p.q.data())[at.byte];
  byte = static_cast<uint8_t>((byte & ~(0xF << at.shift)) | ((u & 0xF) << at.shift));
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

}  // namespace

PackedWeight allocate_packed_weight(const WeightFormat& f, int64_t n, int64_t k, Device device) {
  return allocate_packed(f, true, n, k, device);
}

const char* to_string(WeightLayout layout) {
  switch (layout) {
    case WeightLayout::w4_mma_k128: return "w4_mma_k128";
  }
  return "?";
}

NibbleIndex w4_mma_k128_index(int64_t n, int64_t k, int64_t k_pad) {
  const int64_t nb = n / 8, g = n % 8, kb = k / 128, kr = k % 128;
  const int64_t j = kr / 32, within = kr % 32;  // k32 step, position inside it
  const int64_t high = within / 16, c = (within % 16) / 4, b = within % 4;
  const int64_t lane = 4 * g + c;
  const int64_t block = nb * (k_pad / 128) + kb;
  return {block * 512 + lane * 16 + j * 4 + b, static_cast<int>(high * 4)};
}

PackedWeight pack_weight(const QuantizedWeightView& w, Device device) {
  const detail::ArgCheck check("pack_weight");
  check.condition(w.format.scheme == WeightScheme::s4_sym ||
                      w.format.scheme == WeightScheme::s4_two_level,
                  "w.format",
                  std::string("must be s4_sym or s4_two_level for layout w4_mma_k128, got ") +
                      to_string(w.format.scheme),
                  ErrorCode::unsupported);
  const WeightStorage st = detail::checked_weight_storage(check, w.format, w.n, w.k, "w.");
  check_cpu_matrix(check, w.q, "w.q", st.q);
  check_cpu_matrix(check, w.scales, "w.scales", st.scales);
  const bool two_level = w.format.scheme == WeightScheme::s4_two_level;
  if (two_level) {
    check_cpu_matrix(check, w.zeros, "w.zeros", st.zeros);
    check_cpu_matrix(check, w.group_scales, "w.group_scales", st.group_scales);
  }
  const WeightFormat& f = w.format;
  PackedWeight p = allocate_packed(f, true, w.n, w.k);
  for (int64_t n = 0; n < w.n; ++n)
    for (int64_t k = 0; k < w.k; ++k) {
      const int v = cpu::get_int(w.q, n, k);
      if (two_level) {
        // The kernel computes u·g_s + (128 − g_s·g_z) in one byte: it must stay in [0, 255],
        // i.e. w8 = g_s·(u − g_z) must be an int8, for every stored value.
        const int64_t gi = k / f.group_size;
        const int w8 = cpu::get_int(w.group_scales, n, gi) * (v - cpu::get_int(w.zeros, n, gi));
        check.condition(w8 >= -128 && w8 <= 127, "w.group_scales",
                        "and w.zeros must make every w8 = g_s·(q − g_z) an int8, got " +
                            std::to_string(w8) + " at (" + std::to_string(n) + ", " +
                            std::to_string(k) + ")");
      }
      put_nibble(p, n, k, two_level ? v : v + 8);
    }
  float* scales = static_cast<float*>(p.scales.data());
  if (f.per_channel() || two_level) {
    for (int64_t n = 0; n < w.n; ++n) scales[n] = cpu::get_float(w.scales, n, 0);
  } else {
    for (int64_t gi = 0; gi < w.k / f.group_size; ++gi)
      for (int64_t n = 0; n < w.n; ++n)
        scales[gi * p.n_pad + n] = cpu::get_float(w.scales, n, gi);
  }
  if (two_level) {
    auto* params = static_cast<uint8_t*>(p.group_params.data());
    for (int64_t gi = 0; gi < w.k / f.group_size; ++gi)
      for (int64_t n = 0; n < w.n; ++n) {
        const int gs = cpu::get_int(w.group_scales, n, gi), gz = cpu::get_int(w.zeros, n, gi);
        const int offset = 128 - gs * gz;  // u·g_s + offset = w8 + 128, one byte per value
        check.condition(gs >= 1 && gz >= 0 && gz <= 15 && offset >= 0 && offset <= 255,
                        "w.group_scales",
                        "and w.zeros must be g_s ≥ 1, g_z ∈ [0, 15], 128 − g_s·g_z ∈ [0, 255], got g_s=" +
                            std::to_string(gs) + " g_z=" + std::to_string(gz) + " at (" +
                            std::to_string(n) + ", group " + std::to_string(gi) + ")");
        params[(gi * p.n_pad + n) * 2] = static_cast<uint8_t>(gs);
        params[(gi * p.n_pad + n) * 2 + 1] = static_cast<uint8_t>(offset);
      }
  }
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
  PackedWeight p = allocate_packed(f, false, w.size(0), w.size(1));
  for (int64_t n = 0; n < w.size(0); ++n)
    for (int64_t k = 0; k < w.size(1); ++k) put_nibble(p, n, k, cpu::get_int(w, n, k) + 8);
  return device.type == DeviceType::cpu ? p : p.to(device);
}

int packed_weight_value(const PackedWeightView& w, int64_t n, int64_t k) {
  const NibbleIndex at = w4_mma_k128_index(n, k, w.k_pad);
  const int u = (static_cast<const uint8_t*>(w.q.data)[at.byte] >> at.shift) & 0xF;
  return w.format.scheme == WeightScheme::s4_two_level ? u : u - 8;
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
  return v;
}

PackedWeight PackedWeight::to(Device device) const {
  PackedWeight p = *this;
  p.q = q.to(device);
  if (scales.defined()) p.scales = scales.to(device);
  if (group_params.defined()) p.group_params = group_params.to(device);
  return p;
}

std::string describe_layout(WeightLayout layout) {
  std::string s = std::string("layout ") + to_string(layout) + " v" +
                  std::to_string(kW4MmaK128Version) +
                  ": a block is 8 rows (n) x 128 columns (k) = 512 bytes; lane l = 4g+c owns "
                  "bytes [16l, 16l+16), word j of them the k32 step j (add 32j to k below)\n";
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, c = lane % 4;
    s += "lane " + std::string(lane < 10 ? " " : "") + std::to_string(lane) + "  n=" +
         std::to_string(g) + "  byte b: low nibble k=" + std::to_string(4 * c) + "+b, high k=" +
         std::to_string(16 + 4 * c) + "+b\n";
  }
  return s;
}

}  // namespace nibble
