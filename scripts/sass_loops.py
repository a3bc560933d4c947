#!/usr/bin/env python3
"""Counts the instructions of each kernel's innermost tensor-core loop in compiled SASS.

The wgmma kernels are bound by their consumer warps' instruction stream (docs/kernels.md, "What
bounds the 128-token tile"), so the length of the innermost loop that issues the MMAs is a
GPU-free proxy for a change's effect: count it before and after, then time only what moved.

    usage: scripts/sass_loops.py OBJECT [OBJECT_B] [--filter TEXT] [--histogram | --all-loops]

OBJECT is a library, an object file (cuobjdump -sass is run on it) or a .sass / .txt file of
cuobjdump -sass output. For every function whose demangled name contains TEXT it prints the
innermost loop's instruction count and MMA count (a loop is the code between a backward branch
and its target; the innermost is the shortest one holding an HMMA / IMMA / xGMMA instruction),
with OBJECT_B beside it and the difference. --all-loops prints the sizes of every loop holding
an MMA instead (a persistent kernel has one K loop per tile walk: the stream-K walk's is not the
innermost), and for one OBJECT each loop's most frequent opcodes. --histogram prints, per function, the opcodes whose
counts differ between the two innermost loops (predicates stripped), e.g. R2UR moves that appear
when a descriptor leaves the uniform datapath. Exit status 77 when no cuobjdump is found
(scripts/sass_check.py's search: PATH, beside nvcc, the PyPI wheels nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm).
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sass_check import FUNCTION, find_cuobjdump, sass_lines  # noqa: E402

INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
MMA = re.compile(r"\b(HMMA|IMMA|[HIQ]GMMA)\b")
PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def functions(lines):
    """{mangled name: [(address, instruction text)]}"""
    out, current = {}, None
    for line in lines:
        m = FUNCTION.match(line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        m = INSTRUCTION.match(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2)))
    return out


def mma_loops(instructions):
    """Every backward-branch loop holding an MMA instruction, as lists of texts, in address
    order (a persistent kernel has one K loop per tile walk and per instance of its body)."""
    index = {address: i for i, (address, _) in enumerate(instructions)}
    loops = []
    for i, (address, text) in enumerate(instructions):
        m = BRANCH.search(text)
        if not m:
            continue
        target = int(m.group(1), 16)
        if target < address and target in index:
            body = [t for _, t in instructions[index[target]:i + 1]]
            if any(MMA.search(t) for t in body):
                loops.append(body)
    return loops


def innermost_mma_loop(instructions):
    """The shortest backward-branch loop holding an MMA instruction, as a list of texts."""
    return min(mma_loops(instructions), key=len, default=[])


def opcodes(body):
    return collections.Counter(PREDICATE.sub("", t).split()[0] for t in body)


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return dict(zip(names, names))
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout
    return dict(zip(names, out.splitlines()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", metavar="OBJECT")
    parser.add_argument("--filter", default="")
    parser.add_argument("--histogram", action="store_true")
    parser.add_argument("--all-loops", action="store_true")
    parser.add_argument("--cuobjdump", default=None)
    args = parser.parse_args()
    if len(args.inputs) > 2:
        parser.error("one or two objects")
    if not all(p.endswith((".sass", ".txt")) for p in args.inputs):
        args.cuobjdump = args.cuobjdump or find_cuobjdump()
        if args.cuobjdump is None:
            print("sass_loops: no cuobjdump "
                  "(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
            return 77
    sides = [functions(sass_lines(p, args.cuobjdump, "sass_loops")) for p in args.inputs]
    names = demangle(sorted(sides[0]))
    for mangled, name in names.items():
        if args.filter not in name:
            continue
        if args.all_loops:
            every = [mma_loops(side.get(mangled, [])) for side in sides]
            print(name)
            for label, side_loops in zip(("A", "B"), every):
                print(f"  {label if len(every) == 2 else ' '} {sorted(len(b) for b in side_loops)}")
            if len(every) == 1:
                for body in every[0]:
                    mma = sum(bool(MMA.search(t)) for t in body)
                    print(f"    {len(body):5d} ({mma} MMA): " + ", ".join(
                        f"{op} {n}" for op, n in opcodes(body).most_common(12)))
            continue
        loops = [innermost_mma_loop(side.get(mangled, [])) for side in sides]
        counts = [f"{len(b):5d} ({sum(bool(MMA.search(t)) for t in b)} MMA)" for b in loops]
        diff = f" {len(loops[1]) - len(loops[0]):+5d}" if len(loops) == 2 else ""
        print(f"{'  '.join(counts)}{diff}  {name}")
        if args.histogram and len(loops) == 2:
            a, b = opcodes(loops[0]), opcodes(loops[1])
            for op in sorted(set(a) | set(b)):
                if a[op] != b[op]:
                    print(f"        {op:24s} {a[op]:4d} {b[op]:4d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
