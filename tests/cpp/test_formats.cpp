// The format catalogue (src/common/formats.cpp): canonical strings, parsing and its error
// messages, which weights × activations pairs exist, storage cost, and the int32 K limits.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "nibble/nibble.h"
#include "test_util.h"

namespace nibble {
namespace {

using test::throws_error;

constexpr WeightScheme kWeightSchemes[] = {WeightScheme::s4_sym, WeightScheme::u4_asym,
                                           WeightScheme::u4_fzp, WeightScheme::s8_sym,
                                           WeightScheme::s4_two_level};
constexpr ActScheme kActSchemes[] = {ActScheme::none, ActScheme::s8_per_token,
                                     ActScheme::s8_per_tensor, ActScheme::s4_per_token,
                                     ActScheme::e4m3_per_token};
constexpr int kGroupSizes[] = {0, 32, 64, 128, 256};
constexpr DType kScaleDtypes[] = {DType::f32, DType::f16, DType::bf16};

// Every weight format the catalogue defines: granularity and scale dtype over every scheme.
std::vector<WeightFormat> all_weight_formats() {
  std::vector<WeightFormat> out;
  for (WeightScheme s : kWeightSchemes)
    for (int g : kGroupSizes)
      for (DType d : kScaleDtypes) {
        const bool needs_groups = s == WeightScheme::u4_asym || s == WeightScheme::u4_fzp ||
                                  s == WeightScheme::s4_two_level;
        if (!(needs_groups && g == 0)) out.push_back({s, g, d});
      }
  return out;
}

// ---- canonical strings --------------------------------------------------------------------------

using WS = WeightScheme;
using AS = ActScheme;
using DT = DType;

struct LinearGolden {
  const char* name;
  WeightScheme scheme;
  int group_size;
  DType scale_dtype;
  ActScheme act;
};

// The `nibble formats` list (tools/nibble/main.cpp) and the variants formats.h describes.
// clang-format off
const LinearGolden kLinearGolden[] = {
    {"w4a8_pc",                 WS::s4_sym,       0,   DT::f32,  AS::s8_per_token},
    {"w4a8_g128",               WS::s4_sym,       128, DT::bf16, AS::s8_per_token},
    {"w4a8_g128_2level",        WS::s4_two_level, 128, DT::f32,  AS::s8_per_token},
    {"w4afp8_pc",               WS::s4_sym,       0,   DT::f32,  AS::e4m3_per_token},
    {"w4afp8_g128",             WS::s4_sym,       128, DT::bf16, AS::e4m3_per_token},
    {"w8a8",                    WS::s8_sym,       0,   DT::f32,  AS::s8_per_token},
    {"w8a8_static",             WS::s8_sym,       0,   DT::f32,  AS::s8_per_tensor},
    {"w4a16_pc",                WS::s4_sym,       0,   DT::f32,  AS::none},
    {"w4a16_g128",              WS::s4_sym,       128, DT::bf16, AS::none},
    {"w4a16_g128_asym",         WS::u4_asym,      128, DT::bf16, AS::none},
    {"w4a16_g128_fzp",          WS::u4_fzp,       128, DT::bf16, AS::none},
    {"w8a16",                   WS::s8_sym,       0,   DT::f32,  AS::none},
    {"w4a4_pc",                 WS::s4_sym,       0,   DT::f32,  AS::s4_per_token},
    {"w4a4_g128",               WS::s4_sym,       128, DT::bf16, AS::s4_per_token},
    {"w4a8_g32",                WS::s4_sym,       32,  DT::bf16, AS::s8_per_token},
    {"w4a8_g64",                WS::s4_sym,       64,  DT::bf16, AS::s8_per_token},
    {"w4a8_g256",               WS::s4_sym,       256, DT::bf16, AS::s8_per_token},
    {"w4a8_pc_static",          WS::s4_sym,       0,   DT::f32,  AS::s8_per_tensor},
    {"w4a8_g128_2level_static", WS::s4_two_level, 128, DT::f32,  AS::s8_per_tensor},
    {"w4a8_g128_sf16",          WS::s4_sym,       128, DT::f16,  AS::s8_per_token},
    {"w4a8_g128_sf32",          WS::s4_sym,       128, DT::f32,  AS::s8_per_token},
    {"w4a8_pc_sbf16",           WS::s4_sym,       0,   DT::bf16, AS::s8_per_token},
    {"w4a8_g32_2level_sbf16",   WS::s4_two_level, 32,  DT::bf16, AS::s8_per_token},
    {"w8a8_static_sf16",        WS::s8_sym,       0,   DT::f16,  AS::s8_per_tensor},
    {"w8a16_sbf16",             WS::s8_sym,       0,   DT::bf16, AS::none},
    {"w4a16_g64_asym_sf16",     WS::u4_asym,      64,  DT::f16,  AS::none},
    {"w4a16_g256_fzp_sf32",     WS::u4_fzp,       256, DT::f32,  AS::none},
};
// clang-format on

TEST(FormatsStrings, CanonicalLinearStringsParseToTheirFieldsAndBack) {
  for (const LinearGolden& g : kLinearGolden) {
    SCOPED_TRACE(g.name);
    const LinearFormat f = parse_linear_format(g.name);
    EXPECT_EQ(f.weight.scheme, g.scheme);
    EXPECT_EQ(f.weight.group_size, g.group_size);
    EXPECT_EQ(f.weight.scale_dtype, g.scale_dtype);
    EXPECT_EQ(f.act, g.act);
    EXPECT_EQ(to_string(f), g.name);
    EXPECT_TRUE(is_valid(f));
  }
}

TEST(FormatsStrings, CanonicalWeightStringsParseToTheirFieldsAndBack) {
  // clang-format off
  const struct { const char* name; WeightFormat f; } cases[] = {
      {"w4_pc",          {WeightScheme::s4_sym, 0, DType::f32}},
      {"w4_g32",         {WeightScheme::s4_sym, 32, DType::bf16}},
      {"w4_g64",         {WeightScheme::s4_sym, 64, DType::bf16}},
      {"w4_g128",        {WeightScheme::s4_sym, 128, DType::bf16}},
      {"w4_g256",        {WeightScheme::s4_sym, 256, DType::bf16}},
      {"w4_g128_asym",   {WeightScheme::u4_asym, 128, DType::bf16}},
      {"w4_g128_fzp",    {WeightScheme::u4_fzp, 128, DType::bf16}},
      {"w4_g128_2level", {WeightScheme::s4_two_level, 128, DType::f32}},
      {"w8_pc",          {WeightScheme::s8_sym, 0, DType::f32}},
      {"w8_g128",        {WeightScheme::s8_sym, 128, DType::bf16}},
      {"w4_pc_sf16",     {WeightScheme::s4_sym, 0, DType::f16}},
      {"w4_g128_sf32",   {WeightScheme::s4_sym, 128, DType::f32}},
      {"w4_g64_fzp_sf16", {WeightScheme::u4_fzp, 64, DType::f16}},
      {"w4_g128_2level_sbf16", {WeightScheme::s4_two_level, 128, DType::bf16}},
  };
  // clang-format on
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(parse_weight_format(c.name), c.f);
    EXPECT_EQ(to_string(c.f), c.name);
  }
}

TEST(FormatsStrings, EveryWeightFormatRoundTrips) {
  const std::vector<WeightFormat> all = all_weight_formats();
  EXPECT_EQ(all.size(), 66u);  // 5 schemes × 5 granularities × 3 scale dtypes, less 3 × 3
  for (const WeightFormat& f : all) {
    const std::string s = to_string(f);
    SCOPED_TRACE(s);
    EXPECT_EQ(parse_weight_format(s), f);
  }
}

TEST(FormatsStrings, EveryValidLinearFormatRoundTripsAndEveryOtherIsRejected) {
  int valid = 0;
  for (const WeightFormat& w : all_weight_formats())
    for (ActScheme a : kActSchemes) {
      const LinearFormat f{w, a};
      const std::string s = to_string(f);
      SCOPED_TRACE(s);
      if (is_valid(f)) {
        ++valid;
        EXPECT_EQ(parse_linear_format(s), f);
        EXPECT_EQ(to_string(parse_linear_format(s)), s);
      } else {
        EXPECT_TRUE(throws_error([&] { parse_linear_format(s); }, ErrorCode::invalid_argument,
                                 {"nibble::parse_linear_format", "'" + s + "'"}));
      }
    }
  // none: s4_sym, s8_sym, u4_asym, u4_fzp (54); s8 per token / per tensor: s4_sym, s8_sym,
  // two-level (42 each); s4 and fp8 per token: s4_sym (15 each).
  EXPECT_EQ(valid, 54 + 42 + 42 + 15 + 15);
}

TEST(FormatsStrings, ScaleSuffixesSetTheScaleDtypeAndDefaultsAreOmitted) {
  EXPECT_EQ(parse_linear_format("w4a8_g128_sf16").weight.scale_dtype, DType::f16);
  EXPECT_EQ(parse_linear_format("w4a8_g128_sf32").weight.scale_dtype, DType::f32);
  EXPECT_EQ(parse_linear_format("w4a8_pc_sbf16").weight.scale_dtype, DType::bf16);
  // Defaults: f32 per channel and for the two-level channel scale, bf16 per group.
  EXPECT_EQ(default_scale_dtype(WeightScheme::s4_sym, 0), DType::f32);
  EXPECT_EQ(default_scale_dtype(WeightScheme::s8_sym, 0), DType::f32);
  EXPECT_EQ(default_scale_dtype(WeightScheme::s4_sym, 128), DType::bf16);
  EXPECT_EQ(default_scale_dtype(WeightScheme::u4_asym, 32), DType::bf16);
  EXPECT_EQ(default_scale_dtype(WeightScheme::u4_fzp, 256), DType::bf16);
  EXPECT_EQ(default_scale_dtype(WeightScheme::s4_two_level, 128), DType::f32);
  // A suffix naming the default is accepted but not canonical: to_string drops it.
  EXPECT_EQ(to_string(parse_linear_format("w4a8_g128_sbf16")), "w4a8_g128");
  EXPECT_EQ(to_string(parse_linear_format("w4a8_pc_sf32")), "w4a8_pc");
  EXPECT_EQ(to_string(parse_linear_format("w4a8_g128_2level_sf32")), "w4a8_g128_2level");
  EXPECT_EQ(to_string(parse_weight_format("w4_g64_sbf16")), "w4_g64");
  // Other accepted spellings normalise to the canonical string.
  EXPECT_EQ(to_string(parse_linear_format("w8a8_pc")), "w8a8");
  EXPECT_EQ(to_string(parse_weight_format("w8")), "w8_pc");
  EXPECT_EQ(to_string(parse_linear_format("w8a8_sf16_static")), "w8a8_static_sf16");
}

// Each malformed string is rejected with invalid_argument, and the message quotes the string and
// says what is wrong.
TEST(FormatsStrings, MalformedLinearStringsAreRejectedWithTheReason) {
  // clang-format off
  const struct { const char* s; const char* why; } cases[] = {
      {"",                       "must start with w4 or w8"},
      {"x4a8_pc",                "must start with w4 or w8"},
      {"W4A8_PC",                "must start with w4 or w8"},
      {"w2a8_pc",                "must start with w4 or w8"},
      {"w4a9_pc",                "unknown activation 'a9'"},
      {"w4a8x_pc",               "unknown activation 'a8x'"},
      {"w4a8",                   "need a granularity"},
      {"w4a8_asym",              "need a granularity"},
      {"w4a8_g100",              "group size must be 32, 64, 128 or 256, got 'g100'"},
      {"w4a8_g16",               "group size must be 32, 64, 128 or 256, got 'g16'"},
      {"w4a8_gabc",              "group size must be 32, 64, 128 or 256, got 'gabc'"},
      {"w4a8_g128x",             "group size must be 32, 64, 128 or 256, got 'g128x'"},
      {"w4a8_g-128",             "group size must be 32, 64, 128 or 256, got 'g-128'"},
      {"w4a8_g",                 "unexpected or repeated option 'g'"},
      {"w4a8_g128_g64",          "unexpected or repeated option 'g64'"},
      {"w4a8_pc_pc",             "unexpected or repeated option 'pc'"},
      {"w4a8_pc_g128",           "unexpected or repeated option 'g128'"},
      {"w4a8_pc_",               "unexpected or repeated option ''"},
      {"w4a8__pc",               "unexpected or repeated option ''"},
      {"w4a8_pc ",               "unexpected or repeated option 'pc '"},
      {"w8a8_asym",              "unexpected or repeated option 'asym'"},
      {"w4a16_g128_asym_fzp",    "unexpected or repeated option 'fzp'"},
      {"w4a8_pc_static_static",  "unexpected or repeated option 'static'"},
      {"w4a16_pc_static",        "unexpected or repeated option 'static'"},
      {"w4a4_pc_static",         "unexpected or repeated option 'static'"},
      {"w4a8_pc_sf8",            "unexpected or repeated option 'sf8'"},
      {"w4a8_pc_se4m3",          "unexpected or repeated option 'se4m3'"},
      {"w4a8_pc_sf16_sbf16",     "unexpected or repeated option 'sbf16'"},
      {"w4a8_pc_bogus",          "unexpected or repeated option 'bogus'"},
      {"w4a16_pc_asym",          "need a group size"},
      {"w4a16_pc_fzp",           "need a group size"},
      {"w4a8_pc_2level",         "need a group size"},
      {"w4a8_g128_asym",         "not in the catalogue"},
      {"w4a8_g128_fzp",          "not in the catalogue"},
      {"w4a16_g128_2level",      "not in the catalogue"},
      {"w4afp8_g128_2level",     "not in the catalogue"},
      {"w4a4_g128_asym",         "not in the catalogue"},
      {"w8afp8",                 "not in the catalogue"},
      {"w8a4",                   "not in the catalogue"},
      {"w4_pc",                  "names its activations"},
      {"w8_pc",                  "names its activations"},
  };
  // clang-format on
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string("'") + c.s + "'");
    EXPECT_TRUE(throws_error([&] { parse_linear_format(c.s); }, ErrorCode::invalid_argument,
                             {"nibble::parse_linear_format", std::string("'") + c.s + "'",
                              "is not a valid format", c.why}));
  }
}

TEST(FormatsStrings, MalformedWeightStringsAreRejectedWithTheReason) {
  // clang-format off
  const struct { const char* s; const char* why; } cases[] = {
      {"",               "must start with w4 or w8"},
      {"w4",             "need a granularity"},
      {"w4a8_pc",        "has no activation part"},
      {"w8a16",          "has no activation part"},
      {"w4_pc_asym",     "need a group size"},
      {"w4_g100",        "group size must be"},
      {"w4_g128_static", "unexpected or repeated option 'static'"},
      {"w8_g128_2level", "unexpected or repeated option '2level'"},
  };
  // clang-format on
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string("'") + c.s + "'");
    EXPECT_TRUE(throws_error([&] { parse_weight_format(c.s); }, ErrorCode::invalid_argument,
                             {"nibble::parse_weight_format", std::string("'") + c.s + "'", c.why}));
  }
}

TEST(FormatsStrings, SchemeAndDtypeNames) {
  EXPECT_STREQ(to_string(WeightScheme::s4_sym), "s4_sym");
  EXPECT_STREQ(to_string(WeightScheme::u4_asym), "u4_asym");
  EXPECT_STREQ(to_string(WeightScheme::u4_fzp), "u4_fzp");
  EXPECT_STREQ(to_string(WeightScheme::s8_sym), "s8_sym");
  EXPECT_STREQ(to_string(WeightScheme::s4_two_level), "s4_two_level");
  EXPECT_STREQ(to_string(ActScheme::none), "none");
  EXPECT_STREQ(to_string(ActScheme::s8_per_token), "s8_per_token");
  EXPECT_STREQ(to_string(ActScheme::s8_per_tensor), "s8_per_tensor");
  EXPECT_STREQ(to_string(ActScheme::s4_per_token), "s4_per_token");
  EXPECT_STREQ(to_string(ActScheme::e4m3_per_token), "e4m3_per_token");
}

// ---- catalogue properties -----------------------------------------------------------------------

TEST(FormatsCatalogue, IsValidGoldenPairs) {
  const auto w = [](WeightScheme s, int g, DType d = DType::bf16) { return WeightFormat{s, g, d}; };
  // clang-format off
  const struct { LinearFormat f; bool valid; } cases[] = {
      {{w(WeightScheme::s4_sym, 0, DType::f32), ActScheme::s8_per_token}, true},
      {{w(WeightScheme::s4_sym, 128), ActScheme::e4m3_per_token}, true},
      {{w(WeightScheme::s4_sym, 128), ActScheme::s4_per_token}, true},
      {{w(WeightScheme::s8_sym, 0), ActScheme::s8_per_tensor}, true},
      {{w(WeightScheme::s4_two_level, 64), ActScheme::s8_per_token}, true},
      {{w(WeightScheme::u4_asym, 128), ActScheme::none}, true},
      {{w(WeightScheme::u4_fzp, 32), ActScheme::none}, true},
      {{w(WeightScheme::u4_asym, 128), ActScheme::s8_per_token}, false},
      {{w(WeightScheme::u4_fzp, 128), ActScheme::e4m3_per_token}, false},
      {{w(WeightScheme::s4_two_level, 128), ActScheme::none}, false},
      {{w(WeightScheme::s4_two_level, 128), ActScheme::s4_per_token}, false},
      {{w(WeightScheme::s8_sym, 0), ActScheme::s4_per_token}, false},
      {{w(WeightScheme::s8_sym, 0), ActScheme::e4m3_per_token}, false},
      {{w(WeightScheme::u4_asym, 0), ActScheme::none}, false},        // needs a group size
      {{w(WeightScheme::s4_two_level, 0), ActScheme::s8_per_token}, false},
      {{w(WeightScheme::s4_sym, 100), ActScheme::s8_per_token}, false},  // group size
      {{w(WeightScheme::s4_sym, 16), ActScheme::s8_per_token}, false},
      {{w(WeightScheme::s4_sym, -1), ActScheme::s8_per_token}, false},
      {{w(WeightScheme::s4_sym, 128, DType::e4m3), ActScheme::s8_per_token}, false},  // scale dtype
      {{w(WeightScheme::s4_sym, 128, DType::s8), ActScheme::s8_per_token}, false},
  };
  // clang-format on
  for (const auto& c : cases) {
    SCOPED_TRACE(to_string(c.f));
    EXPECT_EQ(is_valid(c.f), c.valid);
  }
  for (int g : {32, 64, 128, 256}) EXPECT_TRUE(is_valid_group_size(g)) << g;
  for (int g : {-128, 0, 1, 16, 31, 96, 100, 512, 1024}) EXPECT_FALSE(is_valid_group_size(g)) << g;
}

TEST(FormatsCatalogue, ValueDtypesAndRanges) {
  EXPECT_EQ(weight_value_dtype(WeightScheme::s4_sym), DType::s4);
  EXPECT_EQ(weight_value_dtype(WeightScheme::s8_sym), DType::s8);
  EXPECT_EQ(weight_value_dtype(WeightScheme::u4_asym), DType::u4);
  EXPECT_EQ(weight_value_dtype(WeightScheme::u4_fzp), DType::u4);
  EXPECT_EQ(weight_value_dtype(WeightScheme::s4_two_level), DType::u4);
  EXPECT_EQ(weight_qmin(WeightScheme::s4_sym), -8);
  EXPECT_EQ(weight_qmax(WeightScheme::s4_sym), 7);
  EXPECT_EQ(weight_qmin(WeightScheme::s8_sym), -128);
  EXPECT_EQ(weight_qmax(WeightScheme::s8_sym), 127);
  for (WeightScheme s : {WeightScheme::u4_asym, WeightScheme::u4_fzp, WeightScheme::s4_two_level}) {
    EXPECT_EQ(weight_qmin(s), 0);
    EXPECT_EQ(weight_qmax(s), 15);
  }
  EXPECT_EQ(act_value_dtype(ActScheme::none), DType::f32);
  EXPECT_EQ(act_value_dtype(ActScheme::s8_per_token), DType::s8);
  EXPECT_EQ(act_value_dtype(ActScheme::s8_per_tensor), DType::s8);
  EXPECT_EQ(act_value_dtype(ActScheme::s4_per_token), DType::s4);
  EXPECT_EQ(act_value_dtype(ActScheme::e4m3_per_token), DType::e4m3);
}

TEST(FormatsCatalogue, EffectiveBitsPerWeightGoldenValues) {
  // All values are dyadic, so the comparisons are exact.
  // clang-format off
  const struct { const char* name; int64_t k; double bits; } cases[] = {
      {"w4_pc",           4096, 4.0 + 32.0 / 4096},     // f32 scale per row
      {"w4_pc",           128,  4.25},
      {"w4_pc_sbf16",     4096, 4.0 + 16.0 / 4096},
      {"w4_g32",          4096, 4.5},                    // bf16 scale per 32
      {"w4_g64",          4096, 4.25},
      {"w4_g128",         4096, 4.125},
      {"w4_g256",         4096, 4.0625},
      {"w4_g128_sf32",    4096, 4.25},
      {"w4_g128_asym",    4096, 4.1875},                 // bf16 scale + u8 zero per 128
      {"w4_g32_asym_sf32", 4096, 5.25},
      {"w4_g128_fzp",     4096, 4.25},                   // bf16 scale + bf16 zero per 128
      {"w4_g128_fzp_sf32", 4096, 4.5},
      {"w4_g128_2level",  4096, 4.125 + 32.0 / 4096},    // u8 g_s + u8 g_z per 128, f32 s_ch
      {"w4_g32_2level",   1024, 4.5 + 32.0 / 1024},
      {"w8_pc",           4096, 8.0 + 32.0 / 4096},
      {"w8_g128",         4096, 8.125},
  };
  // clang-format on
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(effective_bits_per_weight(parse_weight_format(c.name), c.k), c.bits);
  }
}

// The cost formula agrees with the buffers weight_storage() asks for, for every format.
TEST(FormatsCatalogue, EffectiveBitsMatchTheStorageOfEveryFormat) {
  const int64_t n = 16, k = 1024;
  for (const WeightFormat& f : all_weight_formats()) {
    SCOPED_TRACE(to_string(f));
    const WeightStorage st = weight_storage(f, n, k);
    double bits = 0;
    for (const BufferSpec* b : {&st.q, &st.scales, &st.zeros, &st.group_scales}) {
      if (b->rank == 0) continue;
      const int64_t count = b->rank == 1 ? b->shape[0] : b->shape[0] * b->shape[1];
      bits += static_cast<double>(count) * dtype_bits(b->dtype);
    }
    EXPECT_EQ(effective_bits_per_weight(f, k), bits / static_cast<double>(n * k));
  }
}

TEST(FormatsCatalogue, MaxInt32AccumulationKGoldenValues) {
  EXPECT_EQ(max_int32_accumulation_k(DType::s8, DType::s8), 131071);
  EXPECT_EQ(max_int32_accumulation_k(DType::s8, DType::s4), 2097151);
  EXPECT_EQ(max_int32_accumulation_k(DType::s4, DType::s8), 2097151);
  EXPECT_EQ(max_int32_accumulation_k(DType::s4, DType::s4), 33554431);
  EXPECT_EQ(max_int32_accumulation_k(DType::s8, DType::u4), 1118481);  // 128 · 15
  EXPECT_EQ(max_int32_accumulation_k(DType::u4, DType::u4), 9544371);  // 15 · 15
}

// K is the largest length for which K products of the largest magnitude fit in int32 and K + 1
// do not: the bound is tight, not merely safe. (The largest product is (−128)·(−128) etc.,
// positive, so the positive side of int32 binds.)
TEST(FormatsCatalogue, MaxInt32AccumulationKIsTheLargestSafeK) {
  const DType dtypes[] = {DType::s8, DType::u8, DType::s4, DType::u4};
  const auto max_abs = [](DType t) {
    const auto [lo, hi] = test::int_range(t);
    return std::max<int64_t>(-int64_t{lo}, hi);
  };
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  for (DType a : dtypes)
    for (DType w : dtypes) {
      SCOPED_TRACE(std::string(to_string(a)) + "×" + to_string(w));
      const int64_t k = max_int32_accumulation_k(a, w);
      const int64_t product = max_abs(a) * max_abs(w);
      EXPECT_LE(k * product, kInt32Max);
      EXPECT_GT((k + 1) * product, kInt32Max);
    }
}

TEST(FormatsCatalogue, MaxInt32AccumulationKRejectsFloatDtypes) {
  for (DType t : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::s32}) {
    SCOPED_TRACE(to_string(t));
    EXPECT_TRUE(throws_error([&] { max_int32_accumulation_k(DType::s8, t); },
                             ErrorCode::invalid_argument,
                             {"nibble::max_int32_accumulation_k", to_string(t)}));
    EXPECT_TRUE(throws_error([&] { max_int32_accumulation_k(t, DType::s4); },
                             ErrorCode::invalid_argument,
                             {"nibble::max_int32_accumulation_k", to_string(t)}));
  }
}

}  // namespace
}  // namespace nibble
