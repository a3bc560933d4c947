#include "llm/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "common/check.h"
#include "llm/file_util.h"
#include "llm/json.h"
#include "nibble/numeric.h"

namespace nibble::llm {

namespace {

[[noreturn]] void fail_file(const std::string& what, const std::string& msg,
                            ErrorCode code = ErrorCode::invalid_argument) {
  detail::fail(code, "nibble::llm::SafetensorsFile: " + what + ": " + msg);
}

void json_string(std::string& out, const std::string& s) { out += json_quote(s); }

}  // namespace

int safetensors_dtype_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  return parse_bytes(FileBytes::map(path, "nibble::llm::SafetensorsFile"), path);
}

SafetensorsFile SafetensorsFile::parse(std::vector<uint8_t> bytes, const std::string& what) {
  return parse_bytes(FileBytes(std::move(bytes)), what);
}

SafetensorsFile SafetensorsFile::parse_bytes(FileBytes bytes, const std::string& what) {
  SafetensorsFile f;
  f.bytes_ = std::move(bytes);
  f.what_ = what;
  const uint64_t size = f.bytes_.size();
  if (size < 8)
    fail_file(what, "truncated: " + std::to_string(size) + " bytes, the header size alone needs 8",
              ErrorCode::io_error);
  uint64_t header_bytes;
  std::memcpy(&header_bytes, f.bytes_.data(), 8);
  if (header_bytes > kMaxHeaderBytes)
    fail_file(what, "header size " + std::to_string(header_bytes) + " exceeds the limit of " +
                        std::to_string(kMaxHeaderBytes) + " bytes");
  if (header_bytes > size - 8)
    fail_file(what,
              "truncated: the header claims " + std::to_string(header_bytes) +
                  " bytes, the file has " + std::to_string(size - 8) + " after the size",
              ErrorCode::io_error);
  f.data_start_ = 8 + header_bytes;
  const uint64_t data_size = size - f.data_start_;
  const Json header = Json::parse(
      std::string_view(reinterpret_cast<const char*>(f.bytes_.data() + 8), header_bytes),
      what + " (header)");
  if (!header.is_object()) fail_file(what, "the header is not a JSON object");
  for (const auto& [name, entry] : header.members()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail_file(what, "__metadata__ is not an object");
      for (const auto& [k, v] : entry.members()) {
        if (!v.is_string()) fail_file(what, "__metadata__ value of '" + k + "' is not a string");
        f.metadata_[k] = v.string();
      }
      continue;
    }
    const std::string ctx = "tensor '" + name + "'";
    if (!entry.is_object()) fail_file(what, ctx + " is not described by an object");
    SafetensorsTensor t;
    t.name = name;
    const Json* dtype = entry.find("dtype");
    const Json* shape = entry.find("shape");
    const Json* offsets = entry.find("data_offsets");
    if (dtype == nullptr || !dtype->is_string()) fail_file(what, ctx + " has no string dtype");
    if (shape == nullptr || !shape->is_array()) fail_file(what, ctx + " has no shape array");
    if (offsets == nullptr || !offsets->is_array() || offsets->items().size() != 2)
      fail_file(what, ctx + " has no data_offsets [begin, end]");
    t.dtype = dtype->string();
    const int elem = safetensors_dtype_bytes(t.dtype);
    if (elem == 0)
      fail_file(what, ctx + " has unknown dtype '" + t.dtype + "'", ErrorCode::unsupported);
    // Element count and byte size, with every product checked against 2^62 (no overflow).
    constexpr uint64_t kLimit = uint64_t{1} << 62;
    uint64_t numel = 1;
    for (const Json& d : shape->items()) {
      if (!d.is_int() || d.integer() < 0)
        fail_file(what, ctx + " has a non-integer or negative dimension");
      const auto dim = static_cast<uint64_t>(d.integer());
      if (dim != 0 && numel > kLimit / dim) fail_file(what, ctx + " has a shape too large");
      numel *= dim;
      t.shape.push_back(d.integer());
    }
    if (numel > kLimit / static_cast<uint64_t>(elem))
      fail_file(what, ctx + " has a shape too large");
    for (const Json& o : offsets->items())
      if (!o.is_int() || o.integer() < 0)
        fail_file(what, ctx + " has a non-integer or negative data offset");
    t.begin = static_cast<uint64_t>(offsets->items()[0].integer());
    t.end = static_cast<uint64_t>(offsets->items()[1].integer());
    if (t.end < t.begin) fail_file(what, ctx + " has data_offsets with end before begin");
    if (t.end - t.begin != numel * static_cast<uint64_t>(elem))
      fail_file(what, ctx + " has " + std::to_string(t.end - t.begin) + " bytes of data, its " +
                          t.dtype + " shape needs " + std::to_string(numel * elem));
    if (t.end > data_size)
      fail_file(what,
                ctx + " (bytes " + std::to_string(t.begin) + ".." + std::to_string(t.end) +
                    ") lies outside the data section of " + std::to_string(data_size) + " bytes",
                ErrorCode::io_error);
    f.tensors_.push_back(std::move(t));
  }
  // No two tensors may share bytes (a file that aliases tensors is malformed).
  std::vector<const SafetensorsTensor*> by_begin;
  for (const auto& t : f.tensors_) by_begin.push_back(&t);
  std::sort(by_begin.begin(), by_begin.end(), [](auto* a, auto* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_begin.size(); ++i)
    if (by_begin[i]->begin < by_begin[i - 1]->end)
      fail_file(what,
                "tensors '" + by_begin[i - 1]->name + "' and '" + by_begin[i]->name + "' overlap");
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const SafetensorsTensor& SafetensorsFile::tensor(const std::string& name) const {
  const SafetensorsTensor* t = find(name);
  if (t == nullptr) fail_file(what_, "no tensor named '" + name + "'");
  return *t;
}

const uint8_t* SafetensorsFile::data(const SafetensorsTensor& t) const {
  return bytes_.data() + data_start_ + t.begin;
}

void SafetensorsFile::release(const SafetensorsTensor& t) const {
  bytes_.release(data_start_ + t.begin, t.end - t.begin);
}

std::vector<float> SafetensorsFile::to_f32(const SafetensorsTensor& t) const {
  const uint8_t* p = data(t);
  const auto n = static_cast<size_t>(t.numel());
  std::vector<float> out(n);
  if (t.dtype == "F32") {
    // An empty vector's data() may be null, and memcpy's pointers must not be, even for 0 bytes.
    if (n != 0) std::memcpy(out.data(), p, n * 4);
  } else if (t.dtype == "F16" || t.dtype == "BF16") {
    const bool bf = t.dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = bf ? bf16_bits_to_f32(h) : f16_bits_to_f32(h);
    }
  } else if (t.dtype == "F64") {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    fail_file(what_,
              "tensor '" + t.name + "' is " + t.dtype +
                  ", not a float type (F32, F16, "
                  "BF16, F64)",
              ErrorCode::unsupported);
  }
  release(t);
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      first = false;
      json_string(h, k);
      h += ':';
      json_string(h, v);
    }
    h += '}';
  }
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    if (h.size() > 1) h += ',';
    json_string(h, t.name);
    h += ":{\"dtype\":";
    json_string(h, t.dtype);
    h += ",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i > 0) h += ',';
      h += std::to_string(t.shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(offset) + "," +
         std::to_string(offset + t.bytes.size()) + "]}";
    offset += t.bytes.size();
  }
  h += '}';
  while ((8 + h.size()) % 8 != 0) h += ' ';  // the data section starts 8-byte aligned
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& t : tensors)
    f.write(reinterpret_cast<const char*>(t.bytes.data()),
            static_cast<std::streamsize>(t.bytes.size()));
  if (!f) detail::fail(ErrorCode::io_error, "nibble::llm::write_safetensors: cannot write " + path);
}

}  // namespace nibble::llm
