// libFuzzer target for the Hugging Face JSON files: the input is read as a tokenizer.json (and,
// when that builds, used to encode and decode a fixed text) and as a config.json. Each must be
// accepted or rejected with nibble::Error; never crash, hang, or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "llm/config.h"
#include "llm/tokenizer.h"
#include "nibble/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto t = nibble::llm::Tokenizer::from_hf_json(text, "fuzz");
    const auto ids = t.encode("Hello, world! 123 <|end|> caf\xC3\xA9 \xF0\x9F\x99\x82\n\n  x");
    (void)t.decode(ids);
  } catch (const nibble::Error&) {
  }
  try {
    (void)nibble::llm::ModelConfig::from_hf_json(text, "fuzz");
  } catch (const nibble::Error&) {
  }
  return 0;
}
