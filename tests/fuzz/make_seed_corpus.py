#!/usr/bin/env python3
"""Writes the GGUF fuzzing seed corpus (tests/fuzz/corpus/gguf/): a small valid file with one
tensor of each supported type and a few metadata kinds, mirroring tests/cpp/test_gguf.cpp."""
import os
import struct

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")
os.makedirs(out, exist_ok=True)
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
with open(os.path.join(out, "sample.gguf"), "wb") as f:
    f.write(b)
print(f"wrote {len(b)} bytes to {out}/sample.gguf")
