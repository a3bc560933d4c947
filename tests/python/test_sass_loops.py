"""scripts/sass_loops.py on synthetic cuobjdump -sass text (no GPU, no cuobjdump)."""
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "sass_loops.py"


def sass(function, body):
    """A cuobjdump-like listing of one function: one instruction per 16 bytes from 0x0000."""
    lines = ["\tcode for sm_90a", f"\t\tFunction : {function}"]
    for i, text in enumerate(body):
        lines.append(f"        /*{16 * i:04x}*/                   {text} ;"
                     "                     /* 0x0000000000000000 */")
    return "\n".join(lines) + "\n"


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True)


def listing(extra_moves):
    # An outer loop 0x10..0xa0 holding an inner MMA loop 0x20..(branch back to 0x20).
    inner = ["R2UR UR14, R12"] * extra_moves + [
        "HGMMA.64x128x16.F32.BF16 R24, R152, gdesc[UR12], R24",
        "LOP3.LUT R1, R2, 0xf, RZ, 0xc0, !PT"]
    body = ["MOV R0, RZ", "IADD3 R3, R3, 0x1, RZ"] + inner
    body.append("@!P1 BRA 0x20")  # back to the inner loop's first instruction
    body.append("@P0 BRA 0x10")   # the outer loop
    body.append("EXIT")
    return body


def test_counts_the_innermost_mma_loop_and_the_difference(tmp_path):
    a, b = tmp_path / "a.sass", tmp_path / "b.sass"
    a.write_text(sass("kernel_one", listing(2)) + sass("no_mma", ["NOP", "BRA 0x0"]))
    b.write_text(sass("kernel_one", listing(0)) + sass("no_mma", ["NOP", "BRA 0x0"]))
    out = run(a, b, "--histogram")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # inner loop of a: 2 moves + HGMMA + LOP3 + the branch = 5; of b: 3.
    assert lines[0].split()[:5] == ["5", "(1", "MMA)", "3", "(1"], lines
    assert "-2" in lines[0] and "kernel_one" in lines[0]
    assert lines[1].split() == ["R2UR", "2", "0"]
    assert any("0 (0 MMA)" in line and "no_mma" in line for line in lines)


def test_filter_selects_functions(tmp_path):
    a = tmp_path / "a.sass"
    a.write_text(sass("kernel_one", listing(1)) + sass("kernel_two", listing(3)))
    out = run(a, "--filter", "two")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 1 and "kernel_two" in out.stdout
    assert out.stdout.split()[0] == "6"


def test_all_loops_lists_every_mma_loop(tmp_path):
    # The outer loop holds the MMA too: a persistent kernel's walks each have such a loop.
    a, b = tmp_path / "a.sass", tmp_path / "b.sass"
    a.write_text(sass("kernel_one", listing(2)))
    b.write_text(sass("kernel_one", listing(0)))
    out = run(a, b, "--all-loops")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "kernel_one"
    assert lines[1].split() == ["A", "[5,", "7]"] and lines[2].split() == ["B", "[3,", "5]"]
    out = run(a, "--all-loops")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split() == ["[5,", "7]"]
    assert lines[2].split()[:3] == ["5", "(1", "MMA):"] and "R2UR 2" in lines[2]
