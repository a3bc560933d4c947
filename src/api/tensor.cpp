// Owning tensors (tensor.h). Host memory is 64-byte aligned; CUDA memory comes from cudaMalloc
// (256-byte aligned), never managed memory.
#include "nibble/tensor.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "api/validate.h"
#include "common/check.h"
#include "common/cuda_runtime_check.h"

namespace nibble {

namespace {

std::shared_ptr<void> allocate(int64_t bytes, Device device) {
  const size_t n = static_cast<size_t>(bytes > 0 ? bytes : 1);
  if (device.type == DeviceType::cpu) {
    void* p = std::aligned_alloc(64, (n + 63) / 64 * 64);
    if (p == nullptr)
      detail::fail(ErrorCode::invalid_argument,
                   "nibble::Tensor: cannot allocate " + std::to_string(bytes) + " host bytes");
    return {p, [](void* q) { std::free(q); }};
  }
#if NIBBLE_WITH_CUDA
  detail::DeviceGuard guard(device.index);
  void* p = nullptr;
  NIBBLE_CUDA_CHECK(cudaMalloc(&p, n));
  const int index = device.index;
  return {p, [index](void* q) {
            detail::DeviceGuard g(index);
            cudaFree(q);  // cannot throw from a deleter; a failing free is reported by the next call
          }};
#else
  detail::fail(ErrorCode::unsupported,
               "nibble::Tensor: device " + to_string(device) +
                   " requested, but this build of nibble has no CUDA backend");
#endif
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, int64_t bytes) {
  if (dst_dev.type == DeviceType::cpu && src_dev.type == DeviceType::cpu) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return;
  }
#if NIBBLE_WITH_CUDA
  NIBBLE_CUDA_CHECK(cudaMemcpy(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault));
#else
  detail::fail(ErrorCode::unsupported, "nibble::Tensor: copies to or from a CUDA device need "
                                       "the CUDA backend, which this build lacks");
#endif
}

}  // namespace

Tensor::Tensor(DType dtype, std::vector<int64_t> shape, Device device) {
  const detail::ArgCheck check("Tensor");
  check.condition(shape.size() <= static_cast<size_t>(TensorView::kMaxRank), "shape",
                  "must have at most 4 dimensions, got " + std::to_string(shape.size()));
  int64_t elements = 1;
  for (int64_t s : shape) {
    check.condition(s >= 0, "shape", "must have non-negative sizes, got " + std::to_string(s));
    check.condition(!__builtin_mul_overflow(elements, s, &elements) && elements <= (int64_t{1} << 60),
                    "shape", "has more elements than can be addressed", ErrorCode::out_of_range);
  }
  check.condition(dtype_bits(dtype) != 4 || shape.empty() || shape.back() % 2 == 0, "shape",
                  std::string("must have an even last dimension for ") + to_string(dtype));
  if (device.type == DeviceType::cuda) detail::check_backend(check, device);
  view_.dtype = dtype;
  view_.device = device;
  view_.rank = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = view_.rank - 1; d >= 0; --d) {
    view_.shape[static_cast<size_t>(d)] = shape[static_cast<size_t>(d)];
    view_.strides[static_cast<size_t>(d)] = stride;
    stride *= shape[static_cast<size_t>(d)];
  }
  storage_ = allocate(view_.nbytes(), device);
  view_.data = storage_.get();
}

Tensor Tensor::to(Device device) const {
  std::vector<int64_t> shape(view_.shape.begin(), view_.shape.begin() + view_.rank);
  Tensor out(view_.dtype, shape, device);
  copy_bytes(out.data(), device, data(), view_.device, nbytes());
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  const detail::ArgCheck check("Tensor::copy_from");
  check.condition(src.view_.dtype == view_.dtype && src.view_.rank == view_.rank &&
                      src.view_.shape == view_.shape,
                  "src", "must match " + view_.describe() + ", got " + src.view_.describe());
  copy_bytes(data(), view_.device, src.data(), src.view_.device, nbytes());
}

void Tensor::fill_bytes(uint8_t byte) {
  if (view_.device.type == DeviceType::cpu) {
    std::memset(data(), byte, static_cast<size_t>(nbytes()));
    return;
  }
#if NIBBLE_WITH_CUDA
  detail::DeviceGuard guard(view_.device.index);
  NIBBLE_CUDA_CHECK(cudaMemset(data(), byte, static_cast<size_t>(nbytes())));
  NIBBLE_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

namespace {
Tensor make(const BufferSpec& spec, Device device) {
  if (spec.rank == 0) return Tensor();
  std::vector<int64_t> shape(spec.shape, spec.shape + spec.rank);
  return Tensor(spec.dtype, shape, device);
}
TensorView view_or_empty(const Tensor& t) { return t.defined() ? t.view() : TensorView{}; }
Tensor copy_or_empty(const Tensor& t, Device device) { return t.defined() ? t.to(device) : Tensor(); }
}  // namespace

QuantizedWeight::QuantizedWeight(const WeightFormat& f, int64_t n_, int64_t k_, Device device)
    : format(f), n(n_), k(k_) {
  const WeightStorage st = weight_storage(f, n_, k_);
  q = make(st.q, device);
  scales = make(st.scales, device);
  zeros = make(st.zeros, device);
  group_scales = make(st.group_scales, device);
}

QuantizedWeightView QuantizedWeight::view() const {
  return {format, n, k, view_or_empty(q), view_or_empty(scales), view_or_empty(zeros),
          view_or_empty(group_scales)};
}

QuantizedWeight QuantizedWeight::to(Device device) const {
  QuantizedWeight out;
  out.format = format;
  out.n = n;
  out.k = k;
  out.q = copy_or_empty(q, device);
  out.scales = copy_or_empty(scales, device);
  out.zeros = copy_or_empty(zeros, device);
  out.group_scales = copy_or_empty(group_scales, device);
  return out;
}

QuantizedActivation::QuantizedActivation(ActScheme s, int64_t m, int64_t k, Device device)
    : scheme(s) {
  const detail::ArgCheck check("QuantizedActivation");
  check.condition(s != ActScheme::none, "scheme", "must be a quantized activation scheme");
  q = Tensor(act_value_dtype(s), {m, k}, device);
  scales = Tensor(DType::f32, {s == ActScheme::s8_per_tensor ? 1 : m}, device);
}

QuantizedActivationView QuantizedActivation::view() const {
  return {scheme, view_or_empty(q), view_or_empty(scales)};
}

QuantizedActivation QuantizedActivation::to(Device device) const {
  QuantizedActivation out;
  out.scheme = scheme;
  out.q = copy_or_empty(q, device);
  out.scales = copy_or_empty(scales, device);
  return out;
}

}  // namespace nibble
