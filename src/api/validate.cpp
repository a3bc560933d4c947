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

void check_weight(const ArgCheck& check, const QuantizedWeightView& w, Device device) {
  const WeightStorage st = weight_storage(w.format, w.n, w.k);  // validates format, N, K
  check_buffer(check, w.q, "w.q", st.q, device);
  check_buffer(check, w.scales, "w.scales", st.scales, device);
  check_buffer(check, w.zeros, "w.zeros", st.zeros, device);
  check_buffer(check, w.group_scales, "w.group_scales", st.group_scales, device);
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
