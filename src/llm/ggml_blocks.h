// The ggml tensor types a GGUF file can hold and their decoding to f32: plain floats (F32, F16,
// BF16), llama.cpp's 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and its 256-element
// "K-quant" super-blocks (Q2_K .. Q6_K, IQ4_XS) — the types of the GGUF files people download
// (Q4_K_M mixes Q4_K and Q6_K, with Q5_0 / Q8_0 for rows that are not a multiple of 256).
//
// Each block decodes on its own; the byte layouts are written out beside the decoders in
// ggml_blocks.cpp. Every product of a scale and a quant that the decoders compute is exact in f32
// except Q6_K's and IQ4_XS's (d·scale)·q, which round once, in the order llama.cpp and gguf-py
// round them; so the values are the same bits as theirs (tests/llm/reference.py checks a whole
// model against gguf-py's decoders).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace nibble::llm {

/// ggml tensor types this reader understands (the numbers are the file's).
enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  iq4_nl = 20,
  iq4_xs = 23,
  bf16 = 30,
};

/// The type's name as llama.cpp writes it ("Q4_K").
const char* to_string(GgmlType t);
/// The type with this file number, or nullopt for a type the reader does not decode.
std::optional<GgmlType> ggml_type_from_id(uint32_t id);
/// "F32 F16 BF16 Q4_0 ..." — the decodable types, for error messages.
std::string supported_ggml_types();
/// Elements per block (1 for plain floats, 32, or 256) and bytes per block.
uint64_t ggml_block_elems(GgmlType t);
uint64_t ggml_block_bytes(GgmlType t);

/// Decodes `n_blocks` consecutive blocks of type t at `src` into n_blocks · block_elems floats.
void dequantize_ggml_blocks(GgmlType t, const uint8_t* src, uint64_t n_blocks, float* out);

}  // namespace nibble::llm
