#include "llm/model_files.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/check.h"
#include "llm/file_util.h"
#include "llm/gguf.h"
#include "llm/json.h"
#include "llm/linear.h"
#include "llm/safetensors.h"
#include "nibble/nibble.h"

namespace nibble::llm {

namespace {

[[noreturn]] void fail_model(const std::string& msg, ErrorCode code = ErrorCode::invalid_argument) {
  detail::fail(code, "nibble::llm::open_model: " + msg);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

void check_shape(const std::string& what, const std::string& name, const std::vector<int64_t>& got,
                 std::initializer_list<int64_t> want) {
  if (!std::equal(got.begin(), got.end(), want.begin(), want.end()))
    fail_model(what + ": tensor '" + name + "' has shape " + shape_str(got) +
               ", the config needs " + shape_str(std::vector<int64_t>(want)));
}

// Which layer and role a canonical name has: "blk.3.attn_q.weight" → (3, "attn_q").
bool is_q_or_k(const std::string& name, bool& is_q) {
  const bool q = name.size() > 14 && name.compare(name.size() - 14, 14, ".attn_q.weight") == 0;
  const bool k = name.size() > 14 && name.compare(name.size() - 14, 14, ".attn_k.weight") == 0;
  is_q = q;
  return q || k;
}

class GgufSource final : public WeightSource {
 public:
  GgufSource(GgufFile g, const ModelConfig& c) : g_(std::move(g)), c_(c) {}

  bool has(const std::string& name) const override {
    const std::string f = file_name(name);
    for (const auto& t : g_.tensors())
      if (t.name == f) return true;
    return false;
  }

  std::vector<float> load(const std::string& name, std::initializer_list<int64_t> shape) override {
    const GgufTensorInfo& t = g_.tensor(file_name(name));
    std::vector<int64_t> dims;  // GGUF lists the innermost dimension first
    for (auto it = t.dims.rbegin(); it != t.dims.rend(); ++it)
      dims.push_back(static_cast<int64_t>(*it));
    check_shape("GGUF", name, dims, shape);
    std::vector<float> w = g_.dequantize(t);
    bool is_q = false;
    if (c_.arch == "llama" && is_q_or_k(name, is_q))  // Qwen files keep Hugging Face's order
      unpermute_gguf_qk(w, is_q ? c_.n_heads : c_.n_kv_heads, c_.head_dim, c_.dim);
    return w;
  }

  // llama.cpp's phi3 files call the fused gate|up tensor ffn_up (and have no separate up).
  std::string file_name(const std::string& canonical) const {
    if (c_.arch != "phi3") return canonical;
    const std::string gate_up = ".ffn_gate_up.weight", up = ".ffn_up.weight";
    if (canonical.size() > gate_up.size() &&
        canonical.compare(canonical.size() - gate_up.size(), gate_up.size(), gate_up) == 0)
      return canonical.substr(0, canonical.size() - gate_up.size()) + up;
    if (canonical.size() > up.size() &&
        canonical.compare(canonical.size() - up.size(), up.size(), up) == 0)
      return canonical + " (fused into ffn_up)";  // no such tensor: served by FusedPartsSource
    return canonical;
  }

  std::string describe() const override {
    std::map<std::string, int> counts;
    for (const auto& t : g_.tensors()) ++counts[to_string(t.type)];
    std::string s = "GGUF v" + std::to_string(g_.version()) +
                    (g_.shards() > 1 ? " (" + std::to_string(g_.shards()) + " shards)" : "") +
                    ", tensors:";
    for (const auto& [k, v] : counts) s += " " + k + "×" + std::to_string(v);
    return s;
  }

 private:
  GgufFile g_;
  ModelConfig c_;
};

const char* const kQuantParts[] = {"qweight", "scales", "zeros", "group_scales"};

// ---- checkpoints quantized by GPTQ or AWQ tools --------------------------------------------------
// Hugging Face checkpoints made by AutoGPTQ / GPTQModel / optimum (quant_method "gptq") or
// AutoAWQ (quant_method "awq", GEMM packing) store each 4-bit layer as w = s·(q − z) per group:
// nibble's w4a16_g<G>_asym_sf16. They are imported as that format without re-quantizing, by
// nibble::unpack_int4_checkpoint (its header has the layouts); here, config.json's
// quantization_config says which layout and group, and what is refused.
}  // namespace

std::string ImportedQuantization::format() const {
  return "w4a16_g" + std::to_string(group) + "_asym_sf16";
}

Int4Packing ImportedQuantization::packing() const {
  return method == "awq" ? Int4Packing::awq : zero_plus_one ? Int4Packing::gptq : Int4Packing::gptq_v2;
}

ImportedQuantization imported_quantization(std::string_view config_json, const std::string& what) {
  const Json config = Json::parse(config_json, what);
  const Json* q = config.is_object() ? config.find("quantization_config") : nullptr;
  if (q == nullptr || q->is_null()) return {};
  if (!q->is_object()) fail_model(what + ": quantization_config is not an object");
  Int4CheckpointConfig c;
  for (const auto& [key, v] : q->members()) {
    if (v.is_string() && key == "quant_method") c.quant_method = v.string();
    if (v.is_string() && key == "checkpoint_format") c.checkpoint_format = v.string();
    if (v.is_string() && key == "version") c.version = v.string();
    if (v.is_int() && (key == "bits" || key == "w_bit")) c.bits = v.integer();
    if (v.is_int() && (key == "group_size" || key == "q_group_size")) c.group_size = v.integer();
    if (v.is_bool() && key == "zero_point") c.zero_point = v.boolean();
    if (v.is_bool() && key == "lm_head") c.lm_head = v.boolean();
  }
  try {
    const Int4Packing p = int4_packing_of(c);
    ImportedQuantization iq;
    iq.method = p == Int4Packing::awq ? "awq" : "gptq";
    iq.group = c.group_size;
    iq.zero_plus_one = p == Int4Packing::gptq;
    return iq;
  } catch (const Error& e) {
    fail_model(what + ": quantization_config: " + e.what(), e.code());
  }
}

namespace {

// The layer's expected qweight / qzeros / scales shapes divide n by 8 and k by G: a layer these
// do not divide is refused here, naming it, before a shape built from them could mismatch.
void check_imported_shape(const ImportedQuantization& iq, const std::string& name, int64_t n,
                          int64_t k) {
  if (k <= 0 || n <= 0 || k % iq.group != 0 || n % 8 != 0)
    fail_model("'" + name + "': " + iq.method + " layer of " + std::to_string(n) +
               " outputs and " + std::to_string(k) + " inputs: needs outputs a multiple of 8 and "
               "inputs a multiple of the group size " + std::to_string(iq.group));
}

// A block's tensors: the Hugging Face name after "model.layers.N." and the GGUF name after
// "blk.N." (llama.cpp's), both ways.
const std::pair<const char*, const char*> kBlockTensorRoles[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.bias", "attn_output.bias"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},   // Phi-3: q, k, v rows in one tensor
    {"mlp.gate_up_proj.weight", "ffn_gate_up.weight"},  // Phi-3: gate rows, then up rows
};

// Phi-3's fused tensors: which canonical tensor is which row range of which fused one.
struct FusedPart {
  std::string fused;
  int64_t first_row = 0, rows = 0, fused_rows = 0;
};
std::optional<FusedPart> fused_part(const std::string& name, const ModelConfig& c) {
  const size_t dot = name.find('.', 4);
  if (name.rfind("blk.", 0) != 0 || dot == std::string::npos) return std::nullopt;
  const std::string blk = name.substr(0, dot + 1), role = name.substr(dot + 1);
  const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  if (role == "attn_q.weight") return FusedPart{blk + "attn_qkv.weight", 0, qd, qd + 2 * kvd};
  if (role == "attn_k.weight") return FusedPart{blk + "attn_qkv.weight", qd, kvd, qd + 2 * kvd};
  if (role == "attn_v.weight")
    return FusedPart{blk + "attn_qkv.weight", qd + kvd, kvd, qd + 2 * kvd};
  if (role == "ffn_gate.weight")
    return FusedPart{blk + "ffn_gate_up.weight", 0, c.ffn_dim, 2 * c.ffn_dim};
  if (role == "ffn_up.weight")
    return FusedPart{blk + "ffn_gate_up.weight", c.ffn_dim, c.ffn_dim, 2 * c.ffn_dim};
  return std::nullopt;
}

// Serves the canonical q, k, v, gate and up tensors of a file that stores them fused (Phi-3) as
// row ranges of the fused tensors, everything else from the file. The fused tensor read last is
// kept until its last part is served, so q, k and v (loaded in that order) cost one read.
class FusedPartsSource final : public WeightSource {
 public:
  FusedPartsSource(std::unique_ptr<WeightSource> inner, const ModelConfig& c)
      : inner_(std::move(inner)), c_(c) {}

  bool has(const std::string& name) const override {
    if (inner_->has(name)) return true;
    const std::optional<FusedPart> p = fused_part(name, c_);
    return p && inner_->has(p->fused);
  }

  std::vector<float> load(const std::string& name, std::initializer_list<int64_t> shape) override {
    const std::optional<FusedPart> p = fused_part(name, c_);
    if (inner_->has(name) || !p || !inner_->has(p->fused)) return inner_->load(name, shape);
    if (shape.size() != 2 || *shape.begin() != p->rows)
      fail_model("'" + name + "' is asked for with a shape that is not its " +
                 std::to_string(p->rows) + " rows of '" + p->fused + "'");
    const int64_t k = *(shape.begin() + 1);
    if (cached_name_ != p->fused) {
      cached_ = inner_->load(p->fused, {p->fused_rows, k});
      cached_name_ = p->fused;
    }
    const auto first = cached_.begin() + p->first_row * k;
    std::vector<float> part(first, first + p->rows * k);
    if (p->first_row + p->rows == p->fused_rows) {  // the last part (v, up): free the copy
      cached_ = {};
      cached_name_.clear();
    }
    return part;
  }

  std::string describe() const override {
    const bool fused = inner_->has("blk.0.attn_qkv.weight");
    return inner_->describe() + (fused ? " (q|k|v and gate|up fused)" : "");
  }
  std::string quantized_format(const std::string& name) const override {
    return inner_->quantized_format(name);
  }
  QuantizedWeight load_quantized(const std::string& name, int64_t n, int64_t k) override {
    return inner_->load_quantized(name, n, k);
  }

 private:
  std::unique_ptr<WeightSource> inner_;
  ModelConfig c_;
  std::string cached_name_;
  std::vector<float> cached_;
};

// The safetensors dtype a quantized buffer is stored in: 4-bit values as their packed bytes.
std::string stored_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    case DType::s8:
      return "I8";
    default:
      return "U8";  // u8, and s4/u4 packed two per byte
  }
}

class SafetensorsSource final : public WeightSource {
 public:
  explicit SafetensorsSource(std::vector<SafetensorsFile> files,
                             ImportedQuantization imported = {})
      : files_(std::move(files)), imported_(std::move(imported)) {
    if (!imported_.method.empty()) format_ = imported_.format();
    for (size_t f = 0; f < files_.size(); ++f) {
      if (auto it = files_[f].metadata().find("nibble.format"); it != files_[f].metadata().end()) {
        if (!imported_.method.empty())
          fail_model(files_[f].what() + ": a nibble checkpoint whose config.json names a " +
                     imported_.method + " quantization");
        if (!format_.empty() && format_ != it->second)
          fail_model(files_[f].what() + ": shards of different nibble formats");
        format_ = it->second;
        check_weight_mode(format_);
      }
      for (const auto& t : files_[f].tensors()) {
        std::string c = canonical_tensor_name(t.name);
        if (c.empty()) {  // a quantized part "<hf name>.qweight" etc. of a nibble checkpoint?
          const size_t dot = t.name.rfind('.');
          const std::string part = dot == std::string::npos ? "" : t.name.substr(dot + 1);
          bool is_part = false;
          for (const char* q : kQuantParts) is_part = is_part || part == q;
          if (!imported_.method.empty()) is_part = is_part || part == "qzeros" || part == "g_idx";
          if (!is_part) continue;  // e.g. rotary_emb.inv_freq of old checkpoints
          c = canonical_tensor_name(t.name.substr(0, dot) + ".weight");
          if (c.empty()) continue;
          c += ":" + part;
        }
        if (!index_.emplace(c, std::make_pair(f, &t)).second)
          fail_model(files_[f].what() + ": tensor '" + t.name + "' appears twice");
      }
    }
  }

  bool has(const std::string& name) const override {
    return index_.count(name) != 0 || index_.count(name + ":qweight") != 0;
  }

  std::string quantized_format(const std::string& name) const override {
    return !format_.empty() && index_.count(name + ":qweight") ? format_ : "";
  }

  QuantizedWeight load_quantized(const std::string& name, int64_t n, int64_t k) override {
    if (quantized_format(name).empty()) return WeightSource::load_quantized(name, n, k);
    if (!imported_.method.empty()) return load_imported(name, n, k);
    const int64_t kp = padded_k(format_, k);
    QuantizedWeight qw(parse_linear_format(format_).weight, n, kp);
    const Tensor* parts[] = {&qw.q, &qw.scales, &qw.zeros, &qw.group_scales};
    for (int i = 0; i < 4; ++i) {
      const Tensor& buf = *parts[i];
      auto it = index_.find(name + ":" + kQuantParts[i]);
      if (!buf.defined()) {
        if (it != index_.end())
          fail_model("'" + name + "' has a " + kQuantParts[i] + " tensor its format " + format_ +
                     " does not use");
        continue;
      }
      if (it == index_.end())
        fail_model("'" + name + "' lacks its " + std::string(kQuantParts[i]) + " tensor");
      const auto& [f, t] = it->second;
      std::vector<int64_t> want(buf.view().shape.begin(),
                                buf.view().shape.begin() + buf.view().rank);
      if (dtype_bits(buf.view().dtype) == 4) want.back() /= 2;  // stored as packed bytes
      if (t->dtype != stored_dtype(buf.view().dtype) || t->shape != want ||
          static_cast<int64_t>(t->end - t->begin) != buf.nbytes())
        fail_model(files_[f].what() + ": '" + t->name + "' is " + t->dtype + " " +
                   shape_str(t->shape) + ", " + format_ + " with n = " + std::to_string(n) +
                   ", k = " + std::to_string(kp) + " needs " + stored_dtype(buf.view().dtype) +
                   " " + shape_str(want));
      std::memcpy(buf.data(), files_[f].data(*t), static_cast<size_t>(buf.nbytes()));
      files_[f].release(*t);
    }
    return qw;
  }

  std::vector<float> load(const std::string& name, std::initializer_list<int64_t> shape) override {
    auto it = index_.find(name);
    if (it == index_.end() && index_.count(name + ":qweight") != 0)
      fail_model(format_.empty()
                     ? "'" + name + "' is stored quantized (a qweight tensor), but neither "
                       "config.json's quantization_config (gptq, awq) nor the file's nibble.format "
                       "says how"
                     : "'" + name + "' is stored quantized as " + format_ +
                           " and its float weights are not in the checkpoint: run it as " +
                           format_);
    if (it == index_.end()) fail_model("the checkpoint has no tensor for '" + name + "'");
    const auto& [f, t] = it->second;
    check_shape(files_[f].what(), t->name, t->shape, shape);
    return files_[f].to_f32(*t);
  }

  std::string describe() const override {
    std::map<std::string, int> counts;
    for (const auto& [c, ft] : index_) ++counts[ft.second->dtype];
    const std::string quantized =
        format_.empty()             ? ""
        : imported_.method.empty() ? ", pre-quantized nibble " + format_
                                   : ", " + imported_.method + " 4-bit (g" +
                                         std::to_string(imported_.group) + ") imported as " +
                                         format_;
    std::string s = "safetensors (" + std::to_string(files_.size()) + " file" +
                    (files_.size() == 1 ? "" : "s") + ")" + quantized + ", tensors:";
    for (const auto& [k, v] : counts) s += " " + k + "×" + std::to_string(v);
    return s;
  }

 private:
  // The raw int32 / f16 contents of part `part` of `name`, checked to be `dtype` of `shape`.
  template <class T>
  std::vector<T> imported_part(const std::string& name, const char* part, const char* dtype,
                               std::vector<int64_t> shape) {
    auto it = index_.find(name + ":" + part);
    if (it == index_.end())
      fail_model("the " + imported_.method + " checkpoint lacks '" + name + "' " + part);
    const auto& [f, t] = it->second;
    if (t->dtype != dtype || t->shape != shape)
      fail_model(files_[f].what() + ": " + imported_.method + " tensor '" + t->name + "' is " +
                 t->dtype + " " + shape_str(t->shape) + ", expected " + dtype + " " +
                 shape_str(shape));
    std::vector<T> v(static_cast<size_t>(t->end - t->begin) / sizeof(T));
    std::memcpy(v.data(), files_[f].data(*t), v.size() * sizeof(T));
    files_[f].release(*t);
    return v;
  }

  // A GPTQ / AWQ layer (see ImportedQuantization) as the QuantizedWeight of format_ holding the
  // same q, z and s; columns past k (padded_k) stay zero with zero scales.
  QuantizedWeight load_imported(const std::string& name, int64_t n, int64_t k) {
    const int64_t g = imported_.group;
    const bool gptq = imported_.method == "gptq";
    check_imported_shape(imported_, name, n, k);  // before the shapes below divide by them
    const auto qweight = imported_part<uint32_t>(
        name, "qweight", "I32", gptq ? std::vector<int64_t>{k / 8, n} : std::vector<int64_t>{k, n / 8});
    const auto qzeros = imported_part<uint32_t>(name, "qzeros", "I32", {k / g, n / 8});
    const auto scales = imported_part<uint16_t>(name, "scales", "F16", {k / g, n});
    std::vector<int32_t> g_idx;
    if (gptq && index_.count(name + ":g_idx") != 0)
      g_idx = imported_part<int32_t>(name, "g_idx", "I32", {k});
    QuantizedWeight qw(parse_linear_format(format_).weight, n, padded_k(format_, k));
    auto view = [](const auto& v, DType dtype, std::initializer_list<int64_t> shape) {
      return v.empty() ? TensorView{}
                       : TensorView::contiguous(const_cast<void*>(static_cast<const void*>(v.data())),
                                                dtype, shape, Device::cpu());
    };
    try {
      unpack_int4_checkpoint(imported_.packing(),
                             view(qweight, DType::s32, {gptq ? k / 8 : k, gptq ? n : n / 8}),
                             view(qzeros, DType::s32, {k / g, n / 8}),
                             view(scales, DType::f16, {k / g, n}), view(g_idx, DType::s32, {k}),
                             qw.view());
    } catch (const Error& e) {
      fail_model("'" + name + "': " + e.what(), e.code());
    }
    return qw;
  }

  std::vector<SafetensorsFile> files_;
  ImportedQuantization imported_;
  std::string format_;  // nibble.format of a pre-quantized checkpoint, or the imported format
  // canonical name (or "name:part" for quantized parts) → (file, tensor)
  std::map<std::string, std::pair<size_t, const SafetensorsTensor*>> index_;
};

// splitmix64: a fast, well-mixed generator; random weights for an 8B model take seconds.
uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class RandomSource final : public WeightSource {
 public:
  RandomSource(const ModelConfig& c, uint64_t seed) : c_(c), seed_(seed) {}

  bool has(const std::string& name) const override {
    return name != "output.weight" || !c_.tied_embeddings;
  }

  std::vector<float> load(const std::string& name, std::initializer_list<int64_t> shape) override {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> w(static_cast<size_t>(n));
    const bool bias = name.ends_with(".bias");
    if (shape.size() == 1 && !bias) {  // norm weights: ones, as at initialization
      std::fill(w.begin(), w.end(), 1.0f);
      return w;
    }
    // Uniform in [-a, a] with variance 1/K (a = sqrt(3/K)) keeps each layer's output O(1);
    // embedding rows get unit variance; biases (which zeros would not test) are uniform in
    // [-0.5, 0.5], the size of a trained model's.
    const int64_t k = bias ? 0 : *(shape.begin() + 1);
    const bool embedding = name == "token_embd.weight";
    const double a = bias        ? 0.5
                     : embedding ? std::sqrt(3.0)
                                 : std::sqrt(3.0 / static_cast<double>(k));
    uint64_t s = seed_;
    for (const char ch : name) s = (s ^ static_cast<uint8_t>(ch)) * 0x100000001B3ull;  // FNV-1a
    for (auto& x : w) {
      const double u = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;  // [0, 1)
      x = static_cast<float>((2.0 * u - 1.0) * a);
    }
    return w;
  }

  std::string describe() const override {
    return "random weights (seed " + std::to_string(seed_) + "; not a trained model)";
  }

  std::optional<uint64_t> random_seed() const override { return seed_; }

 private:
  ModelConfig c_;
  uint64_t seed_;
};

ModelFiles open_hf_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  ModelFiles m;
  m.path = dir.string();
  const fs::path config = dir / "config.json";
  if (!fs::is_regular_file(config))
    fail_model(dir.string() + ": no config.json", ErrorCode::io_error);
  const std::string config_text = read_text_file(config.string(), "nibble::llm::open_model");
  m.config = ModelConfig::from_hf_json(config_text, config.string());
  if (m.config.name.empty()) m.config.name = dir.filename().string();
  // The weight files: one model.safetensors, or the shards of an index.
  std::vector<std::string> shards;
  const fs::path single = dir / "model.safetensors";
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::is_regular_file(single)) {
    shards.push_back(single.string());
  } else if (fs::is_regular_file(index)) {
    const Json j =
        Json::parse(read_text_file(index.string(), "nibble::llm::open_model"), index.string());
    const Json* map = j.is_object() ? j.find("weight_map") : nullptr;
    if (map == nullptr || !map->is_object()) fail_model(index.string() + ": no weight_map object");
    for (const auto& [name, file] : map->members()) {
      if (!file.is_string() || file.string().find('/') != std::string::npos ||
          file.string().empty())
        fail_model(index.string() + ": weight_map['" + name +
                   "'] is not a file name in the directory");
      if (std::find(shards.begin(), shards.end(), (dir / file.string()).string()) == shards.end())
        shards.push_back((dir / file.string()).string());
    }
  } else {
    fail_model(dir.string() + ": neither model.safetensors nor model.safetensors.index.json",
               ErrorCode::io_error);
  }
  std::vector<SafetensorsFile> files;
  for (const auto& s : shards) {
    files.push_back(SafetensorsFile::open(s));
    m.file_bytes += static_cast<int64_t>(fs::file_size(s));
  }
  m.weights = std::make_unique<FusedPartsSource>(
      std::make_unique<SafetensorsSource>(
          std::move(files), imported_quantization(config_text, config.string())),
      m.config);
  if (!m.weights->has("output.weight")) m.config.tied_embeddings = true;
  // The tokenizer, with BOS/EOS ids from config.json (tokenizer.json does not name them).
  const fs::path tok = dir / "tokenizer.json";
  if (fs::is_regular_file(tok)) {
    Tokenizer t = Tokenizer::from_hf_json(read_text_file(tok.string(), "nibble::llm::open_model"),
                                          tok.string());
    const Json cj = Json::parse(config_text, config.string());
    auto id_of = [&](const char* key, int32_t fallback) -> int32_t {
      const Json* v = cj.find(key);
      if (v == nullptr || v->is_null()) return fallback;
      if (v->is_array() && !v->items().empty()) v = &v->items()[0];
      if (!v->is_int() || v->integer() < 0 || v->integer() >= t.vocab_size())
        fail_model(config.string() + ": '" + key + "' is not a token id of the vocabulary");
      return static_cast<int32_t>(v->integer());
    };
    t.set_bos_eos(id_of("bos_token_id", t.bos_id()), id_of("eos_token_id", t.eos_id()),
                  t.add_bos());
    // Every listed EOS ends generation (Llama 3.1: <|end_of_text|>, <|eom_id|>, <|eot_id|>), and
    // so do generation_config.json's.
    auto end_ids = [&](const Json& j, const std::string& what) {
      const Json* v = j.find("eos_token_id");
      if (v == nullptr || v->is_null()) return;
      const std::vector<Json> one = v->is_array() ? std::vector<Json>{} : std::vector<Json>{*v};
      for (const Json& e : v->is_array() ? v->items() : one) {
        if (!e.is_int() || e.integer() < 0 || e.integer() >= t.vocab_size())
          fail_model(what + ": 'eos_token_id' holds a value that is not a token id");
        t.add_end_of_generation(static_cast<int32_t>(e.integer()));
      }
    };
    end_ids(cj, config.string());
    const fs::path gen = dir / "generation_config.json";
    if (fs::is_regular_file(gen))
      end_ids(Json::parse(read_text_file(gen.string(), "nibble::llm::open_model"), gen.string()),
              gen.string());
    // The chat template, to recognise the chat format (tokenizer.chat_format()).
    const fs::path tc = dir / "tokenizer_config.json";
    if (fs::is_regular_file(tc)) {
      const Json j =
          Json::parse(read_text_file(tc.string(), "nibble::llm::open_model"), tc.string());
      if (const Json* ct = j.find("chat_template"); ct != nullptr && ct->is_string())
        t.set_chat_template(ct->string());
    }
    m.tokenizer = std::move(t);
  }
  return m;
}

}  // namespace

QuantizedWeight WeightSource::load_quantized(const std::string& name, int64_t, int64_t) {
  fail_model("'" + name + "' is not stored pre-quantized");
}

void MemorySource::put(const std::string& name, std::vector<int64_t> shape,
                       std::vector<float> data) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  if (count != static_cast<int64_t>(data.size()))
    detail::fail(ErrorCode::internal, "nibble::llm::MemorySource: '" + name +
                                          "' has a shape that does not match its data");
  quantized_.erase(name);
  floats_[name] = {std::move(shape), std::move(data)};
}

void MemorySource::put_quantized(const std::string& name, const std::string& format,
                                 QuantizedWeight qw) {
  floats_.erase(name);
  quantized_[name] = {format, std::move(qw)};
}

std::vector<float>& MemorySource::values(const std::string& name) {
  auto it = floats_.find(name);
  if (it == floats_.end()) fail_model("memory weights: no float tensor '" + name + "'");
  return it->second.data;
}

std::vector<float> MemorySource::load(const std::string& name,
                                      std::initializer_list<int64_t> shape) {
  auto it = floats_.find(name);
  if (it == floats_.end()) fail_model("memory weights: no float tensor '" + name + "'");
  check_shape("memory weights", name, it->second.shape, shape);
  return it->second.data;
}

bool MemorySource::has(const std::string& name) const {
  return floats_.count(name) != 0 || quantized_.count(name) != 0;
}

std::string MemorySource::describe() const {
  std::map<std::string, int> counts;
  for (const auto& [name, q] : quantized_) ++counts[q.first];
  std::string s = "in memory: " + std::to_string(floats_.size()) + " f32 tensors";
  for (const auto& [f, c] : counts) s += ", " + std::to_string(c) + " " + f;
  return s;
}

std::string MemorySource::quantized_format(const std::string& name) const {
  auto it = quantized_.find(name);
  return it == quantized_.end() ? "" : it->second.first;
}

QuantizedWeight MemorySource::load_quantized(const std::string& name, int64_t n, int64_t k) {
  auto it = quantized_.find(name);
  if (it == quantized_.end()) fail_model("'" + name + "' is not stored pre-quantized");
  const QuantizedWeight& qw = it->second.second;
  if (qw.n != n || qw.k != padded_k(it->second.first, k))
    fail_model("memory weights: '" + name + "' is " + std::to_string(qw.n) + "×" +
               std::to_string(qw.k) + ", the model needs " + std::to_string(n) + "×" +
               std::to_string(padded_k(it->second.first, k)));
  return qw;
}

std::string hf_tensor_name(const std::string& c) {
  if (c == "token_embd.weight") return "model.embed_tokens.weight";
  if (c == "output_norm.weight") return "model.norm.weight";
  if (c == "output.weight") return "lm_head.weight";
  if (c.rfind("blk.", 0) != 0) return "";
  const size_t dot = c.find('.', 4);
  if (dot == std::string::npos) return "";
  for (const auto& [hf, gguf] : kBlockTensorRoles)
    if (c.compare(dot + 1, std::string::npos, gguf) == 0)
      return "model.layers." + c.substr(4, dot - 4) + "." + hf;
  return "";
}

void write_nibble_checkpoint(ModelFiles& m, const std::string& format, const std::string& head_mode,
                             const std::string& dir) {
  namespace fs = std::filesystem;
  check_weight_mode(format);
  if (format == "f32" || format == "bf16")
    fail_model("a nibble checkpoint needs a quantized format, not " + format);
  if (head_mode != "f32" && head_mode != "bf16") fail_model("the head format must be f32 or bf16");
  if (!m.tokenizer) fail_model("the model has no tokenizer to write");
  const ModelConfig& c = m.config;
  std::vector<SafetensorsEntry> out;
  // Norm weights stay f32 (the backends use them in f32); embedding and output in head_mode.
  auto floats = [&](const std::string& name, std::initializer_list<int64_t> shape) {
    const std::vector<float> w = m.weights->load(name, shape);
    const bool bf16 = head_mode == "bf16" && shape.size() == 2;
    SafetensorsEntry e{hf_tensor_name(name), bf16 ? "BF16" : "F32", shape, {}};
    if (bf16) {
      e.bytes.resize(w.size() * 2);
      for (size_t i = 0; i < w.size(); ++i) {
        const uint16_t h = f32_to_bf16_bits(w[i]);
        std::memcpy(e.bytes.data() + 2 * i, &h, 2);
      }
    } else {
      e.bytes.resize(w.size() * 4);
      std::memcpy(e.bytes.data(), w.data(), e.bytes.size());
    }
    out.push_back(std::move(e));
  };
  auto quantized = [&](const std::string& name, int64_t n, int64_t k) {
    std::unique_ptr<Linear> lin;
    QuantizedWeight stored;
    if (m.weights->quantized_format(name) == format)
      stored = m.weights->load_quantized(name, n, k);
    else
      lin = make_linear(format, m.weights->load(name, {n, k}), n, k, nullptr);
    const QuantizedWeight& qw = lin ? *lin->quantized() : stored;
    const std::string base = hf_tensor_name(name);
    const std::string stem = base.substr(0, base.size() - 7);  // drop ".weight"
    const Tensor* parts[] = {&qw.q, &qw.scales, &qw.zeros, &qw.group_scales};
    for (int i = 0; i < 4; ++i) {
      const Tensor& buf = *parts[i];
      if (!buf.defined()) continue;
      std::vector<int64_t> shape(buf.view().shape.begin(),
                                 buf.view().shape.begin() + buf.view().rank);
      if (dtype_bits(buf.view().dtype) == 4) shape.back() /= 2;
      const auto* b = static_cast<const uint8_t*>(buf.data());
      out.push_back({stem + "." + kQuantParts[i], stored_dtype(buf.view().dtype), shape,
                     std::vector<uint8_t>(b, b + buf.nbytes())});
    }
  };
  const int64_t d = c.dim, hd = c.head_dim, qd = c.n_heads * hd, kvd = c.n_kv_heads * hd;
  floats("token_embd.weight", {c.vocab_size, d});
  floats("output_norm.weight", {d});
  if (!c.tied_embeddings) floats("output.weight", {c.vocab_size, d});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    floats(p + "attn_norm.weight", {d});
    floats(p + "ffn_norm.weight", {d});
    quantized(p + "attn_q.weight", qd, d);
    quantized(p + "attn_k.weight", kvd, d);
    quantized(p + "attn_v.weight", kvd, d);
    quantized(p + "attn_output.weight", d, qd);
    if (c.qkv_bias) {
      floats(p + "attn_q.bias", {qd});
      floats(p + "attn_k.bias", {kvd});
      floats(p + "attn_v.bias", {kvd});
    }
    if (c.o_bias) floats(p + "attn_output.bias", {d});
    if (c.qk_norm) {
      floats(p + "attn_q_norm.weight", {c.head_dim});
      floats(p + "attn_k_norm.weight", {c.head_dim});
    }
    quantized(p + "ffn_gate.weight", c.ffn_dim, d);
    quantized(p + "ffn_up.weight", c.ffn_dim, d);
    quantized(p + "ffn_down.weight", d, c.ffn_dim);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail_model(dir + ": cannot create the directory", ErrorCode::io_error);
  write_safetensors((fs::path(dir) / "model.safetensors").string(), out,
                    {{"nibble.format", format},
                     {"nibble.version", build_info().version},
                     {"nibble.source", m.path}});
  auto write_text = [&](const char* file, const std::string& text) {
    std::ofstream f(fs::path(dir) / file, std::ios::binary);
    f << text;
    if (!f) fail_model(dir + "/" + file + ": cannot write", ErrorCode::io_error);
  };
  write_text("config.json", c.to_hf_json(m.tokenizer->bos_id(), m.tokenizer->eos_id()));
  write_text("tokenizer.json", m.tokenizer->to_hf_json());
}

void unpermute_gguf_qk(std::vector<float>& w, int64_t heads, int64_t head_dim, int64_t k) {
  if (static_cast<int64_t>(w.size()) != heads * head_dim * k)
    fail_model("Q/K weight of " + std::to_string(w.size()) + " values does not have " +
               std::to_string(heads) + " heads of " + std::to_string(head_dim) + " rows of " +
               std::to_string(k));
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t src = h * head_dim + 2 * i + j, dst = h * head_dim + j * half + i;
        std::copy_n(w.begin() + src * k, k, out.begin() + dst * k);
      }
  w.swap(out);
}

std::string canonical_tensor_name(const std::string& n) {
  if (n == "model.embed_tokens.weight") return "token_embd.weight";
  if (n == "model.norm.weight") return "output_norm.weight";
  if (n == "lm_head.weight") return "output.weight";
  const std::string prefix = "model.layers.";
  if (n.rfind(prefix, 0) != 0) return "";
  const size_t dot = n.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return "";
  const std::string layer = n.substr(prefix.size(), dot - prefix.size());
  for (const char c : layer)
    if (c < '0' || c > '9') return "";
  const std::string role = n.substr(dot + 1);
  for (const auto& [hf, gguf] : kBlockTensorRoles)
    if (role == hf) return "blk." + layer + "." + gguf;
  return "";
}

ModelFiles open_model(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return open_hf_dir(path);
  if (!fs::is_regular_file(path, ec))
    fail_model(path + ": no such file or directory", ErrorCode::io_error);
  if (fs::path(path).filename() == "config.json") return open_hf_dir(fs::path(path).parent_path());
  GgufFile g = GgufFile::open(path);
  ModelFiles m;
  m.path = path;
  m.file_bytes = static_cast<int64_t>(g.file_bytes());
  m.config = ModelConfig::from_gguf(g);
  if (m.config.name.empty()) m.config.name = fs::path(path).stem().string();
  m.tokenizer = Tokenizer::from_gguf(g);
  if (m.tokenizer->vocab_size() != m.config.vocab_size)
    fail_model(path + ": the tokenizer has " + std::to_string(m.tokenizer->vocab_size()) +
               " tokens, the embedding " + std::to_string(m.config.vocab_size));
  m.weights = std::make_unique<FusedPartsSource>(
      std::make_unique<GgufSource>(std::move(g), m.config), m.config);
  return m;
}

ModelFiles random_model(const ModelConfig& config, uint64_t seed) {
  config.validate("random_model");
  ModelFiles m;
  m.config = config;
  m.path = "random weights";
  m.weights = std::make_unique<RandomSource>(m.config, seed);
  return m;
}

ModelFiles random_model(const std::string& arch, uint64_t seed) {
  ModelFiles m = random_model(ModelConfig::preset(arch), seed);
  m.path = "--random-weights --arch " + arch;
  return m;
}

}  // namespace nibble::llm
