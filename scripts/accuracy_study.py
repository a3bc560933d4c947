#!/usr/bin/env python3
"""The accuracy study of docs/accuracy.md: perplexity of SmolLM2-135M-Instruct on the held-out
Austen text for weight bits {8, 4, 3, 2} x granularity {per channel, 128, 64, 32} x method {RTN,
GPTQ, SmoothQuant+RTN, SmoothQuant+GPTQ} in W8A8, W4A8 and W4A16, plus the real-format checks.

Every cell: `nibble quantize` writes a checkpoint (the real quantizers), `nibble perplexity
--format sim:FMT` evaluates it (weights dequantized, activations quantized per token, f32
products; docs/accuracy.md, "Method"). A checkpoint serves every activation scheme of its
weight format (W4A8 and W4A16 share one). Results go to a JSON file cell by cell, so an
interrupted run resumes where it stopped; `--report` renders docs/accuracy.md's generated part
and the plot (needs matplotlib) from the JSON alone.

  usage: accuracy_study.py --nibble EXE --model GGUF --train TXT --heldout TXT --json OUT
                           [--doc docs/accuracy.md --plot docs/accuracy.png] [--report]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

GRANS = ["pc", "g128", "g64", "g32"]
METHODS = ["rtn", "gptq", "smoothquant-rtn", "smoothquant-gptq"]
METHOD_LABEL = {"rtn": "RTN", "gptq": "GPTQ", "smoothquant-rtn": "SQ+RTN",
                "smoothquant-gptq": "SQ+GPTQ"}
MAX_TOKENS, CTX = 2048, 512
# Cells also evaluated through nibble's reference linear (the real formats), on the same
# checkpoint: the headline rows, and the simulated mode's agreement for W4A8, W8A8 and W4A16.
REAL_CHECKS = {("a8", 4, "g128", "rtn"), ("a8", 4, "g128", "gptq"), ("a16", 4, "g128", "rtn"),
               ("a8", 8, "pc", "rtn"), ("a8", 8, "pc", "smoothquant-rtn")}
CALIB_SAMPLES, CALIB_LEN, SEED, ALPHA = 8, 512, 0, 0.5
ALPHA_SWEEP = (0.25, 0.75, 0.9)  # besides ALPHA; method "smoothquant-rtn@<alpha>"


def weight_format(bits, gran, act):
    """The linear format string of a cell: w8 for 8-bit weights, w4 (qmax restricted) below."""
    if bits == 8:
        return "w8a8" if gran == "pc" else f"w8a8_{gran}"
    return f"w4{act}_{gran}"


def cells():
    """Every (act, bits, gran, method), most important first (a run cut short still has the
    acceptance rows, then the 4-bit grid, then the cheap methods everywhere, then the rest)."""
    out = []

    def add(act, bits, gran, method):
        if (act, bits, gran, method) not in out:
            out.append((act, bits, gran, method))

    def both(bits, gran, method):  # W4A8 and W4A16 share a checkpoint: evaluate them together
        add("a8", bits, gran, method)
        if bits < 8:
            add("a16", bits, gran, method)

    for m in METHODS:  # the acceptance rows
        both(4, "g128", m)
    for m in METHODS:
        both(8, "pc", m)
    for gran in GRANS:
        for m in METHODS:
            both(4, gran, m)
    for bits in (3, 2, 8):  # 8-bit groups: RTN and SmoothQuant only (GPTQ: see the doc)
        for gran in GRANS:
            for m in ("rtn", "smoothquant-rtn"):
                both(bits, gran, m)
    for alpha in ALPHA_SWEEP:  # SmoothQuant's migration strength, with RTN
        add("a8", 8, "pc", f"smoothquant-rtn@{alpha}")
        add("a8", 4, "g128", f"smoothquant-rtn@{alpha}")
    for bits in (3, 2):
        for gran in GRANS:
            for m in ("gptq", "smoothquant-gptq"):
                both(bits, gran, m)
    return out


def key(act, bits, gran, method):
    return f"{act}/w{bits}/{gran}/{method}"


def run(cmd):
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout, time.time() - t0


def perplexity(a, model, fmt, max_tokens=MAX_TOKENS):
    out, secs = run([a.nibble, "perplexity", model, "--text", a.heldout, "--max-tokens",
                     str(max_tokens), "--ctx", str(CTX), "--format", fmt, "--quiet"])
    m = re.search(r"perplexity ([0-9.]+) .*tokens scored ([0-9]+)", out)
    return {"ppl": float(m.group(1)), "scored": int(m.group(2)), "eval_s": round(secs, 1)}


def study(a):
    res = json.load(open(a.json)) if os.path.exists(a.json) else {}
    res.setdefault("config", {"model": os.path.basename(a.model), "max_tokens": MAX_TOKENS,
                              "ctx": CTX, "calib_samples": CALIB_SAMPLES,
                              "calib_len": CALIB_LEN, "seed": SEED, "alpha": ALPHA,
                              "gptq": "act-order, damp 0.01, block 128"})
    cells_done = res.setdefault("cells", {})
    t_start = time.time()

    def save():
        res["wall_s"] = round(res.get("wall_s", 0) + time.time() - save.t, 1)
        save.t = time.time()
        tmp = a.json + ".tmp"
        json.dump(res, open(tmp, "w"), indent=1, sort_keys=True)
        os.replace(tmp, a.json)
    save.t = time.time()

    base = res.setdefault("baseline", {})
    for fmt in ("f32", "bf16"):
        if fmt not in base:
            base[fmt] = perplexity(a, a.model, fmt)
            print(f"{fmt}: {base[fmt]['ppl']}", flush=True)
            save()
    work = tempfile.mkdtemp(prefix="nibble-accuracy-")
    ckpts = {}  # (bits, gran, method) -> (dir, stored format)
    try:
        todo = [c for c in cells() if key(*c) not in cells_done]
        for i, (act, bits, gran, method) in enumerate(todo):
            wk = (bits, gran, method)
            if wk not in ckpts:
                for d, *_ in ckpts.values():  # one checkpoint on disk at a time
                    shutil.rmtree(d, ignore_errors=True)
                ckpts.clear()
                fmt = weight_format(bits, gran, "a8")
                d = os.path.join(work, "ckpt")
                base_method, _, alpha = method.partition("@")
                cmd = [a.nibble, "quantize", a.model, "--format", fmt, "--method", base_method,
                       "--out", d, "--quiet", "--seed", str(SEED), "--alpha", alpha or str(ALPHA)]
                if bits in (3, 2):
                    cmd += ["--bits", str(bits)]
                if method != "rtn":
                    cmd += ["--calib", a.train, "--calib-samples", str(CALIB_SAMPLES),
                            "--calib-len", str(CALIB_LEN)]
                if "gptq" in method:
                    cmd += ["--act-order"]
                _, qsecs = run(cmd)
                ckpts[wk] = (d, fmt, round(qsecs, 1))
            d, stored, qsecs = ckpts[wk]
            fmt = weight_format(bits, gran, act)
            r = perplexity(a, d, "sim:" + fmt)
            r.update({"format": fmt, "quantize_s": qsecs})
            cells_done[key(act, bits, gran, method)] = r
            print(f"[{i + 1}/{len(todo)}] {key(act, bits, gran, method)} {fmt}: {r['ppl']} "
                  f"(quantize {qsecs} s, eval {r['eval_s']} s)", flush=True)
            if (act, bits, gran, method) in REAL_CHECKS:  # the same checkpoint, real format
                real = perplexity(a, d, fmt)
                res.setdefault("real", {})[key(act, bits, gran, method)] = {"real": real,
                                                                             "sim": r}
                print(f"  real {fmt}: {real['ppl']} ({real['eval_s']} s)", flush=True)
            save()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"study: {time.time() - t_start:.0f} s this run")


# ---- the report --------------------------------------------------------------------------------

def fmt_ppl(v):
    return "—" if v is None else (f"{v:.2f}" if v < 1000 else f"{v:.3g}")


def report(a):
    res = json.load(open(a.json))
    c, base = res["cells"], res["baseline"]
    bf16 = base["bf16"]["ppl"]
    lines = []
    L = lines.append
    L(f"bf16 perplexity **{bf16:.2f}**, f32 {base['f32']['ppl']:.2f} "
      f"({base['bf16']['scored']:,} tokens scored). Cells: perplexity (simulated formats, "
      f"see Method); — = not run.")
    L("")
    for act, bits_list, title in (("a8", [8], "W8A8 (int8 weights, int8 per-token activations)"),
                                  ("a8", [4, 3, 2], "W4A8 (int4 storage, int8 per-token activations)"),
                                  ("a16", [4, 3, 2], "W4A16 (int4 storage, bf16 activations)")):
        L(f"### {title}")
        L("")
        L("| bits | granularity | " + " | ".join(METHOD_LABEL[m] for m in METHODS) +
          " | GPTQ gap closed |")
        L("|---|---|" + "---|" * len(METHODS) + "---|")
        for bits in bits_list:
            for gran in GRANS:
                row = [c.get(key(act, bits, gran, m), {}).get("ppl") for m in METHODS]
                if all(v is None for v in row):
                    continue
                rtn, gq = row[0], row[1]
                gap = (f"{100 * (rtn - gq) / (rtn - bf16):.0f}%" if rtn and gq and rtn > bf16
                       else "—")
                L(f"| {bits} | {'per channel' if gran == 'pc' else gran} | " +
                  " | ".join(fmt_ppl(v) for v in row) + f" | {gap} |")
        L("")
    sweep = [(al, c.get(key("a8", 8, "pc", f"smoothquant-rtn@{al}"), {}).get("ppl"),
              c.get(key("a8", 4, "g128", f"smoothquant-rtn@{al}"), {}).get("ppl"))
             for al in sorted(ALPHA_SWEEP + (ALPHA,))]
    if any(v is not None for _, v, _ in sweep):
        L("### SmoothQuant's α (with RTN)")
        L("")
        rtn8 = c.get(key("a8", 8, "pc", "rtn"), {}).get("ppl")
        rtn4 = c.get(key("a8", 4, "g128", "rtn"), {}).get("ppl")
        L("| α | W8A8 per channel | W4A8 g128 |")
        L("|---|---|---|")
        L(f"| — (RTN) | {fmt_ppl(rtn8)} | {fmt_ppl(rtn4)} |")
        for al, v8, v4 in sweep:
            if al == ALPHA:
                v8 = c.get(key("a8", 8, "pc", "smoothquant-rtn"), {}).get("ppl")
                v4 = c.get(key("a8", 4, "g128", "smoothquant-rtn"), {}).get("ppl")
            L(f"| {al} | {fmt_ppl(v8)} | {fmt_ppl(v4)} |")
        L("")
    real = res.get("real", {})
    if real:
        L("### Real formats (nibble's reference linear) against the simulated mode")
        L("")
        L("| format | method | real | simulated | difference | real s | simulated s |")
        L("|---|---|---|---|---|---|---|")
        for k, r in real.items():
            method = k.split("/")[-1]
            fmt = r["sim"]["format"]
            d = 100 * (r["sim"]["ppl"] - r["real"]["ppl"]) / r["real"]["ppl"]
            L(f"| {fmt} | {METHOD_LABEL[method]} | {r['real']['ppl']:.2f} | {r['sim']['ppl']:.2f} "
              f"| {d:+.2f}% | {r['real']['eval_s']:.0f} | {r['sim']['eval_s']:.0f} |")
        L("")
    total_q = sum(v.get("quantize_s", 0) for v in c.values())
    L(f"Cells run: {len(c)} of {len(cells())}; wall time of the study so far "
      f"{res.get('wall_s', 0) / 60:.0f} min on this 2-core machine (the sum of the cells' "
      f"quantization times, each checkpoint counted once per cell that used it, is "
      f"{total_q / 60:.0f} min).")
    text = "\n".join(lines)
    doc = open(a.doc).read()
    begin, end = "<!-- BEGIN GENERATED (scripts/accuracy-study.sh) -->", "<!-- END GENERATED -->"
    i, j = doc.index(begin) + len(begin), doc.index(end)
    open(a.doc, "w").write(doc[:i] + "\n" + text + "\n" + doc[j:])
    plot(res, a.plot, bf16)


def plot(res, path, bf16):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    c = res["cells"]
    panels = (("a8", 8), ("a8", 4), ("a16", 4), ("a8", 3))
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 4.6))
    for ax, (act, bits) in zip(axes, panels):
        for m, style in zip(METHODS, ("o-", "s-", "^--", "v--")):
            ys = [c.get(key(act, bits, g, m), {}).get("ppl") for g in GRANS]
            xs = [i for i, y in enumerate(ys) if y is not None]
            ax.plot(xs, [ys[i] for i in xs], style, label=METHOD_LABEL[m])
        ax.axhline(bf16, color="k", lw=0.8, ls=":", label="bf16")
        ax.set_xticks(range(len(GRANS)), ["per channel", "g128", "g64", "g32"])
        ax.set_title(f"W{bits}{'A8' if act == 'a8' else 'A16'}")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("perplexity (held-out Austen, 2,044 tokens; log scale)")
    axes[1].legend()
    fig.suptitle("SmolLM2-135M-Instruct: perplexity by granularity and method (simulated "
                 "formats; each panel its own scale; 2-bit: tables)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nibble")
    p.add_argument("--model")
    p.add_argument("--train")
    p.add_argument("--heldout")
    p.add_argument("--json", required=True)
    p.add_argument("--doc", default="docs/accuracy.md")
    p.add_argument("--plot", default="docs/accuracy.png")
    p.add_argument("--report", action="store_true", help="only render the doc and the plot")
    a = p.parse_args()
    if not a.report:
        study(a)
    report(a)


if __name__ == "__main__":
    main()
