#!/usr/bin/env bash
# Does `pip install .` work on a fresh machine? Installs the project into a new virtual
# environment the way the README says (scikit-build-core from PyPI, the same CMake project),
# then, from outside the source tree, runs the installed `nibble` command and a quantized
# linear through the installed Python package, checked against numpy in float64.
#   usage: scripts/check-pip-install.sh [DIR]   (default build/pip-check; removed first)
# NIBBLE_PIP_CUDA (env, default OFF) is passed as NIBBLE_CUDA: CI's 2-core machine builds the CPU
# library only (the CUDA kernels are built and tested by scripts/test.sh already); AUTO builds
# them when nvcc is found, as a plain `pip install .` does.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
dir=$(realpath -m "${1:-build/pip-check}")
rm -rf "$dir"
mkdir -p "$dir"
t0=$SECONDS
python3 -m venv "$dir/venv"
"$dir/venv/bin/python" -m pip install -q --upgrade pip
"$dir/venv/bin/python" -m pip install -q "$src" \
  -C "cmake.define.NIBBLE_CUDA=${NIBBLE_PIP_CUDA:-OFF}" -C "build-dir=$dir/build"
echo "pip install . took $((SECONDS - t0)) s"
cd "$dir"  # away from the source tree: only the installed package can be imported
"$dir/venv/bin/nibble" formats | grep -q w4a8_g128 ||
  { echo "FAIL: the installed nibble command does not list w4a8_g128"; exit 1; }
"$dir/venv/bin/python" - <<'EOF'
import os, sys
import numpy as np
import nibble

where = os.path.dirname(nibble.__file__)
site = os.path.realpath(os.path.join(sys.prefix, "lib"))
assert os.path.realpath(where).startswith(site + os.sep), \
    f"imported nibble from {where}, not from the virtual environment's {site}"
rng = np.random.default_rng()
m, n, k = 3, 40, 256
w = rng.standard_normal((n, k)).astype(np.float32)
x = rng.standard_normal((m, k)).astype(np.float32)
qw = nibble.quantize_weight(w, "w4a8_g128")
a = nibble.quantize_activation(x, "s8_per_token")
y = nibble.linear(a, qw)
ref = nibble.dequantize_activation(a).astype(np.float64) @ \
    nibble.dequantize_weight(qw).astype(np.float64).T
err = float(np.abs(np.asarray(y, dtype=np.float64) - ref).max() / np.abs(ref).max())
print(f"installed nibble {nibble.__version__} "
      f"from {where}: w4a8_g128 linear ({m}x{n}x{k}) against float64, relative error {err:.2e}")
assert err < 1e-5, "the installed package computes a different linear"
print("PASS")
EOF
