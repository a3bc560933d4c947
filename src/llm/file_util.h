// Reading whole files for the model-file parsers, with errors that name the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace nibble::llm {

/// The read-only bytes of a model file: memory-mapped from a path (the file is not copied into
/// the process; its pages come from the page cache as they are touched, and release() hands
/// pages that were read back, so loading a model does not hold a second copy of it), or owned
/// (a buffer given by the caller: tests, fuzzers).
class FileBytes {
 public:
  /// Maps the file read-only; throws nibble::Error(io_error) "<who>: <path>: cannot ...".
  static FileBytes map(const std::string& path, const char* who);
  explicit FileBytes(std::vector<uint8_t> owned);
  FileBytes() = default;  ///< empty
  FileBytes(FileBytes&& o) noexcept;
  FileBytes& operator=(FileBytes&& o) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  /// Drops the mapped pages wholly inside [offset, offset + n) from the process (a later read
  /// maps them again from the page cache); nothing for owned bytes.
  void release(uint64_t offset, uint64_t n) const;

 private:
  std::vector<uint8_t> owned_;
  void* map_ = nullptr;
  uint64_t map_size_ = 0;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

/// The bytes of a file; throws nibble::Error(io_error) "<who>: <path>: cannot ...".
std::vector<uint8_t> read_file_bytes(const std::string& path, const char* who);
/// The contents of a text file.
std::string read_text_file(const std::string& path, const char* who);
bool file_exists(const std::string& path);

}  // namespace nibble::llm
