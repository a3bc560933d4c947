#!/usr/bin/env python3
"""Where a kernel's warps stall, per SASS instruction, from Nsight Compute's source page.

Reads the CSV of `ncu --import R --page source --csv --print-source sass` (a report with the
SourceCounters section) and prints, for scripts/ncu_profile.sh's NIBBLE_NCU_SASS=1:
  - the warp-stall samples per stall reason over the whole kernel,
  - the samples and instruction count per opcode (the first word of the SASS, predicate dropped),
  - the TOP instructions with the most samples, each with its three largest reasons.
The column names differ between ncu versions, so columns are found by what their names contain:
the total is the one with "Warp Stall Sampling (All"; reasons are the other numeric columns whose
name contains "stall" (the not-issued total is skipped). When no total column is found the
header is printed instead, to adapt this script.
  usage: ncu_sass_hot.py SOURCE.csv LABEL [TOP]
"""
import collections
import csv
import re
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main():
    path, label = sys.argv[1], sys.argv[2]
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows)
                      if any(c.strip() == "Source" for c in r) and
                      any("Address" in c for c in r)), None)
    print(f"#### {label}: warp-stall samples per SASS instruction")
    if header_at is None:
        print("no source table in the CSV; its first lines:")
        for r in rows[:5]:
            print("  " + ",".join(r)[:300])
        return 1
    header = rows[header_at]
    body = [r for r in rows[header_at + 1:] if len(r) == len(header)]
    source = header.index("Source")
    total = next((i for i, c in enumerate(header) if "Warp Stall Sampling (All" in c), None)
    if total is None:
        print("no 'Warp Stall Sampling (All ...)' column; the header:")
        print("  " + " | ".join(header))
        return 1
    reasons = [i for i, c in enumerate(header)
               if i != total and "stall" in c.lower() and "Not-issued" not in c and
               "Not Issued" not in c and "Warp Stall Sampling" not in c]
    samples = [number(r[total]) or 0.0 for r in body]
    all_samples = sum(samples) or 1.0

    def opcode(sass):
        words = [w for w in sass.split() if not re.fullmatch(r"@!?U?P[T0-9]+", w)]
        return words[0] if words else "?"

    print(f"{len(body)} instructions, {all_samples:.0f} samples")
    if reasons:
        per_reason = {header[i]: sum(number(r[i]) or 0.0 for r in body) for i in reasons}
        print("by reason: " + ", ".join(
            f"{name} {100 * v / all_samples:.1f}%"
            for name, v in sorted(per_reason.items(), key=lambda kv: -kv[1]) if v > 0))
    by_op = collections.defaultdict(lambda: [0, 0.0])
    for r, s in zip(body, samples):
        entry = by_op[opcode(r[source])]
        entry[0] += 1
        entry[1] += s
    print("by opcode (instructions, % of samples): " + ", ".join(
        f"{op} {n} {100 * s / all_samples:.1f}%"
        for op, (n, s) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:20]))
    address = next((i for i, c in enumerate(header) if "Address" in c), None)
    order = sorted(range(len(body)), key=lambda j: -samples[j])[:top]
    for j in order:
        r = body[j]
        why = sorted(((number(r[i]) or 0.0, header[i]) for i in reasons), reverse=True)[:3]
        reasons_text = ", ".join(f"{name} {v:.0f}" for v, name in why if v > 0)
        where = r[address] if address is not None else str(j)
        print(f"  {where:>8} {100 * samples[j] / all_samples:5.1f}%  {r[source][:70]:70}  "
              f"{reasons_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
