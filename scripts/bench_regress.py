#!/usr/bin/env python3
"""Flags bench cells that got slower: compares a new `nibble bench gemm` JSON with earlier ones.

    scripts/bench_regress.py NEW.json OLD.json [OLD2.json ...] [--threshold 0.10]

A cell is (op, M, N, K). Each nibble cell of NEW is compared with the same cell in the OLD files
(the fastest time among them, so a committed grid plus topical runs can serve as the baseline)
and printed when it is more than `threshold` slower. Peers (cuBLAS, cuBLASLt) are printed the
same way but do not count: their drift says how much of a nibble change is the machine's.
Exit status 1 when a nibble cell regressed, so a GPU script can flag it; it never edits anything.

Why: a register count that drifted by two took a quarter of the W4A16 decode tile's occupancy
and 20-42% of its speed for a day (docs/kernels.md, "Decode occupancy") while every acceptance
cell still looked plausible on its own.
"""
import argparse
import json
import sys

PEERS = ("cublas", "cublaslt", "read_")  # peers and reference rows: reported, not counted


def cells(path):
    with open(path) as f:
        data = json.load(f)
    return {(r["op"], r["M"], r["N"], r["K"]): r["us"] for r in data["records"]}, data


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("new")
    ap.add_argument("old", nargs="+")
    ap.add_argument("--threshold", type=float, default=0.10,
                    help="relative slowdown that is reported (default 0.10)")
    args = ap.parse_args()

    new, new_data = cells(args.new)
    best = {}
    for path in args.old:
        old, _ = cells(path)
        for key, us in old.items():
            best[key] = min(us, best.get(key, us))

    regressed = 0
    compared = 0
    for key in sorted(new, key=lambda k: (k[0], k[1], k[2], k[3])):
        if key not in best:
            continue
        compared += 1
        ratio = new[key] / best[key]
        if ratio > 1 + args.threshold:
            peer = key[0].startswith(PEERS)
            if not peer:
                regressed += 1
            op, m, n, k = key
            print(f"{'peer ' if peer else 'SLOWER'} {op:28s} M={m:<5d} {n}x{k}: "
                  f"{new[key]:.1f} us against {best[key]:.1f} (x{ratio:.2f})")
    print(f"bench_regress: {compared} cells compared with {len(args.old)} file(s), "
          f"{regressed} nibble cells more than {args.threshold:.0%} slower "
          f"({new_data.get('commit', '?')} on {new_data.get('device', '?')})")
    return 1 if regressed else 0


if __name__ == "__main__":
    sys.exit(main())
