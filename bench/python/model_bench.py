#!/usr/bin/env python3
"""The Python package's acceptance benchmark (issue 8): a stack of Llama-3-8B-shaped blocks
(q/k/v/o projections + gated MLP, bf16) quantized with nibble.torch.quantize_ for each format,
against the float model on one GPU.

For each format it measures, with CUDA-graph replay (warm-up first, median of repeats, CUDA
events), the whole model and the model's linear layers alone (every nn.Linear / QuantizedLinear
of the stack called once in order on static inputs: the "kernel level", activation quantization
included), at M tokens, and checks:
  * accuracy: relative Frobenius error of the output against the float model ≤ the format's
    tolerance (tests/python/nibble_testing.py REL_TOL_VS_FLOAT);
  * speed: model speedup (float time / nibble time) ≥ 0.85 × the speedup the kernel-level
    ratio gives the model, i.e. the model keeps at least that ratio minus 15%. The model's other
    work (norms, attention, elementwise: the float model's model − linears time) is the same in
    both models, so the kernel-level ratio carries over to the model as
        expected = float model / (float model − float linears + nibble linears)
    (Amdahl's law): the raw kernel-level ratio is out of any model's reach once its linears are
    much faster than the rest (H200, 2026-11-29: w4a8_pc linears 2.06× faster, the rest 94 µs of
    the float model's 368 µs, so at most 1.62×). `glue_us` is the time the nibble model spends
    outside its linears beyond the float model's: what a format's layer costs around its kernels
    (overlapping launches between linears, which the model's torch ops in between forgo, would
    count here too).
The weights of 2 or more blocks exceed 3× the H100's L2, so nothing runs from cache.

  python bench/python/model_bench.py --out bench/results/python_model_h100.json --check

Options: --layers N (default 2), --m M (default 1), --formats a,b,c (default: every format of
nibble.LINEAR_FORMATS), --repeats R, --compile (also time torch.compile(fullgraph) + graph).
Exit status 1 with --check when a format misses either criterion.
"""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "python"))

import torch  # noqa: E402

import nibble  # noqa: E402
import nibble.torch as nt  # noqa: E402
from llama_stack import LLAMA3_8B, capture, make_stack  # noqa: E402
from nibble_testing import rel_fro, tol_vs_float  # noqa: E402

SPEED_SLACK = 0.85


def time_graph(graph, repeats, inner=20):
    """Median µs of one replay over `repeats` batches of `inner` replays."""
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / inner)
    return statistics.median(times)


def linear_inputs(model, m, device):
    """(layer, static input) for every linear layer of the stack, in order."""
    pairs = []
    for mod in model.modules():
        if isinstance(mod, (torch.nn.Linear, nt.QuantizedLinear)):
            pairs.append((mod, torch.randn(m, mod.in_features, device=device,
                                           dtype=torch.bfloat16)))
    return pairs


def measure(model, x, m, repeats, do_compile):
    with torch.no_grad():
        g_model, _ = capture(model, x)
        pairs = linear_inputs(model, m, x.device)
        g_lin, _ = capture(lambda: [layer(inp) for layer, inp in pairs])
        r = {"model_us": time_graph(g_model, repeats), "linears_us": time_graph(g_lin, repeats)}
        if do_compile:
            # Every format compiles the same forward code objects: without a reset, dynamo's
            # recompile limit (8 per code object) ends a run of all formats under fullgraph.
            torch._dynamo.reset()
            t0 = time.time()
            compiled = torch.compile(model, fullgraph=True)
            compiled(x)
            r["compile_s"] = time.time() - t0
            g_c, _ = capture(compiled, x)
            r["compiled_model_us"] = time_graph(g_c, repeats)
        del g_model, g_lin
    return r


def judge_speed(r, base):
    """Adds the speed criterion's numbers to a format's result r (model_us, linears_us) against
    the float model's `base`; see the module docstring."""
    other_us = base["model_us"] - base["linears_us"]  # the float model outside its linears
    r["kernel_speedup"] = base["linears_us"] / r["linears_us"]
    r["model_speedup"] = base["model_us"] / r["model_us"]
    r["expected_model_speedup"] = base["model_us"] / (other_us + r["linears_us"])
    r["glue_us"] = r["model_us"] - r["linears_us"] - other_us
    r["speed_ok"] = r["model_speedup"] >= SPEED_SLACK * r["expected_model_speedup"]


def write(result, path):
    """Writes the JSON (when a path is given); True if written."""
    if not path:
        return False
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--formats", default=",".join(nibble.LINEAR_FORMATS))
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--commit", default="",
                    help="the commit measured (default: git rev-parse HEAD; a copied working "
                         "tree's git may name another)")
    args = ap.parse_args()

    dev = torch.device("cuda")
    info = nibble.cuda_device_info(0)
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=HERE).stdout.strip()
    except OSError:
        sha = ""
    result = {"bench": "python_model", "git_sha": args.commit or sha,
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "device": info,
              "nibble": nibble.build_info(), "torch": torch.__version__,
              "torch_cuda": torch.version.cuda, "layers": args.layers, "m": args.m,
              "dims": LLAMA3_8B, "speed_slack": SPEED_SLACK, "formats": {}}

    torch.manual_seed(0)
    float_model = make_stack(args.layers, device=dev)
    x = torch.randn(args.m, LLAMA3_8B["d"], device=dev, dtype=torch.bfloat16)
    checks = [torch.randn(mm, LLAMA3_8B["d"], device=dev, dtype=torch.bfloat16)
              for mm in (args.m, 16)]
    calib = [torch.randn(16, LLAMA3_8B["d"], device=dev, dtype=torch.bfloat16)]
    base = measure(float_model, x, args.m, args.repeats, args.compile)
    result["float"] = base
    print(f"float bf16: model {base['model_us']:.1f} us, linears {base['linears_us']:.1f} us",
          flush=True)
    with torch.no_grad():
        refs = [float_model(c).float() for c in checks]

    failed = []
    for fmt in args.formats.split(","):
        t0 = time.time()
        model = nt.quantize_(copy.deepcopy(float_model), fmt, calibration_data=calib)
        quantize_s = time.time() - t0
        with torch.no_grad():
            err = max(rel_fro(model(c).float(), r) for c, r in zip(checks, refs))
        r = measure(model, x, args.m, args.repeats, args.compile)
        r["quantize_s"] = quantize_s
        r["rel_err"] = err
        r["tolerance"] = tol_vs_float(fmt)
        r["layout"] = sorted({q.layout for q in model.modules()
                              if isinstance(q, nt.QuantizedLinear)})
        judge_speed(r, base)
        r["accuracy_ok"] = err <= r["tolerance"]
        result["formats"][fmt] = r
        if not (r["accuracy_ok"] and r["speed_ok"]):
            failed.append(fmt)
        print(f"{fmt:24s} err {err:.4f} (tol {r['tolerance']}) model {r['model_us']:8.1f} us "
              f"linears {r['linears_us']:8.1f} us  speedup model {r['model_speedup']:.2f}x "
              f"kernel {r['kernel_speedup']:.2f}x (model expected {r['expected_model_speedup']:.2f}x, "
              f"glue {r['glue_us']:+.1f} us)  {'ok' if fmt not in failed else 'FAIL'} "
              f"({r['layout']}, quantize {quantize_s:.1f} s)", flush=True)
        del model
        torch.cuda.empty_cache()
        result["failed"] = failed
        write(result, args.out)  # after every format: a run cut short keeps what it measured

    result["failed"] = failed
    if write(result, args.out):
        print("wrote", args.out)
    print(f"{len(result['formats']) - len(failed)} passed, {len(failed)} failed")
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
