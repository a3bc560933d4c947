#!/usr/bin/env bash
# One command for a GPU machine: configure with its nvcc, build, run every test (GPU tests
# included), run the demo and the benchmarks, and write logs and JSON to $OUT (or build/gpu-check).
#   usage: scripts/gpu-check.sh [--tests-only] [--bench-only] [--sanitizer-only]
# The device tool stops a call at 600 s: when the build and ctest leave too little time, the
# compute-sanitizer runs are skipped with a note, and `--sanitizer-only` runs them in the next
# call on the same (warm) machine.
# Files written (at most 8, flat, so the device tool can return them all):
#   build.log (with SASS MMA / local-memory counts)  test.log  demo.log  bench.log  bench.json
#   summary.json  sanitizer-memcheck.log  sanitizer-racecheck.log
# Then, within the machine's 30 s warm period, scripts/gpu-followup.sh runs the runner, Python
# and activation-quantization checks on this build without rebuilding.
# Env: NIBBLE_COMMIT (recorded in the JSON), NIBBLE_BENCH_ARGS (extra `bench gemm` arguments),
#      NIBBLE_BENCH_KERNELS (see the bench section), NIBBLE_WERROR (default ON).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/build/gpu-check}"
mkdir -p "$out"
run_tests=1 run_bench=1 run_ctest=1 run_sanitizer=1
for a in "$@"; do
  case "$a" in
    --tests-only) run_bench=0 ;;
    --bench-only) run_tests=0 ;;
    --sanitizer-only) run_bench=0 run_ctest=0 ;;
  esac
done
preset=cuda
status=0

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv
  nvcc --version | tail -2; cmake --version | head -1; } > "$out/build.log" 2>&1
t0=$(date +%s)
cmake --preset "$preset" -DNIBBLE_WERROR=${NIBBLE_WERROR:-ON} >> "$out/build.log" 2>&1 &&
  cmake --build --preset "$preset" -j "$(nproc)" >> "$out/build.log" 2>&1
build_rc=$?
build_s=$(( $(date +%s) - t0 ))
echo "build: rc=$build_rc in ${build_s}s" | tee -a "$out/build.log"
if [ $build_rc -ne 0 ]; then tail -40 "$out/build.log"; exit 1; fi
bin="build/$preset"

# SASS facts for the kernel issues: which MMA instructions each kernel uses, and spills.
# (Counted into build.log: the device tool returns at most 8 files.)
{ echo "SASS instruction counts (MMA, local memory):"
  cuobjdump --dump-sass "$bin/libnibble.a" 2>/dev/null |
    grep -oE "IMMA[.A-Z0-9]*|HMMA[.A-Z0-9]*|[HIQ]GMMA[.A-Z0-9]*|LDL|STL" | sort | uniq -c; } >> "$out/build.log"

test_rc=0
if [ $run_tests -eq 1 ]; then
  "$bin/nibble" info | tee -a "$out/test.log"
  if [ $run_ctest -eq 1 ]; then
  # -LE llm: the runner's end-to-end entries download the model and Python packages, and the
  # GPU machines have no network (CI runs them).
  # -j 8: the suite's ~560 s of test time took over 320 s at -j 4 on the H200 (2026-11-29, with
  # a 279 s build: past the call's 600 s); the GPU tests are short launches that share the GPU.
  ctest --test-dir "$bin" -j 8 --timeout 300 -LE llm --output-on-failure >> "$out/test.log" 2>&1
  test_rc=$?
  grep -E "tests passed|tests failed|Skipped|Failed" "$out/test.log" | tail -15
  fi
  # Both sanitizer runs together take about 150 s.
  if [ $run_ctest -eq 1 ] && [ $SECONDS -gt ${NIBBLE_SANITIZER_DEADLINE:-420} ]; then
    echo "compute-sanitizer: skipped, ${SECONDS}s used (run scripts/gpu-check.sh --sanitizer-only)" |
      tee -a "$out/test.log"
    run_sanitizer=0
  fi
  # compute-sanitizer on the tensor-core kernels and the activation quantizer: out-of-bounds /
  # misaligned accesses (memcheck) and shared-memory races (racecheck) on odd shapes, split-K,
  # strided / unaligned rows and rows streamed from global memory included.
  # racecheck is much slower than memcheck, so it runs the split-K test alone (both kernels,
  # split and unsplit tiles).
  [ $run_sanitizer -eq 1 ] && for tool in memcheck racecheck; do
    filter='CudaW4A8.S32IsBitExactOnOddShapes:CudaW4A8.SplitKIsDeterministic:CudaWeightOnly.*'
    filter+=':CudaW8A8.S32IsBitExactOnOddShapes:CudaW8A8.SplitKIsDeterministic:CudaW4A4.S32IsBitExactOnOddShapes'
    filter+=':CudaActQuant.StridedAndUnalignedRowsAreBitExactAndGapsStayUntouched'
    filter+=':CudaActQuant.NormedInPlaceOverwritesXWithY'
    filter+=':CudaW4AFp8.EveryWeightValueAndExtremeActivationsMatchTheReference:CudaW4AFp8.SplitKMatchesTheReference'
    filter+=':CudaW4A8.FusedQuantizationReplaysInACudaGraph'
    # sm90_w4a8_gemm's stream-K partials and fix-up (forced on four shapes, six formats).
    filter+=':CudaW4A8.Sm90StreamKMatchesWholeTiles'
    # sm80_weight_only_gemm's edge tiles and hoisted copies (odd N, K tails), 8- and 4-bit.
    filter+=':Formats/CudaWeightOnlyLinear.MatchesReferenceOnOddShapes/w8a16_xbf16_bf16'
    filter+=':Formats/CudaWeightOnlyLinear.MatchesReferenceOnOddShapes/w4a16_g128_asym_xbf16_bf16'
    [ $tool = racecheck ] && filter='CudaW4A8.SplitKIsDeterministic:CudaW8A8.SplitKIsDeterministic:CudaWeightOnly.SplitKIsDeterministicAndExplained:CudaActQuant.NormedInPlaceOverwritesXWithY:CudaW4A8.FusedQuantizationReplaysInACudaGraph'
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 1 --print-limit 10 "$bin/tests/cpp/nibble_tests" \
      --gtest_filter="$filter" \
      > "$out/sanitizer-$tool.log" 2>&1 && echo "compute-sanitizer $tool: clean" | tee -a "$out/test.log" \
      || { echo "compute-sanitizer $tool: FAILED" | tee -a "$out/test.log"; status=1; }
  done
  [ $run_ctest -eq 1 ] && { "$bin/nibble" demo > "$out/demo.log" 2>&1 || status=1; }
  cat "$out/demo.log" 2>/dev/null
fi
[ $test_rc -eq 0 ] || status=1

bench_rc=0
if [ $run_bench -eq 1 ]; then
  # NIBBLE_BENCH_KERNELS="sm80_w4a8_gemm sm90_w4a8_gemm" times the W4A8 rows (and the W8A8 rows
  # on the matching sm80_w8a8_gemm / sm90_w8a8_gemm) once per forced kernel (bench-<arch>.json
  # each); otherwise one run with the dispatcher's choice.
  for kernel in ${NIBBLE_BENCH_KERNELS:-dispatch}; do
    json="$out/bench.json"
    [ "$kernel" = dispatch ] || json="$out/bench-${kernel%%_*}.json"
    [ "$kernel" = dispatch ] || export NIBBLE_W4A8_KERNEL="$kernel" NIBBLE_W8A8_KERNEL="${kernel/w4a8/w8a8}"
    echo "== bench ($kernel)" >> "$out/bench.log"
    timeout 400 "$bin/nibble" bench gemm --json "$json" --commit "${NIBBLE_COMMIT:-unknown}" \
      ${NIBBLE_BENCH_ARGS:-} >> "$out/bench.log" 2>&1 || bench_rc=1
    unset NIBBLE_W4A8_KERNEL NIBBLE_W8A8_KERNEL
  done
  tail -80 "$out/bench.log"
  [ $bench_rc -eq 0 ] || status=1
  # Cells more than 10% slower than the committed H100 grid (a report, not a failure: the
  # machine's own drift shows in the peers' rows).
  if [ -f "$out/bench.json" ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then
    python3 scripts/bench_regress.py "$out/bench.json" bench/results/h100.json | tee -a "$out/bench.log"
  fi
fi

passed=$(grep -oE "[0-9]+% tests passed.*out of [0-9]+" "$out/test.log" | tail -1)
skipped=0
[ -f "$out/test.log" ] && skipped=$(grep -c "(Skipped)" "$out/test.log" || true)
cat > "$out/summary.json" <<JSON
{"commit": "${NIBBLE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}", "date": "$(date -u +%FT%TZ)",
 "device": "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)",
 "build_seconds": $build_s, "ctest": "$passed", "skipped": $skipped,
 "test_rc": $test_rc, "bench_rc": $bench_rc}
JSON
cat "$out/summary.json"
exit $status
