#include "nibble/formats.h"

#include <charconv>
#include <vector>

#include "common/check.h"

namespace nibble {

const char* to_string(WeightScheme s) {
  switch (s) {
    case WeightScheme::s4_sym: return "s4_sym";
    case WeightScheme::u4_asym: return "u4_asym";
    case WeightScheme::u4_fzp: return "u4_fzp";
    case WeightScheme::s8_sym: return "s8_sym";
    case WeightScheme::s4_two_level: return "s4_two_level";
  }
  return "?";
}

const char* to_string(ActScheme s) {
  switch (s) {
    case ActScheme::none: return "none";
    case ActScheme::s8_per_token: return "s8_per_token";
    case ActScheme::s8_per_tensor: return "s8_per_tensor";
    case ActScheme::s4_per_token: return "s4_per_token";
    case ActScheme::e4m3_per_token: return "e4m3_per_token";
  }
  return "?";
}

DType default_scale_dtype(WeightScheme s, int group_size) {
  if (s == WeightScheme::s4_two_level) return DType::f32;  // the scale is per channel
  return group_size == 0 ? DType::f32 : DType::bf16;
}

DType weight_value_dtype(WeightScheme s) {
  switch (s) {
    case WeightScheme::s4_sym: return DType::s4;
    case WeightScheme::s8_sym: return DType::s8;
    default: return DType::u4;
  }
}

int weight_qmin(WeightScheme s) {
  switch (s) {
    case WeightScheme::s4_sym: return -8;
    case WeightScheme::s8_sym: return -128;
    default: return 0;
  }
}

int weight_qmax(WeightScheme s) {
  switch (s) {
    case WeightScheme::s4_sym: return 7;
    case WeightScheme::s8_sym: return 127;
    default: return 15;
  }
}

DType act_value_dtype(ActScheme s) {
  switch (s) {
    case ActScheme::none: return DType::f32;
    case ActScheme::s8_per_token:
    case ActScheme::s8_per_tensor: return DType::s8;
    case ActScheme::s4_per_token: return DType::s4;
    case ActScheme::e4m3_per_token: return DType::e4m3;
  }
  return DType::f32;
}

bool is_valid_group_size(int g) { return g == 32 || g == 64 || g == 128 || g == 256; }

namespace {

bool weight_format_ok(const WeightFormat& f) {
  if (f.group_size != 0 && !is_valid_group_size(f.group_size)) return false;
  if (f.scale_dtype != DType::f32 && f.scale_dtype != DType::f16 && f.scale_dtype != DType::bf16)
    return false;
  const bool needs_groups = f.scheme == WeightScheme::u4_asym ||
                            f.scheme == WeightScheme::u4_fzp ||
                            f.scheme == WeightScheme::s4_two_level;
  return !(needs_groups && f.group_size == 0);
}

const char* act_token(ActScheme a) {
  switch (a) {
    case ActScheme::none: return "a16";
    case ActScheme::s8_per_token:
    case ActScheme::s8_per_tensor: return "a8";
    case ActScheme::s4_per_token: return "a4";
    case ActScheme::e4m3_per_token: return "afp8";
  }
  return "?";
}

// Everything after the leading "w4"/"w4a8" token, shared by weight and linear strings.
std::string suffix(const WeightFormat& f, bool omit_w8_pc) {
  std::string s;
  if (f.group_size == 0) {
    if (!(omit_w8_pc && f.scheme == WeightScheme::s8_sym)) s += "_pc";
  } else {
    s += "_g" + std::to_string(f.group_size);
  }
  if (f.scheme == WeightScheme::u4_asym) s += "_asym";
  if (f.scheme == WeightScheme::u4_fzp) s += "_fzp";
  if (f.scheme == WeightScheme::s4_two_level) s += "_2level";
  return s;
}

std::string scale_suffix(const WeightFormat& f) {
  if (f.scale_dtype == default_scale_dtype(f.scheme, f.group_size)) return "";
  return std::string("_s") + to_string(f.scale_dtype);
}

std::vector<std::string_view> split(std::string_view s) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t pos = s.find('_', start);
    parts.push_back(s.substr(start, pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

[[noreturn]] void bad_format(const char* fn, std::string_view s, const std::string& why) {
  detail::fail(ErrorCode::invalid_argument, std::string("nibble::") + fn + ": '" +
                                                std::string(s) + "' is not a valid format: " +
                                                why + " (see docs/formats.md)");
}

// Parses "w4" / "w8" (+ optional activation token) and the underscore-separated options.
struct Parsed {
  WeightFormat weight;
  ActScheme act = ActScheme::none;
  bool has_act = false;
};

Parsed parse_common(const char* fn, std::string_view s) {
  auto parts = split(s);
  std::string_view head = parts[0];
  Parsed p;
  int bits = 0;
  if (head.substr(0, 2) == "w4") bits = 4;
  else if (head.substr(0, 2) == "w8") bits = 8;
  else bad_format(fn, s, "it must start with w4 or w8");
  std::string_view act = head.substr(2);
  if (!act.empty()) {
    p.has_act = true;
    if (act == "a8") p.act = ActScheme::s8_per_token;
    else if (act == "a16") p.act = ActScheme::none;
    else if (act == "a4") p.act = ActScheme::s4_per_token;
    else if (act == "afp8") p.act = ActScheme::e4m3_per_token;
    else bad_format(fn, s, "unknown activation '" + std::string(act) + "' (a8, a16, a4, afp8)");
  }
  p.weight.scheme = bits == 8 ? WeightScheme::s8_sym : WeightScheme::s4_sym;
  p.weight.group_size = -1;  // not given yet
  bool scale_given = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string_view t = parts[i];
    if (t == "pc" && p.weight.group_size == -1) {
      p.weight.group_size = 0;
    } else if (t.size() > 1 && t[0] == 'g' && p.weight.group_size == -1) {
      int g = 0;
      auto [ptr, ec] = std::from_chars(t.data() + 1, t.data() + t.size(), g);
      if (ec != std::errc() || ptr != t.data() + t.size() || !is_valid_group_size(g))
        bad_format(fn, s, "group size must be 32, 64, 128 or 256, got '" + std::string(t) + "'");
      p.weight.group_size = g;
    } else if ((t == "asym" || t == "fzp" || t == "2level") && bits == 4 &&
               p.weight.scheme == WeightScheme::s4_sym) {
      p.weight.scheme = t == "asym"  ? WeightScheme::u4_asym
                        : t == "fzp" ? WeightScheme::u4_fzp
                                     : WeightScheme::s4_two_level;
    } else if (t == "static" && p.act == ActScheme::s8_per_token) {
      p.act = ActScheme::s8_per_tensor;
    } else if ((t == "sf32" || t == "sf16" || t == "sbf16") && !scale_given) {
      p.weight.scale_dtype = parse_dtype(t.substr(1));
      scale_given = true;
    } else {
      bad_format(fn, s, "unexpected or repeated option '" + std::string(t) + "'");
    }
  }
  if (p.weight.group_size == -1) {
    if (bits == 8) p.weight.group_size = 0;  // "w8a8", "w8a16": per channel by default
    else bad_format(fn, s, "4-bit formats need a granularity: _pc or _g<size>");
  }
  if (!scale_given)
    p.weight.scale_dtype = default_scale_dtype(p.weight.scheme, p.weight.group_size);
  if (!weight_format_ok(p.weight))
    bad_format(fn, s, "asymmetric and two-level weights need a group size");
  return p;
}

}  // namespace

std::string to_string(const WeightFormat& f) {
  return std::string(f.scheme == WeightScheme::s8_sym ? "w8" : "w4") + suffix(f, false) +
         scale_suffix(f);
}

std::string to_string(const LinearFormat& f) {
  std::string s = std::string(f.weight.scheme == WeightScheme::s8_sym ? "w8" : "w4") +
                  act_token(f.act) + suffix(f.weight, true);
  if (f.act == ActScheme::s8_per_tensor) s += "_static";
  return s + scale_suffix(f.weight);
}

WeightFormat parse_weight_format(std::string_view s) {
  Parsed p = parse_common("parse_weight_format", s);
  if (p.has_act)
    bad_format("parse_weight_format", s, "a weight format has no activation part");
  return p.weight;
}

LinearFormat parse_linear_format(std::string_view s) {
  Parsed p = parse_common("parse_linear_format", s);
  if (!p.has_act)
    bad_format("parse_linear_format", s, "a linear format names its activations (e.g. w4a8)");
  LinearFormat f{p.weight, p.act};
  if (!is_valid(f))
    bad_format("parse_linear_format", s, "this weights × activations pair is not in the catalogue");
  return f;
}

bool is_valid(const LinearFormat& f) {
  if (!weight_format_ok(f.weight)) return false;
  switch (f.act) {
    case ActScheme::none: return f.weight.scheme != WeightScheme::s4_two_level;
    case ActScheme::s8_per_token:
    case ActScheme::s8_per_tensor:
      return f.weight.scheme == WeightScheme::s4_sym || f.weight.scheme == WeightScheme::s8_sym ||
             f.weight.scheme == WeightScheme::s4_two_level;
    case ActScheme::s4_per_token:
    case ActScheme::e4m3_per_token: return f.weight.scheme == WeightScheme::s4_sym;
  }
  return false;
}

double effective_bits_per_weight(const WeightFormat& f, int64_t k) {
  const double value_bits = dtype_bits(weight_value_dtype(f.scheme));
  const double scale_bits = dtype_bits(f.scale_dtype);
  if (f.per_channel()) return value_bits + scale_bits / static_cast<double>(k);
  const double g = f.group_size;
  switch (f.scheme) {
    case WeightScheme::u4_asym: return value_bits + (scale_bits + 8.0) / g;  // u8 zero
    case WeightScheme::u4_fzp: return value_bits + 2.0 * scale_bits / g;     // float zero
    case WeightScheme::s4_two_level:  // u8 group scale + u8 zero, f32-class channel scale
      return value_bits + 16.0 / g + scale_bits / static_cast<double>(k);
    default: return value_bits + scale_bits / g;
  }
}

int64_t max_int32_accumulation_k(DType a, DType w) {
  auto max_abs = [](DType t) -> int64_t {
    switch (t) {
      case DType::s8: return 128;
      case DType::u8: return 255;
      case DType::s4: return 8;
      case DType::u4: return 15;
      default:
        detail::fail(ErrorCode::invalid_argument,
                     std::string("nibble::max_int32_accumulation_k: not an integer operand "
                                 "dtype: ") + to_string(t));
    }
  };
  return ((int64_t{1} << 31) - 1) / (max_abs(a) * max_abs(w));
}

}  // namespace nibble
