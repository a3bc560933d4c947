#!/usr/bin/env bash
# Fuzzes the model-file parsers with libFuzzer under AddressSanitizer and UBSan: GGUF, safetensors
# (whose header exercises the JSON reader) and the Hugging Face JSON files (tokenizer.json,
# config.json). The time budget (default 120 s) is split 3:3:2 between the three targets.
# Needs clang++ with its libFuzzer runtime (Debian: clang).
#   usage: scripts/fuzz.sh [total seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-120}"
if ! command -v clang++ > /dev/null; then
  echo "fuzz: skipped (no clang++ on this machine; install Debian's clang)"
  exit 0
fi
out=build/fuzz
mkdir -p "$out"
common=(src/common/numeric.cpp src/common/check.cpp src/common/types.cpp)
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -pthread -Iinclude -Isrc -DNIBBLE_WITH_CUDA=0)

# name, budget share (eighths), max input length, sources
run() {
  local name="$1" share="$2" max_len="$3"
  shift 3
  local t=$((seconds * share / 8))
  [ "$t" -ge 1 ] || t=1
  clang++ "${flags[@]}" "tests/fuzz/fuzz_$name.cpp" "$@" "${common[@]}" -o "$out/fuzz_$name"
  mkdir -p "$out/corpus_$name"
  cp tests/fuzz/corpus/"$name"/* "$out/corpus_$name/"
  "$out/fuzz_$name" -max_total_time="$t" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$out/corpus_$name" 2>&1 | tail -6
  echo "fuzz: ${t}s of $name fuzzing found no crash"
}

run gguf 3 4096 src/llm/gguf.cpp src/llm/ggml_blocks.cpp src/llm/file_util.cpp
run safetensors 3 4096 src/llm/safetensors.cpp src/llm/json.cpp src/llm/file_util.cpp
run hf_json 2 8192 src/llm/tokenizer.cpp src/llm/config.cpp src/llm/json.cpp src/llm/gguf.cpp src/llm/ggml_blocks.cpp src/llm/file_util.cpp
