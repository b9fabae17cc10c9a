"""The Ray engine on the 3-node test cluster, reading from and writing to the local S3 server:
the same bytes as the local engine on local disk."""

from __future__ import annotations

import json

import pytest
from conftest import make_samples, to_table, write_jsonl

pytest.importorskip("ray")
pytest.importorskip("moto")
pytestmark = pytest.mark.xdist_group("ray")  # one cluster per test process: keep them together


def test_ray_from_and_to_s3_gives_the_local_bytes(cli, cluster, s3, tmp_path):
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    for i in range(2):
        pq.write_table(
            to_table(make_samples(300, seed=i, median=50)),
            data / f"p{i}.parquet",
            row_group_size=40,
        )
        write_jsonl(data / f"j{i}.jsonl", make_samples(250, seed=10 + i, median=50))
    s3.put_dir(data, "corpus")
    args = ["-L", "256", "--overlength", "split", "--block-size", "24KiB", "--json"]
    r = cli("pack", data, "-o", tmp_path / "local", *args)
    assert r.exit_code == 0, r.output
    r = cli(
        "pack",
        s3.url("corpus/"),
        "-o",
        s3.url("packed"),
        "--engine",
        "ray",
        "--ray-address",
        cluster,
        *args,
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["engine"] == "ray" and report["blocks"] > 10

    local = json.loads((tmp_path / "local" / "manifest.json").read_text())
    remote = s3.manifest("packed")
    assert [s3.get(f"packed/{s['file']}") for s in remote["shards"]] == [
        (tmp_path / "local" / s["file"]).read_bytes() for s in local["shards"]
    ]
    assert remote["stats"] == local["stats"]
    r = cli("verify", s3.url("packed"), "--input", s3.url("corpus/"), "--no-attention", "--json")
    assert r.exit_code == 0, r.output
