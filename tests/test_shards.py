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
    assert one.shards == two.shards  # names, counts and sha256 of every shard, in order
    for shard in one.shards:
        assert (tmp_path / "w1" / shard["file"]).read_bytes() == (
            tmp_path / "w2" / shard["file"]).read_bytes()
    assert (tmp_path / "w1" / "manifest.json").read_bytes() == (
        tmp_path / "w2" / "manifest.json").read_bytes()
