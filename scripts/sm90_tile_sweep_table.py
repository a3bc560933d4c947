#!/usr/bin/env python3
"""Summarises a scripts/sm90_tile_sweep.sh folder: per format, shape and M, the planner's time
and choice, every forced token tile's time under whole tiles (whole), stream-K over all tiles
(sk) and stream-K after the most whole waves (skw), and cuBLAS bf16's time. Each cell reads
"us/plan": the kernel's token tile and schedule, w (whole tiles, one per CTA), p (persistent
CTAs), k (stream-K), kN (stream-K after N whole waves), sN (N K splits); a forced schedule the
planner could not take shows what it ran instead. Usage: scripts/sm90_tile_sweep_table.py DIR"""
import glob
import io
import json
import os
import re
import sys
import tarfile


def runs_of(folder):
    """{(format, run name): bench JSON} of a sweep folder, from its archive or loose files."""
    runs = {}
    archive = os.path.join(folder, "sweep_runs.tar.gz")
    if os.path.exists(archive):
        with tarfile.open(archive) as t:
            for m in t.getmembers():
                if m.name.endswith(".json"):
                    fmt, name = m.name[:-5].split("/")[-2:]
                    runs[(fmt, name)] = json.load(io.TextIOWrapper(t.extractfile(m)))
    for path in glob.glob(os.path.join(folder, "*", "*.json")):
        fmt, name = path[:-5].split(os.sep)[-2:]
        runs[(fmt, name)] = json.load(open(path))
    return runs


def schedule(kernel):
    kernel = kernel or ""
    bm = re.search(r"tile (\d+)x", kernel)
    split = re.search(r"split-K (\d+)", kernel)
    waves = re.search(r"(\d+) whole waves? of tiles", kernel)
    mode = (f"k{waves.group(1)}" if waves else "k" if "stream-K" in kernel
            else f"s{split.group(1)}" if split
            else "p" if "persistent CTAs" in kernel else "w")
    return f"{bm.group(1) if bm else '?'}{mode}"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    cells, bf16, header = {}, {}, None
    for (fmt, name), run in sorted(runs_of(sys.argv[1]).items()):
        header = header or f"{run['device']}, {run['date']}, commit {run['commit']}; {run['method']}"
        for r in run["records"]:
            if "us" not in r:
                continue
            if r["op"] == "cublas_bf16":
                bf16[(r["N"], r["K"], r["M"])] = r["us"]
                continue
            cells.setdefault((r["op"], r["N"], r["K"], r["M"]), {})[name] = (
                r["us"], schedule(r.get("kernel")))
    cols = ["plan"] + [f"{s}_bm{b}" for s in ("whole", "sk", "skw") for b in (64, 128, 256)]
    print(header or "no runs")
    print(f"{'op':<12} {'N x K':>11} {'M':>5} " + " ".join(f"{c:>12}" for c in cols) +
          f" {'best/plan':>9} {'bf16':>7} {'bf16/plan':>9}")
    for key in sorted(cells):
        op, n, k, m = key
        row = cells[key]
        plan = row.get("plan", (float("nan"), ""))[0]
        best = min(v[0] for v in row.values())
        b = bf16.get((n, k, m), float("nan"))
        print(f"{op:<12} {f'{n}x{k}':>11} {m:>5} " +
              " ".join(f"{row[c][0]:>6.1f}/{row[c][1]:<5}" if c in row else f"{'-':>12}"
                       for c in cols) +
              f" {best / plan:>9.2f} {b:>7.1f} {b / plan:>9.2f}")


if __name__ == "__main__":
    main()
