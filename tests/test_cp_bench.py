"""scripts/bench_cp.py runs, prints its tables, and its end-to-end check agrees with the planner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_cp_prints_its_tables():
    args = ["--rows", "40", "--contexts", "4096", "--cp-sizes", "1", "8", "--seeds", "2"]
    args += ["--pack-rows", "10", "--repeats", "1"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_cp.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    plan_rows = [line for line in lines if "| 4,096 |" in line]
    assert len(plan_rows) == 4  # two mixes x two CP sizes
    for line in plan_rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows, lb_padded, lb_real = (int(cells[i].replace(",", "")) for i in (5, 6, 8))
        assert rows >= lb_padded >= lb_real
        if cells[2] == "1":
            assert cells[4] == "0.000" and lb_padded == lb_real  # no padding without CP
        else:
            assert float(cells[4]) > 0  # CP 8 pads samples of lengths that are not multiples of 16
    assert "worst rows / LB padded over seeds 0-1" in result.stdout
    packed = [line for line in lines if line.count("|") == 9 and "| cp |" not in line]
    assert len(packed) == 4
    for line in packed:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2] == cells[3]  # pack wrote the rows the planner planned
