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
[ ${#need[@]} -eq 0 ] && exit 0
echo "nibble: installing ${need[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q "${need[@]}"
