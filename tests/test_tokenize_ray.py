"""`packer pack RAW --tokenizer --engine ray`: the raw batches are tokenized as Ray tasks on
the session's multi-node test cluster (conftest's `cluster`), one tokenizer per worker process,
into the shards and packed bytes of the local path; a killed driver is resumed with --resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_tokenize_ray_resume import ROWS, write_raw
from tokenizers_util import PLAIN, build_tokenizer
from typer.testing import CliRunner

from packer.cli import app

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one cluster per test process: keep them together

ROOT = Path(__file__).resolve().parents[1]
BLOCK = ("--block-size", "64KiB")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "plain", PLAIN)


def digests(directory: Path, pattern: str) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.glob(pattern))
    }


@pytest.fixture(scope="module")
def local(tokenizer, tmp_path_factory) -> tuple[Path, Path, Path]:
    """Six batches of raw rows (the last one partial: twice the cluster's CPUs) packed by the
    local engine: (raw file, output, cache); the bytes the Ray runs below must write."""
    d = tmp_path_factory.mktemp("local")
    raw = write_raw(d / "raw.jsonl", 5 * ROWS + 300, seed=5)
    args = ["pack", raw, "--tokenizer", tokenizer, "-L", "256", *BLOCK, "-o", d / "out"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PACKER_CACHE_DIR", str(d / "cache"))
        r = CliRunner().invoke(app, [*map(str, args), "--workers", "2"], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return raw, d / "out", d / "cache"


def test_ray_tokenizes_to_the_local_shards_and_packed_bytes(
    cli, cluster, tokenizer, local, tmp_path, monkeypatch
):
    raw, local_out, local_cache = local
    args = ["pack", raw, "--tokenizer", tokenizer, "-L", "256", *BLOCK]
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "c2"))
    inits = []  # the tokenize tasks and the block tasks run in one Ray session
    monkeypatch.setattr(
        ray, "init", lambda *a, _init=ray.init, **k: inits.append(1) or _init(*a, **k)
    )
    on_ray = cli(*args, "-o", tmp_path / "ray", "--engine", "ray", "--ray-address", cluster)
    assert on_ray.exit_code == 0, on_ray.stderr
    assert "on ray tasks" in on_ray.stderr
    assert len(inits) == 1 and not ray.is_initialized()
    assert digests(tmp_path / "ray", "shard-*") == digests(local_out, "shard-*")
    tokenized = digests(tmp_path / "c2", "tokenized/*/part-*")
    assert tokenized == digests(local_cache, "tokenized/*/part-*") and len(tokenized) == 6


def test_a_bad_record_on_a_ray_task_is_one_line_naming_file_and_line(
    cli, cluster, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    raw = write_raw(tmp_path / "raw.jsonl", ROWS + 10, seed=6)
    with raw.open("a") as fh:
        fh.write(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    r = cli("pack", raw, "--tokenizer", tokenizer, "-L", "256", "-o", tmp_path / "out",
            "--engine", "ray", "--ray-address", cluster)  # fmt: skip
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines()[-1].startswith(f"error: {raw}:{ROWS + 11}: ")
    assert not (tmp_path / "out").exists()
    assert [p for p in (tmp_path / "cache" / "tokenized").iterdir()] == []


def _records(cache: Path) -> list[Path]:
    return list(cache.glob("tokenized/.*.packer-tmp-*/.done/part-*.json"))


def test_a_killed_ray_driver_resumes_its_tokenize_batches(
    cli, cluster, tokenizer, local, tmp_path, monkeypatch
):
    """SIGKILL the driver while the batches run on Ray: each task recorded its batch once its
    shard was written, --resume keeps exactly those and writes the local run's bytes."""
    raw, local_out, local_cache = local
    args = ["pack", raw, "--tokenizer", tokenizer, "-L", "256", *BLOCK]
    cache = tmp_path / "c2"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_CACHE_DIR": str(cache)}
    on_ray = [*args, "-o", tmp_path / "out", "--engine", "ray", "--ray-address", cluster]
    cmd = [sys.executable, "-m", "packer", *map(str, on_ray)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not _records(cache):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.02)
        proc.kill()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    seen, still = -1, 0
    while still < 3:  # Ray ends the dead driver's tasks; wait until no record appears
        time.sleep(1)
        count = len(_records(cache))
        still, seen = (still + 1, seen) if count == seen else (0, count)
    assert seen > 0 and not (tmp_path / "out").exists()

    monkeypatch.setenv("PACKER_CACHE_DIR", str(cache))
    resumed = cli(*on_ray, "--resume")
    assert resumed.exit_code == 0, resumed.stderr
    kept = "1 batch" if seen == 1 else f"{seen} batches"
    assert f"{kept} kept from the killed run" in resumed.stderr, (seen, resumed.stderr)
    assert digests(tmp_path / "out", "shard-*") == digests(local_out, "shard-*")
    entries = list((cache / "tokenized").iterdir())
    assert len(entries) == 1 and not (entries[0] / ".done").exists()
    parts = list(digests(entries[0], "part-*").values())
    assert parts == list(digests(local_cache, "tokenized/*/part-*").values())
    assert len(parts) == 6


def test_packer_tokenize_on_ray_writes_the_local_output(cli, cluster, tokenizer, tmp_path):
    a = write_raw(tmp_path / "a.jsonl", ROWS + 5, seed=8)
    b = write_raw(tmp_path / "b.jsonl", 40, seed=9)
    args = ["tokenize", a, b, "--tokenizer", tokenizer, "--workers", "1"]
    local = cli(*args, "-o", tmp_path / "local")
    assert local.exit_code == 0, local.stderr
    on_ray = cli(*args, "-o", tmp_path / "ray", "--engine", "ray", "--ray-address", cluster)
    assert on_ray.exit_code == 0, on_ray.stderr
    assert "on ray tasks" in on_ray.stderr
    files = digests(tmp_path / "local", "*")
    assert files == digests(tmp_path / "ray", "*") and len(files) == 4  # 3 shards, tokenized.json
