#include "llm/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include "common/check.h"

namespace nibble::llm {

FileBytes FileBytes::map(const std::string& path, const char* who) {
  auto fail = [&](const char* what) {
    detail::fail(ErrorCode::io_error, std::string(who) + ": " + path + ": " + what);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open the file");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("cannot read its size (not a regular file?)");
  }
  FileBytes b;
  b.size_ = static_cast<uint64_t>(st.st_size);
  if (b.size_ == 0) {  // mmap of nothing fails; an empty file is an empty buffer
    ::close(fd);
    b.data_ = b.owned_.data();
    return b;
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(b.size_), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) fail("cannot map the file");
  b.map_ = p;
  b.map_size_ = b.size_;
  b.data_ = static_cast<const uint8_t*>(p);
  return b;
}

FileBytes::FileBytes(std::vector<uint8_t> owned)
    : owned_(std::move(owned)), data_(owned_.data()), size_(owned_.size()) {}

FileBytes::FileBytes(FileBytes&& o) noexcept { *this = std::move(o); }

FileBytes& FileBytes::operator=(FileBytes&& o) noexcept {
  if (this == &o) return *this;
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(map_size_));
  owned_ = std::move(o.owned_);
  map_ = std::exchange(o.map_, nullptr);
  map_size_ = std::exchange(o.map_size_, 0);
  size_ = std::exchange(o.size_, 0);
  data_ = map_ != nullptr ? static_cast<const uint8_t*>(map_) : owned_.data();
  o.data_ = nullptr;
  return *this;
}

FileBytes::~FileBytes() {
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(map_size_));
}

void FileBytes::release(uint64_t offset, uint64_t n) const {
  if (map_ == nullptr || offset >= size_) return;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t end = std::min(size_, offset + n);
  const uint64_t first = (offset + page - 1) / page * page, last = end / page * page;
  // Private read-only file pages: MADV_DONTNEED unmaps them; they are re-read if touched again.
  if (last > first)
    ::madvise(static_cast<uint8_t*>(map_) + first, static_cast<size_t>(last - first),
              MADV_DONTNEED);
}

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
