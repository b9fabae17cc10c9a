"""Progress: bars drawn on a terminal (bytes of the file and of all files, planning, rows), none
with --json; without a terminal (a CI log) a plain `progress:` line every
PACKER_PROGRESS_INTERVAL seconds instead."""

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


def run_on_terminal(args: list[str], cwd: Path, **extra_env: str) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal; (exit code, stdout, terminal output)."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm-256color", **extra_env}
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
        env = {**os.environ, "PACKER_PROGRESS_INTERVAL": "3600"}  # no line in this short run
        proc = subprocess.run(
            [sys.executable, "-m", "packer", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
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


def _log_run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The CLI with stderr in a pipe (a CI log), a progress line at every update."""
    env = {**os.environ, "PACKER_PROGRESS_INTERVAL": "0"}
    cmd = [sys.executable, "-m", "packer", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env)


def test_lines_in_a_log(inputs: Path, tmp_path: Path):
    proc = _log_run(["pack", str(inputs), "-o", str(tmp_path / "out"), "-L", "512"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("progress: ")]
    stages = [line.split()[1] for line in lines]
    assert {"reading", "planning", "writing"} <= set(stages), proc.stderr
    assert stages.index("reading") < stages.index("planning") < stages.index("writing")
    assert "\x1b" not in proc.stderr  # plain lines: no cursor moves, no colours
    total = sum(p.stat().st_size for p in inputs.iterdir())
    assert any(f"/ {total / 1000:.1f} kB (100 %)" in line for line in lines)
    proc = _log_run(
        ["verify", str(tmp_path / "out"), "--input", str(inputs), "--no-attention"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "progress: reading the --input files" in proc.stderr
    assert "progress: checking every row" in proc.stderr


@pytest.mark.parametrize("reader", ["whole", "batches"])
def test_parquet_reports_its_bytes_as_it_is_decoded(tmp_path: Path, reader: str):
    """A large Parquet file moves from its first row group, not only once it is read whole."""
    import pyarrow.parquet as pq

    from packer.read.cache import BATCH_READERS
    from packer.read.formats import READERS

    path = write_parquet(tmp_path / "p.parquet", make_samples(2000, seed=3, max_len=256))
    pq.write_table(pq.read_table(path), path, row_group_size=200)  # 10 row groups
    counted = []
    with metering(counted.append):
        if reader == "whole":
            rows = READERS["parquet"](path, ["input_ids"]).table.num_rows
        else:
            rows = sum(
                t.table.num_rows for t in BATCH_READERS["parquet"](path, ["input_ids"], 1 << 16)
            )
    assert rows == 2000
    assert sum(counted) == path.stat().st_size
    assert len([n for n in counted if n > 0]) >= 5, counted


def test_tokenizing_spinner_starts_no_thread(monkeypatch):
    """The tokenize spinner is redrawn by its callback, not by rich's refresh thread: the worker
    pool forks only a thread-free process, and with that thread every worker was spawned and
    loaded its own tokenizer (1 to 3.5 CPU s each) on a terminal."""
    import io
    import threading

    from rich.console import Console

    import packer.cli.render as render
    from packer.cli.raw import tokenize_progress

    screen = io.StringIO()
    monkeypatch.setattr(render, "stderr", Console(file=screen, force_terminal=True, width=100))
    before = threading.active_count()
    with tokenize_progress(True) as update:
        assert threading.active_count() == before
        update("tokenize", 2048, 0, "2,048 lines, 1,000 tokens/s")
    assert "2,048 lines, 1,000 tokens/s" in screen.getvalue()


def test_raw_pack_on_a_terminal_forks_its_workers(tmp_path: Path):
    """`pack RAW --tokenizer --workers 2` on a terminal: the spinner is drawn and the workers are
    forked with the loaded tokenizer (a spawned worker would start as multiprocessing.spawn)."""
    import json
    import random

    from tokenizers_util import PLAIN, build_tokenizer, generated_chat

    rng = random.Random(3)
    raw = tmp_path / "raw.jsonl"
    raw.write_text(
        "".join(json.dumps({"messages": generated_chat(rng)}) + "\n" for _ in range(3000))
    )
    tok = build_tokenizer(tmp_path / "tok", PLAIN)
    probe = tmp_path / "sitecustomize.py"  # each interpreter that starts says so
    probe.write_text(
        "import os, sys\n"
        "with open(os.environ['PROBE_LOG'], 'a') as f:\n"
        "    f.write(' '.join(sys.argv[:2]) + '\\n')\n"
    )
    log = tmp_path / "started.txt"
    args = ["pack", str(raw), "--tokenizer", str(tok), "-o", "out", "-L", "512", "--workers", "2"]
    code, _, terminal = run_on_terminal(
        args,
        tmp_path,
        PROBE_LOG=str(log),
        PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        PACKER_CACHE_DIR=str(tmp_path / "cache"),
    )
    assert code == 0, terminal
    assert "tokenizing" in terminal and "samples in" in terminal
    started = log.read_text().splitlines()
    assert len(started) == 1, started  # the command alone: its workers were forked
