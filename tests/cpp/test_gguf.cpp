// The GGUF reader: metadata and tensor tables, dequantization of every supported type against
// hand-computed values, and rejection of malformed files (every truncation of a valid file
// included) with nibble::Error — never a crash or an out-of-bounds read.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "llm/gguf.h"
#include "nibble/nibble.h"
#include "test_llm_util.h"

namespace nibble::llm {
namespace {

using Writer = test::GgufWriter;  // tests/cpp/test_llm_util.h

uint16_t h(float x) { return f32_to_f16_bits(x); }

// A file with one tensor of each type; returns the bytes.
std::vector<uint8_t> sample_file() {
  Writer w;
  w.header(5, 4);
  w.kv_string("general.architecture", "llama");
  w.kv_u32("llama.context_length", 2048);
  w.kv_f32("llama.rope.freq_base", 10000.0f);
  w.str("tokenizer.ggml.tokens");  // an array of strings
  w.put<uint32_t>(9);
  w.put<uint32_t>(8);
  w.put<uint64_t>(2);
  w.str("<s>");
  w.str("hi");
  w.tensor("f32", {2}, 0, 0);
  w.tensor("f16", {2}, 1, 32);
  w.tensor("q8_0", {32}, 8, 64);
  w.tensor("q4_0", {32}, 2, 128);
  w.tensor("q4_1", {32}, 3, 160);
  w.align();
  const size_t data = w.bytes.size();
  w.put<float>(1.5f);
  w.put<float>(-2.0f);
  w.align();
  w.put<uint16_t>(h(0.5f));
  w.put<uint16_t>(h(-3.0f));
  w.align();
  w.put<uint16_t>(h(0.25f));  // Q8_0: d = 0.25, q = j − 16
  for (int j = 0; j < 32; ++j) w.put<int8_t>(static_cast<int8_t>(j - 16));
  w.align();
  w.put<uint16_t>(h(2.0f));  // Q4_0: d = 2, low nibble j, high nibble 15 − j
  for (int j = 0; j < 16; ++j) w.put<uint8_t>(static_cast<uint8_t>(j | ((15 - j) << 4)));
  w.align();
  w.put<uint16_t>(h(0.5f));  // Q4_1: d = 0.5, m = −1
  w.put<uint16_t>(h(-1.0f));
  for (int j = 0; j < 16; ++j) w.put<uint8_t>(static_cast<uint8_t>(j | ((15 - j) << 4)));
  EXPECT_EQ(data % 32, 0u);
  return w.bytes;
}

TEST(Gguf, ReadsMetadataAndTensorTables) {
  const GgufFile g = GgufFile::parse(sample_file());
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_uint("llama.context_length"), 2048u);
  EXPECT_EQ(g.get_float("llama.rope.freq_base"), 10000.0);
  const auto& tokens = g.metadata().at("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.is_array);
  ASSERT_EQ(tokens.array.size(), 2u);
  EXPECT_EQ(std::get<std::string>(tokens.array[1]), "hi");
  ASSERT_EQ(g.tensors().size(), 5u);
  EXPECT_EQ(g.tensor("q4_1").type, GgmlType::q4_1);
  EXPECT_EQ(g.tensor("q4_1").nbytes, 20u);
}

TEST(Gguf, DequantizesEveryTypeToHandComputedValues) {
  const GgufFile g = GgufFile::parse(sample_file());
  EXPECT_EQ(g.dequantize(g.tensor("f32")), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(g.dequantize(g.tensor("f16")), (std::vector<float>{0.5f, -3.0f}));
  const auto q8 = g.dequantize(g.tensor("q8_0"));
  const auto q40 = g.dequantize(g.tensor("q4_0"));
  const auto q41 = g.dequantize(g.tensor("q4_1"));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q8[j], 0.25f * static_cast<float>(j - 16)) << j;
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(q40[j], 2.0f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(q40[j + 16], 2.0f * static_cast<float>(15 - j - 8)) << j;
    EXPECT_EQ(q41[j], 0.5f * static_cast<float>(j) - 1.0f) << j;
    EXPECT_EQ(q41[j + 16], 0.5f * static_cast<float>(15 - j) - 1.0f) << j;
  }
}

TEST(Gguf, EveryTruncationIsRejectedWithAnError) {
  const std::vector<uint8_t> full = sample_file();
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      GgufFile::parse(cut, "truncated");
      ADD_FAILURE() << "a file cut to " << n << " of " << full.size() << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::io_error || e.code() == ErrorCode::invalid_argument)
          << e.what();
    }
  }
}

TEST(Gguf, MalformedHeadersAndTablesAreRejected) {
  struct Case {
    const char* what;
    std::vector<uint8_t> bytes;
    const char* fragment;
  };
  std::vector<Case> cases;
  {
    Writer w;
    w.put<uint32_t>(0x12345678);
    cases.push_back({"bad magic", w.bytes, "not a GGUF file"});
  }
  {
    Writer w;
    w.put<uint32_t>(0x46554747u);
    w.put<uint32_t>(1);
    cases.push_back({"version 1", w.bytes, "version 1"});
  }
  {
    Writer w;
    w.header(0, 1ull << 60);
    cases.push_back({"huge metadata count", w.bytes, "exceed what the file can hold"});
  }
  {
    Writer w;
    w.header(0, 1);
    w.put<uint64_t>(1ull << 62);  // key length
    w.put<uint64_t>(0);           // a few bytes, so the counts themselves are plausible
    cases.push_back({"huge string", w.bytes, "truncated"});
  }
  {
    Writer w;
    w.header(0, 1);
    w.str("a");
    w.put<uint32_t>(9);
    w.put<uint32_t>(4);
    w.put<uint64_t>(1ull << 61);
    cases.push_back({"huge array", w.bytes, "more than the file can hold"});
  }
  {
    Writer w;
    w.header(0, 1);
    w.str("a");
    w.put<uint32_t>(99);
    cases.push_back({"unknown value type", w.bytes, "unknown value type 99"});
  }
  {
    Writer w;
    w.header(1, 0);
    w.tensor("t", {1, 2, 3, 4, 5}, 0, 0);
    cases.push_back({"five dimensions", w.bytes, "5 dimensions"});
  }
  {
    Writer w;
    w.header(1, 0);
    w.tensor("t", {1ull << 39, 1ull << 39}, 0, 0);
    cases.push_back({"shape overflow", w.bytes, "too large shape"});
  }
  {
    Writer w;
    w.header(1, 0);
    w.tensor("t", {32}, 16, 0);  // IQ2_XXS: its lattice codebooks are not decoded
    cases.push_back({"unsupported type", w.bytes, "ggml type 16, not one of F32 F16 BF16"});
  }
  {
    Writer w;
    w.header(1, 0);
    w.tensor("t", {32}, 12, 0);  // Q4_K rows hold whole 256-element super-blocks
    cases.push_back({"row not whole blocks", w.bytes, "not a multiple of 256 for Q4_K"});
  }
  {
    Writer w;
    w.header(1, 0);
    w.tensor("t", {16}, 2, 0);
    cases.push_back({"partial Q4_0 block", w.bytes, "not a multiple of 32"});
  }
  {
    Writer w;
    w.header(1, 0);
    w.tensor("t", {2}, 0, 4);
    cases.push_back({"misaligned offset", w.bytes, "not aligned"});
  }
  {
    Writer w;
    w.header(1, 0);
    w.tensor("t", {1024}, 0, 0);
    w.align();
    cases.push_back({"data past the end", w.bytes, "outside the data section"});
  }
  {
    Writer w;
    w.header(0, 1);
    w.kv_u32("general.alignment", 24);
    cases.push_back({"alignment not a power of two", w.bytes, "power of two"});
  }
  {
    Writer w;
    w.header(0, 2);
    w.kv_u32("k", 1);
    w.kv_u32("k", 2);
    cases.push_back({"duplicate key", w.bytes, "appears twice"});
  }
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    try {
      GgufFile::parse(c.bytes, "case");
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.fragment), std::string::npos) << e.what();
    }
  }
}

// A model split by llama.cpp's gguf-split: opened from its first shard, the tensors of all
// shards in one table, each decoded from its own file; the wrong shard or a missing one is named.
TEST(Gguf, SplitModelsOpenFromTheFirstShard) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("nibble-split-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto shard = [&](uint16_t no, const char* tensor, float value) {
    Writer w;
    w.header(1, no == 0 ? 4 : 3);
    if (no == 0) w.kv_string("general.architecture", "llama");
    w.str("split.no"), w.put<uint32_t>(2), w.put<uint16_t>(no);  // u16, as gguf-split writes
    w.str("split.count"), w.put<uint32_t>(2), w.put<uint16_t>(2);
    w.str("split.tensors.count"), w.put<uint32_t>(5), w.put<int32_t>(2);
    w.tensor(tensor, {2}, 0, 0);
    w.align();
    w.put<float>(value), w.put<float>(-value);
    char name[64];
    std::snprintf(name, sizeof name, "m-%05d-of-00002.gguf", no + 1);
    std::ofstream(dir / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(w.bytes.data()), static_cast<std::streamsize>(w.bytes.size()));
  };
  shard(0, "a", 1.5f);
  shard(1, "b", 2.5f);
  const GgufFile g = GgufFile::open((dir / "m-00001-of-00002.gguf").string());
  EXPECT_EQ(g.shards(), 2u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.dequantize(g.tensor("a")), (std::vector<float>{1.5f, -1.5f}));
  EXPECT_EQ(g.dequantize(g.tensor("b")), (std::vector<float>{2.5f, -2.5f}));
  EXPECT_EQ(g.file_bytes(), fs::file_size(dir / "m-00001-of-00002.gguf") +
                                fs::file_size(dir / "m-00002-of-00002.gguf"));
  try {
    GgufFile::open((dir / "m-00002-of-00002.gguf").string());
    ADD_FAILURE() << "the second shard opened as a model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("opens from its first shard"), std::string::npos)
        << e.what();
  }
  fs::remove(dir / "m-00002-of-00002.gguf");
  EXPECT_THROW(GgufFile::open((dir / "m-00001-of-00002.gguf").string()), Error);
  fs::remove_all(dir);
}

TEST(Gguf, MissingKeysAndTensorsAreNamed) {
  const GgufFile g = GgufFile::parse(sample_file());
  try {
    g.get_string("llama.context_length");  // exists, but is not a string
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'llama.context_length' is not a string"),
              std::string::npos)
        << e.what();
  }
  try {
    g.tensor("nope");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor named 'nope'"), std::string::npos);
  }
  try {
    GgufFile::open("/nonexistent/model.gguf");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io_error);
  }
}

}  // namespace
}  // namespace nibble::llm
