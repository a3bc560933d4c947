#!/usr/bin/env bash
# Nsight Compute on `nibble bench gemm`, to see where a GEMM's time goes: for each bench gemm
# option set given (one format, shape and M each), one ncu process profiles the first launch of
# nibble's GEMM kernel and another the first launch of cuBLAS bf16's, with the sections that
# answer "compute, memory or latency?": speed of light, the compute pipes (tensor pipe busy),
# memory (L2 and DRAM throughput), warp stall reasons, launch statistics and occupancy. ncu
# locks the clocks to base and flushes the caches before each pass: compare the two kernels of
# a run with each other, not with `bench gemm`'s times.
# Writes OUT/ncu.txt (all sections) and OUT/ncu_summary.txt (the lines compared most often).
#   usage: scripts/ncu_profile.sh NIBBLE OUT "OPTIONS" ["OPTIONS" ...]
#     OPTIONS  bench gemm options of one profile, quoted as one argument
#   e.g. scripts/ncu_profile.sh build/sm90a/nibble "$OUT" \
#          "--formats w4a16_g128 --m 1024 --shapes 6144x4096" \
#          "--formats w4a16_g128 --m 4096 --shapes 6144x4096"
#   NIBBLE_NCU_OURS / NIBBLE_NCU_PEER (env): regexes of the kernel names profiled (defaults:
#   nibble's *_gemm_kernel and cuBLAS's nvjet / xmma / cutlass kernels).
#   NIBBLE_NCU_EXTRA (env): more ncu arguments for every profile, e.g. "--print-details all"
#   (the stall-reason table of WarpStateStats).
#   NIBBLE_NCU_SASS=1 (env): also sample nibble's kernel per SASS instruction (SourceCounters,
#   the report's source page) and write OUT/sass_hot.txt: per profile the instructions with the
#   most warp-stall samples and the stall reasons of each (scripts/ncu_sass_hot.py).
set -uo pipefail
nibble=$1 out=$2
shift 2
ours=${NIBBLE_NCU_OURS:-'^(sm80|sm90|simt)_[a-z0-9_]*_kernel'}
peer=${NIBBLE_NCU_PEER:-'nvjet|xmma|cutlass'}
ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
[ -x "$ncu_bin" ] || { echo "ncu not found (PATH, /usr/local/cuda/bin)"; exit 1; }
mkdir -p "$out"
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats
          --section Occupancy)
: > "$out/ncu.txt"
[ "${NIBBLE_NCU_SASS:-0}" = 1 ] && : > "$out/sass_hot.txt"
rc=0
for opts in "$@"; do
  for who in ours peer; do
    re=$ours peers=none
    [ $who = peer ] && re=$peer peers=bf16
    echo "#### $opts ($who: kernels matching '$re')" >> "$out/ncu.txt"
    # shellcheck disable=SC2086  # OPTIONS and NIBBLE_NCU_EXTRA are lists of words on purpose
    "$ncu_bin" -k "regex:$re" -c 1 "${sections[@]}" ${NIBBLE_NCU_EXTRA:-} \
      "$nibble" bench gemm --peers $peers $opts >> "$out/ncu.txt" 2>&1 || rc=1
  done
  if [ "${NIBBLE_NCU_SASS:-0}" = 1 ]; then
    report=$(mktemp -u /tmp/nibble_ncu_XXXXXX)
    # shellcheck disable=SC2086
    if "$ncu_bin" -k "regex:$ours" -c 1 --section SourceCounters --section WarpStateStats \
         --import-source no -o "$report" "$nibble" bench gemm --peers none $opts \
         > "$report.log" 2>&1 &&
       "$ncu_bin" --import "$report.ncu-rep" --page source --csv --print-source sass \
         > "$report.csv" 2>> "$report.log"; then
      python3 "$(dirname "$0")/ncu_sass_hot.py" "$report.csv" "$opts" >> "$out/sass_hot.txt" || rc=1
    else
      { echo "#### $opts: SASS sampling failed"; tail -20 "$report.log"; } >> "$out/sass_hot.txt"
      rc=1
    fi
    rm -f "$report.ncu-rep" "$report.csv" "$report.log"
  fi
done
grep -E '^####|^  [a-zA-Z_].*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Executed Ipc Active|Registers Per Thread|Achieved Occupancy|Warp Cycles Per Issued|One or More Eligible|Stall|stall' \
  "$out/ncu.txt" > "$out/ncu_summary.txt"
cat "$out/ncu_summary.txt"
exit $rc
