#!/usr/bin/env bash
# The second call of a GPU session, on the machine `scripts/gpu-check.sh --tests-only` has just
# built (build/cuda kept while the machine is warm): everything that needs the build but not a
# rebuild, in one command, packed into one archive (the device tool returns at most 8 files):
#   1. scripts/gpu-runner-check.sh --skip-build: the runner's GPU tests, SmolLM2 GPU vs CPU
#      (when the model is there, see below), runner_ops_bench, bench-model --profile-decode;
#   2. the Python package's GPU tests (pytest tests/python);
#   3. bench/python/model_bench.py --compile for FORMATS (default: every format);
#   4. nibble bench act-quant (issue 6's streaming criterion).
# The SmolLM2 GGUF (94 MB) exceeds one call's 64 MiB: split it into parts under build/smol/
# (`split -b 48M MODEL build/smol/part`), carry part aa with the gpu-check call and part ab
# with this one; the parts are joined here and the sha256 checked.
#
#   usage: NIBBLE_COMMIT=<sha> [FORMATS=a,b] [SKIP=runner,python,model,actquant] \
#          scripts/gpu-followup.sh
# Writes $OUT/followup.tar.gz (every log and JSON) and $OUT/summary.txt; each stage has a time
# limit so that the whole stays under the device tool's 600 s per call.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/build/gpu-followup}"
work="$out/followup"
mkdir -p "$work"
commit="${NIBBLE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
skip=",${SKIP:-},"
build=build/cuda
t0=$(date +%s)
summary="$out/summary.txt"
: > "$summary"
note() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$summary"; }

if [ ! -x "$build/nibble" ]; then
  note "FAILED: no $build/nibble (run scripts/gpu-check.sh --tests-only first, same machine)"
  exit 1
fi

# ---- the model, from its parts ---------------------------------------------------------------------
model=""
if ls build/smol/part* > /dev/null 2>&1; then
  cat build/smol/part* > build/smol/model.gguf
  sum=$(sha256sum build/smol/model.gguf | cut -d' ' -f1)
  if [ "$sum" = b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 ]; then
    model="$PWD/build/smol/model.gguf"
    note "SmolLM2 joined from $(ls build/smol/part* | wc -l) parts, sha256 ok"
  else
    note "SmolLM2 parts do not join to the published sha256 (got $sum): SmolLM2 checks skipped"
  fi
fi

# ---- 1. runner -------------------------------------------------------------------------------------
if [[ "$skip" != *,runner,* ]]; then
  OUT="$work/runner" BUILD_DIR="$build" NIBBLE_MODEL="$model" NIBBLE_COMMIT="$commit" \
    timeout 200 scripts/gpu-runner-check.sh --skip-build > "$work/runner.log" 2>&1
  note "runner check: rc=$? ($(grep -c '^PASS' "$work/runner.log") SmolLM2 PASS lines)"
fi

# ---- 2. Python GPU tests ---------------------------------------------------------------------------
export PYTHONPATH="$PWD/$build/python"
if [[ "$skip" != *,python,* ]]; then
  timeout 120 python3 -m pytest tests/python -q -p no:cacheprovider > "$work/pytest.log" 2>&1
  note "pytest: rc=$? $(grep -E '[0-9]+ (passed|failed)' "$work/pytest.log" | tail -1)"
fi

# ---- 3. Python model bench -------------------------------------------------------------------------
if [[ "$skip" != *,model,* ]]; then
  left=$(( 480 - ($(date +%s) - t0) ))
  if [ $left -gt 30 ]; then
    fmts=()
    [ -n "${FORMATS:-}" ] && fmts=(--formats "$FORMATS")
    timeout $left python3 bench/python/model_bench.py --compile --commit "$commit" \
      --out "$work/python_model.json" "${fmts[@]}" > "$work/model_bench.log" 2>&1
    note "model_bench: rc=$? $(grep -c ' ok ' "$work/model_bench.log") ok, $(grep -c 'FAIL' "$work/model_bench.log") FAIL"
  else
    note "model_bench: skipped (time)"
  fi
fi

# ---- 4. activation quantization bench ------------------------------------------------------------
if [[ "$skip" != *,actquant,* ]]; then
  left=$(( 560 - ($(date +%s) - t0) ))
  if [ $left -gt 20 ]; then
    timeout $left "$build/nibble" bench act-quant --json "$work/act_quant.json" --commit "$commit" \
      > "$work/act_quant.log" 2>&1
    note "act-quant bench: rc=$?"
  else
    note "act-quant bench: skipped (time)"
  fi
fi

tar -C "$out" -czf "$out/followup.tar.gz" followup
note "wrote $out/followup.tar.gz ($(du -h "$out/followup.tar.gz" | cut -f1))"
