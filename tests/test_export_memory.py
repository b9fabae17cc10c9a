"""`packer export --memory-budget`: a budget that cuts the source's record batches into runs of
rows changes nothing that a trainer reads (MDS and Megatron files keep their bytes; TRL and
Bridge files hold the same rows, in more Arrow batches and Parquet row groups), and a budget
that cannot hold the export is refused before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_samples, write_jsonl

import packer
from packer.cli import app
from packer.contract.shards import read_shard
from packer.errors import UsageError
from packer.export import EXPORT_MANIFEST, export
from packer.export import megatron as megatron_module
from packer.export import run as run_module
from packer.export.rows import row_batch, row_runs
from packer.export.source import open_source

L = 256
pytestmark = pytest.mark.xdist_group("export")


@pytest.fixture(scope="module", params=[1, 2], ids=["cp1", "cp2"])
def packed(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("export-memory")
    samples = make_samples(300, seed=11, median=50)
    src = write_jsonl(root / "in.jsonl", samples)
    out = root / "packed"
    cfg = packer.PackConfig(max_len=L, pad=True, overlength="split", cp_size=request.param)
    packer.pack([src], out, cfg)
    return out


def _read(fmt: str, path):
    if fmt == "trl":
        return pa.ipc.open_stream(pa.OSFile(str(path))).read_all().combine_chunks()
    return pq.read_table(path).combine_chunks()


def _pieces(fmt: str, path) -> int:
    if fmt == "trl":
        return sum(1 for _ in pa.ipc.open_stream(pa.OSFile(str(path))))
    return pq.ParquetFile(path).num_row_groups


@pytest.mark.parametrize("fmt", ["mds", "megatron", "trl", "megatron-bridge"])
def test_a_small_budget_exports_the_same_rows(packed, tmp_path, monkeypatch, fmt):
    extra = {"eos_id": 0} if fmt == "megatron-bridge" else {}
    whole = export(packed, fmt, tmp_path / "whole", **extra)
    # 2.2 MiB at 4 KiB a token: runs of at most 281 tokens (one row of L = 256) per thread
    monkeypatch.setitem(
        run_module.BYTES_PER_TOKEN, fmt, 2048 if fmt in ("mds", "megatron") else 4096
    )
    monkeypatch.setattr(run_module, "PARQUET_WRITER", 0)
    monkeypatch.setattr(megatron_module, "CHUNK", 3)  # the index assembled 3 entries at a time
    limit = {"mds_size_limit": 1 << 16} if fmt == "mds" else {}
    cut = export(packed, fmt, tmp_path / "cut", memory_budget="2.2MiB", **extra, **limit)
    if fmt == "mds":  # the same rows as the whole batches give, at the same size limit
        whole = export(packed, fmt, tmp_path / "whole-limit", **extra, **limit)
    assert (cut.rows, cut.samples, cut.tokens) == (whole.rows, whole.samples, whole.tokens)
    names = sorted(p.name for p in whole.dest.iterdir() if p.name != EXPORT_MANIFEST)
    assert names == sorted(p.name for p in cut.dest.iterdir() if p.name != EXPORT_MANIFEST)
    for name in names:
        a, b = whole.dest / name, cut.dest / name
        if fmt in ("trl", "megatron-bridge") and name.endswith((".arrow", ".parquet")):
            assert _read(fmt, a).equals(_read(fmt, b)), name
            assert _pieces(fmt, b) > _pieces(fmt, a), name  # the budget did cut the batches
        else:
            assert a.read_bytes() == b.read_bytes(), name


def test_row_runs_hold_at_most_the_budget_and_every_row_once():
    lengths = np.array([5, 1, 9, 3, 3, 12, 2])
    runs = row_runs(lengths, 9)
    assert runs == [(0, 2), (2, 3), (3, 5), (5, 6), (6, 7)]
    assert row_runs(lengths, None) == [(0, 7)]
    assert row_runs(lengths, 1000) == [(0, 7)]


def test_a_slice_of_a_record_batch_is_the_same_rows(packed):
    """rows_slice views rows lo..hi-1 as their own batch: row_batch gives the same rows as the
    matching rows of the whole batch."""
    source = open_source(packed)
    part = read_shard(packed / source.shards[0])[0]
    whole = row_batch(part)
    lo, hi = 2, min(part.rows, 7)
    piece = row_batch(part.rows_slice(lo, hi))
    t0, t1 = int(whole.off[lo]), int(whole.off[hi])
    s0, s1 = int(whole.seq_off[lo]), int(whole.seq_off[hi])
    assert piece.ids.tolist() == whole.ids[t0:t1].tolist()
    assert piece.labels.tolist() == whole.labels[t0:t1].tolist()
    assert piece.seq_lens.tolist() == whole.seq_lens[s0:s1].tolist()
    assert piece.sample_index.tolist() == whole.sample_index[s0:s1].tolist()
    assert piece.first_row == part.first_row + lo


def test_a_budget_below_one_mds_shard_is_refused(packed, tmp_path, runner):
    dest = tmp_path / "mds"
    with pytest.raises(UsageError, match="memory_budget"):
        export(packed, "mds", dest, memory_budget="32MiB")  # below the 64 MiB shard limit
    assert not dest.exists()
    r = runner.invoke(
        app, ["export", str(packed), "--to", "mds", "-o", str(dest), "--memory-budget", "32MiB"]
    )
    assert r.exit_code == 2
    assert "--memory-budget 32MiB" in r.output and "--mds-size-limit" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    r = runner.invoke(
        app,
        ["export", str(packed), "--to", "mds", "-o", str(dest), "--memory-budget", "32MiB"]
        + ["--mds-size-limit", str(1 << 24)],
    )
    assert r.exit_code == 0, r.output
    assert json.loads((dest / EXPORT_MANIFEST).read_text())["rows"] > 0


def test_pack_export_refuses_a_budget_before_packing(tmp_path, runner):
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(20, seed=1, median=30))
    out = tmp_path / "out"
    r = runner.invoke(
        app,
        ["pack", str(src), "-o", str(out), "-L", "64", "--export", "mds"]
        + ["--memory-budget", "8MiB"],
    )
    assert r.exit_code == 2 and "--memory-budget" in r.output, r.output
    assert not out.exists()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """An output of several shards, and one whose shards hold, here and there, a label that is
    not its input id."""
    root = tmp_path_factory.mktemp("export-shards")
    samples = make_samples(200, seed=5, median=40)
    src = write_jsonl(root / "in.jsonl", samples)
    out = root / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=L, shard_rows=4, overlength="drop"))
    bad = root / "bad"
    labels = [list(s.get("labels", s["input_ids"])) for s in samples]
    for s, lab in zip(samples, labels, strict=True):
        s["labels"] = lab
    for s in samples[60::50]:
        s["labels"][-1] = s["input_ids"][-1] + 1
    packer.pack(
        [write_jsonl(root / "bad.jsonl", samples)],
        bad,
        packer.PackConfig(max_len=L, shard_rows=4, overlength="drop"),
    )
    return out, bad


@pytest.mark.parametrize("fmt", ["trl", "megatron-bridge"])
def test_shards_written_two_at_a_time_equal_one_at_a_time(sharded, tmp_path, monkeypatch, fmt):
    out, _ = sharded
    assert len(json.loads((out / "manifest.json").read_text())["shards"]) > 3
    seen = []
    two = export(out, fmt, tmp_path / "two", progress=lambda d, t: seen.append(d))
    assert seen == sorted(seen) and seen[-1] == two.rows  # rows done, never counted twice
    monkeypatch.setattr(run_module, "THREADS", 1)
    one = export(out, fmt, tmp_path / "one")
    names = sorted(p.name for p in one.dest.iterdir())
    assert names == sorted(p.name for p in two.dest.iterdir())
    for name in names:
        if name != EXPORT_MANIFEST:
            assert (one.dest / name).read_bytes() == (two.dest / name).read_bytes(), name
    assert one.to_dict()["files"] == two.to_dict()["files"]
    assert one.details == two.details


def test_a_refused_shard_is_named_as_a_serial_run_names_it(sharded, tmp_path):
    _, bad = sharded
    first = None
    for entry in json.loads((bad / "manifest.json").read_text())["shards"]:
        rows = pa.ipc.open_stream(pa.OSFile(str(bad / entry["file"]))).read_all().to_pylist()
        if any(lab not in (-100, i) for r in rows for i, lab in zip(r["input_ids"], r["labels"])):
            first = first or entry["file"]
    assert first is not None and first != entry["file"]  # later shards are written beside it
    dest = tmp_path / "bridge"
    with pytest.raises(UsageError, match="differs from its input id") as caught:
        export(bad, "megatron-bridge", dest)
    assert caught.value.where == first
    assert not dest.exists() and not [p for p in tmp_path.iterdir() if p.name != "bridge"]
