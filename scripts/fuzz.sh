#!/usr/bin/env bash
# Fuzzes the GGUF reader with libFuzzer under AddressSanitizer and UBSan for a given number of
# seconds (default 120). Needs clang++ with its libFuzzer runtime (Debian: clang).
#   usage: scripts/fuzz.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-120}"
if ! command -v clang++ > /dev/null; then
  echo "fuzz: skipped (no clang++ on this machine; install Debian's clang)"
  exit 0
fi
out=build/fuzz
mkdir -p "$out" "$out/corpus"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Iinclude -Isrc -DNIBBLE_WITH_CUDA=0 \
  tests/fuzz/fuzz_gguf.cpp src/llm/gguf.cpp src/common/numeric.cpp src/common/check.cpp \
  src/common/types.cpp -o "$out/fuzz_gguf"
cp tests/fuzz/corpus/gguf/* "$out/corpus/"
"$out/fuzz_gguf" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "$out/corpus" 2>&1 | tail -15
echo "fuzz: ${seconds}s of GGUF fuzzing found no crash"
