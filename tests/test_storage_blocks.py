"""Block runs read remote inputs in place: each task reads its block from the local S3 server
(ranged reads of Parquet row groups, Arrow batches and JSONL bytes) and uploads what it writes;
nothing is staged. The bytes are those of the same run on local disk, and errors name the URL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_samples, to_table, write_arrow, write_jsonl
from typer.testing import CliRunner

from packer.cli import app

pytest.importorskip("boto3")
pytest.importorskip("moto")

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["-L", "256", "--overlength", "split", "--block-size", "8KiB", "--shard-rows", "20"]


def make_inputs(d: Path) -> Path:
    """Every input format: Parquet (row groups of 40 rows), Arrow IPC, JSONL, gzipped JSONL."""
    d.mkdir()
    pq.write_table(
        to_table(make_samples(300, seed=0, median=50)), d / "a.parquet", row_group_size=40
    )
    write_arrow(d / "b.arrow", make_samples(200, seed=1, median=50))
    write_jsonl(d / "c.jsonl", make_samples(250, seed=2, median=50))
    write_jsonl(d / "d.jsonl.gz", make_samples(120, seed=3, median=50), compress="gzip")
    return d


def pack(inputs, out, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`packer pack ... --json`, in this process; in a process of its own where `env` is given
    (PACKER_STAGE_DIR is read once per process: a fresh process shows what the run staged)."""
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


def test_a_block_run_reads_remote_inputs_in_place_with_the_local_bytes(s3, tmp_path):
    data = make_inputs(tmp_path / "data")
    corpus = s3.put_dir(data, "corpus")
    local = tmp_path / "local"
    r = pack(data, local)
    assert r.returncode == 0, r.stderr
    stage = tmp_path / "stage"
    r = pack(corpus, s3.url("packed"), env={"PACKER_STAGE_DIR": str(stage)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["blocks"] > 30
    # nothing was staged: the tasks' private directories are all that was made there, and gone
    assert not list(stage.glob("packer-stage-*")) and list(stage.iterdir()) == []
    remote, here = s3.manifest("packed"), json.loads((local / "manifest.json").read_text())
    assert [s3.get(f"packed/{s['file']}") for s in remote["shards"]] == [
        (local / s["file"]).read_bytes() for s in here["shards"]
    ]
    assert remote["stats"] == here["stats"]
    assert [(i["path"], i["fingerprint"]) for i in remote["inputs"]] == [
        (s3.url(f"corpus/{Path(i['path']).name}"), i["fingerprint"]) for i in here["inputs"]
    ]
    # a local output from remote inputs read in place: the same files as from local inputs
    r = pack(corpus, tmp_path / "out2")
    assert r.returncode == 0, r.stderr
    for s in here["shards"]:
        assert (tmp_path / "out2" / s["file"]).read_bytes() == (local / s["file"]).read_bytes()


def test_a_bad_line_in_a_remote_block_is_named_by_its_url_and_line(s3, tmp_path):
    data = make_inputs(tmp_path / "data")
    lines = (data / "c.jsonl").read_text().splitlines()
    lines[180] = '{"input_ids": "oops"}'
    (data / "c.jsonl").write_text("\n".join(lines) + "\n")
    corpus = s3.put_dir(data, "corpus")
    r = pack(corpus, s3.url("packed"))
    assert r.returncode == 1
    (line,) = r.stderr.splitlines()
    assert line.startswith("error: s3://bkt/corpus/c.jsonl: line 181: "), line
    assert s3.keys("packed/") == []
