#!/usr/bin/env bash
# Perplexity of the default model on the held-out Austen text for each format, as a Markdown
# table (the one in docs/runner.md). CPU reference path: slow (the A16 formats take minutes per
# 512-token window), hence a token budget.
#   usage: tests/llm/perplexity_table.sh NIBBLE_EXE [MAX_TOKENS=2048] [CTX=512] [FORMATS]
set -euo pipefail
nibble="$1"
max_tokens="${2:-2048}"
ctx="${3:-512}"
formats="${4:-f32 bf16 w8a8 w4a8_pc w4a8_g128 w4a16_g128 w4a16_g128_asym}"
here="$(cd "$(dirname "$0")/../.." && pwd)"
model="$("$here/scripts/get-model.sh")"
heldout="$(python3 "$here/scripts/get-austen.py" | tail -1)"
echo "| format | perplexity | tokens scored | windows of $ctx | seconds |"
echo "|---|---|---|---|---|"
for f in $formats; do
  line="$("$nibble" perplexity "$model" --text "$heldout" --max-tokens "$max_tokens" --ctx "$ctx" \
          --format "$f" --quiet)"
  # "perplexity P  format F  tokens scored N  windows W of C  nll X  S s"
  read -r _ ppl _ _ _ _ scored _ windows _ _ _ _ secs _ <<< "$line"
  echo "| $f | $ppl | $scored | $windows | $secs |"
done
