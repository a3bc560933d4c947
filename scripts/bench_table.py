#!/usr/bin/env python3
"""Renders a bench JSON (bench/results/<gpu>.json, written by `nibble bench gemm --json`) as a
markdown table: per layer and M, the time of each nibble format and of each peer, and the ratio
of the best nibble format to each peer. Usage: scripts/bench_table.py FILE [--ops a,b,...]"""
import json
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    data = json.load(open(sys.argv[1]))
    recs = [r for r in data["records"] if "us" in r]
    # Peers (cublas*) and the read-only reference rows (read_*: a plain read of the same int4 or
    # int8 weight bytes, decode rows only) are not nibble formats.
    ours = sorted({r["op"] for r in recs if not r["op"].startswith(("cublas", "read_"))})
    peers = ["cublas_bf16", "cublaslt_s8"]
    cells = {}
    for r in recs:
        cells[(r["N"], r["K"], r["M"], r["op"])] = r
    shapes = sorted({(r["N"], r["K"]) for r in recs}, key=lambda s: (s[1] * s[0]))
    ms = sorted({r["M"] for r in recs})
    print(f"{data['device']}, {data['date']}, commit {data['commit']}; copy ceiling "
          f"{data['copy_GBps']:.0f} GB/s; {data['method']}\n")
    head = ["N×K", "M"] + [f"{o} µs" for o in ours] + [f"{p} µs" for p in peers] + \
           ["best / bf16", "best / s8", "best wGB/s (% copy)", "int4 read wGB/s (% copy)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for n, k in shapes:
        for m in ms:
            row = [f"{n}×{k}", str(m)]
            best = None
            for o in ours:
                r = cells.get((n, k, m, o))
                row.append(f"{r['us']:.1f}" if r else "—")
                if r and (best is None or r["us"] < best["us"]):
                    best = r
            for p in peers:
                r = cells.get((n, k, m, p))
                row.append(f"{r['us']:.1f}" if r else "—")
            for p in peers:
                r = cells.get((n, k, m, p))
                row.append(f"{r['us'] / best['us']:.2f}×" if (r and best) else "—")
            for r in (best, cells.get((n, k, m, "read_int4_bytes"))):
                row.append(f"{r['wGBps']:.0f} ({100 * r['wGBps'] / data['copy_GBps']:.0f}%)"
                           if r else "—")
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
