// The ggml block decoders (llm/ggml_blocks.h): every quantized type is built here from random
// quants and scales by an encoder written from the layout description (the inverse direction of
// the decoder), decoded, and compared with scale·q (− min) per element. tests/llm/reference.py
// `requant` re-encodes a whole model in these types and `check` runs it against gguf-py's decoders
// (CTest llm_ggml_types_logits_vs_gguf_py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llm/ggml_blocks.h"
#include "llm/gguf.h"
#include "nibble/nibble.h"
#include "test_llm_util.h"

namespace nibble::llm {
namespace {

constexpr int kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                1,    13,   25,  38,  53,  69,  89,  113};

struct Rng {
  std::mt19937 g{std::random_device{}()};
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); }
  // An f16-representable scale of either sign, with subnormals and large values now and then.
  float scale() {
    const int kind = uniform(0, 9);
    const float mag = kind == 0 ? 3e-6f : kind == 1 ? 200.0f : 0.001f * static_cast<float>(uniform(1, 4000));
    const float s = (uniform(0, 1) ? -1.0f : 1.0f) * mag;
    return f16_bits_to_f32(f32_to_f16_bits(s));
  }
};

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16_bits(v);
  std::memcpy(p, &h, 2);
}

// One encoded block and the values it must decode to.
struct Case {
  std::vector<uint8_t> bytes;
  std::vector<double> want;
};

void check(GgmlType t, const Case& c, int trial) {
  ASSERT_EQ(c.bytes.size(), ggml_block_bytes(t));
  ASSERT_EQ(c.want.size(), ggml_block_elems(t));
  std::vector<float> got(c.want.size() + 1, -777.0f);  // one poisoned element past the block
  dequantize_ggml_blocks(t, c.bytes.data(), 1, got.data());
  for (size_t e = 0; e < c.want.size(); ++e) {
    // The decoders' products are exact except Q6_K's and IQ4_XS's, which round once in f32.
    EXPECT_NEAR(got[e], c.want[e], std::abs(c.want[e]) * 1.2e-7)
        << to_string(t) << " trial " << trial << " element " << e;
  }
  EXPECT_EQ(got.back(), -777.0f) << to_string(t) << ": wrote past the block";
}

Case encode_q5(Rng& r, bool with_min) {
  Case c;
  c.bytes.assign(with_min ? 24 : 22, 0);
  const float d = r.scale(), m = with_min ? r.scale() : 0.0f;
  put_f16(c.bytes.data(), d);
  if (with_min) put_f16(c.bytes.data() + 2, m);
  uint8_t* qh = c.bytes.data() + (with_min ? 4 : 2);
  uint8_t* qs = qh + 4;
  for (int e = 0; e < 32; ++e) {
    const int q = r.uniform(0, 31);
    qs[e % 16] |= static_cast<uint8_t>((q & 0xF) << (e < 16 ? 0 : 4));
    qh[e / 8] |= static_cast<uint8_t>((q >> 4) << (e % 8));
    c.want.push_back(with_min ? double(d) * q + m : double(d) * (q - 16));
  }
  return c;
}

Case encode_iq4_nl(Rng& r) {
  Case c;
  c.bytes.assign(18, 0);
  const float d = r.scale();
  put_f16(c.bytes.data(), d);
  for (int e = 0; e < 32; ++e) {
    const int i = r.uniform(0, 15);
    c.bytes[2 + e % 16] |= static_cast<uint8_t>(i << (e < 16 ? 0 : 4));
    c.want.push_back(double(d) * kIq4Levels[i]);
  }
  return c;
}

// The 2-bit field of element e in a 64-byte area (Q2_K's and Q3_K's quants, Q6_K's high bits):
// byte 32·(e / 128) + e % 32, bits 2·((e % 128) / 32).
void put_2bits(uint8_t* area, int e, int v) {
  area[32 * (e / 128) + e % 32] |= static_cast<uint8_t>(v << (2 * ((e % 128) / 32)));
}

Case encode_q2_k(Rng& r) {
  Case c;
  c.bytes.assign(84, 0);
  const float d = r.scale(), dmin = r.scale();
  put_f16(c.bytes.data() + 80, d);
  put_f16(c.bytes.data() + 82, dmin);
  int sc[16], mn[16];
  for (int i = 0; i < 16; ++i) {
    sc[i] = r.uniform(0, 15);
    mn[i] = r.uniform(0, 15);
    c.bytes[i] = static_cast<uint8_t>(sc[i] | (mn[i] << 4));
  }
  for (int e = 0; e < 256; ++e) {
    const int q = r.uniform(0, 3);
    put_2bits(c.bytes.data() + 16, e, q);
    c.want.push_back(double(d) * sc[e / 16] * q - double(dmin) * mn[e / 16]);
  }
  return c;
}

Case encode_q3_k(Rng& r) {
  Case c;
  c.bytes.assign(110, 0);
  const float d = r.scale();
  put_f16(c.bytes.data() + 108, d);
  uint8_t* hmask = c.bytes.data();
  uint8_t* sc = c.bytes.data() + 96;
  int scale[16];
  for (int i = 0; i < 16; ++i) {
    scale[i] = r.uniform(-32, 31);
    const int s = scale[i] + 32;
    sc[i % 8] |= static_cast<uint8_t>((s & 0xF) << (4 * (i / 8)));
    sc[8 + i % 4] |= static_cast<uint8_t>((s >> 4) << (2 * (i / 4)));
  }
  for (int e = 0; e < 256; ++e) {
    const int q = r.uniform(-4, 3);  // stored as q (high bit set) or q + 4 (high bit clear)
    put_2bits(c.bytes.data() + 32, e, q >= 0 ? q : q + 4);
    if (q >= 0) hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
    c.want.push_back(double(d) * scale[e / 16] * q);
  }
  return c;
}

Case encode_q45_k(Rng& r, bool five_bits) {
  Case c;
  c.bytes.assign(five_bits ? 176 : 144, 0);
  const float d = r.scale(), dmin = r.scale();
  put_f16(c.bytes.data(), d);
  put_f16(c.bytes.data() + 2, dmin);
  uint8_t* s = c.bytes.data() + 4;
  uint8_t* qh = c.bytes.data() + 16;
  uint8_t* qs = c.bytes.data() + (five_bits ? 48 : 16);
  int sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = r.uniform(0, 63);
    mn[j] = r.uniform(0, 63);
  }
  for (int j = 0; j < 4; ++j) {  // 6-bit pairs: j in bytes j / j + 4, j + 4 split over three
    s[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4));
  }
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = e % 32;
    const int q = r.uniform(0, five_bits ? 31 : 15);
    qs[32 * (j / 2) + l] |= static_cast<uint8_t>((q & 0xF) << (4 * (j % 2)));
    if (five_bits) qh[l] |= static_cast<uint8_t>((q >> 4) << j);
    c.want.push_back(double(d) * sc[j] * q - double(dmin) * mn[j]);
  }
  return c;
}

Case encode_q6_k(Rng& r) {
  Case c;
  c.bytes.assign(210, 0);
  const float d = r.scale();
  put_f16(c.bytes.data() + 208, d);
  int scale[16];
  for (int i = 0; i < 16; ++i) {
    scale[i] = r.uniform(-128, 127);
    c.bytes[192 + i] = static_cast<uint8_t>(static_cast<int8_t>(scale[i]));
  }
  for (int e = 0; e < 256; ++e) {
    const int q = r.uniform(-32, 31), u = q + 32;
    c.bytes[64 * (e / 128) + e % 64] |= static_cast<uint8_t>((u & 0xF) << (4 * ((e % 128) / 64)));
    put_2bits(c.bytes.data() + 128, e, u >> 4);
    // The decoder rounds (d·scale)·q once in f32, as llama.cpp: the expected value does too.
    c.want.push_back(static_cast<float>(d * static_cast<float>(scale[e / 16])) * static_cast<float>(q));
  }
  return c;
}

Case encode_iq4_xs(Rng& r) {
  Case c;
  c.bytes.assign(136, 0);
  const float d = r.scale();
  put_f16(c.bytes.data(), d);
  uint16_t scales_h = 0;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = r.uniform(-32, 31), s = ls + 32;
    c.bytes[4 + ib / 2] |= static_cast<uint8_t>((s & 0xF) << (4 * (ib % 2)));
    scales_h = static_cast<uint16_t>(scales_h | ((s >> 4) << (2 * ib)));
    for (int j = 0; j < 32; ++j) {
      const int i = r.uniform(0, 15);
      c.bytes[8 + 16 * ib + j % 16] |= static_cast<uint8_t>(i << (j < 16 ? 0 : 4));
      c.want.push_back(double(d) * ls * kIq4Levels[i]);
    }
  }
  std::memcpy(c.bytes.data() + 2, &scales_h, 2);
  return c;
}

TEST(GgmlBlocks, EveryQuantizedTypeDecodesWhatItsEncoderPacked) {
  Rng r;
  for (int trial = 0; trial < 50; ++trial) {
    check(GgmlType::q5_0, encode_q5(r, false), trial);
    check(GgmlType::q5_1, encode_q5(r, true), trial);
    check(GgmlType::iq4_nl, encode_iq4_nl(r), trial);
    check(GgmlType::q2_k, encode_q2_k(r), trial);
    check(GgmlType::q3_k, encode_q3_k(r), trial);
    check(GgmlType::q4_k, encode_q45_k(r, false), trial);
    check(GgmlType::q5_k, encode_q45_k(r, true), trial);
    check(GgmlType::q6_k, encode_q6_k(r), trial);
    check(GgmlType::iq4_xs, encode_iq4_xs(r), trial);
  }
}

TEST(GgmlBlocks, ConsecutiveBlocksDecodeIndependently) {
  Rng r;
  const Case a = encode_q45_k(r, false), b = encode_q45_k(r, false);
  std::vector<uint8_t> both = a.bytes;
  both.insert(both.end(), b.bytes.begin(), b.bytes.end());
  std::vector<float> got(512);
  dequantize_ggml_blocks(GgmlType::q4_k, both.data(), 2, got.data());
  for (int e = 0; e < 256; ++e) {
    EXPECT_NEAR(got[e], a.want[e], std::abs(a.want[e]) * 1.2e-7) << e;
    EXPECT_NEAR(got[256 + e], b.want[e], std::abs(b.want[e]) * 1.2e-7) << e;
  }
}

// A tensor large enough to be decoded on several threads gives the single-threaded values.
TEST(GgmlBlocks, LargeGgufTensorDecodesAsOneCall) {
  Rng r;
  constexpr uint64_t kBlocks = 4100;  // 1 049 600 weights: past the threading threshold
  std::vector<uint8_t> data;
  for (uint64_t b = 0; b < kBlocks; ++b) {
    const Case c = encode_q45_k(r, b % 2 == 1);  // alternate contents; Q4_K layout either way
    data.insert(data.end(), c.bytes.begin(), c.bytes.begin() + 144);
  }
  test::GgufWriter w;
  w.header(1, 0);
  w.tensor("big", {256, kBlocks}, static_cast<uint32_t>(GgmlType::q4_k), 0);
  w.align();
  w.bytes.insert(w.bytes.end(), data.begin(), data.end());
  const GgufFile g = GgufFile::parse(w.bytes, "big");
  std::vector<float> want(256 * kBlocks);
  dequantize_ggml_blocks(GgmlType::q4_k, data.data(), kBlocks, want.data());
  EXPECT_EQ(g.dequantize(g.tensor("big")), want);
}

TEST(GgmlBlocks, TypeTableNamesAndSizes) {
  EXPECT_EQ(ggml_type_from_id(12), GgmlType::q4_k);
  EXPECT_EQ(ggml_type_from_id(4), std::nullopt);   // Q4_2, removed from ggml
  EXPECT_EQ(ggml_type_from_id(16), std::nullopt);  // IQ2_XXS: not decoded
  EXPECT_STREQ(to_string(GgmlType::q6_k), "Q6_K");
  EXPECT_EQ(ggml_block_elems(GgmlType::iq4_xs), 256u);
  EXPECT_EQ(ggml_block_bytes(GgmlType::q3_k), 110u);
  const std::string all = supported_ggml_types();
  for (const char* name : {"F32", "BF16", "Q5_1", "Q2_K", "Q6_K", "IQ4_NL", "IQ4_XS"})
    EXPECT_NE(all.find(name), std::string::npos) << name;
}

}  // namespace
}  // namespace nibble::llm
