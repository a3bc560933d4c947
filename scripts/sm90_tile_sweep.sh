#!/usr/bin/env bash
# Times the wgmma kernels (sm90_w4a8_gemm; sm90_weight_only_gemm for the w*a16 formats) at
# every forced token tile (NIBBLE_SM90_BM, NIBBLE_SM90_WEIGHT_ONLY_BM) under three schedules,
# beside the planner's own choice: whole tiles (NIBBLE_SM90_STREAM_K=0), stream-K over all the
# tiles (=1 with NIBBLE_SM90_STREAM_K_WHOLE_WAVES=0) and stream-K after the most whole waves
# (WHOLE_WAVES=-1). The data the planners' tile and stream-K costs (src/cuda/launch/
# sm90_tiling.h) are fitted to. One `nibble bench gemm` process per run.
#   usage: scripts/sm90_tile_sweep.sh NIBBLE OUT [FORMATS] [bench gemm options...]
#     FORMATS  comma list (default w4a8_pc,w4a8_g128,w8a8); the int8/fp8-activation group
#              formats get tiles of 64 and 128 tokens (their f32 sums leave no room for 256),
#              the others 64, 128 and 256.
#   Writes OUT/<format>/plan.json (with cuBLAS bf16) and <schedule>_bm<BM>.json, packed into
#   OUT/sweep_runs.tar.gz at the end, and OUT/tiles.txt (scripts/sm90_tile_sweep_table.py).
#   NIBBLE_COMMIT (env) is recorded in the JSON.
#   e.g. scripts/sm90_tile_sweep.sh build/cuda/nibble "$OUT" w4a8_pc,w4a16_g128 \
#          --m 256,1024 --shapes 6144x4096,10240x8192
set -uo pipefail
nibble=$1 out=$2
formats=${3:-w4a8_pc,w4a8_g128,w8a8}
shift 3 2>/dev/null || shift $#
here=$(dirname "$0")
bench() {  # JSON, then bench gemm options
  local json=$1
  shift
  "$nibble" bench gemm --bf16-in no --commit "${NIBBLE_COMMIT:-unknown}" --json "$json" "$@" \
    > "${json%.json}.log" 2>&1 || echo "sm90_tile_sweep: $json failed: $(tail -1 "${json%.json}.log")"
}
for f in ${formats//,/ }; do
  knob=NIBBLE_SM90_BM bms="64 128 256"
  case "$f" in
    w*a16*) knob=NIBBLE_SM90_WEIGHT_ONLY_BM ;;
    *_g*) bms="64 128" ;;
  esac
  mkdir -p "$out/$f"
  bench "$out/$f/plan.json" --formats "$f" --peers bf16 "$@"
  for bm in $bms; do
    # schedule name, NIBBLE_SM90_STREAM_K, NIBBLE_SM90_STREAM_K_WHOLE_WAVES
    for mode in "whole 0 0" "sk 1 0" "skw 1 -1"; do
      read -r name sk waves <<< "$mode"
      ( export NIBBLE_SM90_STREAM_K=$sk NIBBLE_SM90_STREAM_K_WHOLE_WAVES=$waves "$knob=$bm"
        bench "$out/$f/${name}_bm$bm.json" --formats "$f" --peers none "$@" )
    done
  done
  # Rewritten after every format, so a call stopped at its time limit keeps what ran.
  python3 "$here/sm90_tile_sweep_table.py" "$out" > "$out/tiles.txt"
done
cat "$out/tiles.txt"
( cd "$out" && tar -czf sweep_runs.tar.gz */*.json */*.log && rm -rf -- */ )
