#include "cuda/dispatch/registry.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

#include "common/check.h"
#include "cuda/dispatch/int8_mma.h"
#include "cuda/generic/simt_linear_entry.h"
#include "nibble/device.h"

namespace nibble::cuda {

const std::vector<LinearKernel>& linear_kernels() {
  // Most specialised first; the SIMT kernel accepts every problem and must stay last.
  static const std::vector<LinearKernel> kernels = {
      w8a8_int8_mma_entry(),
      w4a4_int8_mma_entry(),
      simt_linear_kernel_entry(),
  };
  return kernels;
}

namespace {
void log_choice(const LinearProblem& p, const LinearKernel& k) {
  static const bool enabled = [] {
    const char* v = std::getenv("NIBBLE_LOG_DISPATCH");
    return v != nullptr && v[0] == '1';
  }();
  if (!enabled) return;
  static std::mutex mu;
  static std::set<std::string> seen;
  const std::string key = to_string(p.format) + " " + std::to_string(p.m) + "x" +
                          std::to_string(p.n) + "x" + std::to_string(p.k) + " -> " + k.name;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(key).second) std::fprintf(stderr, "nibble dispatch: %s\n", key.c_str());
}
}  // namespace

const LinearKernel& select_linear(const LinearProblem& p) {
  for (const LinearKernel& k : linear_kernels()) {
    std::string why_not;
    if (k.supports(p, &why_not)) {
      log_choice(p, k);
      return k;
    }
  }
  detail::fail(ErrorCode::internal, "nibble: no kernel accepted " + to_string(p.format) +
                                        "; the SIMT fallback must accept every problem");
}

std::string explain_linear(const LinearProblem& p) {
  std::string out;
  for (const LinearKernel& k : linear_kernels()) {
    std::string why_not;
    if (k.supports(p, &why_not)) return out + "runs " + k.name;
    out += std::string("not ") + k.name + " (" + why_not + "); ";
  }
  return out + "no kernel";
}

LinearProblem make_problem(const LinearFormat& format, int64_t m, int64_t n, int64_t k,
                           int device) {
  const DeviceInfo info = cuda_device_info(device);
  LinearProblem p;
  p.format = format;
  p.m = m;
  p.n = n;
  p.k = k;
  p.cc = info.cc_major * 10 + info.cc_minor;
  p.sm_count = info.sm_count;
  return p;
}

}  // namespace nibble::cuda
