// The CUDA backend of the LLM runner (compiled only with NIBBLE_WITH_CUDA): make_backend()
// returns it for device "cuda" / "cuda:N". See cuda_backend.cpp and docs/runner.md.
#pragma once

#include <memory>

#include "llm/backend.h"

namespace nibble::llm {

struct ModelFiles;

/// The model of `files` on CUDA device `ordinal`; throws nibble::Error(unsupported) when there
/// is no such device or it is older than sm_80, and for shapes the kernels do not handle.
std::unique_ptr<Backend> make_cuda_backend(ModelFiles& files, const BackendOptions& options,
                                           int ordinal);

}  // namespace nibble::llm
