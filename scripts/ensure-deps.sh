#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build nibble: CMake, Ninja, a C++20
# compiler and GoogleTest (all from the distribution). The CUDA toolkit is optional: with nvcc
# on PATH the CUDA backend is built too. Needs root (or sudo) only when something is missing.
set -euo pipefail
need=()
command -v cmake > /dev/null || need+=(cmake)
command -v ninja > /dev/null || need+=(ninja-build)
command -v g++ > /dev/null || need+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
# The LLM runner's end-to-end tests: Python with venv + pip (the reference check installs numpy,
# gguf and tokenizers from PyPI into a venv of the build tree).
command -v python3 > /dev/null || need+=(python3)
python3 -c "import venv, ensurepip" 2> /dev/null || need+=(python3-venv)
[ ${#need[@]} -eq 0 ] && exit 0
echo "nibble: installing ${need[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q "${need[@]}"
