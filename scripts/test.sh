#!/usr/bin/env bash
# Builds nibble and runs every test. CUDA kernels are compiled when nvcc is found; GPU tests
# run when a GPU is present and are reported as skipped otherwise.
#   usage: scripts/test.sh            (preset "ci": warnings are errors)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
preset="${NIBBLE_PRESET:-ci}"
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$(nproc)"
ctest --preset "$preset" -j "$(nproc)"
