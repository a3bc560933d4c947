// Which GPU targets the build compiled device code for (NIBBLE_CUDA_ARCHS_STRING, set by CMake
// for the library, e.g. "80,90a"): the kernels whose code exists only for some targets ask here
// before they claim a GPU.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace nibble::cuda {

/// Whether the build holds device code for `arch` ("90a", "89", ...): one of the comma- or
/// semicolon-separated entries of NIBBLE_CUDA_ARCHS_STRING, matched whole.
inline bool cuda_code_built(std::string_view arch) {
  static const std::vector<std::string> archs = [] {
    std::vector<std::string> v;
    std::string cur;
    for (char c : std::string(NIBBLE_CUDA_ARCHS_STRING) + ",") {
      if (c == ',' || c == ';') {
        if (!cur.empty()) v.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    return v;
  }();
  return std::find(archs.begin(), archs.end(), arch) != archs.end();
}

}  // namespace nibble::cuda
