#!/usr/bin/env python3
"""The main loops of tensor-core kernels in SASS, to compare instruction counts between builds.

A loop here is a backward branch whose body holds wgmma/mma instructions (GMMA, HMMA, IMMA); each
is printed with its size in instructions and its most frequent opcodes. Uniform-datapath opcodes
(UIMAD, UIADD3, ...) turning into vector ones (IMAD, R2UR) in a loop is how a change of the tile
walk showed its cost before any device time (docs/kernels.md, stream-K segments, 2026-12-07).

  cuobjdump --dump-sass --function MANGLED_NAME build.o > a.sass
  scripts/sass_k_loops.py a.sass [--max-size N]
"""
import argparse
import collections
import re


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sass", help="cuobjdump --dump-sass output of one function")
    parser.add_argument("--max-size", type=int, default=0,
                        help="print only loops of at most this many instructions (0: all)")
    args = parser.parse_args()
    instructions = []
    for line in open(args.sass):
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            instructions.append((int(m.group(1), 16), m.group(2)))
    index_of = {address: i for i, (address, _) in enumerate(instructions)}
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
        mma = sum(bool(re.search(r"[HIQ]?GMMA|HMMA|IMMA", t)) for t in body)
        if not mma or (args.max_size and len(body) > args.max_size):
            continue
        opcodes = collections.Counter(
            re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
        print(f"{instructions[start][0]:#x}-{address:#x} {len(body)} instructions, {mma} MMA:",
              ", ".join(f"{op} {n}" for op, n in opcodes.most_common(12)))


if __name__ == "__main__":
    main()
