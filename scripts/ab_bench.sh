#!/usr/bin/env bash
# A/B of two source variants on one GPU machine, in one call: builds `nibble` from the tree as
# it is (A), applies a patch and builds again (B), restores the tree, then times A, B, A, B with
# the same `nibble bench gemm` options (cuBLAS bf16 beside each run), so machine drift shows in
# the repeats and the peers' rows. Writes OUT/{a1,b1,a2,b2}.json and .log, and OUT/ab.txt.
#   usage: scripts/ab_bench.sh PATCH OUT [--reverse] [bench gemm options...]
#     PATCH      a `git diff` of src/ (made here; it travels with the tree, e.g. under build/dev)
#     --reverse  B is the tree with PATCH taken out (PATCH = base..HEAD: B is the base)
#   e.g. git diff 134626a HEAD -- src > build/dev/ab.patch
#        scripts/ab_bench.sh build/dev/ab.patch "$OUT" --reverse --formats w4a16_g128,w8a16 --m 1,16
# Builds with the sm90a preset (build/sm90a).
# A rebuild recompiles only the translation units the patch touches (the weight-only one alone
# took about 210 s on the 16-core H100 hosts).
set -uo pipefail
cd "$(dirname "$0")/.."
patch_file=$1 out=$2
shift 2
apply=() restore=(-R)  # patch flags that make B, and that take B back to A
if [ "${1:-}" = --reverse ]; then apply=(-R) restore=(); shift; fi
build=build/sm90a
mkdir -p "$out"
cmake --preset sm90a > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
build_one() {  # $1: variant name
  local t0=$SECONDS
  cmake --build --preset sm90a -j "$(nproc)" --target nibble_cli >> "$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log"; return 1; }
  cp "$build/nibble" "$build/nibble_$1"
  echo "built $1 in $((SECONDS - t0)) s"
}
build_one a || exit 1
patch -p1 -s --dry-run "${apply[@]}" < "$patch_file" > /dev/null 2>&1 ||
  { echo "$patch_file does not apply${apply[*]:+ in reverse} to this tree"; exit 1; }
patch -p1 -s "${apply[@]}" < "$patch_file" || exit 1
build_one b
rc=$?
patch -p1 -s "${restore[@]}" < "$patch_file" || echo "WARNING: the tree was not restored"
[ $rc -eq 0 ] || exit 1
for run in 1 2; do
  for v in a b; do
    "$build/nibble_$v" bench gemm --peers bf16 --json "$out/$v$run.json" "$@" \
      > "$out/$v$run.log" 2>&1 || { tail -20 "$out/$v$run.log"; exit 1; }
  done
done
python3 - "$out" > "$out/ab.txt" <<'EOF'
import json, sys, collections
out = sys.argv[1]
rows = collections.defaultdict(dict)
for v in "ab":
    for run in (1, 2):
        for r in json.load(open(f"{out}/{v}{run}.json"))["records"]:
            rows[(r["op"], r["N"], r["K"], r["M"])].setdefault(v, []).append(r["us"])
print(f"{'op':28} {'N x K':>12} {'M':>5} {'A us':>15} {'B us':>15} {'B/A':>6}")
for (op, n, k, m), t in sorted(rows.items()):
    a, b = t.get("a", []), t.get("b", [])
    ratio = f"{(sum(b) / len(b)) / (sum(a) / len(a)):.3f}" if a and b else "-"
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
    print(f"{op:28} {f'{n}x{k}':>12} {m:>5} {fmt(a):>15} {fmt(b):>15} {ratio:>6}")
EOF
cat "$out/ab.txt"
