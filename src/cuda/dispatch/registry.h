// Kernel registry and selection for the CUDA backend.
//
// Each linear kernel family registers one row: a name, a predicate saying whether it can run a
// problem (and if not, why), and a launcher. `select_linear` walks the rows in order — most
// specialised first — and the last row, the generic SIMT kernel, accepts everything, so the
// ladder always ends in a kernel. `NIBBLE_LOG_DISPATCH=1` prints each new choice once to stderr.
#pragma once

#include <string>
#include <vector>

#include "nibble/formats.h"
#include "nibble/quantize.h"
#include "nibble/types.h"

namespace nibble::cuda {

/// What the predicates look at: the format, the shape and the device. Nothing is hard-coded:
/// SM count and compute capability come from the device.
struct LinearProblem {
  LinearFormat format;
  int64_t m = 0, n = 0, k = 0;
  int cc = 0;        ///< compute capability, major·10 + minor
  int sm_count = 0;
  /// Every operand 16-byte aligned with 16-byte-multiple row pitches, and the weight scales a
  /// contiguous, 16-byte aligned table (what the tensor-core kernels' copies need).
  bool aligned16 = true;
};

/// The tensors of one call. `x` is set for A16 formats, `a` otherwise.
struct LinearCall {
  const QuantizedActivationView* a = nullptr;
  const TensorView* x = nullptr;
  const QuantizedWeightView* w = nullptr;
  const TensorView* bias = nullptr;
  const TensorView* d = nullptr;
};

struct LinearKernel {
  const char* name;
  /// True if the kernel can run `p`; otherwise sets *why_not.
  bool (*supports)(const LinearProblem& p, std::string* why_not);
  void (*launch)(const LinearProblem& p, const LinearCall& call, Stream stream);
};

/// All registered linear kernels, in selection order.
const std::vector<LinearKernel>& linear_kernels();
const LinearKernel& select_linear(const LinearProblem& p);
/// Human-readable account of the selection for `p`.
std::string explain_linear(const LinearProblem& p);

LinearProblem make_problem(const LinearFormat& format, int64_t m, int64_t n, int64_t k,
                           int device);

}  // namespace nibble::cuda
