"""A signal at the commit point of `packer pack --overwrite`, locally, on s3:// and on Ray.

A job scheduler reads 130/143 as "nothing changed": a run stopped before its commit point must
leave the previous output byte for byte, and a run whose output is in place when the signal
arrives must finish and exit 0 (saying on stderr that the signal came late). The runs pause at
named points of the commit (PACKER_FAULT_COMMIT_PAUSE: `before` the swap's signals are held,
`held` just before the swap, `done` just after it) and get the signal there; a second walk sends
it at increasing delays after the first point, across the real swap.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packer.cli import app

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals"),
    pytest.mark.xdist_group("commit_signals"),
]

ROOT = Path(__file__).resolve().parents[1]
OLD = ("-L", "4096", "--shard-rows", "150")  # the previous output
NEW = ("-L", "2048", "--shard-rows", "150")  # what the interrupted run writes instead
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
LINES = {
    signal.SIGINT: "error: interrupted; no partial output was left\n",
    signal.SIGTERM: "error: terminated; no partial output was left\n",
}
NOTES = {
    signal.SIGINT: "note: received Ctrl-C (SIGINT) after the output was in place; the run "
    "finished and its output is complete\n",
    signal.SIGTERM: "note: received SIGTERM after the output was in place; the run finished "
    "and its output is complete\n",
}
# where the signal lands: (point, its exit code is the signal's)
POINTS = [("before", True), ("held", False), ("done", False)]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a shell starts background jobs without it


def packer(*args, env: dict | None = None, pause: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if pause is not None:
        env["PACKER_FAULT_COMMIT_PAUSE"] = pause
    return subprocess.Popen(
        [sys.executable, "-m", "packer", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_default_sigint,
    )


def signal_at(proc: subprocess.Popen, point: str, signum: int, delay: float) -> tuple[int, str]:
    """Send `signum` `delay` s after the run reports reaching `point`; (exit code, stderr
    without the fault lines)."""
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line == f"packer-fault: commit {point}\n":
            if delay:
                time.sleep(delay)
            proc.send_signal(signum)
            break
    rest = proc.stderr.read()
    proc.wait(timeout=120)
    lines += rest.splitlines(keepends=True)
    assert f"packer-fault: commit {point}\n" in lines, "".join(lines)
    return proc.returncode, "".join(x for x in lines if not x.startswith("packer-fault:"))


def snapshot(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".packer-" in p.name)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """(input, pristine previous output, the new run's expected output)."""
    root = tmp_path_factory.mktemp("commit_signals")
    rng = np.random.default_rng(3)
    lengths = rng.integers(20, 500, 6000)
    offsets = np.zeros(lengths.size + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    data = root / "in.parquet"
    pq.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, ids)}), data)
    for name, opts in (("old", OLD), ("new", NEW)):  # in this process: nothing stops them
        r = CliRunner().invoke(
            app, ["pack", str(data), "-o", str(root / name), *opts], catch_exceptions=False
        )
        assert r.exit_code == 0, r.output
    return data, root / "old", snapshot(root / "old"), snapshot(root / "new")


def check_local(
    code: int, stderr: str, out: Path, old: dict, new: dict, signum: int, after_report=False
) -> None:
    """exit 0 <=> the new output (manifest and every shard) is in place; the signal's code <=>
    the previous output is byte for byte as it was. Either way no temporary is left.
    `after_report`: the signal may land once the run has printed its report, while it exits
    (ignored there: no note, and exit 0, not death by the signal)."""
    assert code in (0, CODES[signum]), stderr
    if code == 0:
        assert snapshot(out) == new
        reported = after_report and stderr.rstrip().endswith("┘")
        assert stderr.endswith(NOTES[signum]) or reported, stderr
    else:
        assert snapshot(out) == old
        assert stderr.endswith(LINES[signum]), stderr
    assert leftovers(out.parent) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("point, stops", POINTS, ids=[p for p, _ in POINTS])
def test_signal_at_the_local_commit_point(local, tmp_path, point, stops, signum):
    data, old_dir, old, new = local
    out = tmp_path / "out"
    shutil.copytree(old_dir, out)
    proc = packer("pack", data, "-o", out, "--overwrite", *NEW, "--json", pause="0.3")
    code, stderr = signal_at(proc, point, signum, 0.05)
    assert code == (CODES[signum] if stops else 0), stderr
    check_local(code, stderr, out, old, new, signum)


def test_sigterm_walked_across_the_local_commit(local, tmp_path):
    """No pause: SIGTERM 0-20 ms after the run reaches its commit point, across the swap."""
    data, old_dir, old, new = local
    out = tmp_path / "out"
    codes = []
    for delay_ms in (0, 0, 1, 2, 3, 5, 8, 12, 20):
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(old_dir, out)
        proc = packer("pack", data, "-o", out, "--overwrite", *NEW, pause="0")
        code, stderr = signal_at(proc, "before", signal.SIGTERM, delay_ms / 1000)
        check_local(code, stderr, out, old, new, signal.SIGTERM, after_report=True)
        codes.append(code)
    assert codes[-1] == 0  # 20 ms after the point the output is in place


def test_export_stopped_after_the_pack_commit_says_what_is_in_place(local, tmp_path):
    """`pack --export`: a signal that lands after the packed output is in place stops the run
    before its export is made, and the line names what was put in place."""
    data, old_dir, _, new = local
    out = tmp_path / "out"
    shutil.copytree(old_dir, out)
    proc = packer("pack", data, "-o", out, "--overwrite", *NEW, "--export", "mds", pause="0.3")
    code, stderr = signal_at(proc, "done", signal.SIGTERM, 0.05)
    assert code == 143
    assert stderr.endswith(
        f"error: terminated after {out} was complete and in place; nothing else was written\n"
    ), stderr
    assert snapshot(out) == new
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# --------------------------------------------------------------------------------------------
# s3:// (the local moto server): the commit point is the conditional write of manifest.json


def s3_objects(s3, prefix: str) -> dict[str, bytes]:
    return {k: s3.get(k) for k in s3.keys(prefix + "/")}


@pytest.mark.parametrize("point, stops", POINTS, ids=[p for p, _ in POINTS])
def test_sigterm_at_the_s3_commit_point(local, s3, point, stops):
    pytest.importorskip("moto")
    data = local[0]
    proc = packer("pack", data, "-o", s3.url("out"), *OLD)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    old = s3_objects(s3, "out")
    proc = packer("pack", data, "-o", s3.url("out"), "--overwrite", *NEW, pause="0.3")
    code, stderr = signal_at(proc, point, signal.SIGTERM, 0.05)
    after = s3_objects(s3, "out")
    if stops:
        assert (code, stderr) == (143, LINES[signal.SIGTERM])
        assert after == old  # no file of the stopped run is left either
    else:
        assert code == 0 and stderr.endswith(NOTES[signal.SIGTERM]), stderr
        manifest = s3.manifest("out")
        assert manifest["config"]["max_len"] == 2048
        listed = {f"out/{s['file']}" for s in manifest["shards"]}
        assert listed <= set(after) and not listed & set(old)
        assert set(after) == listed | {"out/manifest.json"}  # the old run's files are gone
        verify = CliRunner().invoke(
            app, ["verify", s3.url("out"), "--no-attention"], catch_exceptions=False
        )
        assert verify.exit_code == 0, verify.output


# --------------------------------------------------------------------------------------------
# the Ray engine: the driver commits


@pytest.mark.parametrize("point, stops", [POINTS[0], POINTS[1]], ids=["before", "held"])
def test_sigterm_at_the_ray_commit_point(cluster, local, tmp_path, point, stops):
    data, old_dir, old, _ = local
    out = tmp_path / "out"
    shutil.copytree(old_dir, out)
    ray = ("--engine", "ray", "--ray-address", cluster, "--block-size", "256KiB")
    proc = packer("pack", data, "-o", out, "--overwrite", *NEW, *ray, pause="0.3")
    code, stderr = signal_at(proc, point, signal.SIGTERM, 0.05)
    if stops:
        assert (code, stderr) == (143, LINES[signal.SIGTERM])
        assert snapshot(out) == old
    else:
        assert code == 0 and stderr.endswith(NOTES[signal.SIGTERM]), stderr
        assert snapshot(out) != old
        verify = CliRunner().invoke(
            app, ["verify", str(out), "--no-attention"], catch_exceptions=False
        )
        assert verify.exit_code == 0, verify.output
    assert leftovers(tmp_path) == []
