#!/usr/bin/env bash
# The accuracy study's simulated mode (sim:FORMAT: dequantized weights, activations quantized and
# dequantized per token, f32 products) against nibble's reference linear (the real format) on
# the same checkpoint: perplexity of 2 windows of 128 held-out tokens, for W4A8, W4A16 and W8A8.
# Prints PASS when every pair is within TOL percent.
#   usage: tests/llm/sim_vs_reference.sh NIBBLE MODEL HELDOUT WORKDIR [TOL=2]
set -euo pipefail
nibble="$1" model="$2" heldout="$3" work="$4" tol="${5:-2}"
fail=0
ppl() { "$nibble" perplexity "$1" --text "$heldout" --max-tokens 256 --ctx 128 --format "$2" \
          --quiet | awk '{print $2}'; }
for fmt in w4a8_g128 w8a8 w4a16_g128; do
  "$nibble" quantize "$model" --format "$fmt" --method rtn --out "$work/$fmt" --quiet > /dev/null
  real="$(ppl "$work/$fmt" "$fmt")"
  sim="$(ppl "$work/$fmt" "sim:$fmt")"
  diff="$(awk -v r="$real" -v s="$sim" 'BEGIN { d = 100 * (s - r) / r; printf "%+.3f", d }')"
  ok="$(awk -v d="$diff" -v t="$tol" 'BEGIN { print (d <= t && d >= -t) ? "ok" : "FAIL" }')"
  echo "$fmt: real $real, sim $sim, difference $diff% ($ok, tolerance ±$tol%)"
  [ "$ok" = ok ] || fail=1
done
rm -rf "$work"
[ $fail -eq 0 ] && printf '\nPASS\n'
