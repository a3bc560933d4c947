// GGUF model files (llama.cpp's format): a bounds-checked reader of the header, the metadata
// key/value table and the tensor table, and dequantization of its tensors to f32 (the types of
// llm/ggml_blocks.h: plain floats, Q4_0 .. Q8_0, the K-quants Q2_K .. Q6_K, IQ4_NL, IQ4_XS).
//
// Layout (little-endian): "GGUF", version (u32, 2 or 3), tensor count (u64), metadata count
// (u64); the metadata pairs (string key, u32 type, value); the tensor infos (string name, u32
// n_dims, u64 dims[n_dims] innermost first, u32 ggml type, u64 offset into the data section);
// padding to `general.alignment` (default 32); the data section. Strings are u64 length + bytes.
// Every read is checked against the file size and every count against what the remaining bytes
// can hold, so a malformed or hostile file gets nibble::Error(io_error / invalid_argument), never
// an out-of-bounds read or a huge allocation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "llm/file_util.h"
#include "llm/ggml_blocks.h"

namespace nibble::llm {


/// One metadata value: a scalar, a string, or an array of scalars or strings.
struct GgufValue {
  using Scalar = std::variant<uint64_t, int64_t, double, bool, std::string>;
  Scalar scalar;
  std::vector<Scalar> array;  ///< non-empty (or is_array) for array values
  bool is_array = false;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  ///< innermost (contiguous) dimension first, as in the file
  GgmlType type = GgmlType::f32;
  uint64_t offset = 0;         ///< from the start of the data section (of its shard's file)
  uint64_t nbytes = 0;
  uint32_t shard = 0;          ///< which file of a split model holds it (0: the first)
  uint64_t numel() const;
};

class GgufFile {
 public:
  /// Parses a whole file held in memory (kept inside the object).
  static GgufFile parse(std::vector<uint8_t> bytes, const std::string& what = "buffer");
  /// Maps the file (llm/file_util.h FileBytes) and parses it. A split model (llama.cpp's
  /// gguf-split: "NAME-00001-of-00003.gguf" ..., `split.count` > 1) is opened from its first
  /// shard: the others are found by name and their tensors join the table (metadata comes from
  /// the first).
  static GgufFile open(const std::string& path);

  uint32_t version() const { return version_; }
  /// Bytes of the file, or of all shards of a split model.
  uint64_t file_bytes() const;
  /// Files the model is split into (1 unless split).
  size_t shards() const { return bytes_.size(); }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo& tensor(const std::string& name) const;

  /// Metadata accessors; throw nibble::Error naming the key when it is absent or of another type.
  std::string get_string(const std::string& key) const;
  uint64_t get_uint(const std::string& key) const;
  double get_float(const std::string& key) const;

  /// The tensor's values as f32, in file order (innermost dimension fastest). A mapped file's
  /// pages of the tensor are released afterwards: each tensor is read once when a model loads.
  std::vector<float> dequantize(const GgufTensorInfo& t) const;

 private:
  static GgufFile parse_bytes(FileBytes bytes, const std::string& what);

  std::vector<FileBytes> bytes_;      // one per shard
  std::vector<uint64_t> data_start_;  // where each shard's data section starts
  std::string what_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

}  // namespace nibble::llm
