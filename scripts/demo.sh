#!/usr/bin/env bash
# Builds nibble and runs its main job: quantize random Llama-3-8B-shaped weights (the o_proj
# layer, 4096×4096) to W4A8 / W8A8 / W4A16 formats, run each on the GPU if there is one (else
# on the CPU reference) and print the error against the float product and the time.
#   usage: scripts/demo.sh [nibble demo options, e.g. --m 1 --device cpu]
#
# `scripts/demo.sh llm [nibble generate options]` runs the LLM runner instead: it fetches the
# default model (SmolLM2-135M-Instruct, scripts/get-model.sh) and answers a chat prompt on the
# CPU, printing time to first token, decode tokens/s, sizes and memory. Options given after
# `llm` override the defaults (e.g. --prompt "..." -n 128 --format w4a8_g128,bf16).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-deps.sh
preset="${NIBBLE_PRESET:-ci}"
cmake --preset "$preset" > /dev/null
cmake --build --preset "$preset" -j "$(nproc)" > /dev/null
if [ "${1:-}" = "llm" ]; then
  shift
  model="$(scripts/get-model.sh)"
  exec "build/$preset/nibble" generate "$model" --chat --device cpu \
    --prompt "What is the capital of France? Answer in one sentence." -n 48 "$@"
fi
"build/$preset/nibble" info
exec "build/$preset/nibble" demo "$@"
