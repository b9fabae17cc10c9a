"""A tokenize worker process that dies (SIGKILL, the OOM killer, a crash in the tokenizer)
fails the run in one line naming the batch it held, exit 1, nothing written, never a hang.

The kills are real: one test SIGKILLs a worker found among the driver's children, the other
makes the worker given a chosen batch SIGKILL itself (PACKER_FAULT_KILL_WORKER_AT=N, the N-th
batch handed out, from 0), so that the batch named is known. Every run is bounded by a
subprocess timeout: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_tokenize_ray_resume import ROWS, write_raw
from tokenizers_util import PLAIN, build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals and /proc")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "plain", PLAIN)


def _env(tmp_path: Path, **extra) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PACKER_CACHE_DIR": str(tmp_path / "cache"),
        "PACKER_PROGRESS_INTERVAL": "0",
        **extra,
    }


def _leftovers(tmp_path: Path) -> list[str]:
    """Anything a run left: outputs, hidden temporary directories, cache entries."""
    found = [p.name for p in tmp_path.iterdir() if p.name not in ("raw.jsonl", "cache")]
    cache = tmp_path / "cache" / "tokenized"
    return found + ([p.name for p in cache.iterdir()] if cache.is_dir() else [])


def test_a_worker_killed_on_a_batch_is_named_and_nothing_is_written(tokenizer, tmp_path):
    raw = write_raw(tmp_path / "raw.jsonl", 4 * ROWS + 10, seed=3)
    cmd = [sys.executable, "-m", "packer", "pack", str(raw), "--tokenizer", str(tokenizer)]
    cmd += ["-L", "256", "-o", str(tmp_path / "out"), "--workers", "2"]
    env = _env(tmp_path, PACKER_FAULT_KILL_WORKER_AT="2")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 1, res.stderr
    lines = [line for line in res.stderr.splitlines() if not line.startswith("progress:")]
    assert len(lines) == 1, res.stderr
    assert "a tokenize worker (pid " in lines[0], lines[0]
    assert "was killed by SIGKILL (out of memory?)" in lines[0]
    assert lines[0].endswith(f"while it tokenized {raw}:{2 * ROWS + 1}-{3 * ROWS}"), lines[0]
    assert "Traceback" not in res.stderr
    time.sleep(0.5)
    assert _leftovers(tmp_path) == []


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(c) for c in text.split()]


def test_a_worker_killed_from_outside_ends_the_run_in_one_line(tokenizer, tmp_path):
    raw = write_raw(tmp_path / "raw.jsonl", 12 * ROWS, seed=4)
    cmd = [sys.executable, "-m", "packer", "tokenize", str(raw), "--tokenizer", str(tokenizer)]
    cmd += ["-o", str(tmp_path / "out"), "--workers", "2"]
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, text=True, env=_env(tmp_path), start_new_session=True
    )
    # a run that hangs is killed with its workers (they hold stderr open): the test fails
    watchdog = threading.Timer(90, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        for line in proc.stderr:
            if line.startswith("progress: tokenizing"):
                workers = _children(proc.pid)
                assert len(workers) == 2, workers
                os.kill(workers[0], signal.SIGKILL)
                break
        rest = proc.stderr.read()
        assert proc.wait(timeout=10) == 1, rest
    finally:
        watchdog.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = [line for line in rest.splitlines() if not line.startswith("progress:")]
    assert len(lines) == 1, rest
    assert f"a tokenize worker (pid {workers[0]}) was killed by SIGKILL" in lines[0], rest
    time.sleep(0.5)
    assert _leftovers(tmp_path) == []


SPAWNED = """
import sys, threading
from packer.tokenize.encode import Encoder
from packer.tokenize.pool import WorkerDied
from packer.tokenize.run import tokenize

stop = threading.Event()
threading.Thread(target=stop.wait, daemon=True).start()  # a thread: workers are spawned
try:
    tokenize(sys.argv[1], sys.argv[2], Encoder(sys.argv[3]), workers=2)
except WorkerDied as exc:
    print(type(exc).__name__, exc.exit_code, exc)
"""


def test_a_spawned_worker_that_dies_raises_worker_died_from_the_library(tokenizer, tmp_path):
    raw = write_raw(tmp_path / "raw.jsonl", 2 * ROWS + 10, seed=5)
    cmd = [sys.executable, "-c", SPAWNED, str(raw), str(tmp_path / "out"), str(tokenizer)]
    env = _env(tmp_path, PACKER_FAULT_KILL_WORKER_AT="1")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("WorkerDied 1 a tokenize worker (pid "), res.stdout
    assert f"while it tokenized {raw}:{ROWS + 1}-{2 * ROWS}" in res.stdout, res.stdout
    assert _leftovers(tmp_path) == []
