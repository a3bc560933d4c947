// Helpers of the LLM runner's tests: a GGUF byte writer, the real model's location, test data.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

namespace nibble::llm::test {

// A temporary path unique to the running test and process: ctest runs each test in its own
// process, in parallel, so a fixed name would be written and removed by several at once.
inline std::string unique_temp_path(const std::string& name) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "none";
  for (char& ch : test)
    if (ch == '/') ch = '_';
  return testing::TempDir() + name + "_" + test + "_" + std::to_string(::getpid());
}

// Writes GGUF bytes the way llama.cpp lays them out (see src/llm/gguf.h).
class GgufWriter {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void header(uint64_t n_tensors, uint64_t n_kv) {
    put<uint32_t>(0x46554747u);
    put<uint32_t>(3);
    put<uint64_t>(n_tensors);
    put<uint64_t>(n_kv);
  }
  void kv_string(const std::string& k, const std::string& v) { str(k), put<uint32_t>(8), str(v); }
  void kv_u32(const std::string& k, uint32_t v) { str(k), put<uint32_t>(4), put<uint32_t>(v); }
  void kv_f32(const std::string& k, float v) { str(k), put<uint32_t>(6), put<float>(v); }
  void kv_bool(const std::string& k, bool v) { str(k), put<uint32_t>(7), put<uint8_t>(v ? 1 : 0); }
  void kv_strings(const std::string& k, const std::vector<std::string>& v) {
    str(k), put<uint32_t>(9), put<uint32_t>(8), put<uint64_t>(v.size());
    for (const auto& s : v) str(s);
  }
  void kv_f32s(const std::string& k, const std::vector<float>& v) {
    str(k), put<uint32_t>(9), put<uint32_t>(6), put<uint64_t>(v.size());
    for (float x : v) put<float>(x);
  }
  void kv_i32s(const std::string& k, const std::vector<int32_t>& v) {
    str(k), put<uint32_t>(9), put<uint32_t>(5), put<uint64_t>(v.size());
    for (int32_t x : v) put<int32_t>(x);
  }
  void tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type, uint64_t off) {
    str(name);
    put<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (uint64_t d : dims) put<uint64_t>(d);
    put<uint32_t>(type);
    put<uint64_t>(off);
  }
  void align(size_t a = 32) {
    while (bytes.size() % a) bytes.push_back(0);
  }
  std::vector<uint8_t> bytes;
};

/// The real model (SmolLM2-135M-Instruct GGUF) when the environment names it: CTest's llm_*
/// entries set NIBBLE_LLM_MODEL after scripts/get-model.sh; elsewhere the tests skip.
inline std::string real_model_path() {
  const char* p = std::getenv("NIBBLE_LLM_MODEL");
  return p != nullptr ? p : "";
}

/// A Hugging Face export of the same model (tests/llm/reference.py export-hf), if named.
inline std::string real_hf_dir() {
  const char* p = std::getenv("NIBBLE_LLM_HF_DIR");
  return p != nullptr ? p : "";
}

inline std::string test_data_path(const std::string& name) {
  return (std::filesystem::path(__FILE__).parent_path().parent_path() / "llm" / "data" / name)
      .string();
}

}  // namespace nibble::llm::test
