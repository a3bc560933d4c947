#include "llm/gguf.h"

#include <cstdio>
#include <cstring>
#include <algorithm>
#include <limits>
#include <optional>
#include <thread>

#include "common/check.h"

namespace nibble::llm {

namespace {

[[noreturn]] void fail_file(const std::string& what, const std::string& msg,
                            ErrorCode code = ErrorCode::invalid_argument) {
  detail::fail(code, "nibble::llm::GgufFile: " + what + ": " + msg);
}

// A cursor over the file bytes; every read is checked against what is left.
class Reader {
 public:
  Reader(const FileBytes& bytes, const std::string& what) : b_(bytes), what_(what) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return b_.size() - pos_; }

  void need(uint64_t n, const std::string& field) const {
    if (n > left())
      fail_file(what_, "truncated while reading " + field + " at byte " + std::to_string(pos_) +
                           ": " + std::to_string(n) + " bytes needed, " + std::to_string(left()) +
                           " left",
                ErrorCode::io_error);
  }

  template <class T>
  T read(const std::string& field) {
    need(sizeof(T), field);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string string(const std::string& field) {
    const uint64_t n = read<uint64_t>(field + " length");
    need(n, field);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  const FileBytes& b_;
  const std::string& what_;
  uint64_t pos_ = 0;
};

enum ValueType : uint32_t {
  kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64
};

// Smallest encoding of one element of a type, to bound array counts by the bytes left.
uint64_t min_size(uint32_t type) {
  switch (type) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    default: return 8;  // u64, i64, f64, string (its length field)
  }
}

GgufValue::Scalar read_scalar(Reader& r, uint32_t type, const std::string& field,
                              const std::string& what) {
  switch (type) {
    case kU8: return uint64_t{r.read<uint8_t>(field)};
    case kI8: return int64_t{r.read<int8_t>(field)};
    case kU16: return uint64_t{r.read<uint16_t>(field)};
    case kI16: return int64_t{r.read<int16_t>(field)};
    case kU32: return uint64_t{r.read<uint32_t>(field)};
    case kI32: return int64_t{r.read<int32_t>(field)};
    case kF32: return double{r.read<float>(field)};
    case kBool: {
      const uint8_t v = r.read<uint8_t>(field);
      if (v > 1) fail_file(what, field + " is a bool with value " + std::to_string(v));
      return v == 1;
    }
    case kString: return r.string(field);
    case kU64: return r.read<uint64_t>(field);
    case kI64: return r.read<int64_t>(field);
    case kF64: return r.read<double>(field);
    default:
      fail_file(what, field + " has unknown value type " + std::to_string(type));
  }
}

}  // namespace

uint64_t GgufTensorInfo::numel() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  return n;
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile g = parse_bytes(FileBytes::map(path, "nibble::llm::GgufFile"), path);
  auto it = g.metadata_.find("split.count");
  if (it == g.metadata_.end()) return g;
  const auto* count = std::get_if<uint64_t>(&it->second.scalar);
  if (count == nullptr || *count == 0 || *count > 9999)
    fail_file(path, "split.count must be an unsigned count of shards up to 9999");
  if (*count == 1) return g;
  // "<base>-00001-of-00003.gguf": the other shards differ in the first number only.
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", 1, static_cast<int>(*count));
  if (path.size() < std::strlen(suffix) ||
      path.compare(path.size() - std::strlen(suffix), std::string::npos, suffix) != 0)
    fail_file(path, "a split model opens from its first shard, named <name>" +
                        std::string(suffix));
  const std::string base = path.substr(0, path.size() - std::strlen(suffix));
  for (uint64_t i = 1; i < *count; ++i) {
    std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", static_cast<int>(i + 1),
                  static_cast<int>(*count));
    const std::string shard_path = base + suffix;
    GgufFile shard = parse_bytes(FileBytes::map(shard_path, "nibble::llm::GgufFile"), shard_path);
    const auto no = shard.metadata_.find("split.no");
    const auto* n = no == shard.metadata_.end() ? nullptr : std::get_if<uint64_t>(&no->second.scalar);
    if (n == nullptr || *n != i)
      fail_file(shard_path, "split.no is not " + std::to_string(i) + " (shard " +
                                std::to_string(i + 1) + " of " + std::to_string(*count) + ")");
    const auto shard_index = static_cast<uint32_t>(g.bytes_.size());
    for (GgufTensorInfo& t : shard.tensors_) {
      for (const GgufTensorInfo& have : g.tensors_)
        if (have.name == t.name)
          fail_file(shard_path, "tensor '" + t.name + "' is in two shards");
      t.shard = shard_index;
      g.tensors_.push_back(std::move(t));
    }
    g.bytes_.push_back(std::move(shard.bytes_[0]));
    g.data_start_.push_back(shard.data_start_[0]);
  }
  if (auto tc = g.metadata_.find("split.tensors.count"); tc != g.metadata_.end()) {
    const auto* u = std::get_if<uint64_t>(&tc->second.scalar);
    const auto* s = std::get_if<int64_t>(&tc->second.scalar);
    const int64_t want = u != nullptr ? static_cast<int64_t>(*u) : s != nullptr ? *s : -1;
    if (want != static_cast<int64_t>(g.tensors_.size()))
      fail_file(path, "the shards hold " + std::to_string(g.tensors_.size()) +
                          " tensors, split.tensors.count says " + std::to_string(want));
  }
  return g;
}

GgufFile GgufFile::parse(std::vector<uint8_t> bytes, const std::string& what) {
  return parse_bytes(FileBytes(std::move(bytes)), what);
}

GgufFile GgufFile::parse_bytes(FileBytes bytes, const std::string& what) {
  GgufFile g;
  g.bytes_.push_back(std::move(bytes));
  g.what_ = what;
  Reader r(g.bytes_[0], g.what_);
  if (r.read<uint32_t>("magic") != 0x46554747u)  // "GGUF" little-endian
    fail_file(what, "not a GGUF file (the first 4 bytes are not \"GGUF\")");
  g.version_ = r.read<uint32_t>("version");
  if (g.version_ != 2 && g.version_ != 3)
    fail_file(what, "GGUF version " + std::to_string(g.version_) + " is not supported (2 or 3)");
  const uint64_t n_tensors = r.read<uint64_t>("tensor count");
  const uint64_t n_kv = r.read<uint64_t>("metadata count");
  // Each pair and each tensor info takes at least 12 bytes: reject counts the file cannot hold.
  if (n_kv > r.left() / 12 || n_tensors > r.left() / 12)
    fail_file(what, "counts (" + std::to_string(n_kv) + " metadata, " + std::to_string(n_tensors) +
                        " tensors) exceed what the file can hold");
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = r.string("metadata key " + std::to_string(i));
    const uint32_t type = r.read<uint32_t>("type of " + key);
    GgufValue v;
    if (type == kArray) {
      v.is_array = true;
      const uint32_t et = r.read<uint32_t>("element type of " + key);
      if (et == kArray) fail_file(what, key + " is an array of arrays, which is not supported");
      const uint64_t count = r.read<uint64_t>("length of " + key);
      if (count > r.left() / min_size(et))
        fail_file(what, key + " claims " + std::to_string(count) +
                            " elements, more than the file can hold");
      v.array.reserve(static_cast<size_t>(count));
      for (uint64_t j = 0; j < count; ++j) v.array.push_back(read_scalar(r, et, key, what));
    } else {
      v.scalar = read_scalar(r, type, key, what);
    }
    if (!g.metadata_.emplace(key, std::move(v)).second)
      fail_file(what, "metadata key '" + key + "' appears twice");
  }
  uint64_t alignment = 32;
  if (auto it = g.metadata_.find("general.alignment"); it != g.metadata_.end()) {
    const auto* a = std::get_if<uint64_t>(&it->second.scalar);
    if (a == nullptr || *a == 0 || (*a & (*a - 1)) != 0 || *a > 65536)
      fail_file(what, "general.alignment must be a power of two up to 65536");
    alignment = *a;
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = r.string("tensor name " + std::to_string(i));
    const uint32_t n_dims = r.read<uint32_t>("dimension count of " + t.name);
    if (n_dims == 0 || n_dims > 4)
      fail_file(what, "tensor '" + t.name + "' has " + std::to_string(n_dims) +
                          " dimensions (1 to 4 expected)");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = r.read<uint64_t>("dimensions of " + t.name);
      if (dim == 0 || dim > (uint64_t{1} << 40) || numel > (uint64_t{1} << 40) / dim)
        fail_file(what, "tensor '" + t.name + "' has an invalid or too large shape");
      numel *= dim;
      t.dims.push_back(dim);
    }
    const uint32_t type = r.read<uint32_t>("type of " + t.name);
    const std::optional<GgmlType> known = ggml_type_from_id(type);
    if (!known)
      fail_file(what, "tensor '" + t.name + "' has ggml type " + std::to_string(type) +
                          ", not one of " + supported_ggml_types(), ErrorCode::unsupported);
    t.type = *known;
    if (t.dims[0] % ggml_block_elems(t.type) != 0)
      fail_file(what, "tensor '" + t.name + "' has a first dimension that is not a multiple of " +
                          std::to_string(ggml_block_elems(t.type)) + " for " + to_string(t.type));
    t.nbytes = numel / ggml_block_elems(t.type) * ggml_block_bytes(t.type);
    t.offset = r.read<uint64_t>("offset of " + t.name);
    if (t.offset % alignment != 0)
      fail_file(what, "tensor '" + t.name + "' is not aligned to " + std::to_string(alignment));
    g.tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  g.data_start_.push_back(data_start);
  const uint64_t size = g.bytes_[0].size();
  const uint64_t data_size = size > data_start ? size - data_start : 0;
  for (const auto& t : g.tensors_)
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail_file(what, "tensor '" + t.name + "' (" + std::to_string(t.nbytes) + " bytes at offset " +
                          std::to_string(t.offset) + ") lies outside the data section of " +
                          std::to_string(data_size) + " bytes",
                ErrorCode::io_error);
  return g;
}

uint64_t GgufFile::file_bytes() const {
  uint64_t n = 0;
  for (const FileBytes& b : bytes_) n += b.size();
  return n;
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return t;
  fail_file(what_, "no tensor named '" + name + "'");
}

namespace {
template <class T>
const T& metadata_as(const std::map<std::string, GgufValue>& m, const std::string& key,
                     const std::string& what, const char* type) {
  auto it = m.find(key);
  if (it == m.end()) fail_file(what, "metadata key '" + key + "' is missing");
  const T* v = it->second.is_array ? nullptr : std::get_if<T>(&it->second.scalar);
  if (v == nullptr) fail_file(what, "metadata key '" + key + "' is not " + type);
  return *v;
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  return metadata_as<std::string>(metadata_, key, what_, "a string");
}

uint64_t GgufFile::get_uint(const std::string& key) const {
  return metadata_as<uint64_t>(metadata_, key, what_, "an unsigned integer");
}

double GgufFile::get_float(const std::string& key) const {
  return metadata_as<double>(metadata_, key, what_, "a float");
}

std::vector<float> GgufFile::dequantize(const GgufTensorInfo& t) const {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  const uint64_t blocks = t.numel() / ggml_block_elems(t.type);
  const uint8_t* src = bytes_[t.shard].data() + data_start_[t.shard] + t.offset;
  auto decode = [&](uint64_t first, uint64_t last) {
    dequantize_ggml_blocks(t.type, src + first * ggml_block_bytes(t.type), last - first,
                           out.data() + first * ggml_block_elems(t.type));
  };
  // Blocks decode independently: a large tensor is split over the cores (a Llama-3-8B layer
  // holds 10^7–10^8 weights); small ones are not worth a thread.
  const uint64_t threads =
      t.numel() < (uint64_t{1} << 20) ? 1 : std::max(1u, std::thread::hardware_concurrency());
  if (threads == 1) {
    decode(0, blocks);
  } else {
    std::vector<std::thread> pool;
    for (uint64_t i = 0; i < threads; ++i)
      pool.emplace_back(decode, blocks * i / threads, blocks * (i + 1) / threads);
    for (std::thread& th : pool) th.join();
  }
  bytes_[t.shard].release(data_start_[t.shard] + t.offset, t.nbytes);
  return out;
}

}  // namespace nibble::llm
