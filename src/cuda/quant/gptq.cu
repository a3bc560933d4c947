// GPTQ's heavy parts on a CUDA device (quant/quant_internal.h, GptqDevice and hessian_add_cuda):
//
//   Hessian      Σ x xᵀ += Xᵀ·X          X (M, K) f32 → f64 on the device, cublasDsyrk (lower)
//   factor       U, Uᵀ·U = H⁻¹           cusolverDnDpotrf(H) → potri (H⁻¹) → potrf (H⁻¹)
//   lazy update  W[:, b1:] −= E·U[b0:b1, b1:]   cublasDgemm, W (N, K) f64 resident
//
// Operands: row-major f64 on the host, handed to cuBLAS/cuSOLVER (column-major) as their
// transposes: a row-major (R, C) matrix with leading dimension C is the column-major (C, R)
// matrix with the same leading dimension. H is symmetric, so its transpose is itself.
// Precondition: a CUDA device; K·K and N·K f64 fit in device memory (an 8192² Hessian is 512
// MiB). Needs no particular arch (f64 BLAS and LAPACK only).
//
// Limitations:
//   1. The column loop of each block (sequential over columns, a few hundred flops per weight)
//      stays on the host, shared with the CPU path; each block's columns travel device → host
//      and its error block host → device (N·B f64 each way per block).
//   2. Everything in f64, so the result matches the CPU path up to summation order, not bit
//      for bit (tests/cpp/test_cuda_gptq.cpp states the tolerance).
//
// Verify: nibble_tests --gtest_filter='CudaGptq*' on a GPU machine.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <string>
#include <vector>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "quant/quant_internal.h"

namespace nibble::quant {

namespace {

[[noreturn]] void fail_library(const char* what, int status, const char* file, int line) {
  detail::fail(ErrorCode::cuda_error, std::string("nibble GPTQ (CUDA): ") + what +
                                          " failed with status " + std::to_string(status) + " at " +
                                          file + ":" + std::to_string(line));
}

#define NIBBLE_CUBLAS_CHECK(call)                                            \
  do {                                                                       \
    const cublasStatus_t nibble_st_ = (call);                                \
    if (nibble_st_ != CUBLAS_STATUS_SUCCESS)                                 \
      fail_library(#call, static_cast<int>(nibble_st_), __FILE__, __LINE__); \
  } while (0)

#define NIBBLE_CUSOLVER_CHECK(call)                                          \
  do {                                                                       \
    const cusolverStatus_t nibble_st_ = (call);                              \
    if (nibble_st_ != CUSOLVER_STATUS_SUCCESS)                               \
      fail_library(#call, static_cast<int>(nibble_st_), __FILE__, __LINE__); \
  } while (0)

// A device allocation freed with its scope.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) {
    if (count > 0) NIBBLE_CUDA_CHECK(cudaMalloc(&ptr_, count * sizeof(T)));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

// f32 → f64, one thread per element (grid-stride).
__global__ void widen_f32_to_f64(const float* __restrict__ in, double* __restrict__ out,
                                 int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = static_cast<double>(in[i]);
}

// Potrf then a check of its info: false when a leading minor is not positive definite.
bool potrf_lower(cusolverDnHandle_t h, double* a, int k, DeviceBuffer<int>& info) {
  int lwork = 0;
  NIBBLE_CUSOLVER_CHECK(cusolverDnDpotrf_bufferSize(h, CUBLAS_FILL_MODE_LOWER, k, a, k, &lwork));
  DeviceBuffer<double> work(static_cast<size_t>(lwork));
  NIBBLE_CUSOLVER_CHECK(
      cusolverDnDpotrf(h, CUBLAS_FILL_MODE_LOWER, k, a, k, work.get(), lwork, info.get()));
  int host_info = 0;
  NIBBLE_CUDA_CHECK(cudaMemcpy(&host_info, info.get(), sizeof(int), cudaMemcpyDeviceToHost));
  return host_info == 0;
}

}  // namespace

struct GptqDevice::State {
  int64_t n = 0, k = 0;
  int ordinal = 0;
  cublasHandle_t blas = nullptr;
  cusolverDnHandle_t solver = nullptr;
  double* w = nullptr;  // (N, K) row-major
  double* u = nullptr;  // (K, K) row-major upper
  double* e = nullptr;  // (N, block) row-major
  size_t e_capacity = 0;
};

GptqDevice::GptqDevice(const std::vector<double>& w, int64_t n, int64_t k, Device device)
    : state_(new State) {
  State& s = *state_;
  s.n = n, s.k = k, s.ordinal = device.index;
  detail::DeviceGuard guard(s.ordinal);
  try {
    NIBBLE_CUBLAS_CHECK(cublasCreate(&s.blas));
    NIBBLE_CUSOLVER_CHECK(cusolverDnCreate(&s.solver));
    NIBBLE_CUDA_CHECK(cudaMalloc(&s.w, static_cast<size_t>(n * k) * sizeof(double)));
    NIBBLE_CUDA_CHECK(cudaMalloc(&s.u, static_cast<size_t>(k * k) * sizeof(double)));
    NIBBLE_CUDA_CHECK(cudaMemcpy(s.w, w.data(), static_cast<size_t>(n * k) * sizeof(double),
                                 cudaMemcpyHostToDevice));
  } catch (...) {
    release(state_);
    throw;
  }
}

GptqDevice::~GptqDevice() { release(state_); }

void GptqDevice::release(State*& s) {
  if (s == nullptr) return;
  detail::DeviceGuard guard(s->ordinal);
  cudaFree(s->w);
  cudaFree(s->u);
  cudaFree(s->e);
  if (s->solver != nullptr) cusolverDnDestroy(s->solver);
  if (s->blas != nullptr) cublasDestroy(s->blas);
  delete s;
  s = nullptr;
}

bool GptqDevice::upper_cholesky_of_inverse(const std::vector<double>& h, std::vector<double>& u) {
  State& s = *state_;
  detail::DeviceGuard guard(s.ordinal);
  const int k = static_cast<int>(s.k);
  NIBBLE_CUDA_CHECK(cudaMemcpy(s.u, h.data(), static_cast<size_t>(s.k * s.k) * sizeof(double),
                               cudaMemcpyHostToDevice));
  DeviceBuffer<int> info(1);
  // H = L·Lᵀ, then H⁻¹ from L (lower triangle), then H⁻¹ = L₂·L₂ᵀ: U = L₂ᵀ (column-major lower
  // L₂ read row-major is its transpose, upper).
  if (!potrf_lower(s.solver, s.u, k, info)) return false;
  int lwork = 0;
  NIBBLE_CUSOLVER_CHECK(
      cusolverDnDpotri_bufferSize(s.solver, CUBLAS_FILL_MODE_LOWER, k, s.u, k, &lwork));
  {
    DeviceBuffer<double> work(static_cast<size_t>(lwork));
    NIBBLE_CUSOLVER_CHECK(cusolverDnDpotri(s.solver, CUBLAS_FILL_MODE_LOWER, k, s.u, k, work.get(),
                                           lwork, info.get()));
  }
  if (!potrf_lower(s.solver, s.u, k, info)) return false;
  u.resize(static_cast<size_t>(s.k * s.k));
  NIBBLE_CUDA_CHECK(cudaMemcpy(u.data(), s.u, u.size() * sizeof(double), cudaMemcpyDeviceToHost));
  // The row-major lower part holds what potrf left of the input: zero it, on both sides.
  for (int64_t r = 0; r < s.k; ++r)
    for (int64_t c = 0; c < r; ++c) u[static_cast<size_t>(r * s.k + c)] = 0.0;
  NIBBLE_CUDA_CHECK(cudaMemcpy(s.u, u.data(), u.size() * sizeof(double), cudaMemcpyHostToDevice));
  return true;
}

void GptqDevice::fetch_columns(int64_t c0, int64_t c1, std::vector<double>& w_host) {
  State& s = *state_;
  detail::DeviceGuard guard(s.ordinal);
  const size_t pitch = static_cast<size_t>(s.k) * sizeof(double);
  NIBBLE_CUDA_CHECK(cudaMemcpy2D(w_host.data() + c0, pitch, s.w + c0, pitch,
                                 static_cast<size_t>(c1 - c0) * sizeof(double),
                                 static_cast<size_t>(s.n), cudaMemcpyDeviceToHost));
}

void GptqDevice::lazy_update(const std::vector<double>& e, int64_t b0, int64_t b1) {
  State& s = *state_;
  detail::DeviceGuard guard(s.ordinal);
  const int64_t bw = b1 - b0, rest = s.k - b1;
  if (rest <= 0) return;
  if (e.size() > s.e_capacity) {
    cudaFree(s.e);
    s.e = nullptr;
    NIBBLE_CUDA_CHECK(cudaMalloc(&s.e, e.size() * sizeof(double)));
    s.e_capacity = e.size();
  }
  NIBBLE_CUDA_CHECK(cudaMemcpy(s.e, e.data(), e.size() * sizeof(double), cudaMemcpyHostToDevice));
  // Column-major: Wᵀ[b1:, :] (rest, N) −= U[b0:b1, b1:]ᵀ (rest, bw) · Eᵀ (bw, N).
  const double alpha = -1.0, beta = 1.0;
  NIBBLE_CUBLAS_CHECK(cublasDgemm(s.blas, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(rest),
                                  static_cast<int>(s.n), static_cast<int>(bw), &alpha,
                                  s.u + b0 * s.k + b1, static_cast<int>(s.k), s.e,
                                  static_cast<int>(bw), &beta, s.w + b1, static_cast<int>(s.k)));
  NIBBLE_CUDA_CHECK(cudaDeviceSynchronize());
}

void hessian_add_cuda(const TensorView& x, std::vector<double>& sum) {
  const int64_t m = x.size(0), k = x.size(1);
  detail::DeviceGuard guard(x.device.index);
  cublasHandle_t blas = nullptr;
  NIBBLE_CUBLAS_CHECK(cublasCreate(&blas));
  try {
    DeviceBuffer<double> xd(static_cast<size_t>(m * k)), hd(static_cast<size_t>(k * k));
    widen_f32_to_f64<<<256, 256>>>(x.ptr<float>(), xd.get(), m * k);
    NIBBLE_CUDA_CHECK_LAUNCH();
    NIBBLE_CUDA_CHECK(
        cudaMemcpy(hd.get(), sum.data(), sum.size() * sizeof(double), cudaMemcpyHostToDevice));
    // Row-major X (M, K) is column-major Xᵀ (K, M): C (K, K) += Xᵀ·X is syrk with op N on Xᵀ.
    const double alpha = 1.0, beta = 1.0;
    NIBBLE_CUBLAS_CHECK(cublasDsyrk(blas, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, static_cast<int>(k),
                                    static_cast<int>(m), &alpha, xd.get(), static_cast<int>(k),
                                    &beta, hd.get(), static_cast<int>(k)));
    NIBBLE_CUDA_CHECK(
        cudaMemcpy(sum.data(), hd.get(), sum.size() * sizeof(double), cudaMemcpyDeviceToHost));
  } catch (...) {
    cublasDestroy(blas);
    throw;
  }
  cublasDestroy(blas);
  // Column-major lower = row-major upper was updated: mirror it to the lower half.
  for (int64_t r = 0; r < k; ++r)
    for (int64_t c = 0; c < r; ++c)
      sum[static_cast<size_t>(r * k + c)] = sum[static_cast<size_t>(c * k + r)];
}

}  // namespace nibble::quant
