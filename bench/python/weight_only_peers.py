#!/usr/bin/env python3
"""Weight-only int4 at decode sizes against torch's int4 kernel, in one run (issue 4).

For each layer shape and M, times in the same process:
  * nibble's W4A16 formats (QuantizedLinear: bf16 in, bf16 out, one call = one launch);
  * torch._weight_int4pack_mm (tinygemm, W4A16 g128 with bf16 scales and zeros: the int4 kernel
    PyTorch and torchao ship);
  * cuBLAS bf16 (torch.nn.functional.linear).
Method: each candidate's 20 calls are captured in a CUDA graph, cycling through enough weight
copies to exceed 4x L2 (so every call streams its weights from HBM); the graph is replayed 7
times and the median per call is kept. The device-to-device copy ceiling is measured in the same
run. wGB/s counts the 4-bit weight payload (N*K/2 bytes) for every int4 method and N*K*2 for
bf16, so the int4 columns compare like for like.

  python bench/python/weight_only_peers.py --out bench/results/h100_weight_only_peers.json \
      --commit $(git rev-parse --short HEAD)

Options: --m 1,4,8,16,32  --shapes 4096x4096,...  --formats w4a16_g128,w4a16_g128_asym
"""

import argparse
import copy
import datetime
import json
import statistics

import torch

import nibble.torch as nt

SHAPES = "6144x4096,4096x4096,28672x4096,4096x14336,10240x8192,8192x28672,5120x5120,13824x5120"


def timed(fn, copies, reps=7, inner=20):
    """Median µs per call of `inner` calls fn(i), i cycling over `copies`, in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            fn(i % copies)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(inner):
            fn(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / inner)
    return statistics.median(times)


def copy_ceiling():
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = timed(lambda i: y.copy_(x), 1, reps=5, inner=5)
    return 2 * x.numel() / (t * 1e-6) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", default="1,4,8,16,32")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--formats", default="w4a16_g128,w4a16_g128_asym")
    ap.add_argument("--out", default="")
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20)

    def copies(nbytes):
        return max(2, min(16, int(4 * l2 // max(nbytes, 1)) + 1))

    ceiling = copy_ceiling()
    result = {"device": props.name, "date": datetime.date.today().isoformat(),
              "commit": args.commit, "torch": torch.__version__, "copy_GBps": round(ceiling, 1),
              "method": "CUDA-graph replay of 20 calls, median of 7 replays, weights rotated "
                        "over >= 4x L2; wGBps = 4-bit payload N*K/2 (bf16: N*K*2) per second",
              "records": []}
    formats = [f for f in args.formats.split(",") if f]
    print(f"{props.name}, copy ceiling {ceiling:.0f} GB/s, torch {torch.__version__}")
    print(f"{'N x K':>13} {'M':>3} " + " ".join(f"{f:>16}" for f in formats) +
          f" {'torch int4':>11} {'bf16':>8} {'x torch int4':>13} {'x bf16':>7} {'% copy':>7}")
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
        torch.nn.init.normal_(lin.weight, std=0.02)
        n4 = copies(n * k // 2)
        ours = {}
        for f in formats:
            q = nt.QuantizedLinear.from_linear(lin, f)
            ours[f] = [q] + [copy.deepcopy(q) for _ in range(n4 - 1)]
        w_bf16 = [lin.weight.detach().clone() for _ in range(copies(n * k * 2))]
        w_int4 = [torch._convert_weight_to_int4pack(
            torch.randint(0, 255, (n, k // 2), device="cuda", dtype=torch.uint8), 8)
            for _ in range(n4)]
        scales_zeros = torch.rand(k // 128, n, 2, device="cuda", dtype=torch.bfloat16)
        del lin
        for m in [int(v) for v in args.m.split(",")]:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            times = {}
            for f in formats:
                mods = ours[f]
                times[f] = timed(lambda i, mods=mods: mods[i](x), len(mods))
            times["torch_int4_w4a16_g128"] = timed(
                lambda i: torch._weight_int4pack_mm(x, w_int4[i], 128, scales_zeros), n4)
            times["cublas_bf16"] = timed(
                lambda i: torch.nn.functional.linear(x, w_bf16[i]), len(w_bf16))
            for op, us in times.items():
                wbytes = n * k * 2 if op == "cublas_bf16" else n * k // 2
                result["records"].append({"op": op, "M": m, "N": n, "K": k, "us": round(us, 3),
                                          "wGBps": round(wbytes / (us * 1e-6) / 1e9, 1)})
            best = min(times[f] for f in formats)
            print(f"{n:6d}x{k:<6d} {m:3d} " + " ".join(f"{times[f]:16.2f}" for f in formats) +
                  f" {times['torch_int4_w4a16_g128']:11.2f} {times['cublas_bf16']:8.2f}"
                  f" {times['torch_int4_w4a16_g128'] / best:13.2f}"
                  f" {times['cublas_bf16'] / best:7.2f}"
                  f" {100 * (n * k / 2) / (best * 1e-6) / 1e9 / ceiling:6.0f}%", flush=True)
        del ours, w_bf16, w_int4
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=0)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
