"""packer/storage/run_records.py: what the block pipeline's and tokenize's --resume share."""

from __future__ import annotations

import os
from pathlib import Path

from packer.contract.names import TMP_MARK
from packer.storage.run_records import dead_runs, take_over, write_record


def _dead(out: Path, pid: int, name: str = "run.json") -> Path:
    d = out.parent / f".{out.name}{TMP_MARK}{pid}-0000abcd"
    d.mkdir()
    write_record(d / name, {"pid": pid})
    return d


def test_a_killed_run_is_found_and_taken_over_once(tmp_path: Path):
    out = tmp_path / "out"
    dead = _dead(out, 2**22 + 7)  # no such process
    alive = _dead(out, os.getpid())
    assert dead_runs(out, TMP_MARK, "run.json") == [dead]
    mine = take_over(dead, out, TMP_MARK)
    assert mine is not None and mine.is_dir() and not dead.exists()
    assert mine.name.startswith(f".out{TMP_MARK}{os.getpid()}-")
    assert (mine / "run.json").is_file() and alive.is_dir()
    assert take_over(dead, out, TMP_MARK) is None  # another run took it first
