#include "convert.h"

#include <memory>
#include <optional>

namespace nibble::python {

namespace {

namespace dl = nb::dlpack;

// The nibble dtype an array element type stands for, if any.
std::optional<DType> natural_dtype(dl::dtype t) {
  if (t.lanes != 1) return std::nullopt;
  switch (static_cast<dl::dtype_code>(t.code)) {
    case dl::dtype_code::Float:
      if (t.bits == 32) return DType::f32;
      if (t.bits == 16) return DType::f16;
      if (t.bits == 64) return DType::f64;
      break;
    case dl::dtype_code::Bfloat:
      if (t.bits == 16) return DType::bf16;
      break;
    case dl::dtype_code::Float8_E4M3FN:
      if (t.bits == 8) return DType::e4m3;
      break;
    case dl::dtype_code::Int:
      if (t.bits == 8) return DType::s8;
      if (t.bits == 32) return DType::s32;
      break;
    case dl::dtype_code::UInt:
      if (t.bits == 8) return DType::u8;
      break;
    default: break;
  }
  return std::nullopt;
}

std::string dlpack_dtype_name(dl::dtype t) {
  const char* kind = "code" ;
  switch (static_cast<dl::dtype_code>(t.code)) {
    case dl::dtype_code::Int: kind = "int"; break;
    case dl::dtype_code::UInt: kind = "uint"; break;
    case dl::dtype_code::Float: kind = "float"; break;
    case dl::dtype_code::Bfloat: kind = "bfloat"; break;
    case dl::dtype_code::Bool: kind = "bool"; break;
    case dl::dtype_code::Complex: kind = "complex"; break;
    default: return "DLPack type code " + std::to_string(t.code) + " of " +
                    std::to_string(t.bits) + " bits";
  }
  return kind + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

// An integer array whose elements are the storage of `declared` (same width; 4-bit: bytes).
bool is_container_for(dl::dtype t, DType declared) {
  const bool integer = t.code == static_cast<uint8_t>(dl::dtype_code::Int) ||
                       t.code == static_cast<uint8_t>(dl::dtype_code::UInt);
  const int storage_bits = dtype_bits(declared) == 4 ? 8 : dtype_bits(declared);
  return integer && t.lanes == 1 && t.bits == storage_bits;
}

std::string python_type_name(nb::handle obj) {
  return nb::cast<std::string>(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())))
                                   .attr("__name__"));
}

}  // namespace

void Call::fail(const std::string& arg, const std::string& what) const {
  throw Error(ErrorCode::invalid_argument,
              std::string("nibble::") + function_ + ": argument '" + arg + "' " + what);
}

TensorView Call::input(nb::handle obj, const std::string& arg) { return view(obj, arg, false); }
TensorView Call::output(nb::handle obj, const std::string& arg) { return view(obj, arg, true); }

TensorView Call::view(nb::handle obj, const std::string& arg, bool writable) {
  if (obj.is_none()) return TensorView{};
  nb::handle array = obj;
  std::optional<DType> declared;
  if (nb::isinstance<nb::tuple>(obj)) {
    const nb::tuple pair = nb::borrow<nb::tuple>(obj);
    if (pair.size() != 2 || !nb::isinstance<nb::str>(pair[1]))
      fail(arg, "must be an array or a pair (array, dtype name)");
    array = pair[0];
    declared = parse_dtype(nb::cast<std::string>(pair[1]));
  }

  // The array's own description, imported without copying or converting.
  const void* data = nullptr;
  dl::dtype type;
  int32_t device_type = 0, device_id = 0;
  std::vector<int64_t> shape, strides;
  const auto describe = [&](const auto& nd) {
    data = nd.data();
    type = nd.dtype();
    device_type = nd.device_type();
    device_id = nd.device_id();
    for (size_t d = 0; d < nd.ndim(); ++d) {
      shape.push_back(static_cast<int64_t>(nd.shape(d)));
      strides.push_back(nd.stride(d));
    }
  };
  if (writable) {
    nb::ndarray<> nd;
    if (!nb::try_cast(array, nd, false)) {
      nb::ndarray<nb::ro> readonly;
      if (nb::try_cast(array, readonly, false)) fail(arg, "is an output and must be writable");
      throw nb::type_error((std::string("nibble::") + function_ + ": argument '" + arg +
                            "' must be an array (DLPack or buffer protocol: numpy, torch, "
                            "cupy), got " + python_type_name(array))
                               .c_str());
    }
    describe(nd);
    outputs_.push_back(std::move(nd));
  } else {
    nb::ndarray<nb::ro> nd;
    if (!nb::try_cast(array, nd, false))
      throw nb::type_error((std::string("nibble::") + function_ + ": argument '" + arg +
                            "' must be an array (DLPack or buffer protocol: numpy, torch, "
                            "cupy), got " + python_type_name(array))
                               .c_str());
    describe(nd);
    inputs_.push_back(std::move(nd));
  }

  const std::optional<DType> natural = natural_dtype(type);
  DType dtype;
  if (declared && natural != declared) {
    if (!is_container_for(type, *declared))
      fail(arg, "is declared " + std::string(to_string(*declared)) + ", which an array of " +
                    dlpack_dtype_name(type) + " cannot hold (expected " +
                    (dtype_bits(*declared) == 4 ? std::string("uint8 bytes, two values each")
                                                : "int" + std::to_string(dtype_bits(*declared)) +
                                                      " or uint" +
                                                      std::to_string(dtype_bits(*declared))) +
                    ")");
    dtype = *declared;
  } else if (natural) {
    dtype = *natural;
  } else {
    fail(arg, "has element type " + dlpack_dtype_name(type) +
                  ", which nibble does not take (float32, float16, bfloat16, float8_e4m3fn, "
                  "int8, uint8, int32; other nibble dtypes as a pair (array, dtype))");
  }

  if (shape.size() > static_cast<size_t>(TensorView::kMaxRank))
    fail(arg, "has " + std::to_string(shape.size()) + " dimensions, at most " +
                  std::to_string(TensorView::kMaxRank) + " are supported");
  TensorView v;
  v.data = const_cast<void*>(data);
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    v.shape[d] = shape[d];
    v.strides[d] = strides[d];
  }
  if (dtype_bits(dtype) == 4) {
    // Bytes → nibbles: C/2 byte columns hold C values. A byte-contiguous last dimension is
    // nibble-contiguous; any other stride is doubled (and then rejected by the API's check that
    // 4-bit rows are packed).
    if (v.rank == 0) fail(arg, "is a 4-bit tensor and needs at least one dimension");
    const size_t last = static_cast<size_t>(v.rank - 1);
    for (size_t d = 0; d < last; ++d) v.strides[d] *= 2;
    v.shape[last] *= 2;
    if (v.strides[last] != 1) v.strides[last] *= 2;
  }

  switch (device_type) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: v.device = Device::cpu(); break;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value: v.device = Device::cuda(device_id); break;
    default:
      fail(arg, "lives on DLPack device type " + std::to_string(device_type) +
                    "; nibble takes CPU and CUDA arrays");
  }
  return v;
}

QuantizedWeightView Call::weight(nb::handle obj, const std::string& arg, bool writable) {
  if (!nb::isinstance<nb::tuple>(obj) || nb::len(obj) != 7)
    fail(arg, "must be a quantized weight (format, n, k, q, scales, zeros, group_scales)");
  const nb::tuple t = nb::borrow<nb::tuple>(obj);
  QuantizedWeightView w;
  w.format = parse_weight_format(nb::cast<std::string>(t[0]));
  w.n = nb::cast<int64_t>(t[1]);
  w.k = nb::cast<int64_t>(t[2]);
  const auto buffer = [&](size_t i, const char* field) {
    return view(t[i], arg + "." + field, writable);
  };
  w.q = buffer(3, "q");
  w.scales = buffer(4, "scales");
  w.zeros = buffer(5, "zeros");
  w.group_scales = buffer(6, "group_scales");
  return w;
}

QuantizedActivationView Call::activation(nb::handle obj, const std::string& arg, bool writable) {
  if (!nb::isinstance<nb::tuple>(obj) || nb::len(obj) != 3)
    fail(arg, "must be quantized activations (scheme, q, scales)");
  const nb::tuple t = nb::borrow<nb::tuple>(obj);
  QuantizedActivationView a;
  a.scheme = act_scheme_from_string(nb::cast<std::string>(t[0]));
  a.q = view(t[1], arg + ".q", writable);
  a.scales = view(t[2], arg + ".scales", writable);
  return a;
}

PackedWeightView Call::packed(nb::handle obj, const std::string& arg) {
  if (!nb::isinstance<nb::tuple>(obj) || nb::len(obj) != 12)
    fail(arg, "must be a packed weight (layout, version, format, has_scales, n, k, n_pad, "
              "k_pad, q, scales, group_params, zeros)");
  const nb::tuple t = nb::borrow<nb::tuple>(obj);
  PackedWeightView w;
  w.layout = weight_layout_from_string(nb::cast<std::string>(t[0]));
  w.version = nb::cast<int>(t[1]);
  w.format = parse_weight_format(nb::cast<std::string>(t[2]));
  w.has_scales = nb::cast<bool>(t[3]);
  w.n = nb::cast<int64_t>(t[4]);
  w.k = nb::cast<int64_t>(t[5]);
  w.n_pad = nb::cast<int64_t>(t[6]);
  w.k_pad = nb::cast<int64_t>(t[7]);
  w.q = input(t[8], arg + ".q");
  w.scales = input(t[9], arg + ".scales");
  w.group_params = input(t[10], arg + ".group_params");
  w.zeros = input(t[11], arg + ".zeros");
  return w;
}

ActScheme act_scheme_from_string(std::string_view name) {
  for (ActScheme s : {ActScheme::none, ActScheme::s8_per_token, ActScheme::s8_per_tensor,
                      ActScheme::s4_per_token, ActScheme::e4m3_per_token})
    if (name == to_string(s)) return s;
  throw Error(ErrorCode::invalid_argument,
              "nibble: unknown activation scheme '" + std::string(name) +
                  "' (none, s8_per_token, s8_per_tensor, s4_per_token, e4m3_per_token)");
}

WeightLayout weight_layout_from_string(std::string_view name) {
  return parse_weight_layout(name);
}

Device device_from(std::string_view type, int index) {
  if (type == "cpu") return Device::cpu();
  if (type == "cuda") return Device::cuda(index);
  throw Error(ErrorCode::invalid_argument,
              "nibble: unknown device type '" + std::string(type) + "' (cpu, cuda)");
}

nb::object to_numpy(const Tensor& t) {
  const TensorView& v = t.view();
  dl::dtype type{static_cast<uint8_t>(dl::dtype_code::UInt), 8, 1};
  switch (v.dtype) {
    case DType::f32: type = nb::dtype<float>(); break;
    case DType::f16: type = {static_cast<uint8_t>(dl::dtype_code::Float), 16, 1}; break;
    case DType::bf16: type = nb::dtype<uint16_t>(); break;
    case DType::s8: type = nb::dtype<int8_t>(); break;
    case DType::s32: type = nb::dtype<int32_t>(); break;
    case DType::f64: type = nb::dtype<double>(); break;
    case DType::e4m3:
    case DType::u8:
    case DType::s4:
    case DType::u4: type = nb::dtype<uint8_t>(); break;
  }
  std::vector<size_t> shape(static_cast<size_t>(v.rank));
  for (int d = 0; d < v.rank; ++d) shape[static_cast<size_t>(d)] = static_cast<size_t>(v.size(d));
  if (dtype_bits(v.dtype) == 4 && v.rank > 0) shape.back() /= 2;
  // The capsule holds a copy of the Tensor, which shares (and so keeps alive) its storage.
  auto* holder = new Tensor(t);
  nb::capsule owner(holder, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  nb::ndarray<nb::numpy> array(v.data, shape.size(), shape.data(), owner, nullptr, type,
                               nb::device::cpu::value);
  return array.cast();
}

void register_errors(nb::module_& m) {
  // Python classes per ErrorCode; each is also the matching builtin (ValueError, ...), so code
  // that catches builtins keeps working.
  static PyObject* base = nullptr;
  static PyObject* by_code[8] = {};
  const auto make = [&](const char* name, const char* doc, PyObject* bases) {
    PyObject* cls =
        PyErr_NewExceptionWithDoc((std::string("nibble._C.") + name).c_str(), doc, bases, nullptr);
    if (cls == nullptr) throw nb::python_error();
    m.attr(name) = nb::handle(cls);
    return cls;
  };
  base = make("NibbleError", "Base class of every error raised by nibble's C++ library.",
              PyExc_Exception);
  const auto sub = [&](ErrorCode code, const char* name, const char* doc, PyObject* builtin) {
    nb::object bases = nb::make_tuple(nb::handle(base), nb::handle(builtin));
    by_code[static_cast<int>(code)] = make(name, doc, bases.ptr());
  };
  sub(ErrorCode::invalid_argument, "InvalidArgumentError",
      "A shape, dtype, stride, alignment, device, pointer or value is wrong.", PyExc_ValueError);
  sub(ErrorCode::unsupported, "UnsupportedError",
      "A valid request that this build or device cannot run.", PyExc_NotImplementedError);
  sub(ErrorCode::out_of_range, "OutOfRangeError",
      "A size above a documented limit (e.g. K beyond the int32 accumulation bound).",
      PyExc_ValueError);
  sub(ErrorCode::cuda_error, "CudaError", "The CUDA runtime or a kernel launch failed.",
      PyExc_RuntimeError);
  sub(ErrorCode::io_error, "NibbleIOError", "A file could not be read or written.",
      PyExc_OSError);
  sub(ErrorCode::internal, "InternalError", "A bug in nibble.", PyExc_RuntimeError);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      const int code = static_cast<int>(e.code());
      PyObject* cls = code > 0 && code < 8 && by_code[code] != nullptr ? by_code[code] : base;
      PyErr_SetString(cls, e.what());
    }
  });
}

}  // namespace nibble::python
