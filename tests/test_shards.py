"""The overlapped gather/write path gives the same bytes as the sequential one."""

from __future__ import annotations

from conftest import make_samples, write_jsonl

import packer


def test_workers_do_not_change_the_output(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", make_samples(400, seed=9, median=40))
    cfg = packer.PackConfig(max_len=128, overlength="split", shard_rows=7)
    one = packer.pack([src], tmp_path / "w1", cfg, workers=1)
    two = packer.pack([src], tmp_path / "w2", cfg, workers=2)
    assert len(one.shards) > 5
    assert one.shards == two.shards  # names, counts and hashes of every shard, in order
    for shard in one.shards:
        assert (tmp_path / "w1" / shard["file"]).read_bytes() == (
            tmp_path / "w2" / shard["file"]
        ).read_bytes()
    assert (tmp_path / "w1" / "manifest.json").read_bytes() == (
        tmp_path / "w2" / "manifest.json"
    ).read_bytes()


def test_shards_of_several_record_batches(tmp_path, monkeypatch, cli):
    """Shards hold record batches of at most BATCH_TOKENS tokens; readers see the same rows."""
    import datasets
    import pyarrow as pa
    from conftest import read_shards

    import packer.write.shards
    from packer.torch import PackedDataset

    src = write_jsonl(tmp_path / "d.jsonl", make_samples(400, seed=3, median=40))
    cfg = packer.PackConfig(max_len=128, overlength="split", shard_rows=40)
    whole = packer.pack([src], tmp_path / "whole", cfg)
    monkeypatch.setattr(packer.write.shards, "BATCH_TOKENS", 300)  # 2 rows of 128 per batch
    outs = {w: packer.pack([src], tmp_path / f"w{w}", cfg, workers=w) for w in (1, 2)}
    assert outs[1].shards == outs[2].shards
    for shard in outs[1].shards:
        data = (tmp_path / "w1" / shard["file"]).read_bytes()
        assert data == (tmp_path / "w2" / shard["file"]).read_bytes()
        batches = list(pa.ipc.open_stream(pa.py_buffer(data)))
        assert [b.num_rows for b in batches] == [2] * (shard["rows"] // 2) + [1] * (
            shard["rows"] % 2
        )
        assert sum(len(b.column("input_ids").values) for b in batches) == shard["tokens"]
    assert len(outs[1].shards) > 3
    # the same rows as shards of one batch each, through every reader
    assert read_shards(tmp_path / "w1").equals(read_shards(tmp_path / "whole"))
    counts = [
        {k: v for k, v in s.items() if k not in ("bytes", "xxh3_128")} for s in outs[1].shards
    ]
    assert counts == [
        {k: v for k, v in s.items() if k not in ("bytes", "xxh3_128")} for s in whole.shards
    ]
    ours = PackedDataset(tmp_path / "w1")
    theirs = PackedDataset(tmp_path / "whole")
    assert len(ours) == len(theirs) == whole.stats["rows"]
    for i in range(0, len(ours), 7):
        assert all(
            (ours[i][k] == theirs[i][k]).all()
            for k in ("input_ids", "labels", "position_ids", "cu_seqlens")
        )
    first = datasets.Dataset.from_file(str(tmp_path / "w1" / outs[1].shards[0]["file"]))
    assert first.num_rows == outs[1].shards[0]["rows"]
    assert cli("verify", str(tmp_path / "w1"), "--input", str(src)).exit_code == 0


def test_each_shard_is_flushed_and_released(tmp_path, monkeypatch):
    """Every shard is fsynced and dropped from the page cache before the output is committed."""
    import os

    import packer.write.commit

    events = []
    real_commit = packer.write.commit.commit

    def fadvise(fd, offset, length, advice):
        events.append(("drop", os.readlink(f"/proc/self/fd/{fd}"), advice))

    def commit(tmp, out, overwrite=True, **kwargs):
        events.append(("commit", str(tmp), None))
        real_commit(tmp, out, overwrite, **kwargs)

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    monkeypatch.setattr(packer.write.commit, "commit", commit)
    src = write_jsonl(tmp_path / "d.jsonl", make_samples(300, seed=4, median=40))
    result = packer.pack(
        [src], tmp_path / "out", packer.PackConfig(max_len=128, overlength="split", shard_rows=9)
    )
    drops = [e for e in events if e[0] == "drop"]
    assert [os.path.basename(p) for _, p, _ in drops] == [s["file"] for s in result.shards]
    assert all(advice == os.POSIX_FADV_DONTNEED for *_, advice in drops)
    assert events[-1][0] == "commit" and len(events) == len(result.shards) + 1


def test_failed_write_stops_the_queue_and_closes_the_shard(tmp_path, monkeypatch):
    """A write failing on the last batch of a shard, with the next shard's batch already queued:
    no later shard is opened, every file is closed, and nothing is left behind."""
    import errno
    import gc
    import warnings

    import pytest

    import packer.write.shards
    from packer.errors import OutputError
    from packer.write.shard_file import ShardWriter

    src = write_jsonl(tmp_path / "d.jsonl", make_samples(300, seed=5, median=40))
    monkeypatch.setattr(packer.write.shards, "BATCH_TOKENS", 300)  # 2 rows of 128 per batch
    opened, adds = [], []
    real_open, real_add = packer.write.shards.open_shard, ShardWriter.add

    def open_shard(path, algorithm, *schema):
        opened.append(path.name)
        return real_open(path, algorithm, *schema)

    def add(self, *args):
        adds.append(self.path.name)
        if len(adds) == 2:  # the second and last batch of shard 0
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_add(self, *args)

    monkeypatch.setattr(packer.write.shards, "open_shard", open_shard)
    monkeypatch.setattr(ShardWriter, "add", add)
    cfg = packer.PackConfig(max_len=128, overlength="split", shard_rows=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(OutputError, match="No space left on device"):
            packer.pack([src], tmp_path / "out", cfg, workers=2)
        gc.collect()
    assert opened == ["shard-00000.arrow"] and adds == ["shard-00000.arrow"] * 2
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["d.jsonl"]


def test_verify_reads_batches_in_place_and_names_shard_rows(tmp_path, monkeypatch, cli):
    """verify maps each record batch without copying it, and a fault in a later batch is
    reported with its row number in the shard file."""
    import json

    import pyarrow as pa
    import xxhash

    import packer.write.shards
    from packer.contract.schema import SCHEMA
    from packer.contract.shards import read_shard

    src = write_jsonl(tmp_path / "d.jsonl", make_samples(300, seed=6, median=30))
    monkeypatch.setattr(packer.write.shards, "BATCH_TOKENS", 300)  # 2 rows of 128 per batch
    out = tmp_path / "out"
    cfg = packer.PackConfig(max_len=128, overlength="split", shard_rows=6)
    result = packer.pack([src], out, cfg)
    first = out / result.shards[0]["file"]
    batches = read_shard(first)
    assert [(b.first_row, b.rows) for b in batches] == [(0, 2), (2, 2), (4, 2)]
    before = pa.total_allocated_bytes()
    again = read_shard(first)  # while `batches` is alive too
    assert pa.total_allocated_bytes() == before  # views of the memory map, nothing copied
    assert not again[1].ids.flags.owndata
    del batches, again  # the file is rewritten below: no mapping of it may stay in use

    # a row holding two samples or more in the last batch of some shard
    def candidates():
        for n, entry in enumerate(result.shards):
            shard = out / entry["file"]
            stream = list(pa.ipc.open_stream(pa.py_buffer(shard.read_bytes())))
            rows = stream[-1].to_pylist()
            multi = [i for i, row in enumerate(rows) if len(row["cu_seqlens"]) > 2]
            if len(stream) > 1 and multi:
                yield n, shard, stream, rows, multi

    n, shard, stream, rows, multi = next(candidates())
    r, first_row = multi[0], sum(b.num_rows for b in stream[:-1])
    assert first_row > 0
    s, e = rows[r]["cu_seqlens"][1], rows[r]["cu_seqlens"][2]
    rows[r]["position_ids"][s:e] = list(range(s, e))  # positions that do not restart
    stream[-1] = pa.RecordBatch.from_pylist(rows, schema=SCHEMA)
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
        for batch in stream:
            writer.write_batch(batch)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][n]["xxh3_128"] = xxhash.xxh3_128(shard.read_bytes()).hexdigest()
    manifest["shards"][n]["bytes"] = shard.stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest))

    res = cli("verify", out, "--json", "--rows", "1")
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    [failure] = report["checks"]["structure"]["failures"]
    assert failure["message"].startswith(f"{shard.name} row {first_row + r}, sample ")
    assert "position_ids do not restart" in failure["message"]
    assert report["checks"]["structure"]["shards"] == len(result.shards)
