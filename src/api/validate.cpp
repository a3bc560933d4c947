#include "api/validate.h"

#include <string>

#include "nibble/device.h"
#include "nibble/formats.h"

namespace nibble::detail {

void check_buffer(const ArgCheck& check, const TensorView& t, const char* arg,
                  const BufferSpec& spec, Device device) {
  if (spec.rank == 0) {
    check.condition(t.data == nullptr, arg, "must be empty for this format, got " + t.describe());
    return;
  }
  check.tensor(t, arg, spec.rank);
  check.dtype(t, arg, {spec.dtype});
  if (spec.rank == 1) check.shape(t, arg, {spec.shape[0]});
  else check.shape(t, arg, {spec.shape[0], spec.shape[1]});
  check.rows_packed(t, arg);
  check.device(t, arg, device);
}

WeightStorage checked_weight_storage(const ArgCheck& check, const WeightFormat& f, int64_t n,
                                     int64_t k, const std::string& prefix) {
  const auto name = [&](const char* field) { return prefix + field; };
  check.condition(f.group_size == 0 || is_valid_group_size(f.group_size),
                  name("format.group_size").c_str(),
                  "must be 0 (per channel) or 32, 64, 128, 256, got " +
                      std::to_string(f.group_size));
  check.condition(f.scale_dtype == DType::f32 || f.scale_dtype == DType::f16 ||
                      f.scale_dtype == DType::bf16,
                  name("format.scale_dtype").c_str(),
                  std::string("must be f32, f16 or bf16, got ") + to_string(f.scale_dtype));
  check.condition(f.group_size != 0 || (f.scheme != WeightScheme::u4_asym &&
                                        f.scheme != WeightScheme::u4_fzp &&
                                        f.scheme != WeightScheme::s4_two_level),
                  name("format").c_str(),
                  std::string("uses ") + to_string(f.scheme) + ", which needs a group size");
  check.condition(n > 0, name("n").c_str(), "must be positive, got " + std::to_string(n));
  check.condition(k > 0, name("k").c_str(), "must be positive, got " + std::to_string(k));
  const DType value = weight_value_dtype(f.scheme);
  check.condition(dtype_bits(value) != 4 || k % 2 == 0, name("k").c_str(),
                  "must be even for 4-bit weights, got " + std::to_string(k));
  check.condition(f.group_size == 0 || k % f.group_size == 0, name("k").c_str(),
                  "must be a multiple of the group size " + std::to_string(f.group_size) +
                      ", got " + std::to_string(k));
  WeightStorage st;
  st.q = {value, 2, {n, k}};
  const int64_t groups = f.group_size == 0 ? 0 : k / f.group_size;
  if (f.scheme == WeightScheme::s4_two_level) {
    st.scales = {f.scale_dtype, 1, {n, 0}};
    st.group_scales = {DType::u8, 2, {n, groups}};
    st.zeros = {DType::u8, 2, {n, groups}};
  } else if (f.group_size == 0) {
    st.scales = {f.scale_dtype, 1, {n, 0}};
  } else {
    st.scales = {f.scale_dtype, 2, {n, groups}};
    if (f.scheme == WeightScheme::u4_asym) st.zeros = {DType::u8, 2, {n, groups}};
    if (f.scheme == WeightScheme::u4_fzp) st.zeros = {f.scale_dtype, 2, {n, groups}};
  }
  return st;
}

void check_weight(const ArgCheck& check, const QuantizedWeightView& w, Device device,
                  const std::string& name) {
  // Format and sizes first: the buffers are checked against the storage they imply.
  const WeightStorage st = checked_weight_storage(check, w.format, w.n, w.k, name + ".");
  check_buffer(check, w.q, (name + ".q").c_str(), st.q, device);
  check_buffer(check, w.scales, (name + ".scales").c_str(), st.scales, device);
  check_buffer(check, w.zeros, (name + ".zeros").c_str(), st.zeros, device);
  check_buffer(check, w.group_scales, (name + ".group_scales").c_str(), st.group_scales, device);
}

int64_t check_activation(const ArgCheck& check, const QuantizedActivationView& a,
                         Device device) {
  check.condition(a.scheme != ActScheme::none, "a.scheme",
                  "must be a quantized activation scheme, got none (use the A16 overload)");
  check.tensor(a.q, "a.q", 2);
  check.dtype(a.q, "a.q", {act_value_dtype(a.scheme)});
  check.rows_packed(a.q, "a.q");
  check.device(a.q, "a.q", device);
  const int64_t m = a.q.size(0);
  check.tensor(a.scales, "a.scales", 1);
  check.dtype(a.scales, "a.scales", {DType::f32});
  check.shape(a.scales, "a.scales", {a.scheme == ActScheme::s8_per_tensor ? 1 : m});
  check.device(a.scales, "a.scales", device);
  return m;
}

void check_backend(const ArgCheck& check, Device device) {
  if (device.type == DeviceType::cpu) return;
  const BuildInfo info = build_info();
  check.condition(info.cuda, "device",
                  "is a CUDA device, but this build of nibble has no CUDA backend",
                  ErrorCode::unsupported);
  const int count = cuda_device_count();
  check.condition(device.index >= 0 && device.index < count, "device",
                  "must be a visible CUDA device (" + std::to_string(count) + " found" +
                      (count == 0 ? ": " + cuda_unavailable_reason() : std::string()) +
                      "), got " + to_string(device),
                  ErrorCode::unsupported);
}

}  // namespace nibble::detail
