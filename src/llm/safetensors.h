// Hugging Face safetensors files: a bounds-checked reader and a writer.
//
// Layout: u64 little-endian header size H; H bytes of JSON, an object mapping each tensor name
// to {"dtype": "F32" | "F16" | "BF16" | "I8" | ..., "shape": [d0, d1, ...] (row-major),
// "data_offsets": [begin, end]} plus an optional "__metadata__" object of string → string; then
// the data section, offsets relative to its start. The reader checks what the format promises
// and a hostile file could break: H within the file and at most kMaxHeaderBytes, strict JSON
// (json.h), known dtypes, non-negative shapes whose byte size is exactly end − begin with no
// overflow, every tensor inside the data section, no two tensors overlapping. A violation is a
// nibble::Error (io_error for truncation, invalid_argument otherwise) naming the file and tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "llm/file_util.h"

namespace nibble::llm {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            ///< as in the file: "F32", "BF16", "I8", ...
  std::vector<int64_t> shape;   ///< row-major, outermost first
  uint64_t begin = 0, end = 0;  ///< byte range in the data section
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // the reference library's cap

  /// Parses a whole file held in memory (it is kept inside the object).
  static SafetensorsFile parse(std::vector<uint8_t> bytes, const std::string& what = "buffer");
  /// Maps the file (llm/file_util.h FileBytes) and parses it.
  static SafetensorsFile open(const std::string& path);

  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The tensor named `name`, or nullptr.
  const SafetensorsTensor* find(const std::string& name) const;
  /// The tensor named `name`; throws naming the file when it is absent.
  const SafetensorsTensor& tensor(const std::string& name) const;
  const std::string& what() const { return what_; }

  /// Values of an F32 / F16 / BF16 / F64 tensor as f32, row-major; a mapped file's pages of the
  /// tensor are released afterwards (each tensor is read once when a model loads).
  std::vector<float> to_f32(const SafetensorsTensor& t) const;
  /// The raw bytes of a tensor (end − begin of them).
  const uint8_t* data(const SafetensorsTensor& t) const;
  /// Releases a mapped file's pages of the tensor once its bytes were copied (FileBytes::release).
  void release(const SafetensorsTensor& t) const;

 private:
  static SafetensorsFile parse_bytes(FileBytes bytes, const std::string& what);

  FileBytes bytes_;
  std::string what_;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

/// Bytes per element of a safetensors dtype name; 0 when the name is unknown.
int safetensors_dtype_bytes(const std::string& dtype);

/// One tensor to write: raw little-endian bytes, row-major.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

/// Writes a safetensors file (tensors in the given order, 8-byte aligned header); throws
/// nibble::Error(io_error) if the file cannot be written.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata);

}  // namespace nibble::llm
