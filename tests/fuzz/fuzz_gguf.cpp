// libFuzzer target for the GGUF reader: any input must either parse (and then every tensor must
// dequantize) or be rejected with nibble::Error — never crash, hang, or read out of bounds
// (built with AddressSanitizer and UBSan by scripts/fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "llm/gguf.h"
#include "nibble/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto g = nibble::llm::GgufFile::parse(std::vector<uint8_t>(data, data + size), "fuzz");
    for (const auto& t : g.tensors())
      if (t.numel() <= (uint64_t{1} << 24)) (void)g.dequantize(t);  // bound the work per input
  } catch (const nibble::Error&) {
    // A clear rejection is the expected outcome for malformed input.
  }
  return 0;
}
