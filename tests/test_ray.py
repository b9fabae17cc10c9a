"""`packer pack --engine ray` on a real multi-node Ray cluster (ray.cluster_utils.Cluster).

Three raylets of one CPU each run on this machine; the tests join them with --ray-address and
check that the output is byte for byte the local engine's, that a worker killed mid-task is
retried without a trace, that bad input fails like the local engine and leaves nothing, and that
`packer verify` passes on what Ray wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_samples, python_script, to_table, write_jsonl

from packer.planning.row_order import order_shards

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one cluster per test process: keep them together

BLOCK = "24KiB"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Three Parquet files (row groups of 40 rows) and three JSONL files, all with labels."""
    d = tmp_path_factory.mktemp("inputs")
    for i in range(3):
        pq.write_table(
            to_table(make_samples(300, seed=i, median=50)), d / f"p{i}.parquet", row_group_size=40
        )
        write_jsonl(d / f"j{i}.jsonl", make_samples(250, seed=10 + i, median=50))
    return d


def outputs_equal(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def pack_args(inputs: Path, out: Path, *extra: str) -> list[str]:
    return ["pack", str(inputs), "-o", str(out), "-L", "256", "--overlength", "split", *extra]


SMALL = ("--block-size", "8KiB", "--shard-rows", "20")  # of `few`: 57 blocks, 10 tail tasks


def local_run(inputs: Path, out: Path, *extra: str) -> Path:
    from typer.testing import CliRunner

    from packer.cli import app

    r = CliRunner().invoke(app, pack_args(inputs, out, *extra))
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def local_blocks(inputs, tmp_path_factory) -> Path:
    """The local engine's block run of `inputs` at BLOCK: the bytes a Ray run must write."""
    return local_run(inputs, tmp_path_factory.mktemp("local") / "out", "--block-size", BLOCK)


@pytest.fixture(scope="module")
def few(inputs, tmp_path_factory) -> Path:
    """Two of the Parquet and two of the JSONL files of `inputs`."""
    d = tmp_path_factory.mktemp("few")
    for name in ("p0.parquet", "p1.parquet", "j0.jsonl", "j1.jsonl"):
        shutil.copy(inputs / name, d / name)
    return d


@pytest.fixture(scope="module")
def local_small(few, tmp_path_factory) -> Path:
    """The local engine's block run of `few` with SMALL's many tasks."""
    return local_run(few, tmp_path_factory.mktemp("local-small") / "out", *SMALL)


def test_ray_output_is_the_local_output_and_verifies(
    cli, cluster, inputs, local_blocks, tmp_path, monkeypatch
):
    """One Ray run, one of whose block tasks kills its own worker process: Ray retries it
    without a trace, and the output is the local engine's bytes, which verify passes."""
    marker = tmp_path / "killed-once"
    monkeypatch.setenv("PACKER_FAULT_KILL_ONCE", str(marker))  # forwarded to the workers
    on_ray = tmp_path / "ray"
    r = cli(
        *pack_args(inputs, on_ray, "--engine", "ray", "--ray-address", cluster),
        "--block-size",
        BLOCK,
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert marker.exists()  # a block task did kill its own worker process
    # Ray's report of the dead worker goes to stderr: stdout is the one JSON object
    assert r.stdout.count("\n") == 1, r.stdout
    report = json.loads(r.stdout)
    assert report["engine"] == "ray" and report["blocks"] > 20
    assert report["tokens_moved"] > 0 and 0 < report["rows"] <= report["global_rows"] + 1
    outputs_equal(local_blocks, on_ray)
    manifest = json.loads((on_ray / "manifest.json").read_text())
    assert "engine" not in manifest["config"] and manifest["config"]["block_size"] == 24 << 10
    # the shards in the seeded order of docs/format.md ("Row order"), each listed once
    names = [s["file"] for s in manifest["shards"]]
    assert names == order_shards(sorted(names), "shuffle", 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed-once", "ray"]

    r = cli("verify", on_ray, "-i", inputs, "--rows", "1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ok"]


def test_bad_input_fails_like_the_local_engine_and_leaves_nothing(cli, cluster, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    samples = make_samples(400, seed=3, median=50)
    write_jsonl(d / "a.jsonl", samples[:200])
    text = "".join(json.dumps(s) + "\n" for s in samples[200:])
    lines = text.splitlines(keepends=True)
    lines[150] = '{"input_ids": [1, 2, "x"]}\n'  # line 151 of b.jsonl, in a later block
    (d / "b.jsonl").write_text("".join(lines))
    local = cli(*pack_args(d, tmp_path / "local", "--block-size", BLOCK))
    on_ray = cli(*pack_args(d, tmp_path / "ray", "--engine", "ray", "--ray-address", cluster))
    assert local.exit_code == on_ray.exit_code == 1
    assert on_ray.stderr.count("\n") == 1 and "b.jsonl: line 151" in on_ray.stderr
    assert on_ray.stderr == local.stderr
    plain = cli(*pack_args(d, tmp_path / "plain"))  # one global plan names the same line
    assert plain.stderr == local.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_unreachable_address_is_one_line_and_writes_nothing(cli, tmp_path, inputs):
    r = cli(*pack_args(inputs, tmp_path / "out", "--engine", "ray", "--ray-address", "127.0.0.1:9"))
    assert r.exit_code == 2
    assert r.stderr == (
        "error: --ray-address 127.0.0.1:9: no Ray cluster answers there (connection refused)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_without_ray_installed_the_ray_engine_is_one_line_and_writes_nothing(tmp_path, inputs):
    code = (
        "import sys; sys.modules['ray'] = None\n"  # `import ray` now raises ImportError
        "from packer.cli import run\n"
        f"sys.argv = ['packer', 'pack', {str(inputs)!r}, '-o', {str(tmp_path / 'out')!r}, "
        "'-L', '256', '--overlength', 'split', '--engine', 'ray']\n"
        "run()\n"
    )
    r = python_script(code)
    assert r.returncode == 2
    assert r.stderr == (
        "error: --engine ray needs Ray, which is not installed: pip install 'ray[data]' "
        "(packer's 'ray' extra)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_each_block_task_reserves_what_its_blocks_need():
    """A block task reserves its largest block's decoded table and flat copy plus the gather
    buffers, never more than `--memory-budget` (which a block task cannot exceed)."""
    from packer.arguments import parse_size
    from packer.engines.ray import MAX_RETRIES, task_options
    from packer.pipelines.blocks import block_memory
    from packer.read.blocks import BlockSpec
    from packer.write.shards import BATCH_TOKENS

    def spec(decoded):
        return BlockSpec(0, "f.parquet", "parquet", 0, 1, 10, 0, decoded=decoded)

    budget = parse_size("3GiB")
    specs = [spec(40 << 20), spec(64 << 20), spec(8 << 20)]
    buffers = 2 * BATCH_TOKENS * 32
    assert block_memory(specs, budget, 2048) == 2 * (64 << 20) + buffers
    assert block_memory(specs, budget, 4 * BATCH_TOKENS) == 2 * (64 << 20) + 4 * buffers
    assert block_memory([spec(1600 << 20)], budget, 2048) == budget
    assert block_memory([], budget, 2048) == buffers
    assert task_options(block_memory(specs, budget, 2048)) == {
        "num_cpus": 1,
        "max_retries": MAX_RETRIES,
        "retry_exceptions": False,
        "memory": 2 * (64 << 20) + buffers,
    }
    assert "memory" not in task_options()  # scans and tail tasks reserve nothing


def test_sigterm_during_a_ray_run_is_one_line_143_and_keeps_the_previous_output(
    cluster, local_blocks, tmp_path
):
    """ray.init makes SIGTERM exit 15 with a stack dump of Ray's; packer's handler stays."""
    d = tmp_path / "in"
    d.mkdir()
    for i in range(4):
        pq.write_table(
            to_table(make_samples(3000, seed=20 + i, median=50)),
            d / f"p{i}.parquet",
            row_group_size=40,
        )
    out = tmp_path / "out"
    shutil.copytree(local_blocks, out)  # a complete output that --overwrite would replace
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    args = [sys.executable, "-m", "packer", *pack_args(d, out, "--block-size", BLOCK)]
    proc = subprocess.Popen(
        [*args, "--overwrite", "--engine", "ray", "--ray-address", cluster],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # no progress line where a loaded machine takes 10 s to reach the block tasks
        env={**os.environ, "PACKER_PROGRESS_INTERVAL": "3600"},
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".out.packer-tmp-*")):  # the block tasks have started
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        proc.terminate()
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr
    assert stderr == "error: terminated; no partial output was left\n"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]


WAIT_FOR_TERM = """
import sys, time
from packer.engines.ray import RayEngine
from packer.errors import Terminated
from packer.interrupts import sigterm_as_interrupt
engine = RayEngine(sys.argv[1], 1)
try:
    with sigterm_as_interrupt():
        # sys.__stdout__: while the engine is open, sys.stdout is stderr (Ray's own reports)
        print("waiting", file=sys.__stdout__, flush=True)
        engine.map(time.sleep, [(4,)])
except KeyboardInterrupt as exc:
    print(type(exc).__name__, file=sys.__stdout__, flush=True)
finally:
    engine.close()
"""


def test_sigterm_while_ray_wait_blocks_stays_terminated(cluster):
    """ray.wait checks signals itself and reraises the handler's `Terminated` as a plain
    KeyboardInterrupt: the engine must give back SIGTERM's exception, or the CLI exits 130."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WAIT_FOR_TERM, cluster],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "waiting\n"
        # inside ray.wait: the one task sleeps for 4 s from its start (after this line was
        # printed), and the stopped run waits for it to end (cancelling does not cut a sleep)
        time.sleep(1.0)
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out == "Terminated\n"


def _records(out: Path) -> dict[str, int]:
    """The completion records of the killed run's tasks, and when each was written."""
    pattern = f".{out.name}.packer-tmp-*/.blocks/done/*.json"
    found = {}
    for path in out.parent.glob(pattern):
        try:
            found[path.name] = path.stat().st_mtime_ns
        except FileNotFoundError:  # the run's directory renamed (adopted) since the glob
            continue
    return found


def _kill_when(proc: subprocess.Popen, out: Path, enough) -> dict[str, int]:
    """SIGKILL the driver once `enough(records)`; then wait until Ray has ended the dead
    driver's tasks (no record appears for 3 s) and return the records left."""
    try:
        deadline = time.monotonic() + 180
        while not enough(_records(out)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        proc.kill()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    seen, still = {}, 0
    while still < 3:
        time.sleep(1)
        records = _records(out)
        still, seen = (still + 1, seen) if records == seen else (0, records)
    return seen


def test_a_killed_ray_driver_is_resumed_with_the_local_bytes(cluster, few, local_small, tmp_path):
    """SIGKILL the driver while block tasks run, then SIGKILL its --resume while tail tasks
    run; each --resume on Ray keeps every task with a completion record (the resumed run
    rewrites none of them) and the last one writes what an uninterrupted local run writes."""

    def args(out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "packer", *pack_args(few, out, *SMALL, *extra)]

    def start(*extra: str) -> subprocess.Popen:
        cmd = args(out, *on_ray, *extra)
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    out = tmp_path / "out"
    on_ray = ("--engine", "ray", "--ray-address", cluster, "--json")
    in_blocks = _kill_when(start(), out, lambda names: len(names) >= 20)
    assert not out.exists() and not any(n[0] == "t" for n in in_blocks)
    in_tails = _kill_when(start("--resume"), out, lambda names: any(n[0] == "t" for n in names))
    assert not out.exists() and len(in_tails) > 57  # every block and at least one tail
    assert {n: in_tails[n] for n in in_blocks} == in_blocks  # kept, not run again
    r = subprocess.run(args(out, *on_ray, "--resume"), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["tasks_reused"] == len(in_tails)
    assert report["tasks_run"] == 57 + 10 - len(in_tails)
    outputs_equal(local_small, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_no_address_starts_its_own_instance_beside_a_running_cluster(cluster, inputs, tmp_path):
    """Without --ray-address packer starts a local Ray of --workers CPUs, even while another Ray
    runs on this machine (the test cluster here), instead of joining it. Without --block-size
    the run uses the default block size, records it, and writes the local engine's bytes at it."""
    local = local_run(inputs, tmp_path / "local", "--block-size", "64MiB")
    on_ray = tmp_path / "ray"
    env = {**os.environ, "RAY_ADDRESS": ""}
    args = pack_args(inputs, on_ray, "--engine", "ray", "--workers", "1")
    r = subprocess.run(
        [sys.executable, "-m", "packer", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((on_ray / "manifest.json").read_text())["config"]["block_size"] == 64 << 20
    outputs_equal(local, on_ray)
