#!/usr/bin/env python3
"""An independent reference for nibble's LLM runner: a Llama forward pass in numpy (float64),
reading the GGUF file with the `gguf` package (llama.cpp's own Python reader and dequantizer) and
tokenizing with Hugging Face's `tokenizers` (Rust) built from the file's vocabulary and merges;
and Google's `sentencepiece` for the SentencePiece-style ("llama") tokenizer.

It shares no code with src/llm/ and deliberately follows llama.cpp's conventions where the C++
runner follows Hugging Face's: it applies RoPE to adjacent pairs (2i, 2i+1) on the Q/K rows as
the GGUF file stores them (permuted by llama.cpp's converter), while the C++ runner undoes the
permutation and rotates the pairs (i, i + hd/2). Agreement checks both conventions at once.

Commands (python3 tests/llm/reference.py COMMAND --help):
  tokens       write test data: token ids of fixed strings, from `tokenizers`
  check        run `nibble generate --format f32` and compare its logits at every prompt
               position and its greedy tokens with this reference
  check-same   two files of one model (e.g. split into shards): nibble's logits are identical
  check-tokens compare `nibble tokenize` with `tokenizers` on a whole text file
  check-spm    train a SentencePiece BPE model, write it as a GGUF "llama" vocabulary, and
               compare `nibble tokenize` with `sentencepiece` on a whole text file
  make-arch    write the model as a Qwen2, Qwen3 or Phi-3 GGUF file (their keys, Q/K rows in
               Hugging Face's order, random q/k/v biases or q/k norms, or fused tensors)
  export-hf    write a Hugging Face checkpoint (config.json, tokenizer.json, model.safetensors,
               f32, Q/K in Hugging Face order) of the GGUF model, for the safetensors path
  check-pre-split  nibble's Llama 3 / Qwen2 pre-tokenizer (tokenizer.ggml.pre llama-bpe, qwen2;
               tokenizer.json Split + ByteLevel) against `tokenizers` with the same regex, on a
               text file, the fixed strings and thousands of random adversarial strings
  requant      write a copy of the GGUF model whose block linears are re-encoded in other ggml
               types (K-quants, Q5_0/Q5_1, IQ4_NL/IQ4_XS), by this file's own encoders; `check`
               on the copy then compares nibble's decoders with gguf-py's
  export-quantized  write a GPTQ or AWQ checkpoint of the model (4-bit, groups, AutoGPTQ's /
               AutoAWQ's packing) and the same codes as a nibble checkpoint; `check-same` then
               compares nibble's import of the first with the second
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import gguf
import numpy as np


# ---- the model -------------------------------------------------------------------------------

class Reference:
    def __init__(self, path):
        self.reader = gguf.GGUFReader(path)
        f = self.reader.fields

        def val(key, default=None):
            if key not in f:
                return default
            return f[key].contents()

        # "llama": Q/K rows permuted by the converter, adjacent-pair RoPE (llama.cpp's NORM
        # mode); "qwen2": rows as Hugging Face stores them, rotate-half RoPE (NEOX mode), and
        # biases on q, k, v.
        self.arch = val("general.architecture")
        a = self.arch + "."
        self.n_layers = int(val(a + "block_count"))
        self.dim = int(val(a + "embedding_length"))
        self.n_heads = int(val(a + "attention.head_count"))
        self.n_kv_heads = int(val(a + "attention.head_count_kv", self.n_heads))
        self.head_dim = int(val(a + "attention.key_length", self.dim // self.n_heads))
        self.ffn = int(val(a + "feed_forward_length"))
        self.theta = float(val(a + "rope.freq_base", 10000.0))
        self.rope_freqs = None  # Llama 3.1-style per-pair divisors (llama.cpp's rope_freqs)
        self.eps = float(val(a + "attention.layer_norm_rms_epsilon"))
        self.t = {}
        for t in self.reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists innermost first
            w = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
            self.t[t.name] = w.astype(np.float32)
        if self.arch == "phi3":  # fused q|k|v and gate|up (llama.cpp calls the latter ffn_up)
            qd, kvd = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
            for l in range(self.n_layers):
                p = f"blk.{l}."
                qkv = self.t.pop(p + "attn_qkv.weight")
                self.t[p + "attn_q.weight"] = qkv[:qd]
                self.t[p + "attn_k.weight"] = qkv[qd:qd + kvd]
                self.t[p + "attn_v.weight"] = qkv[qd + kvd:]
                gate_up = self.t.pop(p + "ffn_up.weight")
                self.t[p + "ffn_gate.weight"] = gate_up[:self.ffn]
                self.t[p + "ffn_up.weight"] = gate_up[self.ffn:]
        self.vocab = self.t["token_embd.weight"].shape[0]
        if "rope_freqs.weight" in self.t:
            self.rope_freqs = self.t["rope_freqs.weight"].astype(np.float64)
        self.out = self.t.get("output.weight", self.t["token_embd.weight"])  # tied when absent

    def w(self, name):
        return self.t[name].astype(np.float64)

    def rope(self, x, pos):
        """llama.cpp's RoPE on x (heads, hd): NORM mode (pairs (2i, 2i+1), the llama arch) or
        NEOX mode (pairs (i, i + hd/2), qwen2)."""
        hd = self.head_dim
        i = np.arange(hd // 2, dtype=np.float64)
        ang = pos * self.theta ** (-2.0 * i / hd)
        if self.rope_freqs is not None:  # as ggml_rope_ext with freq_factors: the rate divided
            ang = ang / self.rope_freqs
        c, s = np.cos(ang), np.sin(ang)
        lo, hi = (np.s_[:, 0::2], np.s_[:, 1::2]) if self.arch == "llama" else \
            (np.s_[:, :hd // 2], np.s_[:, hd // 2:])
        a, b = x[lo].copy(), x[hi].copy()
        y = np.empty_like(x)
        y[lo] = a * c - b * s
        y[hi] = b * c + a * s
        return y

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x) + self.eps) * w

    def run(self, tokens):
        """Logits (len(tokens), vocab) in float64, one token at a time with a KV cache."""
        hd, H, KV = self.head_dim, self.n_heads, self.n_kv_heads
        cache = [([], []) for _ in range(self.n_layers)]
        if not hasattr(self, "W"):  # float64 copies, made once
            self.W = {}
            for l in range(self.n_layers):
                p = f"blk.{l}."
                self.W[l] = {k: self.w(p + k + ".weight") for k in
                             ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v",
                              "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
                for k in ("attn_q", "attn_k", "attn_v", "attn_output"):
                    b = p + k + ".bias"
                    self.W[l][k + "_b"] = self.w(b) if b in self.t else 0.0
                for k in ("attn_q_norm", "attn_k_norm"):  # qwen3: RMSNorm over each head
                    n = p + k + ".weight"
                    self.W[l][k] = self.w(n) if n in self.t else None
        W = self.W
        emb = self.w("token_embd.weight")
        out_w = self.out.astype(np.float64)
        out_norm = self.w("output_norm.weight")
        logits = []
        for pos, tok in enumerate(tokens):
            x = emb[tok].copy()
            for l in range(self.n_layers):
                L = W[l]
                h = self.rmsnorm(x, L["attn_norm"])
                q = (L["attn_q"] @ h + L["attn_q_b"]).reshape(H, hd)
                k = (L["attn_k"] @ h + L["attn_k_b"]).reshape(KV, hd)
                if L["attn_q_norm"] is not None:
                    q = np.stack([self.rmsnorm(r, L["attn_q_norm"]) for r in q])
                    k = np.stack([self.rmsnorm(r, L["attn_k_norm"]) for r in k])
                q, k = self.rope(q, pos), self.rope(k, pos)
                v = (L["attn_v"] @ h + L["attn_v_b"]).reshape(KV, hd)
                cache[l][0].append(k)
                cache[l][1].append(v)
                K = np.stack(cache[l][0])  # (pos+1, KV, hd)
                V = np.stack(cache[l][1])
                att = np.empty((H, hd))
                for head in range(H):
                    kvh = head // (H // KV)
                    s = K[:, kvh, :] @ q[head] / np.sqrt(hd)
                    s = np.exp(s - s.max())
                    att[head] = (s / s.sum()) @ V[:, kvh, :]
                x = x + L["attn_output"] @ att.reshape(-1) + L["attn_output_b"]
                h = self.rmsnorm(x, L["ffn_norm"])
                g, u = L["ffn_gate"] @ h, L["ffn_up"] @ h
                x = x + L["ffn_down"] @ (g / (1.0 + np.exp(-g)) * u)
            logits.append(out_w @ self.rmsnorm(x, out_norm))
        return np.stack(logits)


# ---- the tokenizer ---------------------------------------------------------------------------

def gguf_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def hf_tokenizer(reader):
    """A `tokenizers` Tokenizer from the GGUF vocabulary: byte-level BPE with the SmolLM
    pre-tokenizer (digits one by one, then the GPT-2 regex); control tokens as added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    f = reader.fields
    pre = f["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in f else "default"
    assert f["tokenizer.ggml.model"].contents() == "gpt2", "only gpt2 vocabularies"
    tokens = gguf_strings(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in gguf_strings(reader, "tokenizer.ggml.merges")]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges,
                               ignore_merges=pre == "llama-bpe"))
    stages = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if pre == "smollm":
        stages.insert(0, pre_tokenizers.Digits(individual_digits=True))
    if pre in PRE_SPLIT_REGEX:
        from tokenizers import Regex
        stages = [pre_tokenizers.Split(Regex(PRE_SPLIT_REGEX[pre]), behavior="isolated", invert=False),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = pre_tokenizers.Sequence(stages)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (3, 4)])
    return tok


# The strings of the tokenizer test data: words, contractions, digits, runs of spaces and
# newlines, punctuation, accents, CJK, emoji, control tokens of the chat template, code.
TOKEN_TEST_STRINGS = [
    "Hello world",
    "The capital of France is Paris.",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "I'm sure they'll say we've done what you'd expect; she's not, isn't it? He'd... WE'LL",
    "Numbers: 12345, 3.14159, -42 and 1,000,000 in 2024.",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nand  double  spaces\r\n",
    "Café naïve résumé façade — “quotes” ‘single’ … ½ ²",
    "日本語のテキスト and 中文 and 한국어",
    "emoji 🙂👍🏽 and symbols ©®™ §¶ • ∑∫√",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # square\n",
    "Mr. Darcy's letter—written at eight o'clock—said: \"I have been too long.\"",
    "",
    " ",
    "a",
    "\u00a0non-breaking\u2009thin\u3000ideographic",
    "١٢٣ Arabic-Indic digits and Ⅷ roman",
]


def cmd_tokens(args):
    ref = gguf.GGUFReader(args.model)
    tok = hf_tokenizer(ref)
    out = {"produced_by": "tests/llm/reference.py tokens (Hugging Face tokenizers "
                          + __import__("tokenizers").__version__
                          + " built from the GGUF vocabulary and merges)",
           "model_sha256": args.sha256, "cases": []}
    for s in TOKEN_TEST_STRINGS:
        out["cases"].append({"text": s, "ids": tok.encode(s).ids})
    with open(args.out, "w", encoding="utf-8") as fh:  # one case per line
        head = {k: v for k, v in out.items() if k != "cases"}
        fh.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [\n')
        fh.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in out["cases"]))
        fh.write("\n]}\n")
    print(f"wrote {len(out['cases'])} cases to {args.out}")


# ---- the check against the C++ runner --------------------------------------------------------

# The logits of nibble's f32 path may differ from this float64 reference by f32 rounding:
# measured max |Δ| 3.4e-5 on logits up to 27 (relative Frobenius 1.1e-6); the bound leaves 30x.
LOGIT_TOL = 1e-3


def run_nibble(nibble, model, prompt, n, fmt, extra=()):
    with tempfile.TemporaryDirectory() as d:
        dump = os.path.join(d, "logits.f32")
        cmd = [nibble, "generate", model, "--prompt-ids", ",".join(map(str, prompt)), "-n", str(n),
               "--format", fmt, "--dump-logits", dump, "--ids", "--quiet", "--no-stop", *extra]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"FAIL: {' '.join(cmd)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
        logits = np.fromfile(dump, dtype="<f4")
    gen = None
    for line in res.stdout.splitlines():
        if line.startswith("generated ids: "):
            gen = [int(x) for x in line.split(": ", 1)[1].split(",") if x]
    return logits, gen, res.stdout


def cmd_check(args):
    ref = Reference(args.model)
    tok = hf_tokenizer(ref.reader)
    prompt = tok.encode(args.prompt).ids
    logits, gen, out = run_nibble(args.nibble, args.model, prompt, args.n, "f32")
    logits = logits.reshape(len(prompt), ref.vocab)
    # One causal pass over prompt + generated tokens: its first rows are the prompt's logits,
    # the rest score nibble's greedy choices (teacher forcing).
    full = ref.run(prompt + gen)
    want = full[:len(prompt)]
    diff = np.abs(logits - want).max()
    rel = np.linalg.norm(logits - want) / np.linalg.norm(want)
    print(f"prompt: {args.prompt!r} ({len(prompt)} tokens)")
    print(f"logits at every prompt position: max |nibble f32 - numpy f64| = {diff:.3e} "
          f"(|logit| up to {np.abs(want).max():.1f}), relative Frobenius {rel:.3e}, tolerance {LOGIT_TOL}")
    ok = diff <= LOGIT_TOL
    # Greedy tokens: the reference scores nibble's whole sequence (teacher forcing), so a
    # mismatch is located exactly; it is accepted only where the reference itself sees a tie
    # (its top two logits closer than the logit tolerance).
    match = 0
    for i, g in enumerate(gen):
        row = full[len(prompt) - 1 + i]
        best = int(np.argmax(row))
        if best != g:
            gap = row[best] - row[g]
            if gap > LOGIT_TOL:
                print(f"FAIL: token {i}: nibble chose {g}, the reference {best} (logit gap {gap:.3e})")
                ok = False
                break
            print(f"note: token {i} is a near tie (gap {gap:.2e}); nibble chose {g}, reference {best}")
        match += 1
    print(f"greedy: {match} of {len(gen)} generated tokens are the reference's argmax: "
          f"{tok.decode(gen)!r}")
    if len(gen) < args.n:
        print(f"FAIL: nibble generated {len(gen)} tokens, {args.n} asked")
        ok = False
    if args.safetensors:  # the same model through the safetensors + config.json path
        l2, g2, _ = run_nibble(args.nibble, args.safetensors, prompt, args.n, "f32")
        same = np.array_equal(l2, logits.reshape(-1)) and g2 == gen
        print(f"Hugging Face checkpoint ({args.safetensors}): logits and tokens "
              f"{'identical to the GGUF path' if same else 'DIFFER from the GGUF path'}"
              + ("" if same else f" (max |Δ| {np.abs(l2 - logits.reshape(-1)).max():.3e})"))
        ok = ok and same
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def cmd_check_same(args):
    """Two model files that hold the same model (e.g. one split into shards) give nibble's
    identical logits and tokens."""
    prompt = [int(x) for x in args.prompt_ids.split(",")]
    la, ga, _ = run_nibble(args.nibble, args.a, prompt, args.n, args.format)
    lb, gb, _ = run_nibble(args.nibble, args.b, prompt, args.n, args.format)
    same = np.array_equal(la, lb) and ga == gb
    print(f"{args.a} and {args.b}: logits ({la.size} values) and {len(ga)} tokens "
          + ("identical" if same else "DIFFER"))
    # Two empty runs are "identical": the logits of every prompt position and n tokens, or FAIL.
    complete = la.size >= len(prompt) and la.size % len(prompt) == 0 and len(ga) == args.n
    if not complete:
        print(f"FAIL: {la.size} logits for {len(prompt)} prompt positions, {len(ga)} tokens of "
              f"{args.n} asked")
    ok = same and complete
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def cmd_check_tokens(args):
    """nibble's tokenizer against Hugging Face tokenizers on a whole text file."""
    tok = hf_tokenizer(gguf.GGUFReader(args.model))
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    want = tok.encode(text).ids
    ok = True
    for model in [args.model] + ([args.safetensors] if args.safetensors else []):
        res = subprocess.run([args.nibble, "tokenize", model, "--file", args.text],
                             capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"FAIL: nibble tokenize exited {res.returncode}: {res.stderr}")
        got = [int(x) for x in res.stdout.strip().split(",") if x]
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        same = got == want
        print(f"{model}: {len(got)} tokens from nibble, {len(want)} from tokenizers: "
              + ("identical" if same else f"DIFFER (first at {first})"))
        ok = ok and same
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def vocabulary_gguf_writer(path, tokenizer_model):
    """A GGUF writer for a vocabulary test file: a tiny llama shape (8 wide, one block; only
    token_embd.weight is written) and tokenizer.ggml.model set; the caller adds the vocabulary."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model(tokenizer_model)
    return w


def cmd_check_spm(args):
    """nibble's SentencePiece-style ("llama") tokenizer against the sentencepiece library: a BPE
    model with byte fallback is trained on Austen's training text, its pieces, scores and types
    are written to a GGUF file the way llama.cpp's converter does, and both tokenize a text."""
    import io
    import sentencepiece as spm
    with open(args.train, encoding="utf-8") as f:
        train = f.read()[:300000]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train.split("\n")), model_writer=proto, vocab_size=2000,
        model_type="bpe", byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, split_digits=True, unk_id=0, bos_id=1, eos_id=2,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    n = sp.get_piece_size()
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
             for i in range(n)]
    path = os.path.join(args.out_dir, "spm-austen.gguf")
    os.makedirs(args.out_dir, exist_ok=True)
    w = vocabulary_gguf_writer(path, "llama")
    w.add_token_list([sp.id_to_piece(i) for i in range(n)])
    w.add_token_scores([sp.get_score(i) for i in range(n)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.add_tensor("token_embd.weight", np.zeros((n, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(args.text, encoding="utf-8") as f:
        text = f.read()
    want = [1] + sp.encode(text)
    res = subprocess.run([args.nibble, "tokenize", path, "--file", args.text],
                         capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"FAIL: nibble tokenize exited {res.returncode}: {res.stderr}")
    got = [int(x) for x in res.stdout.strip().split(",") if x]
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    ok = got == want
    print(f"sentencepiece {spm.__version__} BPE, {n} pieces with byte fallback: {len(got)} tokens from "
          f"nibble, {len(want)} from sentencepiece on {args.text}: "
          + ("identical" if ok else f"DIFFER (first at {first}: "
             f"{[sp.id_to_piece(i) for i in got[first:first + 5]] if first is not None else ''} vs "
             f"{[sp.id_to_piece(i) for i in want[first:first + 5]] if first is not None else ''})"))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


# ---- Llama 3 / Qwen2 pre-tokenizers -----------------------------------------------------------

PRE_SPLIT_REGEX = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}

# Pieces the random strings are made of: every class the regexes distinguish, and their edges.
RANDOM_PIECES = (
    list("abcXYZ") + ["hello", "World", "Paris"] + list("0123456789") + ["12345", "2024"]
    + [" ", " ", "  ", "\t", "\n", "\r", "\r\n", "\n\n", " \n", "\u00a0", "\u2009", "\u3000",
       "\u0085", "\u2028", "\x0b", "\x0c"]
    + list(".,!?;:-()\"[]{}<>/\\@#$%^&*_=+`~|") + ["...", "--", "\u2014", "\u201c", "\u2026"]
    + ["'", "'s", "'S", "'t", "'T", "'re", "'RE", "'rE", "'ve", "'Ve", "'m", "'M", "'ll", "'LL",
       "'lL", "'d", "'D", "'x", "''", "'\u017f"]
    + ["é", "Å", "ß", "ø", "ç", "ñ", "e\u0301", "日本語", "中", "한국어", "Ωμέγα", "Привет"]
    + ["\u0661\u0662\u0663", "\u00bd", "\u00b2", "\u2167", "\U0001d7d8"]
    + ["\U0001f642", "\U0001f44d\U0001f3fd", "\u00a9", "\u2211", "\u200b", "\ufeff"]
)


def random_strings(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 24))
        out.append("".join(RANDOM_PIECES[int(i)] for i in rng.integers(0, len(RANDOM_PIECES), k)))
    return out


def cmd_check_pre_split(args):
    """nibble's Llama 3 / Qwen2 pre-tokenizer against `tokenizers` (Rust, Oniguruma regex): the
    model's byte-level vocabulary and merges with tokenizer.ggml.pre set to the pre-type, plus
    two words its merges cannot build (so Llama 3's ignore_merges shows), written as a GGUF
    vocabulary and as a tokenizer.json; both tokenize the text, the fixed strings and random
    strings, one by one."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    reader = gguf.GGUFReader(args.model)
    f = reader.fields
    tokens = gguf_strings(reader, "tokenizer.ggml.tokens")
    merges = gguf_strings(reader, "tokenizer.ggml.merges")
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    extra = ["\u0120zqxjkv", "Qwertyzz"]  # " zqxjkv" byte-level, "Qwertyzz": no merges build them
    tokens, types = tokens + extra, types + [1] * len(extra)
    ignore_merges = args.pre == "llama-bpe"
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)},
                               [tuple(m.split(" ", 1)) for m in merges], ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_SPLIT_REGEX[args.pre]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (3, 4)])
    os.makedirs(args.out_dir, exist_ok=True)
    n = len(tokens)
    path = os.path.join(args.out_dir, f"pre-{args.pre}.gguf")
    w = vocabulary_gguf_writer(path, "gpt2")
    w.add_tokenizer_pre(args.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(int(f["tokenizer.ggml.bos_token_id"].contents()))
    w.add_eos_token_id(int(f["tokenizer.ggml.eos_token_id"].contents()))
    w.add_add_bos_token(False)
    w.add_tensor("token_embd.weight", np.zeros((n, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    hf_dir = os.path.join(args.out_dir, f"pre-{args.pre}-hf")
    os.makedirs(hf_dir, exist_ok=True)
    tok.save(os.path.join(hf_dir, "tokenizer.json"))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": n,
              "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "intermediate_size": 8, "max_position_embeddings": 64,
              "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
              "hidden_act": "silu", "rope_scaling": None}
    with open(os.path.join(hf_dir, "config.json"), "w") as fh:
        json.dump(config, fh)
    write_safetensors(os.path.join(hf_dir, "model.safetensors"),
                      {"model.embed_tokens.weight": np.zeros((n, 8), dtype=np.float32)})
    with open(args.text, encoding="utf-8") as fh:
        text = fh.read()
    strings = ([text] + TOKEN_TEST_STRINGS + ["a zqxjkv b", "Qwertyzz zqxjkv", " zqxjkvzqxjkv"]
               + random_strings(args.random, args.seed))
    want = [tok.encode(s, add_special_tokens=False).ids for s in strings]
    jsonl = os.path.join(args.out_dir, f"pre-{args.pre}-strings.jsonl")
    with open(jsonl, "w", encoding="utf-8") as fh:
        for s in strings:
            fh.write(json.dumps(s) + "\n")
    # The pieces themselves: the ids alone can hide a wrong cut where no merge crosses it.
    split = pre_tokenizers.Split(Regex(PRE_SPLIT_REGEX[args.pre]), behavior="isolated", invert=False)
    want_pieces = [[p for p, _ in split.pre_tokenize_str(s)] for s in strings]

    def compare(model, flag, parse, expected, what, show):
        """nibble tokenize --jsonl with `flag`, line by line against `expected`."""
        res = subprocess.run([args.nibble, "tokenize", model, "--jsonl", jsonl, flag],
                             capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"FAIL: nibble tokenize {flag} exited {res.returncode}: {res.stderr}")
        got = [parse(line) for line in res.stdout.split("\n")[:len(strings)]]
        bad = [i for i in range(len(strings)) if i >= len(got) or got[i] != expected[i]]
        print(f"{model}: {what}: " + ("all identical to tokenizers" if not bad else f"{len(bad)} DIFFER"))
        for i in bad[:5]:
            print(f"  {strings[i][:80]!r}: nibble {got[i][:12] if i < len(got) else None}, "
                  f"tokenizers {show(expected[i][:12])}")
        return not bad

    ok = True
    for model in (path, hf_dir):
        ok &= compare(model, "--pieces", json.loads, want_pieces,
                      f"pre-tokenizer pieces of {len(strings)} strings "
                      f"({sum(map(len, want_pieces))} pieces)", lambda p: p)
    for model in (path, hf_dir):
        ok &= compare(model, "--no-bos", lambda line: [int(x) for x in line.split(",") if x], want,
                      f"{len(strings)} strings ({sum(map(len, want))} tokens; the text, "
                      f"{len(TOKEN_TEST_STRINGS) + 3} fixed, {args.random} random, seed {args.seed})",
                      lambda ids: f"{ids} {[tok.id_to_token(t) for t in ids]}")
    used = sum(t in (n - 2, n - 1) for ids in want for t in ids)
    print(f"the words only ignore_merges builds appear {used} times"
          + (" (ignore_merges is on)" if ignore_merges else " (ignore_merges is off)"))
    if ignore_merges and used == 0:  # else the comparison says nothing about ignore_merges
        print("FAIL: with ignore_merges on, tokenizers produced none of the two words")
        ok = False
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


# ---- ggml types ------------------------------------------------------------------------------
# Encoders for the ggml block types, written from llama.cpp's block layouts (gguf-py decodes the
# K-quants but cannot encode them). They quantize by round to nearest with min/max scales — not
# llama.cpp's search, so the error is somewhat larger — and pack the bits; what matters for the
# check is that nibble and gguf-py decode the same bytes, and `requant` prints each type's
# weight error so a packing mistake (garbage weights) shows too.

IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.float32)


def _f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def _div(a, b):
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, dtype=np.float32), where=b != 0)


def _two_bit_fields(q):
    """(nb, 256) values < 4 → (nb, 64) bytes: element e at bits 2·((e % 128) // 32) of byte
    32·(e // 128) + e % 32."""
    q = q.reshape(-1, 2, 4, 32).astype(np.uint8)
    return (q[:, :, 0] | q[:, :, 1] << 2 | q[:, :, 2] << 4 | q[:, :, 3] << 6).reshape(-1, 64)


def _asym_subblocks(x, sub, levels, scale_max):
    """Asymmetric sub-blocks: per sub-block scale and min quantized against super-block d, dmin."""
    nb = x.shape[0]
    xs = x.reshape(nb, -1, sub)
    lo = np.minimum(xs.min(-1), 0)
    scale = (xs.max(-1) - lo) / levels
    d = _f16(scale.max(-1) / scale_max).astype(np.float32)
    dmin = _f16(-lo.min(-1) / scale_max).astype(np.float32)
    sc = np.clip(np.rint(_div(scale, d[:, None])), 0, scale_max)
    mn = np.clip(np.rint(_div(-lo, dmin[:, None])), 0, scale_max)
    ds = (d[:, None] * sc)[..., None]
    dm = (dmin[:, None] * mn)[..., None]
    q = np.clip(np.rint(_div(xs + dm, ds)), 0, levels).astype(np.uint8).reshape(nb, -1)
    return d, dmin, sc.astype(np.uint8), mn.astype(np.uint8), q


def _sym_subblocks(x, sub, qmin, qmax, scale_bits):
    """Symmetric sub-blocks with signed integer scales against a super-block d."""
    nb = x.shape[0]
    xs = x.reshape(nb, -1, sub)
    idx = np.abs(xs).argmax(-1)
    peak = np.take_along_axis(xs, idx[..., None], -1)[..., 0]
    scale = peak / qmin  # the largest magnitude lands on the most negative level
    smax = 2 ** (scale_bits - 1)
    d = _f16(np.abs(scale).max(-1) / (smax - 1)).astype(np.float32)
    sc = np.clip(np.rint(_div(scale, d[:, None])), -smax, smax - 1)
    ds = (d[:, None] * sc)[..., None]
    q = np.clip(np.rint(_div(xs, ds)), qmin, qmax).astype(np.int16).reshape(nb, -1)
    return d, sc.astype(np.int16), q


def _pack_k4_scales(sc, mn):
    """Q4_K / Q5_K: 8 six-bit scales and mins → 12 bytes (see gguf-py's Q4_K.get_scale_min)."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, 0:4] | (sc[:, 4:8] >> 4) << 6
    out[:, 4:8] = mn[:, 0:4] | (mn[:, 4:8] >> 4) << 6
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | (mn[:, 4:8] & 0xF) << 4
    return out


def _nibbles(q, group):
    """(nb, n) values < 16 → bytes: in each run of `group` elements the first half low nibbles,
    the second half high nibbles."""
    q = q.reshape(q.shape[0], -1, 2, group // 2).astype(np.uint8)
    return (q[:, :, 0] | q[:, :, 1] << 4).reshape(q.shape[0], -1)


def _iq4_index(v):
    return np.abs(v[..., None] - IQ4_LEVELS).argmin(-1).astype(np.uint8)


def encode_blocks(x, name):
    """x: (rows, K) float32 → the raw bytes of ggml type `name`, shape (rows, K / block · size)."""
    rows = x.shape[0]
    qt = getattr(gguf.GGMLQuantizationType, name)
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        return gguf.quants.quantize(x, qt)
    bs, _ = gguf.GGML_QUANT_SIZES[qt]
    b = x.reshape(-1, bs).astype(np.float32)
    nb = b.shape[0]
    h = lambda a: _f16(a).view(np.uint8).reshape(nb, 2)
    if name == "Q2_K":
        d, dmin, sc, mn, q = _asym_subblocks(b, 16, 3, 15)
        parts = [sc | mn << 4, _two_bit_fields(q), h(d), h(dmin)]
    elif name == "Q3_K":
        d, sc, q = _sym_subblocks(b, 16, -4, 3, 6)
        s = (sc + 32).astype(np.uint8)
        scales = np.zeros((nb, 12), dtype=np.uint8)
        for i in range(16):
            scales[:, i % 8] |= (s[:, i] & 0xF) << (4 * (i // 8))
            scales[:, 8 + i % 4] |= (s[:, i] >> 4) << (2 * (i // 4))
        high = (q >= 0).astype(np.uint8).reshape(nb, 8, 32)  # bit e // 32 of hmask[e % 32]
        hmask = np.zeros((nb, 32), dtype=np.uint8)
        for bit in range(8):
            hmask |= high[:, bit] << bit
        parts = [hmask, _two_bit_fields(np.where(q >= 0, q, q + 4)), scales, h(d)]
    elif name in ("Q4_K", "Q5_K"):
        five = name == "Q5_K"
        d, dmin, sc, mn, q = _asym_subblocks(b, 32, 31 if five else 15, 63)
        parts = [h(d), h(dmin), _pack_k4_scales(sc, mn)]
        if five:
            high = (q >> 4).reshape(nb, 8, 32)  # bit j of qh[l] for sub-block j
            qh = np.zeros((nb, 32), dtype=np.uint8)
            for j in range(8):
                qh |= high[:, j] << j
            parts.append(qh)
        parts.append(_nibbles(q & 0xF, 64))
    elif name == "Q6_K":
        d, sc, q = _sym_subblocks(b, 16, -32, 31, 8)
        u = (q + 32).astype(np.uint8)
        ql = (u & 0xF).reshape(nb, 2, 2, 64)  # half, nibble, byte
        ql = (ql[:, :, 0] | ql[:, :, 1] << 4).reshape(nb, 128)
        parts = [ql, _two_bit_fields(u >> 4), sc.astype(np.int8).view(np.uint8), h(d)]
    elif name == "IQ4_NL":
        peak = np.take_along_axis(b, np.abs(b).argmax(-1)[:, None], -1)[:, 0]
        d = _f16(peak / -127.0).astype(np.float32)
        parts = [h(d), _nibbles(_iq4_index(_div(b, d[:, None])), 32)]
    elif name == "IQ4_XS":
        xs = b.reshape(nb, 8, 32)
        peak = np.take_along_axis(xs, np.abs(xs).argmax(-1)[..., None], -1)[..., 0]
        scale = peak / -127.0
        d = _f16(np.abs(scale).max(-1) / 31).astype(np.float32)
        ls = np.clip(np.rint(_div(scale, d[:, None])), -32, 31).astype(np.int16)
        s = (ls + 32).astype(np.uint16)
        scales_h = np.zeros(nb, dtype=np.uint16)
        for ib in range(8):
            scales_h |= (s[:, ib] >> 4) << (2 * ib)
        scales_l = ((s[:, 0::2] & 0xF) | (s[:, 1::2] & 0xF) << 4).astype(np.uint8)
        idx = _iq4_index(_div(xs, (d[:, None] * ls)[..., None])).reshape(nb, 256)
        parts = [h(d), scales_h.view(np.uint8).reshape(nb, 2), scales_l, _nibbles(idx, 32)]
    else:
        raise SystemExit(f"requant: no encoder for {name}")
    return np.concatenate(parts, axis=1).reshape(rows, -1)


def copy_metadata(reader, w, arch="llama", skip=()):
    """Every metadata key of a llama GGUF file into writer `w` (made for `arch`), the llama.* keys
    renamed to arch.*; the writer sets general.architecture and the GGUF.* header itself."""
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in skip:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        key = arch + "." + name[len("llama."):] if name.startswith("llama.") else name
        w.add_key_value(key, field.contents(), vtype, sub)


def llama3_rope_divisors(theta, hd, factor, low, high, orig):
    """Llama 3.1's per-pair RoPE divisors as llama.cpp's converter writes them (f32), computed in
    float64 from Hugging Face's rule."""
    out = []
    for i in range(hd // 2):
        inv = theta ** (-2.0 * i / hd)
        wavelen = 2.0 * 3.14159265358979323846 / inv
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1.0 / ((1.0 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


# The block linears by their GGUF roles (blk.N.<role>.weight).
GGUF_LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def cmd_requant(args):
    reader = gguf.GGUFReader(args.model)
    types = args.types.split(",")
    small = [t for t in types if gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, t)][0] == 32]
    if not small:
        sys.exit("requant: --types needs a 32-element type for rows that are not a multiple of 256")
    arch = reader.fields["general.architecture"].contents()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    w = gguf.GGUFWriter(args.out, arch, split_max_tensors=args.split_max_tensors)
    copy_metadata(reader, w)
    if args.rope_llama3:
        factor, low, high, orig = (float(v) for v in args.rope_llama3.split(","))
        hd = int(reader.fields["llama.embedding_length"].contents()) // int(
            reader.fields["llama.attention.head_count"].contents())
        theta = float(reader.fields["llama.rope.freq_base"].contents())
        w.add_tensor("rope_freqs.weight", llama3_rope_divisors(theta, hd, factor, low, high, orig))
        print(f"added rope_freqs.weight: Llama 3.1 scaling factor {factor}, low {low}, high {high}, "
              f"original context {orig:g}")
    used, err = {}, {}
    n_lin = 0
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        x = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        role = t.name.split(".")[-2] if t.name.startswith("blk.") else ""
        if role not in GGUF_LINEARS:
            w.add_tensor(t.name, x)
            continue
        name = types[n_lin % len(types)]
        n_lin += 1
        if shape[-1] % gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, name)][0]:
            name = small[n_lin % len(small)]
        raw = encode_blocks(x, name)
        qt = getattr(gguf.GGMLQuantizationType, name)
        back = gguf.quants.dequantize(raw, qt).reshape(shape)
        used[name] = used.get(name, 0) + 1
        err.setdefault(name, []).append(np.linalg.norm(back - x) / np.linalg.norm(x))
        w.add_tensor(t.name, raw, raw_shape=raw.shape, raw_dtype=qt)
    # A type asked for but written nowhere (or a file of plain floats) would make the checks that
    # read the file vacuous for it.
    unused = [t for t in types if t not in used]
    if unused:
        sys.exit(f"requant: no block linear of {args.model} took {', '.join(unused)} "
                 f"({n_lin} linears of roles {', '.join(GGUF_LINEARS)})")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shards = f" in {len(w.tensors)} shards" if len(w.tensors) > 1 else ""
    print(f"wrote {args.out}{shards}: " + ", ".join(f"{k}×{v}" for k, v in sorted(used.items())))
    ok = True
    for k in sorted(err):
        e = float(np.mean(err[k]))
        limit = 0.6 if k == "Q2_K" else 0.35 if k == "Q3_K" else 0.15
        ok = ok and e < limit
        print(f"  {k}: relative weight error (gguf-py's decoder against the f32 weights) "
              f"{e:.4f}, limit {limit}")
    if not ok:
        print("FAIL: an encoder gives weights far from the model's (a packing mistake?)")
    return 0 if ok else 1


# ---- Hugging Face export ---------------------------------------------------------------------

SAFETENSORS_DTYPES = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i4"): "I32",
                      np.dtype("u1"): "U8"}


def write_safetensors(path, tensors, metadata=None):
    """float arrays as F32; int32, float16 and uint8 arrays keep their dtype."""
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, a in tensors.items():
        a = np.asarray(a)
        if a.dtype.kind == "f" and a.dtype != np.float16:
            a = a.astype("<f4")
        a = np.ascontiguousarray(a)
        b = a.tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-(8 + len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def cmd_make_arch(args):
    """The model as a Qwen2, Qwen3 or Phi-3 GGUF file: general.architecture and its keys
    (qwen2.*, ...), Q/K rows in Hugging Face's order (llama.cpp's converter permutes only llama),
    the qwen2 pre-tokenizer, and, seeded: qwen2's biases on q, k, v (about 2% of the weight rows'
    norm), qwen3's per-head q/k RMSNorm weights (1 ± 0.2), or phi3's fused attn_qkv and ffn_up
    (gate rows, then up rows) — every difference of the architecture, on a model that still
    generates text. Its matrices are F16 (the model's Q4_1 and Q8_0 values rounded once), which
    both sides of every check read from this file."""
    ref = Reference(args.model)
    assert ref.arch == "llama", "make-arch starts from a llama GGUF file"
    arch = args.arch
    rng = np.random.default_rng(args.seed)
    hd = ref.head_dim
    w = gguf.GGUFWriter(args.out, arch)
    copy_metadata(ref.reader, w, arch=arch, skip=("tokenizer.ggml.pre",))
    w.add_tokenizer_pre("qwen2")
    w.add_key_length(hd)
    w.add_value_length(hd)
    tensors = {}
    for name, x in ref.t.items():
        if name.endswith("attn_q.weight") or name.endswith("attn_k.weight"):
            heads = ref.n_heads if name.endswith("attn_q.weight") else ref.n_kv_heads
            x = x.reshape(heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(x.shape)
        # Matrices as F16 (half the bytes of F32: CI's disk), vectors as F32.
        tensors[name] = np.ascontiguousarray(x, dtype=np.float16 if x.ndim == 2 else np.float32)
    if arch == "phi3":  # q|k|v as attn_qkv, gate|up as ffn_up (llama.cpp's phi3 names)
        for l in range(ref.n_layers):
            p = f"blk.{l}."
            tensors[p + "attn_qkv.weight"] = np.concatenate(
                [tensors.pop(p + r) for r in ("attn_q.weight", "attn_k.weight", "attn_v.weight")])
            tensors[p + "ffn_up.weight"] = np.concatenate(
                [tensors.pop(p + "ffn_gate.weight"), tensors.pop(p + "ffn_up.weight")])
    for name, x in tensors.items():
        w.add_tensor(name, x)
        for role in ("attn_q", "attn_k", "attn_v"):
            if arch == "qwen2" and name.endswith(f".{role}.weight"):
                scale = 0.02 * float(np.sqrt((x.astype(np.float64) ** 2).sum(1).mean()))
                w.add_tensor(name[:-len("weight")] + "bias",
                             (rng.standard_normal(x.shape[0]) * scale).astype(np.float32))
            if arch == "qwen3" and role != "attn_v" and name.endswith(f".{role}.weight"):
                w.add_tensor(name[:-len("weight")].replace(role, role + "_norm") + "weight",
                             (1 + 0.2 * rng.standard_normal(hd)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    what = {"qwen2": "q/k/v biases", "qwen3": "per-head q/k RMSNorm weights",
            "phi3": "fused q|k|v and gate|up tensors"}[arch]
    print(f"wrote {args.out}: {arch} architecture, {what} (seed {args.seed}), "
          f"tokenizer.ggml.pre qwen2")
    return 0


def hf_export(ref, rope_llama3=None):
    """The model as Hugging Face tensors (HF names and row order; float32, or float16 where it
    holds a matrix exactly) and config.json."""
    hd = ref.head_dim

    def unpermute(w, heads):  # llama.cpp's converter permutation, undone
        return w.reshape(heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)

    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
             "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
    out = {"model.embed_tokens.weight": ref.t["token_embd.weight"],
           "model.norm.weight": ref.t["output_norm.weight"]}
    llama = ref.arch == "llama"  # qwen2 files keep Hugging Face's row order
    for l in range(ref.n_layers):
        for g, h in names.items():
            if f"blk.{l}.{g}.weight" not in ref.t:  # the q/k norms of qwen3 only
                continue
            w = ref.t[f"blk.{l}.{g}.weight"]
            if llama and g == "attn_q":
                w = unpermute(w, ref.n_heads)
            elif llama and g == "attn_k":
                w = unpermute(w, ref.n_kv_heads)
            out[f"model.layers.{l}.{h}.weight"] = w
            if f"blk.{l}.{g}.bias" in ref.t:
                out[f"model.layers.{l}.{h}.bias"] = ref.t[f"blk.{l}.{g}.bias"]
    if ref.arch == "phi3":  # Hugging Face's Phi-3 names: qkv_proj, gate_up_proj
        for l in range(ref.n_layers):
            p = f"model.layers.{l}."
            out[p + "self_attn.qkv_proj.weight"] = np.concatenate(
                [out.pop(p + f"self_attn.{r}_proj.weight") for r in "qkv"])
            out[p + "mlp.gate_up_proj.weight"] = np.concatenate(
                [out.pop(p + "mlp.gate_proj.weight"), out.pop(p + "mlp.up_proj.weight")])
    f = ref.reader.fields
    a = ref.arch + "."
    config = {"architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                 "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM"}[ref.arch]],
              "model_type": ref.arch, "head_dim": hd,
              "_name_or_path": "SmolLM2-135M-Instruct (exported from GGUF by tests/llm/reference.py)",
              "vocab_size": ref.vocab, "hidden_size": ref.dim, "num_hidden_layers": ref.n_layers,
              "num_attention_heads": ref.n_heads, "num_key_value_heads": ref.n_kv_heads,
              "intermediate_size": ref.ffn, "max_position_embeddings": int(f[a + "context_length"].contents()),
              "rope_theta": ref.theta, "rms_norm_eps": ref.eps, "tie_word_embeddings": True,
              "hidden_act": "silu", "rope_scaling": None if not rope_llama3 else dict(
                  zip(("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
                      (float(v) for v in rope_llama3.split(",")))) | {"rope_type": "llama3"},
              "bos_token_id": int(f["tokenizer.ggml.bos_token_id"].contents()),
              "eos_token_id": int(f["tokenizer.ggml.eos_token_id"].contents())}
    for name, x in out.items():  # matrices F16 holds exactly (make-arch's) as F16: half the bytes
        if x.ndim == 2 and np.array_equal(x.astype(np.float16).astype(np.float32), x):
            out[name] = x.astype(np.float16)
    return out, config


def write_hf_dir(ref, out_dir, tensors, config, metadata=None):
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors, metadata)
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(config, fh, indent=1)
    hf_tokenizer(ref.reader).save(os.path.join(out_dir, "tokenizer.json"))


def cmd_export_hf(args):
    ref = Reference(args.model)
    out, config = hf_export(ref, args.rope_llama3)
    write_hf_dir(ref, args.out, out, config)
    print(f"wrote {args.out}/model.safetensors, config.json, tokenizer.json")


# ---- GPTQ / AWQ checkpoints ------------------------------------------------------------------------
# The model's block linears quantized to 4 bits with groups of G along the input (round to
# nearest, asymmetric: w ≈ s·(q − z), s f16), packed the way AutoGPTQ (v1: zeros stored minus 1;
# v2: as they are) or AutoAWQ's GEMM version packs them, with config.json's quantization_config;
# and the same q, z, s written as a nibble checkpoint (w4a16_g<G>_asym_sf16: q (n, k/2) low
# nibble first, scales (n, k/G) f16, zeros (n, k/G) u8) by this file's own code, so that nibble
# must give identical logits for the two.
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's pack order: nibble i holds column 8c + AWQ_ORDER[i]
HF_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def rtn_asym(w, group, min_zero):
    """(q, z, s): q (n, k) and z (n, k/G) in [0, 15], s (n, k/G) float16."""
    n, k = w.shape
    wg = w.astype(np.float64).reshape(n, k // group, group)
    lo, hi = np.minimum(wg.min(2), 0.0), np.maximum(wg.max(2), 0.0)
    s = ((hi - lo) / 15).astype(np.float16)
    s = np.where(s == 0, np.float16(1), s)
    sf = s.astype(np.float64)
    z = np.clip(np.rint(-lo / sf), min_zero, 15)
    q = np.clip(np.rint(wg / sf[:, :, None]) + z[:, :, None], 0, 15).reshape(n, k)
    return q.astype(np.uint32), z.astype(np.uint32), s


def pack_along(v, axis_len, order=range(8)):
    """(rows, axis_len) 4-bit values → (rows, axis_len/8) int32, nibble i = column 8c + order[i]."""
    v = v.reshape(v.shape[0], axis_len // 8, 8)
    word = np.zeros(v.shape[:2], dtype=np.uint32)
    for i, col in enumerate(order):
        word |= (v[:, :, col] & 0xF) << np.uint32(4 * i)
    return word.view(np.int32)


def cmd_export_quantized(args):
    ref = Reference(args.model)
    out, config = hf_export(ref)
    g = args.group
    rng = np.random.default_rng(args.seed)
    foreign, native = {}, {}
    for name, w in out.items():
        stem = name[:-len(".weight")]
        if not any(stem.endswith(l) for l in HF_LINEARS):
            foreign[name] = w
            native[name] = w
            continue
        n, k = w.shape
        q, z, s = rtn_asym(w, g, 1 if args.method == "gptq" and not args.gptq_v2 else 0)
        # nibble's checkpoint: q (n, k/2) u8, element 2i in the low nibble; scales, zeros (n, k/G)
        native[stem + ".qweight"] = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
        native[stem + ".scales"] = s
        native[stem + ".zeros"] = z.astype(np.uint8)
        if args.method == "gptq":
            # qweight (k/8, n): bits 4j.. of [i, c] hold q[c, 8i + j]
            qt = q.T.reshape(k // 8, 8, n)
            word = np.zeros((k // 8, n), dtype=np.uint32)
            for j in range(8):
                word |= qt[:, j, :] << np.uint32(4 * j)
            foreign[stem + ".qweight"] = word.view(np.int32)
            stored_z = z - 1 if not args.gptq_v2 else z
            foreign[stem + ".qzeros"] = pack_along(stored_z.T.copy(), n)
            foreign[stem + ".scales"] = np.ascontiguousarray(s.T)
            g_idx = np.arange(k, dtype=np.int32) // g
            if args.act_order:
                g_idx = rng.permutation(g_idx).astype(np.int32)
            foreign[stem + ".g_idx"] = g_idx
        else:
            foreign[stem + ".qweight"] = pack_along(q.T.copy(), n, AWQ_ORDER)
            foreign[stem + ".qzeros"] = pack_along(z.T.copy(), n, AWQ_ORDER)
            foreign[stem + ".scales"] = np.ascontiguousarray(s.T)
    if args.method == "gptq":
        qc = {"quant_method": "gptq", "bits": 4, "group_size": g, "desc_act": bool(args.act_order),
              "sym": False, "checkpoint_format": "gptq_v2" if args.gptq_v2 else "gptq"}
    else:
        qc = {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": True,
              "version": "gemm"}
    write_hf_dir(ref, args.out, foreign, config | {"quantization_config": qc})
    fmt = f"w4a16_g{g}_asym_sf16"
    write_hf_dir(ref, args.nibble_out, native, config, {"nibble.format": fmt})
    print(f"wrote {args.out} ({qc}) and {args.nibble_out} (nibble {fmt}): the same codes")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tokens")
    p.add_argument("--model", required=True)
    p.add_argument("--sha256", default="")
    p.add_argument("--out", required=True)
    p = sub.add_parser("check")
    p.add_argument("--model", required=True)
    p.add_argument("--nibble", required=True)
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("-n", type=int, default=32)
    p.add_argument("--safetensors", default="", help="a checkpoint from export-hf to compare too")
    p = sub.add_parser("check-same")
    p.add_argument("--nibble", required=True)
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--prompt-ids", default="1,504,3458,282,4649,314")
    p.add_argument("-n", type=int, default=8)
    p.add_argument("--format", default="f32", help="nibble's --format for both")
    p = sub.add_parser("check-tokens")
    p.add_argument("--model", required=True)
    p.add_argument("--nibble", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--safetensors", default="", help="also tokenize with this checkpoint's tokenizer.json")
    p = sub.add_parser("check-spm")
    p.add_argument("--nibble", required=True)
    p.add_argument("--train", required=True, help="text to train the SentencePiece model on")
    p.add_argument("--text", required=True, help="text to tokenize with both")
    p.add_argument("--out-dir", required=True)
    p = sub.add_parser("check-pre-split")
    p.add_argument("--model", required=True)
    p.add_argument("--nibble", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--pre", choices=sorted(PRE_SPLIT_REGEX), required=True)
    p.add_argument("--random", type=int, default=5000)
    p.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    p = sub.add_parser("requant")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--types", default="Q4_K,Q5_K,Q6_K,Q3_K,Q2_K,IQ4_XS,Q5_0,Q5_1,IQ4_NL")
    p.add_argument("--rope-llama3", default="", metavar="FACTOR,LOW,HIGH,ORIG",
                   help="add Llama 3.1 RoPE scaling as a rope_freqs.weight tensor")
    p.add_argument("--split-max-tensors", type=int, default=0,
                   help="write shards of at most this many tensors (llama.cpp's gguf-split)")
    p = sub.add_parser("make-arch")
    p.add_argument("--arch", choices=["qwen2", "qwen3", "phi3"], required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    p = sub.add_parser("export-hf")
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rope-llama3", default="", metavar="FACTOR,LOW,HIGH,ORIG",
                   help="the rope_scaling that the GGUF file's rope_freqs.weight was made from")
    p = sub.add_parser("export-quantized")
    p.add_argument("--model", required=True)
    p.add_argument("--method", choices=("gptq", "awq"), required=True)
    p.add_argument("--out", required=True, help="the GPTQ / AWQ checkpoint")
    p.add_argument("--nibble-out", required=True, help="the same codes as a nibble checkpoint")
    p.add_argument("--group", type=int, default=64, help="SmolLM2's 576 inputs take 32 or 64")
    p.add_argument("--gptq-v2", action="store_true", help="zeros stored as they are (gptq_v2)")
    p.add_argument("--act-order", action="store_true", help="a permuted g_idx (desc_act)")
    p.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.cmd == "export-quantized":
        return cmd_export_quantized(args)
    if args.cmd == "tokens":
        return cmd_tokens(args)
    if args.cmd == "check":
        return cmd_check(args)
    if args.cmd == "check-same":
        return cmd_check_same(args)
    if args.cmd == "check-tokens":
        return cmd_check_tokens(args)
    if args.cmd == "check-spm":
        return cmd_check_spm(args)
    if args.cmd == "check-pre-split":
        return cmd_check_pre_split(args)
    if args.cmd == "make-arch":
        return cmd_make_arch(args)
    if args.cmd == "requant":
        return cmd_requant(args)
    return cmd_export_hf(args)


if __name__ == "__main__":
    sys.exit(main())
