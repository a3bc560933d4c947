#!/usr/bin/env bash
# Creates (once) the Python environment of the runner's reference checks: numpy, gguf (llama.cpp's
# GGUF reader and writer), tokenizers (Hugging Face's) and sentencepiece (Google's), pinned,
# from PyPI.
#   usage: tests/llm/setup-venv.sh VENV_DIR
set -euo pipefail
venv="$1"
pins=(numpy==2.4.6 gguf==0.19.0 tokenizers==0.23.3 sentencepiece==0.2.3)
stamp="$venv/.nibble-pins"
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "${pins[*]}" ]; then
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}"
"$venv/bin/python" -c "import gguf, numpy, sentencepiece, tokenizers"
echo "${pins[*]}" > "$stamp"
echo "llm: Python environment ready in $venv"
