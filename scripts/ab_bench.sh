#!/usr/bin/env bash
# A/B of two source variants on one GPU machine, in one call: the tree as it is (A) and the tree
# with a patch applied or taken out (B, in a copy of the tree under build/ab-b) are built at the
# same time, then A, B, A, B are timed with the same `nibble bench gemm` options (cuBLAS bf16
# beside each run), so machine drift shows in the repeats and the peers' rows.
# Writes OUT/ab.txt (the table, and B's test summaries) and OUT/ab_runs.tar.gz ({a,b}{1,2}.json
# and .log, build.log, B's test logs): two files, so the device tool (at most 8 files a call)
# returns everything.
#   usage: scripts/ab_bench.sh PATCH OUT [--reverse] [bench gemm options...]
#     PATCH      a `git diff` of src/ (made here; it travels with the tree, e.g. under build/dev)
#     --reverse  B is the tree with PATCH taken out (PATCH = base..HEAD: B is the base)
#   e.g. git diff 134626a HEAD -- src > build/dev/ab.patch
#        scripts/ab_bench.sh build/dev/ab.patch "$OUT" --reverse --formats w4a16_g128,w8a16 --m 1,16
#   or:  scripts/ab_bench.sh --binaries BIN_A BIN_B OUT [bench gemm options...]
#     times two `nibble` binaries built elsewhere, without building (e.g. packed here by
#     scripts/prebuilt.sh and carried); NIBBLE_AB_TESTS_BIN names B's test binary for
#     NIBBLE_AB_TESTS / NIBBLE_AB_MEMCHECK.
#   NIBBLE_AB_PEERS=all times cuBLASLt int8 (+ rescale) and FP8 beside cuBLAS bf16;
#   NIBBLE_COMMIT names A's commit in the JSON (B's is that plus " (B)");
#   NIBBLE_AB_TESTS=FILTER then builds B's test binary in its tree (patch mode; the library is
#   built already: about a minute) and runs that gtest filter, and NIBBLE_AB_MEMCHECK=FILTER
#   runs compute-sanitizer memcheck on it: a patch's tests in the same call as its timing. The
#   summaries go to the end of ab.txt.
# Both variants build with the sm90a preset (A in build/sm90a, B in build/ab-b/build/sm90a); the
# two builds share the cores, and together take about as long as one (the longest translation
# unit, about 210 s on the 16-core H100 hosts, bounds each).
set -uo pipefail
cd "$(dirname "$0")/.."

build_variants() {  # $1 patch, $2 out, $3.. patch flags that make B
  local patch_file=$1 out=$2
  shift 2
  local b_tree=build/ab-b
  rm -rf "$b_tree" && mkdir -p "$b_tree"
  # The tracked and new (not ignored) files as they are in the working tree.
  git ls-files -z -co --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$b_tree"
  patch -d "$b_tree" -p1 -s --dry-run "$@" < "$patch_file" > /dev/null 2>&1 ||
    { echo "$patch_file does not apply${*:+ ($*)} to this tree"; return 1; }
  patch -d "$b_tree" -p1 -s "$@" < "$patch_file" || return 1
  local t0=$SECONDS pids=() dir
  for dir in . "$b_tree"; do
    ( cd "$dir" && cmake --preset sm90a > /dev/null &&
      cmake --build --preset sm90a -j "$(nproc)" --target nibble_cli ) >> "$out/build.log" 2>&1 &
    pids+=($!)
  done
  local rc=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  [ $rc -eq 0 ] || { tail -40 "$out/build.log"; return 1; }
  echo "built A and B in $((SECONDS - t0)) s"
}

if [ "${1:-}" = --binaries ]; then
  bin_a_given=1
  bin_a=$2 bin_b=$3 out=$4
  shift 4
  mkdir -p "$out"
else
  patch_file=$1 out=$2
  shift 2
  apply=()  # patch flags that make B
  if [ "${1:-}" = --reverse ]; then apply=(-R); shift; fi
  mkdir -p "$out"
  build_variants "$patch_file" "$out" "${apply[@]}" || exit 1
  bin_a=build/sm90a/nibble bin_b=build/ab-b/build/sm90a/nibble
fi
# Everything but ab.txt goes into one archive at the end, whatever the exit.
pack_runs() {
  local files=()
  for f in a1.json a2.json b1.json b2.json a1.log a2.log b1.log b2.log build.log b_tests.log \
           b_memcheck.log; do
    [ -f "$out/$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] && tar -czf "$out/ab_runs.tar.gz" -C "$out" "${files[@]}" &&
    ( cd "$out" && rm -f "${files[@]}" )
}
trap pack_runs EXIT
for run in 1 2; do
  for v in a b; do
    bin=bin_$v
    commit=${NIBBLE_COMMIT:-unknown}
    [ $v = b ] && commit+=" (B)"
    "${!bin}" bench gemm --peers "${NIBBLE_AB_PEERS:-bf16}" --commit "$commit" \
      --json "$out/$v$run.json" "$@" \
      > "$out/$v$run.log" 2>&1 || { tail -20 "$out/$v$run.log"; exit 1; }
  done
done
python3 - "$out" > "$out/ab.txt" <<'PY'
import json, sys, collections
out = sys.argv[1]
rows = collections.defaultdict(dict)
for v in "ab":
    for run in (1, 2):
        for r in (r for r in json.load(open(f"{out}/{v}{run}.json"))["records"] if "us" in r):
            rows[(r["op"], r["N"], r["K"], r["M"])].setdefault(v, []).append(r["us"])
print(f"{'op':28} {'N x K':>12} {'M':>5} {'A us':>15} {'B us':>15} {'B/A':>6}")
for (op, n, k, m), t in sorted(rows.items()):
    a, b = t.get("a", []), t.get("b", [])
    ratio = f"{(sum(b) / len(b)) / (sum(a) / len(a)):.3f}" if a and b else "-"
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
    print(f"{op:28} {f'{n}x{k}':>12} {m:>5} {fmt(a):>15} {fmt(b):>15} {ratio:>6}")
PY
cat "$out/ab.txt"

if [ -n "${NIBBLE_AB_TESTS:-}" ] && { [ -z "${bin_a_given:-}" ] || [ -n "${NIBBLE_AB_TESTS_BIN:-}" ]; }; then
  if [ -n "${bin_a_given:-}" ]; then
    tests_b=$NIBBLE_AB_TESTS_BIN
  else
    ( cd build/ab-b && cmake --build --preset sm90a -j "$(nproc)" --target nibble_tests ) \
      >> "$out/build.log" 2>&1 ||
      { echo "B's test binary did not build" | tee -a "$out/ab.txt"; tail -30 "$out/build.log"; exit 1; }
    tests_b=build/ab-b/build/sm90a/tests/cpp/nibble_tests
  fi
  "$tests_b" --gtest_filter="$NIBBLE_AB_TESTS" > "$out/b_tests.log" 2>&1
  rc=$?
  { echo; echo "B's tests ($NIBBLE_AB_TESTS): rc=$rc"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) *\]|tests? ran|Failure|error" "$out/b_tests.log" | head -30
  } | tee -a "$out/ab.txt"
  if [ -n "${NIBBLE_AB_MEMCHECK:-}" ]; then
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 --print-limit 10 "$tests_b" \
      --gtest_filter="$NIBBLE_AB_MEMCHECK" > "$out/b_memcheck.log" 2>&1
    rc=$?
    { echo "B's memcheck ($NIBBLE_AB_MEMCHECK): rc=$rc"; tail -4 "$out/b_memcheck.log"; } |
      tee -a "$out/ab.txt"
  fi
fi
