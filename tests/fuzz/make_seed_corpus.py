#!/usr/bin/env python3
"""Writes the fuzzing seed corpora under tests/fuzz/corpus/: gguf/ (a small valid file with one
tensor of each of the first supported types and a few metadata kinds, mirroring
tests/cpp/test_gguf.cpp, and one block of every other decoded type),
safetensors/ (a valid file with F32/F16/BF16/I8 tensors and metadata) and hf_json/ (a tiny
byte-level tokenizer.json and a config.json)."""
import json
import os
import struct

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(sub, name, data):
    os.makedirs(os.path.join(root, sub), exist_ok=True)
    with open(os.path.join(root, sub, name), "wb") as f:
        f.write(data)
    print(f"wrote {len(data)} bytes to {sub}/{name}")


# ---- GGUF ----
b = bytearray()


def s(x):
    b.extend(struct.pack("<Q", len(x)) + x.encode())


def align():
    while len(b) % 32:
        b.append(0)


b += struct.pack("<IIQQ", 0x46554747, 3, 5, 3)
s("general.architecture"); b += struct.pack("<I", 8); s("llama")
s("llama.context_length"); b += struct.pack("<II", 4, 2048)
s("tokenizer.ggml.tokens"); b += struct.pack("<IIQ", 9, 8, 2); s("<s>"); s("hi")
for name, dims, typ, off in [("f32", [2], 0, 0), ("f16", [2], 1, 32), ("q8_0", [32], 8, 64),
                             ("q4_0", [32], 2, 128), ("q4_1", [32], 3, 160)]:
    s(name); b += struct.pack("<I", len(dims)); b += b"".join(struct.pack("<Q", d) for d in dims)
    b += struct.pack("<IQ", typ, off)
align(); b += struct.pack("<ff", 1.5, -2.0)
align(); b += struct.pack("<ee", 0.5, -3.0)
align(); b += struct.pack("<e", 0.25) + bytes((j - 16) & 0xFF for j in range(32))
align(); b += struct.pack("<e", 2.0) + bytes(j | ((15 - j) << 4) for j in range(16))
align(); b += struct.pack("<ee", 0.5, -1.0) + bytes(j | ((15 - j) << 4) for j in range(16))
write("gguf", "sample.gguf", bytes(b))

# One block of every other decoded type (pseudo-random bytes with a finite f16 scale at each
# scale position, so the fuzzer starts inside every decoder).
blocks = [("q5_0", 32, 6, 22, [0]), ("q5_1", 32, 7, 24, [0, 2]), ("iq4_nl", 32, 20, 18, [0]),
          ("q2_k", 256, 10, 84, [80, 82]), ("q3_k", 256, 11, 110, [108]),
          ("q4_k", 256, 12, 144, [0, 2]), ("q5_k", 256, 13, 176, [0, 2]),
          ("q6_k", 256, 14, 210, [208]), ("iq4_xs", 256, 23, 136, [0])]
b = bytearray()
b += struct.pack("<IIQQ", 0x46554747, 3, len(blocks), 1)
s("general.architecture"); b += struct.pack("<I", 8); s("llama")
off = 0
for name, elems, typ, size, _ in blocks:
    s(name); b += struct.pack("<IQ", 1, elems); b += struct.pack("<IQ", typ, off)
    off += (size + 31) // 32 * 32
state = 12345
for name, elems, typ, size, scales in blocks:
    align()
    blk = bytearray()
    for _ in range(size):
        state = (state * 1103515245 + 12345) % 2**31
        blk.append(state >> 16 & 0xFF)
    for at in scales:
        blk[at:at + 2] = struct.pack("<e", 0.01)
    b += blk
write("gguf", "ggml_block_types.gguf", bytes(b))

# ---- safetensors ----
tensors = [("a", "F32", [2, 3], struct.pack("<6f", 1, -2, 3.5, 0, 1e-3, -7)),
           ("b", "F16", [2], struct.pack("<2e", 0.5, -3)),
           ("c", "BF16", [2], bytes([0x00, 0x40, 0x80, 0xBE])),
           ("q", "I8", [4], bytes([1, 0xFE, 3, 0xFC]))]
header, off = {"__metadata__": {"format": "pt"}}, 0
for name, dt, shape, data in tensors:
    header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
    off += len(data)
h = json.dumps(header).encode()
h += b" " * (-(8 + len(h)) % 8)
write("safetensors", "sample.safetensors",
      struct.pack("<Q", len(h)) + h + b"".join(t[3] for t in tensors))

# ---- Hugging Face JSON ----
def byte_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for x in range(256):
        if x not in bs:
            bs.append(x); cs.append(256 + n); n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


vocab = {c: i for i, c in enumerate(byte_chars())}
vocab.update({"Ġt": 256, "he": 257, "Ġthe": 258})
tok = {"added_tokens": [{"id": 259, "content": "<|end|>", "special": True}],
       "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
           {"type": "Digits", "individual_digits": True},
           {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]},
       "post_processor": None,
       "model": {"type": "BPE", "vocab": vocab, "merges": [["Ġ", "t"], ["h", "e"], ["Ġt", "he"]]}}
write("hf_json", "tokenizer.json", json.dumps(tok, ensure_ascii=False).encode())
cfg = {"model_type": "llama", "vocab_size": 260, "hidden_size": 64, "num_hidden_layers": 2,
       "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
       "max_position_embeddings": 256, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
       "tie_word_embeddings": True, "hidden_act": "silu", "rope_scaling": None}
write("hf_json", "config.json", json.dumps(cfg).encode())
