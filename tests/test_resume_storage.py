"""`packer pack --resume` to object storage: a block run to the local S3 server (moto, 127.0.0.1)
SIGKILLed at chosen moments, then picked up from the completion records it left beside the
output. The resumed output must hold the bytes of an uninterrupted run (the same run on local
disk), the report must count the tasks kept, and a changed input is refused in one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_samples, to_table, write_jsonl
from typer.testing import CliRunner

from packer.cli import app

pytest.importorskip("boto3")
pytest.importorskip("moto")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals")

ROOT = Path(__file__).resolve().parent.parent
BLOCKS, TAILS = 27, 5  # of the inputs below, with ARGS
ARGS = ["-L", "256", "--overlength", "split", "--block-size", "8KiB", "--shard-rows", "20"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A Parquet file (row groups of 40 rows) and a JSONL file with labels: 27 blocks, 5 tail
    tasks (every task uploads its shards and its record: a run's time grows with its tasks)."""
    d = tmp_path_factory.mktemp("inputs")
    pq.write_table(to_table(make_samples(300, median=50)), d / "p0.parquet", row_group_size=40)
    write_jsonl(d / "j0.jsonl", make_samples(250, seed=10, median=50))
    return d


def pack(inputs, out, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`packer pack ... --json`, in this process; in a process of its own where `env` is given
    (the fault knobs SIGKILL the process)."""
    args = ["pack", str(inputs), "-o", str(out), *ARGS, "--json", *extra]
    if env is None:
        r = CliRunner().invoke(app, args, catch_exceptions=False)
        return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
    return subprocess.run(
        [sys.executable, "-m", "packer", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        timeout=300,
    )


@pytest.fixture(scope="module")
def full(inputs, tmp_path_factory) -> tuple[Path, dict]:
    """The uninterrupted run on local disk: its output and report."""
    out = tmp_path_factory.mktemp("full") / "out"
    r = pack(inputs, out)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def records(s3, prefix: str) -> list[str]:
    return [k for k in s3.keys(f"{prefix}/") if k.split("/")[-1].startswith("done-")]


def killed(s3, inputs, at: int, prefix: str = "packed") -> None:
    """A run to s3://bkt/PREFIX SIGKILLed right after its `at`-th completion record."""
    r = pack(inputs, s3.url(prefix), env={"PACKER_FAULT_KILL_AT_RECORDS": str(at)})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert f"{prefix}/manifest.json" not in s3.keys(f"{prefix}/")
    assert len(records(s3, prefix)) == at


def same_output(s3, prefix: str, local: Path) -> None:
    """The shards on the store are the local shards, in order, byte for byte; the manifests
    differ only in the run's names; nothing else is left under the prefix."""
    remote = s3.manifest(prefix)
    here = json.loads((local / "manifest.json").read_text())
    assert [s3.get(f"{prefix}/{s['file']}") for s in remote["shards"]] == [
        (local / s["file"]).read_bytes() for s in here["shards"]
    ]
    run = remote["shards"][0]["file"].split(".")[1]
    renamed = json.dumps(remote, sort_keys=True).replace(f".{run}.", ".")
    assert json.loads(renamed) == here
    only_the_output(s3, prefix)


def only_the_output(s3, prefix: str) -> None:
    """Under the prefix: the manifest and the files it lists, no record or other run file."""
    remote = s3.manifest(prefix)
    listed = {f"{prefix}/{s['file']}" for s in remote["shards"]} | {f"{prefix}/manifest.json"}
    if remote.get("split_labels"):
        listed.add(f"{prefix}/{remote['split_labels']['file']}")
    assert set(s3.keys(f"{prefix}/")) == listed


@pytest.mark.parametrize(
    "at",
    [1, 15, BLOCKS, BLOCKS + 2, BLOCKS + TAILS],
    ids=["first-block", "mid-blocks", "blocks-done", "mid-tails", "before-commit"],
)
def test_resume_to_s3_after_sigkill_keeps_finished_tasks_and_the_bytes(s3, inputs, full, at):
    killed(s3, inputs, at)
    r = pack(inputs, s3.url("packed"), "--resume")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["tasks_reused"], report["tasks_run"]) == (at, BLOCKS + TAILS - at)
    assert report["output"] == "s3://bkt/packed"
    same_output(s3, "packed", full[0])
    assert {k: v for k, v in report.items() if k not in ("seconds", "timings", "output")} == {
        k: v
        for k, v in full[1].items()
        if k not in ("seconds", "timings", "output", "tasks_reused", "tasks_run")
    } | {"tasks_reused": at, "tasks_run": BLOCKS + TAILS - at}


def test_a_resume_from_s3_inputs_after_an_input_changed_is_refused_in_one_line(s3, inputs, full):
    corpus = s3.put_dir(inputs, "corpus")
    killed(s3, corpus, 10)
    before = s3.get("corpus/j0.jsonl")
    tag = s3.client.head_object(Bucket="bkt", Key="corpus/j0.jsonl")["ETag"]
    s3.client.put_object(Bucket="bkt", Key="corpus/j0.jsonl", Body=before + b'{"input_ids": [1]}\n')
    r = pack(corpus, s3.url("packed"), "--resume")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: s3://bkt/packed: cannot resume: the input s3://bkt/corpus/j0.jsonl changed "
        f"(size {len(before)} -> {len(before) + 19}) since the killed run; rerun without "
        "--resume to pack from the start"
    ]
    # the same size, other bytes: the ETag names the change
    s3.client.put_object(Bucket="bkt", Key="corpus/j0.jsonl", Body=before.replace(b"1", b"2", 1))
    now = s3.client.head_object(Bucket="bkt", Key="corpus/j0.jsonl")["ETag"]
    r = pack(corpus, s3.url("packed"), "--resume")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: s3://bkt/packed: cannot resume: the input s3://bkt/corpus/j0.jsonl changed "
        f"(ETag {tag} -> {now}) since the killed run; rerun without --resume to pack from the "
        "start"
    ]
    assert len(records(s3, "packed")) == 10  # the killed run's files are kept
    s3.client.put_object(Bucket="bkt", Key="corpus/j0.jsonl", Body=before)
    r = pack(corpus, s3.url("packed"), "--resume", "--seed", "3")
    assert r.returncode == 2 and "--seed changed (0 -> 3)" in r.stderr
    # without --resume every task runs and uploads its shards, and the commit removes the
    # killed run's files
    r = pack(corpus, s3.url("packed"))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["tasks_reused"], report["tasks_run"]) == (0, BLOCKS + TAILS)
    assert records(s3, "packed") == []
    only_the_output(s3, "packed")
    assert [s3.get(f"packed/{s['file']}") for s in s3.manifest("packed")["shards"]] == [
        (full[0] / s["file"]).read_bytes()
        for s in json.loads((full[0] / "manifest.json").read_text())["shards"]
    ]
    # a complete output has nothing to resume
    r = pack(corpus, s3.url("packed"), "--resume")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "error: s3://bkt/packed: the output is complete (it has manifest.json): nothing to "
        "resume; pass --overwrite to pack it again"
    ]


def test_a_run_that_fails_leaves_nothing_on_the_store(s3, inputs, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for p in inputs.iterdir():
        (bad / p.name).write_bytes(p.read_bytes())
    with open(bad / "j2.jsonl", "a") as fh:
        fh.write('{"input_ids": "oops"}\n')
    r = pack(bad, s3.url("packed"))
    assert r.returncode == 1
    assert "j2.jsonl" in r.stderr and "Traceback" not in r.stderr
    assert s3.keys("packed/") == []
