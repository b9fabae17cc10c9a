"""`packer tokenize --resume` (and `pack RAW --tokenizer --resume`'s tokenize step): a run
killed part way keeps the batches it finished, and the output is an uninterrupted run's bytes.

The kill is real: PACKER_FAULT_KILL_AT_TOKENIZED=N makes the driver SIGKILL itself right after
its N-th batch record, leaving its temporary output as a crash would.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers_util import PLAIN, build_tokenizer, generated_chat, sentence
from typer.testing import CliRunner

from packer.cli import app

ROOT = Path(__file__).resolve().parents[1]
ROWS = 1024  # rows per batch (`packer.tokenize.files.BATCH_ROWS`)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "plain", PLAIN)


def write_raw(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if i % 2:
            rows.append({"messages": generated_chat(rng, turns=1)})
        else:
            rows.append({"text": sentence(rng, 2, 8)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def packer(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`packer ARGS`, in this process with `env` set; in a process of its own where `env` holds
    a fault knob (PACKER_FAULT_KILL_AT_TOKENIZED SIGKILLs the process)."""
    args = [str(a) for a in args]
    env = env or {}
    if not any(name.startswith("PACKER_FAULT_") for name in env):
        with pytest.MonkeyPatch.context() as mp:
            for name, value in env.items():
                mp.setenv(name, value)
            r = CliRunner().invoke(app, args, catch_exceptions=False)
        return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    cmd = [sys.executable, "-m", "packer", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def digests(directory: Path, pattern: str = "part-*") -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.glob(pattern))
    }


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".packer-tmp-" in p.name)


def test_resume_keeps_the_finished_batches_and_writes_the_same_bytes(tokenizer, tmp_path):
    raw = write_raw(tmp_path / "raw.jsonl", 4 * ROWS + 100)  # five batches
    whole = tmp_path / "whole"
    res = packer("tokenize", raw, "--tokenizer", tokenizer, "-o", whole, "--workers", "1")
    assert res.returncode == 0, res.stderr

    out = tmp_path / "out"
    flags = ["tokenize", raw, "--tokenizer", tokenizer, "-o", out, "--workers", "1"]
    killed = packer(*flags, env={"PACKER_FAULT_KILL_AT_TOKENIZED": "2"})
    assert killed.returncode == -9, killed.stderr
    assert not out.exists() and len(leftovers(tmp_path)) == 1

    resumed = packer(*flags, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert report["batches_reused"] == 2 and report["lines"] == 4 * ROWS + 100
    assert digests(out) == digests(whole) and len(digests(out)) == 5
    assert (
        json.loads((out / "tokenized.json").read_text())["shards"]
        == json.loads((whole / "tokenized.json").read_text())["shards"]
    )
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in whole.iterdir())
    assert leftovers(tmp_path) == []


def test_resume_with_two_workers_and_a_damaged_shard(tokenizer, tmp_path):
    """Kept batches enter the pool's ordered results; a shard whose bytes changed reruns."""
    raw = write_raw(tmp_path / "raw.jsonl", 3 * ROWS + 10, seed=1)
    whole = tmp_path / "whole"
    assert packer("tokenize", raw, "--tokenizer", tokenizer, "-o", whole).returncode == 0
    out = tmp_path / "out"
    flags = ["tokenize", raw, "--tokenizer", tokenizer, "-o", out, "--workers", "2"]
    killed = packer(*flags, env={"PACKER_FAULT_KILL_AT_TOKENIZED": "2"})
    assert killed.returncode == -9, killed.stderr
    (tmp,) = [tmp_path / name for name in leftovers(tmp_path)]
    shard = tmp / "part-00000-000000.parquet"
    shard.write_bytes(shard.read_bytes()[:-1] + b"!")  # same size, other bytes
    resumed = packer(*flags, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["batches_reused"] == 1
    assert digests(out) == digests(whole)


def test_resume_is_refused_when_an_option_changed_and_a_plain_rerun_starts_over(
    tokenizer, tmp_path
):
    raw = write_raw(tmp_path / "raw.jsonl", 2 * ROWS + 10, seed=2)
    out = tmp_path / "out"
    flags = ["tokenize", raw, "--tokenizer", tokenizer, "-o", out, "--workers", "1"]
    assert packer(*flags, env={"PACKER_FAULT_KILL_AT_TOKENIZED": "1"}).returncode == -9
    changed = packer(*flags, "--resume", "--train-on", "last")
    assert changed.returncode == 2
    assert (
        changed.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "cannot resume: the tokenizer, template or --train-on changed since the killed run; "
            "rerun without --resume to tokenize from the start"
        )
    )
    assert len(leftovers(tmp_path)) == 1  # the killed run's files stay for a right resume
    rerun = packer(*flags, "--json")
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout)["batches_reused"] == 0
    assert leftovers(tmp_path) == [] and not (out / ".done").exists()


def test_pack_raw_tokenizer_resumes_its_cache_entry(tokenizer, tmp_path):
    """`pack RAW --tokenizer --resume` keeps the tokenize batches of a killed run's cache entry,
    then packs: the shards of an uninterrupted run."""
    raw = write_raw(tmp_path / "raw.jsonl", 2 * ROWS + 10, seed=3)
    flags = ["pack", raw, "--tokenizer", tokenizer, "-L", "256", "--workers", "1"]
    flags += ["--block-size", "64KiB"]  # a block run: pack's --resume needs one
    whole = packer(*flags, "-o", tmp_path / "whole", env={"PACKER_CACHE_DIR": str(tmp_path / "c")})
    assert whole.returncode == 0, whole.stderr
    env = {"PACKER_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "out"
    killed = packer(*flags, "-o", out, env={**env, "PACKER_FAULT_KILL_AT_TOKENIZED": "1"})
    assert killed.returncode == -9, killed.stderr
    resumed = packer(*flags, "-o", out, "--resume", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 batch kept from the killed run" in resumed.stderr
    assert digests(out, "shard-*") == digests(tmp_path / "whole", "shard-*")
    assert len(digests(out, "shard-*")) > 1


def test_pack_raw_tokenizer_resume_without_a_block_run_is_refused_before_tokenizing(
    tokenizer, tmp_path
):
    raw = write_raw(tmp_path / "raw.jsonl", 20, seed=4)
    cache = tmp_path / "cache"
    r = packer("pack", raw, "--tokenizer", tokenizer, "-L", "256", "-o", tmp_path / "out",
               "--resume", env={"PACKER_CACHE_DIR": str(cache)})  # fmt: skip
    assert r.returncode == 2
    assert r.stderr == (
        "error: --resume picks up block runs: pass --block-size or --engine ray (not with "
        "--repack or --pairs)\n"
    )
    assert not cache.exists() and not (tmp_path / "out").exists()
