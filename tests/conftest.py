"""Shared fixtures: datasets written to tmp dirs in every input format, and a CLI runner."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packer.cli import app


def make_samples(
    n: int = 200,
    seed: int = 0,
    median: int = 60,
    max_len: int | None = None,
    vocab: int = 1000,
    with_labels: bool = True,
) -> list[dict]:
    """Random tokenized samples; labels mask a prompt prefix with -100 like SFT data."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(median), 0.8, n))).astype(int)
    if max_len is not None:
        lengths = np.minimum(lengths, max_len)
    samples = []
    for length in lengths:
        ids = rng.integers(0, vocab, size=length).tolist()
        sample = {"input_ids": ids}
        if with_labels:
            prompt = int(rng.integers(0, length))
            sample["labels"] = [-100] * prompt + ids[prompt:]
        samples.append(sample)
    return samples


def write_jsonl(path: Path, samples: list[dict], compress: str | None = None) -> Path:
    text = "".join(json.dumps(s) + "\n" for s in samples).encode()
    if compress == "gzip":
        path.write_bytes(gzip.compress(text, mtime=0))
    elif compress == "zstd":
        with pa.output_stream(str(path), compression="zstd") as out:
            out.write(text)
    else:
        path.write_bytes(text)
    return path


def to_table(samples: list[dict], int_type=pa.int32()) -> pa.Table:
    cols = {"input_ids": pa.array([s["input_ids"] for s in samples], pa.list_(int_type))}
    if samples and "labels" in samples[0]:
        cols["labels"] = pa.array([s["labels"] for s in samples], pa.list_(int_type))
    return pa.table(cols)


def write_parquet(path: Path, samples: list[dict], int_type=pa.int32()) -> Path:
    pq.write_table(to_table(samples, int_type), path)
    return path


def write_arrow(path: Path, samples: list[dict], stream: bool = False) -> Path:
    table = to_table(samples)
    with pa.OSFile(str(path), "wb") as sink:
        opener = pa.ipc.new_stream if stream else pa.ipc.new_file
        with opener(sink, table.schema) as writer:
            writer.write_table(table)
    return path


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def cli(runner):
    """Invoke the real CLI in-process; returns click's Result (exit_code, stdout, stderr)."""

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke


def read_shards(out_dir: Path) -> pa.Table:
    """All shards of a packer output, in manifest order, as one table."""
    manifest = json.loads((out_dir / "manifest.json").read_text())
    tables = []
    for shard in manifest["shards"]:
        with pa.memory_map(str(out_dir / shard["file"])) as src:
            tables.append(pa.ipc.open_stream(src).read_all())
    return pa.concat_tables(tables)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch's CPU threads spin against each other on a loaded 2-core machine (40x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
