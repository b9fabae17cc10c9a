"""`verify` progress: the library reports each check's rows to a callback and prints nothing; the
CLI draws them on a terminal (transient), never with --json or when stderr is a pipe."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl

from packer.verify import STAGE_ATTENTION, STAGE_MODEL, STAGE_STRUCTURE, verify

pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS = 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    from typer.testing import CliRunner

    from packer.cli import app

    root = tmp_path_factory.mktemp("verify-progress")
    src = write_jsonl(root / "data.jsonl", make_samples(60, seed=7, median=30, vocab=500))
    out = root / "packed"
    res = CliRunner().invoke(
        app,
        [
            "pack",
            str(src),
            "-o",
            str(out),
            "-L",
            "128",
            "--overlength",
            "split",
            "--shard-rows",
            "4",
        ],
    )
    assert res.exit_code == 0, res.output
    return out


def run_on_terminal(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pseudo-terminal; (exit code, stdout, terminal output)."""
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm-256color", "OMP_NUM_THREADS": "1"}
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


def test_the_library_reports_each_checks_rows_and_prints_nothing(packed, capfd):
    calls = []
    result = verify(packed, rows=ROWS, model_check=True, progress=lambda *call: calls.append(call))
    assert result.ok
    assert capfd.readouterr() == ("", "")
    stages = [stage for stage, _, _ in calls]
    assert stages == sorted(stages, key=[STAGE_STRUCTURE, STAGE_ATTENTION, STAGE_MODEL].index)
    structure = [(done, total) for stage, done, total in calls if stage == STAGE_STRUCTURE]
    shards = len(json.loads((packed / "manifest.json").read_text())["shards"])
    assert shards > 2
    assert structure == [(i, shards) for i in range(shards + 1)]  # shard by shard
    for stage in (STAGE_ATTENTION, STAGE_MODEL):
        assert [c for c in calls if c[0] == stage] == [(stage, i, ROWS) for i in range(ROWS + 1)]


def test_no_progress_callback_no_progress(packed, capfd):
    assert verify(packed, rows=1).ok
    assert capfd.readouterr() == ("", "")


def test_progress_is_drawn_on_a_terminal(packed, tmp_path):
    code, stdout, terminal = run_on_terminal(
        ["verify", str(packed), "--rows", str(ROWS), "--model-check"], tmp_path
    )
    assert code == 0, terminal
    assert stdout == ""
    for text in (STAGE_STRUCTURE, STAGE_ATTENTION, STAGE_MODEL, f"{ROWS}/{ROWS}", "passed"):
        assert text in terminal, f"{text!r} not drawn:\n{terminal}"
    assert "\x1b[?25l" in terminal  # rich hides the cursor while it draws


@pytest.mark.parametrize("how", ["--json", "pipe"])
def test_no_progress_for_json_or_a_pipe(packed, tmp_path, how):
    args = ["verify", str(packed), "--rows", "1"]
    if how == "--json":
        code, stdout, terminal = run_on_terminal([*args, "--json"], tmp_path)
        assert json.loads(stdout)["ok"]
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "packer", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PACKER_PROGRESS_INTERVAL": "3600"},
        )
        code, terminal = proc.returncode, proc.stderr
        assert "passed" in terminal  # the report itself still goes to stderr
    assert code == 0, terminal
    assert STAGE_ATTENTION not in terminal and STAGE_STRUCTURE not in terminal
    assert "\x1b[?25l" not in terminal


def test_help_says_how_to_set_the_cpu_threads(cli):
    text = " ".join(cli("verify", "--help").stdout.split())
    assert "OMP_NUM_THREADS=N sets how many" in text
