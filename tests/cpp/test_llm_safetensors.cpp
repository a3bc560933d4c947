// The safetensors reader and writer: a round trip of every float dtype, and rejection of
// malformed files (every truncation, bad headers, shapes, offsets, overlaps) with clear errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "llm/file_util.h"
#include "llm/safetensors.h"
#include "nibble/numeric.h"
#include "nibble/status.h"
#include "test_llm_util.h"

namespace nibble::llm {
namespace {

std::vector<uint8_t> raw(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

// A file with an F32 (2, 3), an F16 (2) and a BF16 (2) tensor and metadata; returns its bytes.
std::vector<uint8_t> sample_file() {
  const float f32[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
  const uint16_t f16[2] = {f32_to_f16_bits(0.5f), f32_to_f16_bits(-3)};
  const uint16_t bf16[2] = {f32_to_bf16_bits(2), f32_to_bf16_bits(-0.25f)};
  const std::string path = test::unique_temp_path("nibble_sample.safetensors");
  write_safetensors(path,
                    {{"a.f32", "F32", {2, 3}, raw(f32, sizeof f32)},
                     {"b.f16", "F16", {2}, raw(f16, sizeof f16)},
                     {"c.bf16", "BF16", {2}, raw(bf16, sizeof bf16)}},
                    {{"format", "pt"}, {"nibble", "test \"quoted\""}});
  auto bytes = read_file_bytes(path, "test");
  std::filesystem::remove(path);
  return bytes;
}

// A file from a header text and a data section of `data_bytes` zero bytes.
std::vector<uint8_t> with_header(const std::string& header, size_t data_bytes) {
  std::string s(8 + header.size() + data_bytes, '\0');
  const uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  header.copy(s.data() + 8, header.size());
  return std::vector<uint8_t>(s.begin(), s.end());
}

TEST(LlmSafetensors, WriterAndReaderRoundTrip) {
  const SafetensorsFile f = SafetensorsFile::parse(sample_file(), "sample");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.metadata().at("nibble"), "test \"quoted\"");
  const auto& a = f.tensor("a.f32");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f.to_f32(a), (std::vector<float>{1, -2, 3.5f, 0, 1e-3f, -7}));
  EXPECT_EQ(f.to_f32(f.tensor("b.f16")), (std::vector<float>{0.5f, -3}));
  EXPECT_EQ(f.to_f32(f.tensor("c.bf16")), (std::vector<float>{2, -0.25f}));
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_THROW(f.tensor("nope"), Error);
}

// Zero-element tensors (a shape with a 0) read as empty vectors in every float dtype. The
// fuzzer found the F32 case passing a null destination to memcpy (UBSan); its input is kept in
// tests/fuzz/corpus/safetensors.
TEST(LlmSafetensors, EmptyFloatTensorsReadAsEmptyVectors) {
  const std::string header =
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
      R"( "e32": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},)"
      R"( "e16": {"dtype": "F16", "shape": [2, 0], "data_offsets": [4, 4]},)"
      R"( "eb16": {"dtype": "BF16", "shape": [0], "data_offsets": [4, 4]},)"
      R"( "e64": {"dtype": "F64", "shape": [0, 3], "data_offsets": [4, 4]}})";
  const SafetensorsFile f = SafetensorsFile::parse(with_header(header, 4), "empty tensors");
  for (const char* name : {"e32", "e16", "eb16", "e64"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(f.to_f32(f.tensor(name)).empty());
  }
  EXPECT_EQ(f.to_f32(f.tensor("a")), std::vector<float>{0.0f});
}

TEST(LlmSafetensors, EveryTruncationIsRejected) {
  const std::vector<uint8_t> full = sample_file();
  for (size_t n = 0; n < full.size(); ++n) {
    try {
      SafetensorsFile::parse(
          std::vector<uint8_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)), "cut");
      ADD_FAILURE() << "a file cut to " << n << " of " << full.size() << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::io_error || e.code() == ErrorCode::invalid_argument)
          << e.what();
    }
  }
}

TEST(LlmSafetensors, MalformedHeadersAreRejectedWithTheirReason) {
  struct Case {
    std::string header;
    size_t data;
    const char* expect;  // a fragment of the message
  };
  const Case cases[] = {
      {"[]", 0, "not a JSON object"},
      {"{\"t\": 1}", 0, "not described by an object"},
      {"{\"t\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, "no string dtype"},
      {"{\"t\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, "no shape"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, "no data_offsets"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4,
       "no data_offsets"},
      {"{\"t\": {\"dtype\": \"Q9\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
       "unknown dtype"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4,
       "negative dimension"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4,
       "non-integer"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 4]}}", 4, "needs 8"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 0]}}", 4,
       "end before begin"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 4,
       "outside the data"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4,
       "negative data offset"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, "
       "4]}}",
       4, "too large"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
       "\"u\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
       8, "overlap"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
       "\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
       4, "duplicate key"},
      {"{\"__metadata__\": {\"k\": 1}}", 0, "not a string"},
      {"{\"__metadata__\": []}", 0, "not an object"},
      {"{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}", 4,
       "unexpected end"},
  };
  for (const Case& c : cases) {
    try {
      SafetensorsFile::parse(with_header(c.header, c.data), "case");
      ADD_FAILURE() << "accepted: " << c.header;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos)
          << c.header << "\n  -> " << e.what();
    }
  }
  // A header size beyond the file, and one beyond the limit.
  std::vector<uint8_t> b(8, 0);
  uint64_t n = 1000;
  std::memcpy(b.data(), &n, 8);
  EXPECT_THROW(SafetensorsFile::parse(b, "short"), Error);
  n = SafetensorsFile::kMaxHeaderBytes + 1;
  std::memcpy(b.data(), &n, 8);
  EXPECT_THROW(SafetensorsFile::parse(b, "huge"), Error);
}

TEST(LlmSafetensors, IntegerTensorsAreReadRawNotAsFloats) {
  const int8_t q[4] = {1, -2, 3, -4};
  const std::string path = test::unique_temp_path("nibble_int.safetensors");
  write_safetensors(path, {{"q", "I8", {4}, raw(q, 4)}}, {});
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::filesystem::remove(path);
  EXPECT_EQ(std::memcmp(f.data(f.tensor("q")), q, 4), 0);
  EXPECT_THROW(f.to_f32(f.tensor("q")), Error);
  EXPECT_THROW(SafetensorsFile::open(path + ".missing"), Error);
}

}  // namespace
}  // namespace nibble::llm
