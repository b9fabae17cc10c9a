"""The out-of-core path (streamed batches, memory-mapped cache) gives the in-memory bytes."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_samples, to_table, write_arrow, write_jsonl

import packer
from packer.arguments import parse_size
from packer.errors import InputError, UsageError


def _files(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def _inputs(tmp_path, bad: bool = False):
    samples = make_samples(900, seed=3, median=50)
    if bad:
        samples[130]["input_ids"][2] = -5  # negative id, in a later Parquet row group
        samples[444]["labels"] = samples[444]["labels"][:-1]  # labels length
    parquet = tmp_path / "a.parquet"
    pq.write_table(to_table(samples[:300]), parquet, row_group_size=40)
    lines = [json.dumps(s) for s in samples[300:600]]
    if bad:
        lines[77] = '{"input_ids": [1, 2'  # malformed line
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text("\n".join(lines) + "\n")
    arrow = write_arrow(tmp_path / "c.arrow", samples[600:])
    return [parquet, jsonl, arrow]


@pytest.mark.parametrize("overlength", ["split", "truncate"])
def test_out_of_core_gives_the_same_bytes(tmp_path, overlength):
    inputs = _inputs(tmp_path)
    cfg = packer.PackConfig(max_len=128, overlength=overlength, shard_rows=9)
    mem = packer.pack(inputs, tmp_path / "mem", cfg, out_of_core=False)
    ooc = packer.pack(
        inputs, tmp_path / "ooc", cfg, memory_budget="1MiB", out_of_core=True, workers=1
    )
    assert mem.timings["out_of_core"] == 0 and ooc.timings["out_of_core"] == 1
    assert len(mem.shards) > 5
    assert _files(tmp_path / "mem") == _files(tmp_path / "ooc")
    # the cache directory is gone
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_out_of_core_skip_mode_same_rejects_and_bytes(tmp_path):
    inputs = _inputs(tmp_path, bad=True)
    cfg = packer.PackConfig(max_len=128, overlength="split", on_error="skip", shard_rows=9)
    mem = packer.pack(inputs, tmp_path / "mem", cfg, out_of_core=False)
    packer.pack(inputs, tmp_path / "ooc", cfg, memory_budget="1MiB", out_of_core=True)
    assert mem.stats["rejected"] == 3
    assert _files(tmp_path / "mem") == _files(tmp_path / "ooc")


def test_out_of_core_error_names_the_same_sample(tmp_path):
    inputs = _inputs(tmp_path, bad=True)
    cfg = packer.PackConfig(max_len=128, overlength="split")
    messages = []
    for mode in (False, True):
        with pytest.raises(InputError) as info:
            packer.pack(inputs, tmp_path / f"o{mode}", cfg, memory_budget="1MiB", out_of_core=mode)
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "row 130" in messages[0]
    assert not any(tmp_path.glob(".o*"))


def test_cli_memory_budget_streams_and_matches(cli, tmp_path):
    src = tmp_path / "big.parquet"
    pq.write_table(to_table(make_samples(3000, seed=5, median=60)), src, row_group_size=500)
    a = cli("pack", src, "-o", tmp_path / "a", "-L", "256", "--overlength", "split", "--json")
    b = cli(
        "pack",
        src,
        "-o",
        tmp_path / "b",
        "-L",
        "256",
        "--overlength",
        "split",
        "--json",
        "--memory-budget",
        "1MiB",
        "--workers",
        "1",
    )
    assert a.exit_code == 0 and b.exit_code == 0, (a.stderr, b.stderr)
    assert json.loads(a.stdout)["timings"]["out_of_core"] == 0
    assert json.loads(b.stdout)["timings"]["out_of_core"] == 1
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_arrow_stream_and_no_labels(tmp_path):
    samples = make_samples(300, seed=8, median=30, with_labels=False)
    table = to_table(samples)
    src = tmp_path / "s.arrow"
    with pa.OSFile(str(src), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        for batch in table.to_batches(max_chunksize=37):
            w.write_batch(batch)
    jsonl = write_jsonl(tmp_path / "t.jsonl", make_samples(100, seed=1, with_labels=False))
    cfg = packer.PackConfig(max_len=64, overlength="split", shard_rows=11)
    packer.pack([src, jsonl], tmp_path / "mem", cfg, out_of_core=False)
    packer.pack([src, jsonl], tmp_path / "ooc", cfg, out_of_core=True, memory_budget="1MiB")
    assert _files(tmp_path / "mem") == _files(tmp_path / "ooc")


def test_parse_size():
    assert parse_size("2GiB") == 2 << 30
    assert parse_size("512MB") == 512 * 10**6
    assert parse_size("1.5g") == 3 << 29
    for bad in ("lots", "10", "2 parsecs"):
        with pytest.raises(UsageError):
            parse_size(bad)
