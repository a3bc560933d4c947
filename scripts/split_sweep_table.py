#!/usr/bin/env python3
"""Summarises a scripts/split_sweep.sh folder (plan.json and split<N>.json, each written by
`nibble bench gemm --json`): per format, shape and M, the planner's split count and time, the
fastest forced count and its time, their ratio, and cuBLAS bf16's time from the planner's run.
Usage: scripts/split_sweep_table.py DIR"""
import glob
import json
import os
import re
import sys


def split_of(kernel):
    m = re.search(r"split-K (\d+)", kernel or "")
    return int(m.group(1)) if m else 1


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    folder = sys.argv[1]
    plan = json.load(open(os.path.join(folder, "plan.json")))
    forced = {}
    for path in glob.glob(os.path.join(folder, "split*.json")):
        s = int(re.search(r"split(\d+)\.json$", path).group(1))
        for r in json.load(open(path))["records"]:
            if "us" in r:
                forced.setdefault((r["op"], r["N"], r["K"], r["M"]), []).append(
                    (r["us"], split_of(r.get("kernel")), s))
    bf16 = {(r["N"], r["K"], r["M"]): r["us"] for r in plan["records"]
            if r["op"] == "cublas_bf16" and "us" in r}
    print(f"{plan['device']}, {plan['date']}, commit {plan['commit']}; {plan['method']}")
    print(f"{'op':<30} {'N x K':>12} {'M':>4} {'plan s':>6} {'plan us':>8} {'best s':>6} "
          f"{'best us':>8} {'plan/best':>9} {'bf16 us':>8} {'bf16/plan':>9}")
    for r in plan["records"]:
        if r["op"].startswith("cublas") or "us" not in r:
            continue
        key = (r["op"], r["N"], r["K"], r["M"])
        runs = sorted(forced.get(key, []))
        best_us, best_s = (runs[0][0], runs[0][1]) if runs else (float("nan"), 0)
        b = bf16.get((r["N"], r["K"], r["M"]), float("nan"))
        print(f"{r['op']:<30} {str(r['N']) + 'x' + str(r['K']):>12} {r['M']:>4} "
              f"{split_of(r.get('kernel')):>6} {r['us']:>8.2f} {best_s:>6} {best_us:>8.2f} "
              f"{r['us'] / best_us:>9.2f} {b:>8.2f} {b / r['us']:>9.2f}")
        for us, s_eff, s in sorted(runs, key=lambda t: t[2]):
            print(f"{'':<30} {'':>12} {'':>4} forced {s:>2} (ran {s_eff:>2}): {us:8.2f}")


if __name__ == "__main__":
    main()
