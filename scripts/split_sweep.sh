#!/usr/bin/env bash
# Times the sm80 decode kernels (sm80_weight_only_gemm, sm80_w4a8_gemm) at forced split-K counts
# (NIBBLE_SM80_SPLITS; the wgmma kernels' with NIBBLE_SWEEP_KNOB=NIBBLE_SM90_SPLITS or
# NIBBLE_SM90_WEIGHT_ONLY_SPLITS) beside the planner's own choice, in one process per count, and
# prints per format, shape and M the planner's time, the fastest forced count and its time
# (scripts/split_sweep_table.py, written to OUT/table.txt). The planner's run also times cuBLAS
# bf16 for the ratios.
#   usage: scripts/split_sweep.sh NIBBLE OUT [SPLITS] [bench gemm options...]
#     NIBBLE  the nibble binary; OUT  a folder for plan.json and split<N>.json (packed into
#             OUT/sweep_runs.tar.gz at the end, beside OUT/table.txt)
#     SPLITS  comma list of forced counts (default 1,2,3,4,5,6,7,8,10,12,16)
#   NIBBLE_COMMIT (env) is recorded in plan.json and the table; NIBBLE_SWEEP_KNOB (env) names the
#   variable that forces the count (default NIBBLE_SM80_SPLITS).
#   e.g. scripts/split_sweep.sh build/cuda/nibble "$OUT" 1,2,4,8 --m 1,16 --formats w8a16
#        NIBBLE_SWEEP_KNOB=NIBBLE_SM90_SPLITS scripts/split_sweep.sh build/sm90a/nibble "$OUT" \
#          1,2,3,4,6,8 --m 64 --formats w4a8_pc,w8a8 --shapes 4096x4096,6144x4096
set -uo pipefail
nibble=$1 out=$2
splits=${3:-1,2,3,4,5,6,7,8,10,12,16}
shift 3 2>/dev/null || shift $#
knob=${NIBBLE_SWEEP_KNOB:-NIBBLE_SM80_SPLITS}
mkdir -p "$out"
unset "$knob"
"$nibble" bench gemm --peers bf16 --commit "${NIBBLE_COMMIT:-unknown}" --json "$out/plan.json" \
  "$@" > "$out/plan.log" 2>&1 ||
  { tail -20 "$out/plan.log"; exit 1; }
# The table is rewritten after every count, so a call stopped at its time limit keeps what ran
# (about a minute a count for 9 shapes x 3 formats x 2 M on the H100).
table() { python3 "$(dirname "$0")/split_sweep_table.py" "$out" > "$out/table.txt"; }
table
for s in ${splits//,/ }; do
  env "$knob=$s" "$nibble" bench gemm --peers none --json "$out/split$s.json" "$@" \
    > "$out/split$s.log" 2>&1 || { tail -20 "$out/split$s.log"; exit 1; }
  table
done
cat "$out/table.txt"
# The runs' JSON and logs in one archive beside table.txt (the device tool returns 8 files).
( cd "$out" && tar -czf sweep_runs.tar.gz plan.json plan.log split*.json split*.log &&
  rm -f plan.json plan.log split*.json split*.log )
