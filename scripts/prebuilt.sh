#!/usr/bin/env bash
# Build the sm_90a binaries on this (GPU-less) machine and carry them to a device machine, so a
# device call skips its own build (about 200 s of a 10-minute call on the 16-core H100 hosts).
#   scripts/prebuilt.sh pack     here: build `nibble` and `nibble_tests` with the sm90a preset
#                                (build/sm90a: sm_90a only, warnings as errors), and write them
#                                xz-compressed with their sources' identity to build/carry/
#   scripts/prebuilt.sh pack-base REV
#                                here: build `nibble` of commit REV (git archive into
#                                build/base-src) and write it to build/carry/a/, the A side of an
#                                A/B (about 8 minutes; run it beside `pack`, or before)
#   scripts/prebuilt.sh unpack   there (the device tool: carry ["build/carry"]): unpack into
#                                build/sm90a/ (nibble, tests/cpp/nibble_tests), and build/a/nibble
#                                where pack-base wrote one; fails if the binaries were built from
#                                another tree than the one that travelled
#   scripts/prebuilt.sh test OUT there, after unpack: the whole nibble_tests in 8 shards at once
#                                (the stream-K and persistent tests, the slowest, in 3 of them);
#                                the summary on stdout, the logs in OUT/tests.tgz (about 2 minutes
#                                on an H100 host)
# A device call for an A/B of a kernel change then reads, e.g.:
#   scripts/prebuilt.sh unpack && scripts/prebuilt.sh test "$OUT" &&
#   scripts/ab_bench.sh --binaries build/a/nibble build/sm90a/nibble "$OUT/plan" --formats ...
# The binaries need the device machine's CUDA runtime libraries (cuBLAS), which its image has,
# and a glibc no newer than its own (the binaries ask for GLIBC_2.34 at most). The device tool
# carries at most 64 MiB a call: pack prints the sizes (2026-11-28: 11.6 + 12.4 MB compressed,
# from 49 + 52 MB; pack took about 8 minutes on this 2-core machine). They ran on the H100 hosts
# (2026-11-28): a call that unpacks instead of building saves about 240 s.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/sm90a carry=build/carry
# The identity of what the binaries are built from: the contents of the files under the source
# paths (tracked or new, not ignored), so that a binary built before an edit of the sources is
# not run against the edited tree, while committing scripts or docs keeps a pack valid. It hashes
# the files themselves, not git's index: the device machine's copy of the tree can carry an
# older commit's git metadata (2026-11-28: an id from `git ls-files -s` + `git diff HEAD`
# differed there for the same files). On 2026-12-08 this id differed too, cause not found: the
# sort is now in byte order whatever the locale, and unpack prints the files whose hashes differ.
sources=(CMakeLists.txt CMakePresets.json cmake include src bench tests tools python
  ':(exclude)bench/results')  # results committed after a run do not change the binaries
# The files' hashes in byte order (LC_ALL=C: the device machines' locale may collate otherwise).
tree_files() {
  git ls-files -z -co --exclude-standard -- "${sources[@]}" | LC_ALL=C sort -z | xargs -0 sha256sum
}
tree_id() { tree_files | sha256sum | cut -c1-16; }
case "${1:-}" in
  pack)
    cmake --preset sm90a > /dev/null
    cmake --build --preset sm90a --target nibble_cli nibble_tests
    mkdir -p "$carry"
    xz -T0 -6 -c "$build/nibble" > "$carry/nibble.xz"
    xz -T0 -6 -c "$build/tests/cpp/nibble_tests" > "$carry/nibble_tests.xz"
    tree_id > "$carry/tree"
    tree_files > "$carry/tree.files"  # unpack shows the files that differ
    git rev-parse HEAD > "$carry/commit.head"
    ls -la "$carry"
    du -sh "$carry"
    ;;
  unpack)
    # The device copy of the tree may not be a git checkout; then the identity cannot be checked
    # there and the commit recorded here is trusted.
    if git rev-parse HEAD > /dev/null 2>&1 && [ "$(tree_id)" != "$(cat "$carry/tree")" ]; then
      echo "prebuilt.sh: build/carry holds binaries of another tree ($(cat "$carry/tree")," \
        "this one is $(tree_id)); run scripts/prebuilt.sh pack again" >&2
      [ -f "$carry/tree.files" ] && diff <(cat "$carry/tree.files") <(tree_files) | head -20 >&2
      exit 1
    fi
    mkdir -p "$build/tests/cpp"
    xz -dc "$carry/nibble.xz" > "$build/nibble"
    xz -dc "$carry/nibble_tests.xz" > "$build/tests/cpp/nibble_tests"
    chmod +x "$build/nibble" "$build/tests/cpp/nibble_tests"
    echo "prebuilt binaries of $(cat "$carry/commit.head") in $build"
    if [ -f "$carry/a/nibble.xz" ]; then
      mkdir -p build/a
      xz -dc "$carry/a/nibble.xz" > build/a/nibble && chmod +x build/a/nibble
      echo "and the base's nibble of $(cat "$carry/a/commit.head") in build/a"
    fi
    ;;
  pack-base)
    rev=$(git rev-parse --short "${2:?usage: scripts/prebuilt.sh pack-base REV}")
    src=build/base-src
    rm -rf "$src" && mkdir -p "$src"
    git archive "$rev" | tar -x -C "$src"
    ( cd "$src" && cmake --preset sm90a > /dev/null && cmake --build --preset sm90a --target nibble_cli )
    mkdir -p "$carry/a"
    xz -T0 -6 -c "$src/$build/nibble" > "$carry/a/nibble.xz"
    echo "$rev" > "$carry/a/commit.head"
    ls -la "$carry/a"
    ;;
  test)
    out=${2:?usage: scripts/prebuilt.sh test OUT}
    tests=$build/tests/cpp/nibble_tests logs=$(mktemp -d)
    slow='*StreamK*:*Persistent*'
    for i in 0 1 2; do
      GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$i "$tests" --gtest_filter="$slow" \
        > "$logs/slow$i.log" 2>&1 &
    done
    for i in 0 1 2 3 4; do
      GTEST_TOTAL_SHARDS=5 GTEST_SHARD_INDEX=$i "$tests" --gtest_filter="-$slow" \
        > "$logs/rest$i.log" 2>&1 &
    done
    rc=0
    for job in $(jobs -p); do wait "$job" || rc=1; done
    grep -hE "^\[  (PASSED|FAILED) " "$logs"/*.log | sort | uniq -c
    mkdir -p "$out" && tar -czf "$out/tests.tgz" -C "$logs" .
    echo "nibble_tests of $(cat "$carry/commit.head"): rc=$rc"
    exit $rc
    ;;
  *)
    echo "usage: scripts/prebuilt.sh pack|pack-base REV|unpack|test OUT" >&2
    exit 2
    ;;
esac
