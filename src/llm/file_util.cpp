#include "llm/file_util.h"

#include <filesystem>
#include <fstream>

#include "common/check.h"

namespace nibble::llm {

std::vector<uint8_t> read_file_bytes(const std::string& path, const char* who) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f)
    detail::fail(ErrorCode::io_error, std::string(who) + ": " + path + ": cannot open the file");
  const std::streamoff size = f.tellg();
  if (size < 0)
    detail::fail(ErrorCode::io_error, std::string(who) + ": " + path + ": cannot read its size");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  f.seekg(0);
  if (size > 0 && !f.read(reinterpret_cast<char*>(bytes.data()), size))
    detail::fail(ErrorCode::io_error, std::string(who) + ": " + path + ": cannot read the file");
  return bytes;
}

std::string read_text_file(const std::string& path, const char* who) {
  const std::vector<uint8_t> b = read_file_bytes(path, who);
  return std::string(b.begin(), b.end());
}

bool file_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

}  // namespace nibble::llm
