#!/usr/bin/env bash
# Builds nibble and runs every test. CUDA kernels are compiled when nvcc is found; GPU tests
# run when a GPU is present and are reported as skipped otherwise.
#   usage: scripts/test.sh            (preset "ci": warnings are errors)
# The Python stage builds nibble._C in the same build (python/CMakeLists.txt) with the virtual
# environment that `scripts/ensure-deps.sh --python` prepares, then runs pytest on
# tests/python against build/<preset>/python. NIBBLE_PYTHON=0 leaves Python out.
# Last, scripts/check-pip-install.sh installs the project with `pip install .` into a fresh
# virtual environment (the CPU library: the kernels were built above) and runs the installed
# package and command from outside the tree; NIBBLE_PIP_CHECK=0 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${NIBBLE_PRESET:-ci}"
python_flags=()
if [ "${NIBBLE_PYTHON:-1}" != 0 ]; then
  scripts/ensure-deps.sh --python
  venv="${NIBBLE_VENV:-$PWD/build/venv}"
  python_flags=(-DNIBBLE_BUILD_PYTHON=ON "-DPython_EXECUTABLE=$venv/bin/python")
else
  scripts/ensure-deps.sh
fi
cmake --preset "$preset" "${python_flags[@]}"
cmake --build --preset "$preset" -j "$(nproc)"
ctest --preset "$preset" -j "$(nproc)"
# The README's first command, as a newcomer runs it (8 tokens): the build above is reused.
NIBBLE_PRESET="$preset" scripts/demo.sh -n 8 | tee "build/$preset/demo.log"
grep -q "TTFT ms" "build/$preset/demo.log" || { echo "FAIL: scripts/demo.sh printed no report"; exit 1; }
if [ "${NIBBLE_PYTHON:-1}" != 0 ]; then
  PYTHONPATH="build/$preset/python" "$venv/bin/python" -m pytest tests/python -q -rs
  if [ "${NIBBLE_PIP_CHECK:-1}" != 0 ]; then
    scripts/check-pip-install.sh "build/$preset-pip-check"
  fi
fi
