// libFuzzer target for the safetensors reader (and, through its header, the JSON reader): any
// input must either parse — and then every float tensor must convert — or be rejected with
// nibble::Error; never crash, hang, or read out of bounds (ASan + UBSan via scripts/fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "llm/safetensors.h"
#include "nibble/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f =
        nibble::llm::SafetensorsFile::parse(std::vector<uint8_t>(data, data + size), "fuzz");
    for (const auto& t : f.tensors()) {
      if (t.numel() > (int64_t{1} << 20)) continue;  // bound the work per input
      try {
        (void)f.to_f32(t);
      } catch (const nibble::Error&) {
        // integer dtypes are rejected by to_f32, by design
      }
    }
  } catch (const nibble::Error&) {
    // A clear rejection is the expected outcome for malformed input.
  }
  return 0;
}
