#!/usr/bin/env bash
# Checks a stream-K rule on the device: one `nibble` binary's own picks (cuBLAS bf16 beside them)
# against the same layers forced into stream-K ranges (NIBBLE_SM90_STREAM_K=1, with
# NIBBLE_SM90_BM=$FORCED_BM, 128 unless set), two runs of each, alternating. Writes OUT/rule.txt
# (per cell: both times, forced / picks, each side's kernel: token tile, tiles, schedule) and
# OUT/rule_runs.tar.gz (the JSON and logs). The table behind b97e235's rule for w4a8_g128 is
# bench/results/h100_ab_stream_k_interiors_first_7073a8e.txt.
#   usage: scripts/stream_k_rule.sh NIBBLE OUT [bench gemm options: --formats, --m, --shapes]
#   e.g.   scripts/stream_k_rule.sh build/sm90a/nibble "$OUT/rule" --formats w4a8_g128 \
#            --m 256,512 --shapes 12288x4096,18944x3584,6144x4096
set -uo pipefail
bin=${1:?usage: scripts/stream_k_rule.sh NIBBLE OUT [bench gemm options]} out=${2:?OUT}
shift 2
mkdir -p "$out"
for run in 1 2; do
  "$bin" bench gemm --peers bf16 --json "$out/plan$run.json" "$@" > "$out/plan$run.log" 2>&1 ||
    { tail -20 "$out/plan$run.log"; exit 1; }
  NIBBLE_SM90_STREAM_K=1 NIBBLE_SM90_BM=${FORCED_BM:-128} "$bin" bench gemm --peers none \
    --json "$out/forced$run.json" "$@" > "$out/forced$run.log" 2>&1 ||
    { tail -20 "$out/forced$run.log"; exit 1; }
done
python3 - "$out" > "$out/rule.txt" <<'PY'
import collections, json, re, sys
out = sys.argv[1]
times, kernels = collections.defaultdict(list), {}
for kind in ("plan", "forced"):
    for run in (1, 2):
        for r in json.load(open(f"{out}/{kind}{run}.json"))["records"]:
            if "us" not in r:
                continue
            key = (r["op"], r["N"], r["K"], r["M"])
            times[key + (kind,)].append(r["us"])
            k = r.get("kernel", "")
            tile, grid = re.search(r"tile (\d+)x", k), re.search(r"grid (\d+)x(\d+)", k)
            what = "stream-K" if "stream-K" in k else "persistent" if "persistent" in k else "grid"
            if tile and grid:
                what = f"{tile.group(1)} tokens, {int(grid.group(1)) * int(grid.group(2))} tiles, {what}"
            kernels[key + (kind,)] = what
fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
print(f"{'op':18} {'N x K':>11} {'M':>5} {'picks us':>15} {'forced us':>15} {'f/p':>6}  kernels")
for key in sorted({k[:4] for k in times}):
    p, f = times.get(key + ("plan",), []), times.get(key + ("forced",), [])
    ratio = f"{(sum(f) / len(f)) / (sum(p) / len(p)):.3f}" if p and f else "-"
    op, n, k, m = key
    print(f"{op:18} {f'{n}x{k}':>11} {m:>5} {fmt(p):>15} {fmt(f):>15} {ratio:>6}  "
          f"{kernels.get(key + ('plan',), '')} | {kernels.get(key + ('forced',), '')}")
PY
cat "$out/rule.txt"
( cd "$out" && tar -czf rule_runs.tar.gz plan?.json forced?.json plan?.log forced?.log &&
  rm -f plan?.json forced?.json plan?.log forced?.log )
