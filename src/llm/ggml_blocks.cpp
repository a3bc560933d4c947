#include "llm/ggml_blocks.h"

#include <cstring>

#include "nibble/numeric.h"

namespace nibble::llm {

namespace {

struct TypeInfo {
  GgmlType type;
  const char* name;
  uint64_t elems, bytes;
};

// File order of the type numbers; the sizes are the C structs of ggml-common.h.
constexpr TypeInfo kTypes[] = {
    {GgmlType::f32, "F32", 1, 4},        {GgmlType::f16, "F16", 1, 2},
    {GgmlType::bf16, "BF16", 1, 2},      {GgmlType::q4_0, "Q4_0", 32, 18},
    {GgmlType::q4_1, "Q4_1", 32, 20},    {GgmlType::q5_0, "Q5_0", 32, 22},
    {GgmlType::q5_1, "Q5_1", 32, 24},    {GgmlType::q8_0, "Q8_0", 32, 34},
    {GgmlType::iq4_nl, "IQ4_NL", 32, 18}, {GgmlType::q2_k, "Q2_K", 256, 84},
    {GgmlType::q3_k, "Q3_K", 256, 110},  {GgmlType::q4_k, "Q4_K", 256, 144},
    {GgmlType::q5_k, "Q5_K", 256, 176},  {GgmlType::q6_k, "Q6_K", 256, 210},
    {GgmlType::iq4_xs, "IQ4_XS", 256, 136},
};

const TypeInfo& info(GgmlType t) {
  for (const TypeInfo& i : kTypes)
    if (i.type == t) return i;
  return kTypes[0];  // not reached: a GgmlType is only made from a listed id
}

float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_bits_to_f32(h);
}

float f32_of(int v) { return static_cast<float>(v); }

// IQ4_NL's and IQ4_XS's 16 levels: a 4-bit index picks a signed 8-bit value (non-uniform, denser
// near zero, as the weights' distribution).
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

// ---- 32-element blocks --------------------------------------------------------------------------
// Element j < 16 is the low nibble of byte j, element j + 16 its high nibble.

// Q4_0 {f16 d; u8 qs[16]}: x = d·(q − 8).   Q4_1 {f16 d, m; u8 qs[16]}: x = d·q + m.
// Q5_0 {f16 d; u32 qh; u8 qs[16]}: q = nibble | bit j of qh << 4, x = d·(q − 16).
// Q5_1 {f16 d, m; u32 qh; u8 qs[16]}: x = d·q + m.   Q8_0 {f16 d; s8 qs[32]}: x = d·q.
// IQ4_NL {f16 d; u8 qs[16]}: x = d·levels[nibble].
void decode_block32(GgmlType t, const uint8_t* b, float* o) {
  const float d = f16_at(b);
  switch (t) {
    case GgmlType::q4_0:
      for (int j = 0; j < 16; ++j) {
        o[j] = d * f32_of((b[2 + j] & 0xF) - 8);
        o[j + 16] = d * f32_of((b[2 + j] >> 4) - 8);
      }
      return;
    case GgmlType::q4_1: {
      const float m = f16_at(b + 2);
      for (int j = 0; j < 16; ++j) {
        o[j] = d * f32_of(b[4 + j] & 0xF) + m;
        o[j + 16] = d * f32_of(b[4 + j] >> 4) + m;
      }
      return;
    }
    case GgmlType::q5_0:
    case GgmlType::q5_1: {
      const bool has_min = t == GgmlType::q5_1;
      const float m = has_min ? f16_at(b + 2) : 0.0f;
      const uint8_t* p = b + (has_min ? 4 : 2);
      uint32_t qh;
      std::memcpy(&qh, p, 4);
      const uint8_t* qs = p + 4;
      const int offset = has_min ? 0 : 16;
      for (int j = 0; j < 16; ++j) {
        const int lo = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1u) << 4);
        const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
        if (has_min) {
          o[j] = d * f32_of(lo) + m;
          o[j + 16] = d * f32_of(hi) + m;
        } else {
          o[j] = d * f32_of(lo - offset);
          o[j + 16] = d * f32_of(hi - offset);
        }
      }
      return;
    }
    case GgmlType::q8_0:
      for (int j = 0; j < 32; ++j) o[j] = d * f32_of(static_cast<int8_t>(b[2 + j]));
      return;
    case GgmlType::iq4_nl:
      for (int j = 0; j < 16; ++j) {
        o[j] = d * f32_of(kIq4Levels[b[2 + j] & 0xF]);
        o[j + 16] = d * f32_of(kIq4Levels[b[2 + j] >> 4]);
      }
      return;
    default:
      return;
  }
}

// ---- 256-element super-blocks ("K-quants") ------------------------------------------------------
//
// Element e of a super-block, for the 2-bit fields of Q2_K / Q3_K and the high bits of Q6_K:
// half h = e / 128, field s = (e % 128) / 32, lane l = e % 32 — the bits at 2s of byte 32h + l.

// Q4_K's and Q5_K's 8 sub-block scales and mins, 6 bits each, packed into 12 bytes:
//   bytes 0..3  scale j (j < 4) in bits 0..5, the top 2 bits of scale j + 4 in bits 6..7
//   bytes 4..7  min j in bits 0..5, the top 2 bits of min j + 4 in bits 6..7
//   bytes 8..11 the low 4 bits of scale j + 4 (bits 0..3) and of min j + 4 (bits 4..7)
void scale_min_k4(const uint8_t* s, int j, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q2_K {u8 scales[16]; u8 qs[64]; f16 d, dmin}: 16 sub-blocks of 16, scale byte = min << 4 |
// scale (4 bits each); x = (d·scale)·q − dmin·min, q the 2 bits.
void decode_q2_k(const uint8_t* b, float* o) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int e = 0; e < 256; ++e) {
    const int sb = scales[e / 16];
    const int q = (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    o[e] = d * f32_of(sb & 0xF) * f32_of(q) - dmin * f32_of(sb >> 4);
  }
}

// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: 16 sub-blocks of 16 with signed 6-bit
// scales (stored + 32): low 4 bits of scale i in byte i % 8 at bit 4·(i / 8), high 2 bits in byte
// 8 + i % 4 at bit 2·(i / 4). q = the 2 bits − 4 unless bit e / 32 of hmask[e % 32] is set;
// x = (d·scale)·q.
void decode_q3_k(const uint8_t* b, float* o) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = f16_at(b + 108);
  for (int e = 0; e < 256; ++e) {
    const int i = e / 16;
    const int scale = (((sc[i % 8] >> (4 * (i / 8))) & 0xF) | (((sc[8 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32;
    const int low = (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    const int q = low - (((hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4);
    o[e] = d * f32_of(scale) * f32_of(q);
  }
}

// Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]} and Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32];
// u8 qs[128]}: 8 sub-blocks of 32; sub-block j = 2c + t takes the nibble t of bytes 32c .. 32c+31
// (plus, Q5_K, bit j of qh[l] as bit 4); x = (d·scale_j)·q − dmin·min_j.
void decode_q45_k(bool five_bits, const uint8_t* b, float* o) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five_bits ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    int scale, min;
    scale_min_k4(scales, j, scale, min);
    const float ds = d * f32_of(scale), dm = dmin * f32_of(min);
    for (int l = 0; l < 32; ++l) {
      int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
      if (five_bits) q |= ((qh[l] >> j) & 1) << 4;
      o[32 * j + l] = ds * f32_of(q) - dm;
    }
  }
}

// Q6_K {u8 ql[128]; u8 qh[64]; s8 scales[16]; f16 d}: 16 sub-blocks of 16; the low nibble of
// element e is nibble (e % 128) / 64 of ql[64·(e / 128) + e % 64], its high 2 bits the 2-bit
// field of qh (as Q2_K's); q = that 6-bit value − 32, x = (d·scale)·q.
void decode_q6_k(const uint8_t* b, float* o) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_at(b + 208);
  for (int e = 0; e < 256; ++e) {
    const int low = (ql[64 * (e / 128) + e % 64] >> (4 * ((e % 128) / 64))) & 0xF;
    const int high = (qh[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    o[e] = d * f32_of(scales[e / 16]) * f32_of((low | (high << 4)) - 32);
  }
}

// IQ4_XS {f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]}: 8 sub-blocks of 32 with 6-bit
// scales (stored + 32): low 4 bits nibble ib % 2 of scales_l[ib / 2], high 2 bits at 2·ib of
// scales_h; elements as IQ4_NL's over the 16 bytes 16·ib ...; x = (d·scale)·levels[nibble].
void decode_iq4_xs(const uint8_t* b, float* o) {
  const float d = f16_at(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = d * f32_of(ls - 32);
    for (int j = 0; j < 16; ++j) {
      o[32 * ib + j] = dl * f32_of(kIq4Levels[qs[16 * ib + j] & 0xF]);
      o[32 * ib + j + 16] = dl * f32_of(kIq4Levels[qs[16 * ib + j] >> 4]);
    }
  }
}

}  // namespace

const char* to_string(GgmlType t) { return info(t).name; }

std::optional<GgmlType> ggml_type_from_id(uint32_t id) {
  for (const TypeInfo& i : kTypes)
    if (static_cast<uint32_t>(i.type) == id) return i.type;
  return std::nullopt;
}

std::string supported_ggml_types() {
  std::string s;
  for (const TypeInfo& i : kTypes) s += std::string(s.empty() ? "" : " ") + i.name;
  return s;
}

uint64_t ggml_block_elems(GgmlType t) { return info(t).elems; }
uint64_t ggml_block_bytes(GgmlType t) { return info(t).bytes; }

void dequantize_ggml_blocks(GgmlType t, const uint8_t* src, uint64_t n_blocks, float* out) {
  const uint64_t in = ggml_block_bytes(t), on = ggml_block_elems(t);
  for (uint64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = src + i * in;
    float* o = out + i * on;
    switch (t) {
      case GgmlType::f32: std::memcpy(o, b, 4); break;
      case GgmlType::f16: o[0] = f16_at(b); break;
      case GgmlType::bf16: {
        uint16_t h;
        std::memcpy(&h, b, 2);
        o[0] = bf16_bits_to_f32(h);
        break;
      }
      case GgmlType::q2_k: decode_q2_k(b, o); break;
      case GgmlType::q3_k: decode_q3_k(b, o); break;
      case GgmlType::q4_k: decode_q45_k(false, b, o); break;
      case GgmlType::q5_k: decode_q45_k(true, b, o); break;
      case GgmlType::q6_k: decode_q6_k(b, o); break;
      case GgmlType::iq4_xs: decode_iq4_xs(b, o); break;
      default: decode_block32(t, b, o); break;
    }
  }
}

}  // namespace nibble::llm
