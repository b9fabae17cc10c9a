"""Killed runs: `packer pack` in a subprocess, stopped at several moments.

After SIGKILL the output directory must be absent, the previous complete output, or (when the
kill came after the swap) the new complete output; never shards without a manifest. A rerun
must then produce, byte for byte, what an uninterrupted run produces. SIGINT and SIGTERM must
stop cleanly (exit 130 / 143) and remove the temporary directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from packer.cli import app

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses /proc and POSIX signals")

MAX_LEN = "4096"
SHARD_ROWS = "25"


@pytest.fixture(scope="module")
def big_input(tmp_path_factory) -> Path:
    """~17 MB of JSONL (~3M tokens): a pack takes a few seconds on a busy two-core machine."""
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(2000):
        ids = rng.integers(0, 50000, int(rng.integers(20, 600)))
        lines.append('{"input_ids":[' + ",".join(map(str, ids.tolist())) + "]}\n")
    block = "".join(lines).encode()
    path = tmp_path_factory.mktemp("crash") / "big.jsonl"
    with open(path, "wb") as fh:
        for _ in range(5):
            fh.write(block)
    return path


def _default_sigint() -> None:
    # a shell starts background jobs with SIGINT ignored, and Python keeps it ignored; the
    # packer under test must see Ctrl-C as a user at a terminal would
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(inputs: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "packer.cli",
            "pack",
            str(inputs),
            "-o",
            str(out),
            "--max-len",
            MAX_LEN,
            "--shard-rows",
            SHARD_ROWS,
            "--json",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def run(inputs: Path, out: Path, *extra: str) -> dict:
    """An uninterrupted run, in this process (typer's runner); its JSON report."""
    args = ["pack", str(inputs), "-o", str(out), "--max-len", MAX_LEN]
    args += ["--shard-rows", SHARD_ROWS, "--json", *extra]
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def snapshot(path: Path) -> dict[str, str] | None:
    """sha256 of every file of an output directory, or None when it does not exist."""
    if not path.exists():
        return None
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def temp_dirs(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if ".packer-tmp-" in p.name)


def input_open(pid: int, path: Path) -> bool:
    try:
        return any(
            os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd")
        )
    except OSError:
        return False


def wait_for(proc: subprocess.Popen, condition, timeout: float = 60.0) -> bool:
    """Poll every 2 ms until `condition()`; False if the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    raise AssertionError("timed out waiting for a kill point")


def kill_point(name: str, proc: subprocess.Popen, out: Path, inputs: Path) -> bool:
    """Wait for the moment `name`; True when reached while the process still ran."""
    parent = out.parent

    def shards_in_tmp(n: int):
        def cond():
            return any(len(list(t.glob("shard-*.arrow"))) >= n for t in temp_dirs(parent))

        return cond

    if name == "startup":
        time.sleep(0.05)
        return proc.poll() is None
    if name == "reading":
        return wait_for(proc, lambda: input_open(proc.pid, inputs))
    if name == "planning":  # input read and closed, temporary directory not made yet
        wait_for(proc, lambda: input_open(proc.pid, inputs))
        return wait_for(proc, lambda: not input_open(proc.pid, inputs))
    if name == "temp-dir-created":
        return wait_for(proc, lambda: bool(temp_dirs(parent)))
    if name == "first-shard":
        return wait_for(proc, shards_in_tmp(1))
    if name == "half-the-shards":
        return wait_for(proc, shards_in_tmp(15))
    if name == "manifest-written":  # the last file before the swap
        return wait_for(
            proc, lambda: any((t / "manifest.json").exists() for t in temp_dirs(parent))
        )
    raise ValueError(name)


KILL_POINTS = [
    "startup",
    "reading",
    "planning",
    "temp-dir-created",
    "first-shard",
    "half-the-shards",
    "manifest-written",
]


def test_sigkill_at_any_moment_leaves_old_or_nothing(big_input, tmp_path):
    reference = tmp_path / "reference"
    report = run(big_input, reference)
    assert report["shards"] >= 20
    expected = snapshot(reference)

    out = tmp_path / "out"
    observed = {}
    # first without any previous output, then over a previous complete one (--overwrite)
    for previous_kind in ("none", "previous"):
        if previous_kind == "previous":
            run(big_input, out, "--overwrite", "--max-len", "2048")
        before = snapshot(out)
        for point in KILL_POINTS:
            proc = start(big_input, out, "--overwrite")
            reached = kill_point(point, proc, out, big_input)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            after = snapshot(out)
            if after is None:
                state = "absent"
            elif after == before:
                state = "previous"
            else:
                assert after == expected, f"{point}: output is neither old nor new complete"
                state = "new"
            assert after is None or "manifest.json" in after
            assert state != "absent" or before is None, f"{point}: previous output lost"
            observed[(previous_kind, point)] = (reached, state)
            if state == "new":  # killed too late: start the next round from the old state
                if before is None:
                    import shutil

                    shutil.rmtree(out)
                else:
                    run(big_input, out, "--overwrite", "--max-len", "2048")
    # the killed runs left temporary directories; the next run removes them
    run(big_input, out, "--overwrite")
    assert snapshot(out) == expected
    assert temp_dirs(tmp_path) == []
    assert not [p for p in tmp_path.iterdir() if ".packer-" in p.name]
    reached = [k for k, (r, _) in observed.items() if r]
    assert len(reached) >= len(observed) - 2, observed  # most kill points were really hit
    print("kill points:", json.dumps({f"{a}/{b}": v for (a, b), v in observed.items()}))


@pytest.mark.parametrize(
    "signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
@pytest.mark.parametrize("point", ["reading", "first-shard"])
def test_interrupt_stops_cleanly(big_input, tmp_path, signum, code, point):
    out = tmp_path / "out"
    proc = start(big_input, out)
    assert kill_point(point, proc, out, big_input)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code, stderr
    assert stderr.strip().startswith("error: ") and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert json.loads(stdout) == {"error": stderr.strip()[len("error: ") :], "exit_code": code}
    assert not out.exists()
    assert temp_dirs(tmp_path) == []


def test_write_limit_is_a_clean_error(tmp_path):
    """A real kernel write failure (RLIMIT_FSIZE: EFBIG) while shards are written."""
    import resource

    from conftest import make_samples, write_parquet

    data = write_parquet(
        tmp_path / "d.parquet", make_samples(4000, seed=2, median=200, max_len=1000)
    )
    out = tmp_path / "out"

    def pack_to(dest: Path, **kwargs) -> subprocess.CompletedProcess:
        argv = ["pack", str(data), "-o", str(dest), "-L", "1024", "--shard-rows", "100"]
        return subprocess.run(
            [sys.executable, "-m", "packer.cli", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            **kwargs,
        )

    # warm numba's on-disk JIT cache first: on a fresh checkout its cache files are written
    # at the first run, and the file-size limit below is meant for the shards alone
    warm = pack_to(tmp_path / "warm")
    assert warm.returncode == 0, warm.stderr

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10))

    proc = pack_to(out, preexec_fn=limit)
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith(f"error: {out}: cannot write the output: File too large"), line
    assert len(line.splitlines()) == 1
    assert not out.exists() and temp_dirs(tmp_path) == []
