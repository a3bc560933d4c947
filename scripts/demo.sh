#!/usr/bin/env bash
# Builds nibble and runs its main job: quantize random Llama-3-8B-shaped weights (the o_proj
# layer, 4096×4096) to W4A8 / W8A8 / W4A16 formats, run each on the GPU if there is one (else
# on the CPU reference) and print the error against the float product and the time.
#   usage: scripts/demo.sh [nibble demo options, e.g. --m 1 --device cpu]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
preset="${NIBBLE_PRESET:-ci}"
cmake --preset "$preset" > /dev/null
cmake --build --preset "$preset" -j "$(nproc)" > /dev/null
"build/$preset/nibble" info
exec "build/$preset/nibble" demo "$@"
