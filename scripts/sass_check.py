#!/usr/bin/env python3
"""Checks the SASS of nibble's kernels for reads of uniform registers that nothing writes.

ptxas 13.0 (V13.0.88) can compile fully unrolled cp.async copies that carry an L2 cache hint
into LDGSTS instructions whose shared-memory base and memory descriptor are uniform registers
(UR0, UR1) that no instruction of the kernel writes; the H100 stops such a kernel with
"an illegal instruction was encountered" (found 2026-11-28 in sm80_weight_only_gemm). A GPU-less
machine can still catch this: the instructions are in the compiled library.

    usage: scripts/sass_check.py LIBRARY_OR_SASS [--cuobjdump PATH]
           scripts/sass_check.py --which-cuobjdump

LIBRARY_OR_SASS is a library or object with device code (cuobjdump -sass is run on it) or a
.sass / .txt file of cuobjdump -sass output. Exit status 1 and one line per function when some
instruction reads a uniform register that no instruction of that function writes; 77 (CTest's
skip) when no cuobjdump is found: on PATH, beside nvcc, or from the PyPI packages
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm in this Python's environment. --which-cuobjdump
prints the one found (77 if none); scripts/ensure-deps.sh --python installs the wheels when it
finds none. CTest runs the check on libnibble as `sass_uniform_registers`.

A register counts as written when it is the destination (the first operand) of an instruction
that has one; a wide destination (.64, .128 and .WIDE suffixes) writes the following registers
too. This over-approximates the writes (any write anywhere in the function
counts, whatever the control flow), so a report is a real defect, not a style question.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

# Instructions whose first operand is read, not written (stores, copies into shared memory,
# barriers, prefetches, TMA and cluster synchronisation, branches).
NO_DESTINATION = re.compile(
    r"^(ST[A-Z]*|LDGSTS|RED[A-Z]*|UBLKPF|UBLKCP|UBLKRED|UTMA[A-Z]*|UTMALDG|UTMASTG|UTMAPF|"
    r"SYNCS|BAR|BRA|BRX|JMP|CALL|RET|EXIT|BSYNC|BSSY|WARPSYNC|MEMBAR|FENCE|CCTL|ERRBAR|"
    r"DEPBAR|NOP|YIELD|ARRIVES|WARPGROUP|USETMAXREG|ELECT|ACQBULK|UCGABAR[A-Z_]*)$")
FUNCTION = re.compile(r"^\s*Function : (\S+)")
INSTRUCTION = re.compile(
    r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_]+)((?:\.[A-Z0-9_]+)*)\s*(.*?);")
UNIFORM = re.compile(r"\bUR(\d+)\b")
PREDICATE = re.compile(r"!?U?P[T0-9]+")


def width(suffixes: str) -> int:
    """Registers written by a destination, from the opcode's width suffix."""
    if ".128" in suffixes:
        return 4
    if ".64" in suffixes or ".WIDE" in suffixes:  # UIMAD.WIDE writes a pair
        return 2
    return 1


def check(lines):
    """Yields (function, instruction text, register) for each read of a never-written UR."""
    function, written, reads = None, set(), []

    def report():
        for text, regs in reads:
            if not written.intersection(regs):
                yield function, text, regs[0]

    for line in lines:
        m = FUNCTION.match(line)
        if m:
            if function is not None:
                yield from report()
            function, written, reads = m.group(1), set(), []
            continue
        m = INSTRUCTION.search(line)
        if not m or function is None:
            continue
        opcode, suffixes, operands = m.groups()
        parts = [p.strip() for p in operands.split(",")] if operands else []
        sources = parts
        if parts and not NO_DESTINATION.match(opcode):
            # The destination is the first operand that names a register; a predicate written
            # first (R2UR P0, UR6, R14; UISETP ... P0, ...) is skipped over to the register.
            for i, part in enumerate(parts):
                d = UNIFORM.fullmatch(part)
                if d:
                    first = int(d.group(1))
                    written.update(range(first, first + width(suffixes)))
                    sources = parts[i + 1:]
                    break
                if not PREDICATE.fullmatch(part):
                    break
        for part in sources:
            for r in UNIFORM.finditer(part):
                n = int(r.group(1))
                # A memory descriptor desc[URn] is the pair URn, URn+1 and a wgmma descriptor
                # gdesc[URn] the quad URn..URn+3 (its A half is unused when A comes from
                # registers): the read counts as unwritten only when none of them is written.
                prefix = part[:r.start()]
                group = 4 if prefix.endswith("gdesc[") else 2 if prefix.endswith("desc[") else 1
                reads.append((f"{opcode}{suffixes} {operands}", tuple(range(n, n + group))))
    if function is not None:
        yield from report()


def find_cuobjdump():
    """cuobjdump on PATH, beside nvcc, or from the nvidia-cuda-cuobjdump wheel; None if none."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    if nvcc and os.access(os.path.join(os.path.dirname(nvcc), "cuobjdump"), os.X_OK):
        return os.path.join(os.path.dirname(nvcc), "cuobjdump")
    for prefix in {sys.prefix, sys.base_prefix}:
        for path in sorted(glob.glob(os.path.join(
                prefix, "lib", "python3*", "site-packages", "nvidia", "*", "bin", "cuobjdump"))):
            # cuobjdump -sass runs nvdisasm, the other wheel, from the same folder.
            nvdisasm = os.path.join(os.path.dirname(path), "nvdisasm")
            if os.access(path, os.X_OK) and os.access(nvdisasm, os.X_OK):
                return path
    return None


def sass_lines(path, cuobjdump, prog="sass_check"):
    """The lines of `cuobjdump -sass path` (a library or object), or of a saved .sass / .txt
    listing; exits naming `prog` when cuobjdump fails."""
    if path.endswith((".sass", ".txt")):
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    # cuobjdump runs nvdisasm: the one beside it first.
    env = dict(os.environ)
    bin_dir = os.path.dirname(os.path.abspath(cuobjdump))
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, check=False,
                          env=env)
    if proc.returncode != 0:
        sys.exit(f"{prog}: {cuobjdump} -sass {path} failed: {proc.stderr}")
    return proc.stdout.splitlines()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", nargs="?")
    parser.add_argument("--cuobjdump", default=None)
    parser.add_argument("--which-cuobjdump", action="store_true")
    args = parser.parse_args()
    if args.which_cuobjdump:
        found = find_cuobjdump()
        print(found or "no cuobjdump")
        return 0 if found else 77
    if args.input is None:
        parser.error("LIBRARY_OR_SASS is required")
    if not args.input.endswith((".sass", ".txt")):
        args.cuobjdump = args.cuobjdump or find_cuobjdump()
        if args.cuobjdump is None:
            print("sass_check: skipped, no cuobjdump "
                  "(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
            return 77
    lines = sass_lines(args.input, args.cuobjdump)
    bad = {}
    for function, text, reg in check(lines):
        bad.setdefault(function, []).append((reg, text))
    functions = sum(1 for line in lines if FUNCTION.match(line))
    for function, items in sorted(bad.items()):
        regs = sorted({r for r, _ in items})
        print(f"{function}: reads UR{', UR'.join(map(str, regs))}, never written; "
              f"{len(items)} instructions, e.g. {items[0][1]}")
    print(f"sass_check: {functions} functions, {len(bad)} with reads of unwritten uniform "
          f"registers")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
