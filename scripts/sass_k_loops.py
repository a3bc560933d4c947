#!/usr/bin/env python3
"""The main loops of tensor-core kernels in SASS, to compare instruction counts between builds.

A loop here is a backward branch whose body holds wgmma/mma instructions (GMMA, HMMA, IMMA); each
is printed with its size in instructions and its most frequent opcodes. Uniform-datapath opcodes
(UIMAD, UIADD3, ...) turning into vector ones (IMAD, R2UR) in a loop is how a change of the tile
walk showed its cost before any device time (docs/kernels.md, stream-K segments, 2026-12-07).

  scripts/sass_k_loops.py OBJ [--function SUBSTRING] [--max-size N]
      every kernel of OBJ (an object, library or saved cuobjdump -sass listing) with its loops
  scripts/sass_k_loops.py OBJ --base BASE_OBJ [--function SUBSTRING]
      the kernels whose loops differ between BASE_OBJ and OBJ (the same translation unit built
      from two trees), and how much the innermost (shortest) loop of each kernel grew

cuobjdump is found as scripts/sass_check.py finds it (PATH, beside nvcc, or the PyPI wheels
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm); --cuobjdump names one.
"""
import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_check import FUNCTION, find_cuobjdump, sass_lines  # noqa: E402

INSTRUCTION = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")
MMA = re.compile(r"[HIQ]?GMMA|HMMA|IMMA")


def functions(lines):
    """{mangled name: [(address, instruction text), ...]} in the listing's order."""
    result, current = collections.OrderedDict(), None
    for line in lines:
        m = FUNCTION.match(line)
        if m:
            current = result.setdefault(m.group(1), [])
            continue
        m = INSTRUCTION.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2)))
    return result


def mma_loops(instructions):
    """[(start address, end address, body texts)] of the backward branches around MMA code."""
    index_of = {address: i for i, (address, _) in enumerate(instructions)}
    loops = []
    for i, (address, text) in enumerate(instructions):
        if "BRA" not in text:
            continue
        target = re.search(r"0x([0-9a-f]+)", text)
        if not target or int(target.group(1), 16) >= address:
            continue
        start = index_of.get(int(target.group(1), 16))
        if start is None:
            continue
        body = [t for _, t in instructions[start:i + 1]]
        if any(MMA.search(t) for t in body):
            loops.append((instructions[start][0], address, body))
    return loops


def describe(body):
    opcodes = collections.Counter(
        re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
    mma = sum(bool(MMA.search(t)) for t in body)
    return f"{len(body)} instructions, {mma} MMA: " + ", ".join(
        f"{op} {n}" for op, n in opcodes.most_common(12))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="object, library or cuobjdump -sass listing (.sass/.txt)")
    parser.add_argument("--base", help="the same, built from the base tree: compare")
    parser.add_argument("--function", default="", help="only kernels whose name contains this")
    parser.add_argument("--max-size", type=int, default=0,
                        help="print only loops of at most this many instructions (0: all)")
    parser.add_argument("--cuobjdump", help="the cuobjdump to run (default: as sass_check.py)")
    args = parser.parse_args()
    needs_tool = [p for p in (args.input, args.base) if p and not p.endswith((".sass", ".txt"))]
    cuobjdump = args.cuobjdump or (find_cuobjdump() if needs_tool else None)
    if needs_tool and not cuobjdump:
        sys.exit("sass_k_loops: no cuobjdump found (scripts/ensure-deps.sh --python installs it)")
    new = functions(sass_lines(args.input, cuobjdump, "sass_k_loops"))
    pick = lambda fs: {f: ins for f, ins in fs.items() if args.function in f}
    new = pick(new)
    if not args.base:
        for name, instructions in new.items():
            loops = [l for l in mma_loops(instructions)
                     if not args.max_size or len(l[2]) <= args.max_size]
            if loops:
                print(name)
                for start, end, body in loops:
                    print(f"  {start:#x}-{end:#x} {describe(body)}")
        return
    base = pick(functions(sass_lines(args.base, cuobjdump, "sass_k_loops")))
    growth = collections.Counter()
    for name in sorted(set(base) | set(new)):
        if name not in base or name not in new:
            print(f"{name}: only in {'the base' if name in base else args.input}")
            continue
        a = sorted(len(l[2]) for l in mma_loops(base[name]))
        b = sorted(len(l[2]) for l in mma_loops(new[name]))
        if a and b:
            growth[b[0] - a[0]] += 1
        if a != b:
            print(f"{name}\n  base {a}\n  new  {b}")
    print(f"{len(new)} kernels; innermost loop growth (instructions: kernels): " +
          ", ".join(f"{d:+d}: {n}" for d, n in sorted(growth.items())))


if __name__ == "__main__":
    main()
