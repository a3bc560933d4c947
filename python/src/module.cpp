// nibble._C — the nanobind module: one thin function per C++ entry point.
//
// Each function converts its Python arguments into views (convert.h), releases the GIL, calls
// the C++ API and returns. No validation, dispatch or arithmetic happens here: the C++ API
// checks every argument and throws nibble::Error, which arrives in Python as the matching
// nibble error class (InvalidArgumentError, UnsupportedError, ...) with the same message.
// Outputs are caller-allocated; the Python package (python/nibble/) allocates them with the
// caller's array library and documents each function (formula, shapes, dtypes).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "convert.h"
#include "nibble/nibble.h"
#include "nibble/quant_algorithms.h"

namespace nb = nanobind;
using nibble::python::Call;
using nibble::python::stream_from;

namespace {

nb::dict weight_format_dict(const nibble::WeightFormat& f) {
  nb::dict d;
  d["name"] = nibble::to_string(f);
  d["scheme"] = nibble::to_string(f.scheme);
  d["group_size"] = f.group_size;
  d["scale_dtype"] = nibble::to_string(f.scale_dtype);
  d["value_dtype"] = nibble::to_string(nibble::weight_value_dtype(f.scheme));
  d["qmin"] = nibble::weight_qmin(f.scheme);
  d["qmax"] = nibble::weight_qmax(f.scheme);
  return d;
}

nb::object spec_tuple(const nibble::BufferSpec& s) {
  if (s.rank == 0) return nb::none();
  nb::object shape = s.rank == 1 ? nb::make_tuple(s.shape[0]) : nb::make_tuple(s.shape[0], s.shape[1]);
  return nb::make_tuple(nibble::to_string(s.dtype), shape);
}

nb::tuple packed_tuple(const nibble::PackedWeight& p) {
  const auto array_or_none = [](const nibble::Tensor& t) {
    return t.defined() ? nibble::python::to_numpy(t) : nb::none();
  };
  return nb::make_tuple(nibble::to_string(p.layout), p.version, nibble::to_string(p.format),
                        p.has_scales, p.n, p.k, p.n_pad, p.k_pad, array_or_none(p.q),
                        array_or_none(p.scales), array_or_none(p.group_params),
                        array_or_none(p.zeros));
}

// Binds `name`(a, w, d, stream) → nibble::gemm_s32, with the weight read by read_w.
template <class ReadW>
void bind_gemm_s32(nb::module_& m, const char* name, ReadW read_w) {
  m.def(
      name,
      [read_w](nb::handle a, nb::handle w, nb::handle d, uintptr_t stream) {
        Call c("gemm_s32");
        const nibble::TensorView av = c.input(a, "a");
        const auto wv = read_w(c, w);
        const nibble::TensorView dv = c.output(d, "d");
        nb::gil_scoped_release release;
        nibble::gemm_s32(av, wv, dv, stream_from(stream));
      },
      nb::arg("a"), nb::arg("w"), nb::arg("d"), nb::arg("stream") = 0);
}

// Binds `name`(a, w, bias, d, stream) → nibble::linear, with the activations and the weight read
// from Python by read_a / read_w (which decide the C++ overload).
template <class ReadA, class ReadW>
void bind_linear(nb::module_& m, const char* name, const char* a_arg, ReadA read_a, ReadW read_w) {
  m.def(
      name,
      [read_a, read_w](nb::handle a, nb::handle w, nb::handle bias, nb::handle d,
                       uintptr_t stream) {
        Call c("linear");
        const auto av = read_a(c, a);
        const auto wv = read_w(c, w);
        const nibble::TensorView bv = c.input(bias, "bias");
        const nibble::TensorView dv = c.output(d, "d");
        nb::gil_scoped_release release;
        nibble::linear(av, wv, bias.is_none() ? nullptr : &bv, dv, stream_from(stream));
      },
      nb::arg(a_arg), nb::arg("w"), nb::arg("bias").none(), nb::arg("d"), nb::arg("stream") = 0);
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "nibble's C++ API, bound with nanobind. Use the `nibble` package, not this module.";
  nibble::python::register_errors(m);

  // ---- build and devices ---------------------------------------------------------------------
  m.def("build_info", [] {
    const nibble::BuildInfo b = nibble::build_info();
    nb::dict d;
    d["version"] = b.version;
    d["cuda"] = b.cuda;
    d["cuda_archs"] = b.cuda_archs;
    d["cuda_runtime"] = b.cuda_runtime;
    d["compiler"] = b.compiler;
    d["build_type"] = b.build_type;
    return d;
  });
  m.def("cuda_device_count", &nibble::cuda_device_count);
  m.def("cuda_unavailable_reason", &nibble::cuda_unavailable_reason);
  m.def("cuda_device_info", [](int ordinal) {
    const nibble::DeviceInfo i = nibble::cuda_device_info(ordinal);
    nb::dict d;
    d["ordinal"] = i.ordinal;
    d["name"] = i.name;
    d["cc_major"] = i.cc_major;
    d["cc_minor"] = i.cc_minor;
    d["sm_count"] = i.sm_count;
    d["l2_bytes"] = i.l2_bytes;
    d["smem_per_block_optin"] = i.smem_per_block_optin;
    d["global_mem_bytes"] = i.global_mem_bytes;
    d["clock_khz"] = i.clock_khz;
    d["mem_clock_khz"] = i.mem_clock_khz;
    d["mem_bus_bits"] = i.mem_bus_bits;
    return d;
  });
  m.def("synchronize", [](const std::string& type, int index) {
    const nibble::Device device = nibble::python::device_from(type, index);
    nb::gil_scoped_release release;
    nibble::synchronize(device);
  });

  // ---- formats -------------------------------------------------------------------------------
  m.def("weight_format", [](const std::string& s) {
    return weight_format_dict(nibble::parse_weight_format(s));
  });
  m.def("linear_format", [](const std::string& s) {
    const nibble::LinearFormat f = nibble::parse_linear_format(s);
    nb::dict d;
    d["name"] = nibble::to_string(f);
    d["weight"] = weight_format_dict(f.weight);
    d["act"] = nibble::to_string(f.act);
    d["act_dtype"] = f.act == nibble::ActScheme::none
                         ? nb::none()
                         : nb::object(nb::str(nibble::to_string(nibble::act_value_dtype(f.act))));
    return d;
  });
  m.def("weight_storage", [](const std::string& format, int64_t n, int64_t k) {
    const nibble::WeightStorage st =
        nibble::weight_storage(nibble::parse_weight_format(format), n, k);
    nb::dict d;
    d["q"] = spec_tuple(st.q);
    d["scales"] = spec_tuple(st.scales);
    d["zeros"] = spec_tuple(st.zeros);
    d["group_scales"] = spec_tuple(st.group_scales);
    return d;
  });
  m.def("effective_bits_per_weight", [](const std::string& format, int64_t k) {
    return nibble::effective_bits_per_weight(nibble::parse_weight_format(format), k);
  });
  m.def("max_int32_accumulation_k", [](const std::string& a, const std::string& w) {
    return nibble::max_int32_accumulation_k(nibble::parse_dtype(a), nibble::parse_dtype(w));
  });

  // ---- quantization --------------------------------------------------------------------------
  m.def("quantize_weight", [](nb::handle w, nb::handle out) {
    Call c("quantize_weight");
    const nibble::TensorView wv = c.input(w, "w");
    const nibble::QuantizedWeightView ov = c.weight(out, "out", true);
    nb::gil_scoped_release release;
    nibble::quantize_weight(wv, ov);
  });
  // GPTQ / AWQ checkpoints: packing from a quantization_config's keys, then one layer's tensors
  // into a w4_g<G>_asym_sf16 weight.
  m.def("int4_packing_of", [](const std::string& quant_method, int64_t bits, int64_t group_size,
                              const std::string& checkpoint_format, const std::string& version,
                              bool zero_point, bool lm_head) {
    nibble::Int4CheckpointConfig c;
    c.quant_method = quant_method;
    c.bits = bits;
    c.group_size = group_size;
    c.checkpoint_format = checkpoint_format;
    c.version = version;
    c.zero_point = zero_point;
    c.lm_head = lm_head;
    return std::string(nibble::to_string(nibble::int4_packing_of(c)));
  });
  m.def("unpack_int4_checkpoint", [](const std::string& packing, nb::handle qweight,
                                     nb::handle qzeros, nb::handle scales, nb::handle g_idx,
                                     nb::handle out) {
    Call c("unpack_int4_checkpoint");
    const nibble::Int4Packing p = nibble::parse_int4_packing(packing);
    const nibble::TensorView qw = c.input(qweight, "qweight");
    const nibble::TensorView qz = c.input(qzeros, "qzeros");
    const nibble::TensorView sc = c.input(scales, "scales");
    const nibble::TensorView gi = c.input(g_idx, "g_idx");
    const nibble::QuantizedWeightView ov = c.weight(out, "out", true);
    nb::gil_scoped_release release;
    nibble::unpack_int4_checkpoint(p, qw, qz, sc, gi, ov);
  }, nb::arg("packing"), nb::arg("qweight"), nb::arg("qzeros"), nb::arg("scales"),
     nb::arg("g_idx").none(), nb::arg("out"));
  // ---- W4A4 granularity (quant_algorithms.h) --------------------------------------------------
  m.def("tensor_core_ratio", &nibble::tensor_core_ratio);
  m.def("w4a4_group_time_factor", &nibble::w4a4_group_time_factor);
  m.def("weight_quantization_error", [](nb::handle w, const std::string& format,
                                        nb::handle input_mean_square) {
    Call c("weight_quantization_error");
    const nibble::TensorView wv = c.input(w, "w");
    const nibble::TensorView mv = c.input(input_mean_square, "input_mean_square");
    if (mv.data != nullptr &&
        (mv.dtype != nibble::DType::f32 || mv.rank != 1 || mv.stride(0) != 1))
      c.fail("input_mean_square", "must be None or a contiguous 1-D float32 array");
    const std::span<const float> ms(static_cast<const float*>(mv.data),
                                    mv.data == nullptr ? 0 : static_cast<size_t>(mv.size(0)));
    nb::gil_scoped_release release;
    return nibble::weight_quantization_error(wv, nibble::parse_weight_format(format), ms);
  }, nb::arg("w"), nb::arg("format"), nb::arg("input_mean_square").none());
  // layers: [(name, n, k, error_per_channel, error_group)] → (choices [(name, group, gain,
  // added_time)], time_vs_per_channel, error, group_factor, describe()).
  m.def("plan_w4a4_granularity",
        [](const std::vector<std::tuple<std::string, int64_t, int64_t, double, double>>& layers,
           int rho, double budget) {
          std::vector<nibble::GranularityLayer> in;
          for (const auto& [name, n, k, e_pc, e_g] : layers) in.push_back({name, n, k, e_pc, e_g});
          const nibble::GranularityPlan p = nibble::plan_w4a4_granularity(in, rho, budget);
          std::vector<std::tuple<std::string, bool, double, double>> out;
          for (const auto& c : p.layers)
            out.emplace_back(c.name, c.group, c.error_gain, c.added_time);
          return std::make_tuple(out, p.time_vs_per_channel, p.error, p.group_factor, p.describe());
        });
  m.def("dequantize_weight", [](nb::handle w, nb::handle out) {
    Call c("dequantize_weight");
    const nibble::QuantizedWeightView wv = c.weight(w, "w", false);
    const nibble::TensorView ov = c.output(out, "out");
    nb::gil_scoped_release release;
    nibble::dequantize_weight(wv, ov);
  });
  // The fusion arguments (None: that step is off), as ActQuantFusion.
  const auto fusion_of = [](Call& c, nb::handle rms_weight, float rms_eps, nb::handle smooth,
                            nb::handle normed) {
    nibble::ActQuantFusion f;
    f.rms_weight = c.input(rms_weight, "fusion.rms_weight");
    f.rms_eps = rms_eps;
    f.smooth = c.input(smooth, "fusion.smooth");
    f.normed = c.output(normed, "fusion.normed");
    return f;
  };
  m.def(
      "quantize_activation",
      [fusion_of](nb::handle x, nb::handle out, uintptr_t stream, nb::handle rms_weight,
                  float rms_eps, nb::handle smooth, nb::handle normed) {
        Call c("quantize_activation");
        const nibble::TensorView xv = c.input(x, "x");
        const nibble::QuantizedActivationView ov = c.activation(out, "out", true);
        const nibble::ActQuantFusion f = fusion_of(c, rms_weight, rms_eps, smooth, normed);
        nb::gil_scoped_release release;
        nibble::quantize_activation(xv, ov, f, stream_from(stream));
      },
      nb::arg("x"), nb::arg("out"), nb::arg("stream") = 0, nb::arg("rms_weight") = nb::none(),
      nb::arg("rms_eps") = 1e-6f, nb::arg("smooth") = nb::none(), nb::arg("normed") = nb::none());
  m.def(
      "quantize_activation_static",
      [fusion_of](nb::handle x, float scale, nb::handle out, uintptr_t stream,
                  nb::handle rms_weight, float rms_eps, nb::handle smooth, nb::handle normed) {
        Call c("quantize_activation_static");
        const nibble::TensorView xv = c.input(x, "x");
        const nibble::QuantizedActivationView ov = c.activation(out, "out", true);
        const nibble::ActQuantFusion f = fusion_of(c, rms_weight, rms_eps, smooth, normed);
        nb::gil_scoped_release release;
        nibble::quantize_activation_static(xv, scale, ov, f, stream_from(stream));
      },
      nb::arg("x"), nb::arg("scale"), nb::arg("out"), nb::arg("stream") = 0,
      nb::arg("rms_weight") = nb::none(), nb::arg("rms_eps") = 1e-6f,
      nb::arg("smooth") = nb::none(), nb::arg("normed") = nb::none());
  m.def("dequantize_activation", [](nb::handle a, nb::handle out) {
    Call c("dequantize_activation");
    const nibble::QuantizedActivationView av = c.activation(a, "a", false);
    const nibble::TensorView ov = c.output(out, "out");
    nb::gil_scoped_release release;
    nibble::dequantize_activation(av, ov);
  });
  m.def("pack_int4", [](nb::handle unpacked, nb::handle packed) {
    Call c("pack_int4");
    const nibble::TensorView u = c.input(unpacked, "unpacked");
    const nibble::TensorView p = c.output(packed, "packed");
    nb::gil_scoped_release release;
    nibble::pack_int4(u, p);
  });
  m.def("unpack_int4", [](nb::handle packed, nb::handle unpacked) {
    Call c("unpack_int4");
    const nibble::TensorView p = c.input(packed, "packed");
    const nibble::TensorView u = c.output(unpacked, "unpacked");
    nb::gil_scoped_release release;
    nibble::unpack_int4(p, u);
  });

  // ---- packed layouts ------------------------------------------------------------------------
  m.def("pack_weight", [](nb::handle w, const std::string& layout) {
    Call c("pack_weight");
    const nibble::QuantizedWeightView wv = c.weight(w, "w", false);
    const nibble::WeightLayout l = nibble::python::weight_layout_from_string(layout);
    nibble::PackedWeight p;
    {
      nb::gil_scoped_release release;
      p = nibble::pack_weight(wv, l, nibble::Device::cpu());
    }
    return packed_tuple(p);
  }, nb::arg("w"), nb::arg("layout") = "w4_mma_k128");
  m.def("packed_layout", [](const std::string& format) {
    const nibble::LinearFormat f = nibble::parse_linear_format(format);
    return nibble::has_packed_layout(f) ? nb::object(nb::str(nibble::to_string(
                                              nibble::packed_layout(f))))
                                        : nb::none();
  });
  m.def("pack_s4_matrix", [](nb::handle w) {
    Call c("pack_s4_matrix");
    const nibble::TensorView wv = c.input(w, "w");
    nibble::PackedWeight p;
    {
      nb::gil_scoped_release release;
      p = nibble::pack_s4_matrix(wv, nibble::Device::cpu());
    }
    return packed_tuple(p);
  });
  m.def("allocate_packed_weight", [](const std::string& format, int64_t n, int64_t k,
                                     const std::string& layout) {
    return packed_tuple(nibble::allocate_packed_weight(
        nibble::parse_weight_format(format), n, k, nibble::Device::cpu(),
        nibble::python::weight_layout_from_string(layout)));
  }, nb::arg("format"), nb::arg("n"), nb::arg("k"), nb::arg("layout") = "w4_mma_k128");
  m.def("w4_mma_k128_index", [](int64_t n, int64_t k, int64_t k_pad) {
    const nibble::NibbleIndex i = nibble::w4_mma_k128_index(n, k, k_pad);
    return nb::make_tuple(i.byte, i.shift);
  });
  m.def("packed_weight_value", [](nb::handle w, int64_t n, int64_t k) {
    Call c("packed_weight_value");
    return nibble::packed_weight_value(c.packed(w, "w"), n, k);
  });
  m.def("describe_layout", [](const std::string& layout) {
    return nibble::describe_layout(nibble::python::weight_layout_from_string(layout));
  });

  // ---- GEMMs ---------------------------------------------------------------------------------
  // Raw integer GEMMs, with a logical or a packed weight.
  bind_gemm_s32(m, "gemm_s32", [](Call& c, nb::handle w) { return c.input(w, "w"); });
  bind_gemm_s32(m, "gemm_s32_packed", [](Call& c, nb::handle w) { return c.packed(w, "w"); });
  // The four linear entry points: quantized or float activations × logical or packed weights.
  const auto quantized_a = [](Call& c, nb::handle a) { return c.activation(a, "a", false); };
  const auto float_x = [](Call& c, nb::handle x) { return c.input(x, "x"); };
  const auto logical_w = [](Call& c, nb::handle w) { return c.weight(w, "w", false); };
  const auto packed_w = [](Call& c, nb::handle w) { return c.packed(w, "w"); };
  bind_linear(m, "linear", "a", quantized_a, logical_w);
  bind_linear(m, "linear_a16", "x", float_x, logical_w);
  bind_linear(m, "linear_packed", "a", quantized_a, packed_w);
  bind_linear(m, "linear_packed_a16", "x", float_x, packed_w);
  m.def("explain", [](const std::string& format, int64_t m_, int64_t n, int64_t k,
                      const std::string& device_type, int index) {
    return nibble::explain(nibble::parse_linear_format(format), m_, n, k,
                           nibble::python::device_from(device_type, index));
  });
}
