"""scripts/check_raw_bar.py (issue 35's bar) at a small size, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_bar_passes_at_a_small_size(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, str(ROOT / "scripts" / "check_raw_bar.py"), "--lines", "120"]
    done = subprocess.run(
        [*args, "--workers", "2", "--dir", str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    table = dict(
        line.rsplit(None, 1) for line in done.stdout.splitlines() if not line.startswith("work")
    )
    assert table["lines"] == "120" and table["samples"] == "120"
    assert table["mismatches"] == "0"
    assert table["two-step shards identical"] == "yes"
    assert int(table["  messages"]) > 20 and int(table["  conversations"]) > 0
    assert int(table["loss tokens"].replace(",", "")) > 0
    assert sorted(p.name for p in (tmp_path / "one").glob("shard-*")) == sorted(
        p.name for p in (tmp_path / "two").glob("shard-*")
    )
