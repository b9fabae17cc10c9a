"""Progress bars: drawn on a terminal (bytes of the file and of all files, planning, rows),
never with --json or when stderr is not a terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl, write_parquet
from rich.filesize import decimal

from packer.read.progress import metering, open_input


def run_on_terminal(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal; (exit code, stdout, terminal output)."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "packer", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        cwd=cwd,
        env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(master)
    stdout = proc.stdout.read().decode()
    return proc.wait(), stdout, b"".join(chunks).decode(errors="replace")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("progress")
    write_jsonl(d / "a.jsonl.gz", make_samples(3000, seed=1, max_len=512), compress="gzip")
    write_parquet(d / "b.parquet", make_samples(500, seed=2, max_len=512))
    return d


def test_bars_on_a_terminal(inputs: Path, tmp_path: Path):
    code, stdout, terminal = run_on_terminal(
        ["pack", str(inputs), "-o", str(tmp_path / "out"), "-L", "512"], tmp_path
    )
    assert code == 0, terminal
    assert stdout == ""
    for text in ("reading all files", "planning", "writing rows", "samples in"):
        assert text in terminal, f"{text!r} not drawn:\n{terminal}"
    total = sum(p.stat().st_size for p in inputs.iterdir())
    assert f"/ {total / 1000:.1f} kB" in terminal  # bytes of all files


@pytest.mark.parametrize("how", ["--json", "pipe"])
def test_nothing_drawn_for_json_or_a_pipe(inputs: Path, tmp_path: Path, how: str):
    args = ["pack", str(inputs), "-o", str(tmp_path / "out"), "-L", "512"]
    if how == "--json":
        code, stdout, terminal = run_on_terminal([*args, "--json"], tmp_path)
        assert '"samples_in": 3500' in stdout
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "packer", *args], capture_output=True, text=True, cwd=tmp_path
        )
        code, terminal = proc.returncode, proc.stderr
        assert "samples in" in terminal  # the report itself still goes to stderr
    assert code == 0, terminal
    assert "reading" not in terminal and "writing rows" not in terminal
    assert "\x1b[?25l" not in terminal  # rich hides the cursor while it draws bars


def test_meter_counts_the_bytes_of_a_compressed_file(inputs: Path):
    path = inputs / "a.jsonl.gz"
    counted = []
    with metering(counted.append), open_input(path, "gzip") as stream:
        text = stream.read()
    assert sum(counted) == path.stat().st_size
    assert text.count(b"\n") == 3000
    with open_input(path, "gzip") as plain:  # no meter: the plain Arrow stream
        assert plain.read() == text


def test_file_bar_ends_at_the_file_size(inputs: Path, tmp_path: Path):
    # b.parquet is memory-mapped (no bytes counted while it is read) and is read last: its bar
    # stayed at "0 bytes / <size>" while planning and writing were drawn below it
    code, _, terminal = run_on_terminal(
        ["pack", str(inputs), "-o", str(tmp_path / "out"), "-L", "512"], tmp_path
    )
    assert code == 0, terminal
    size = decimal((inputs / "b.parquet").stat().st_size)
    assert f"{size} / {size}" in terminal, terminal
