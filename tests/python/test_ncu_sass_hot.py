"""scripts/ncu_sass_hot.py on a synthetic Nsight Compute source-page CSV (no GPU, no ncu)."""
import csv
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "ncu_sass_hot.py"


def run(tmp_path, rows):
    path = tmp_path / "source.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return subprocess.run([sys.executable, str(SCRIPT), str(path), "--m 1024", "3"],
                          capture_output=True, text=True)


def test_ranks_instructions_opcodes_and_reasons(tmp_path):
    header = ["# Address", "Source", "Warp Stall Sampling (All Samples)",
              "Warp Stall Sampling (Not-issued Samples)", "stall_long_sb", "stall_wait",
              "Instructions Executed"]
    rows = [["Kernel Name", "k"], header,
            ["0x10", "@!P1 HGMMA.64x128x16.F32.BF16 R24, R152, gdesc[UR12], R24 ;", "50",
             "40", "5", "45", "8"],
            ["0x20", "LOP3.LUT R88, R12, 0xf000f, RZ, 0xc0, !PT ;", "30", "20", "0", "30", "8"],
            ["0x30", "LOP3.LUT R89, R13, 0xf000f, RZ, 0xc0, !PT ;", "15", "10", "15", "0", "8"],
            ["0x40", "LDS.128 R12, [R89+0x8000] ;", "5", "5", "5", "0", "8"]]
    out = run(tmp_path, rows)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "#### --m 1024: warp-stall samples per SASS instruction"
    assert lines[1] == "4 instructions, 100 samples"
    assert lines[2] == "by reason: stall_wait 75.0%, stall_long_sb 25.0%"
    assert lines[3].startswith("by opcode (instructions, % of samples): "
                               "HGMMA.64x128x16.F32.BF16 1 50.0%, LOP3.LUT 2 45.0%, LDS.128 1 5.0%")
    hot = lines[4:]
    assert len(hot) == 3  # TOP = 3
    assert "0x10" in hot[0] and "50.0%" in hot[0] and "stall_wait 45, stall_long_sb 5" in hot[0]
    assert "0x30" in hot[2] and "stall_long_sb 15" in hot[2]


def test_unknown_columns_print_the_header_and_fail(tmp_path):
    out = run(tmp_path, [["# Address", "Source", "Samples"], ["0x10", "NOP ;", "1"]])
    assert out.returncode == 1
    assert "no 'Warp Stall Sampling (All ...)' column" in out.stdout
    assert "# Address | Source | Samples" in out.stdout
