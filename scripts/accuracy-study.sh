#!/usr/bin/env bash
# Regenerates docs/accuracy.md's tables and docs/accuracy.png: the quantization accuracy study
# (bits × granularity × method × W8A8/W4A8/W4A16 on SmolLM2-135M-Instruct and the held-out
# Austen text). Builds nibble (CPU), fetches the model and the texts, makes a venv with
# matplotlib (PyPI) for the plot, then runs scripts/accuracy_study.py, which keeps its results
# in build/accuracy/accuracy.json cell by cell (an interrupted run resumes; delete the file to
# start over). About 75 minutes on a 2-core machine; `--report` only re-renders from the JSON.
#   usage: scripts/accuracy-study.sh [--report]
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/accuracy
mkdir -p "$out"
venv="$out/venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import matplotlib" 2> /dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check matplotlib
fi
if [ "${1:-}" = "--report" ]; then
  exec "$venv/bin/python" scripts/accuracy_study.py --report --json "$out/accuracy.json" \
    --doc docs/accuracy.md --plot docs/accuracy.png
fi
scripts/ensure-deps.sh
preset="${NIBBLE_PRESET:-cpu}"
cmake --preset "$preset" > /dev/null
cmake --build --preset "$preset" -j "$(nproc)" --target nibble_cli > /dev/null
model="$(scripts/get-model.sh)"
heldout="$(python3 scripts/get-austen.py | tail -1)"
train="$(dirname "$heldout")/austen-train.txt"
exec "$venv/bin/python" scripts/accuracy_study.py --nibble "build/$preset/nibble" \
  --model "$model" --train "$train" --heldout "$heldout" --json "$out/accuracy.json" \
  --doc docs/accuracy.md --plot docs/accuracy.png
