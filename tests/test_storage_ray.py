"""The Ray engine on the 3-node test cluster, reading from and writing to the local S3 server:
the same bytes as the local engine on local disk."""

from __future__ import annotations

import json

import pytest
from conftest import make_samples, to_table, write_jsonl

pytest.importorskip("ray")
pytest.importorskip("moto")
pytestmark = pytest.mark.xdist_group("ray")  # one cluster per test process: keep them together


def test_ray_from_and_to_s3_gives_the_local_bytes(cli, cluster, s3, tmp_path, monkeypatch):
    """The tasks read their blocks from the store and upload their shards themselves: nothing
    is staged, so nodes that share nothing but the store could run them."""
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
    stage = tmp_path / "stage"
    monkeypatch.setenv("PACKER_STAGE_DIR", str(stage))  # the tasks get it too (PACKER_*)
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
    assert not stage.exists() or list(stage.iterdir()) == []

    local = json.loads((tmp_path / "local" / "manifest.json").read_text())
    remote = s3.manifest("packed")
    assert [s3.get(f"packed/{s['file']}") for s in remote["shards"]] == [
        (tmp_path / "local" / s["file"]).read_bytes() for s in local["shards"]
    ]
    assert remote["stats"] == local["stats"]
    r = cli("verify", s3.url("packed"), "--input", s3.url("corpus/"), "--no-attention", "--json")
    assert r.exit_code == 0, r.output


def test_a_killed_ray_driver_writing_to_s3_is_resumed_with_the_local_bytes(
    cli, cluster, s3, tmp_path
):
    """SIGKILL the driver while Ray's block tasks read from and upload to the store; --resume
    on Ray finds the tasks' completion records beside the output and writes the local bytes."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()  # 27 blocks and 5 tail tasks with `args`
    pq.write_table(to_table(make_samples(300, median=50)), data / "p0.parquet", row_group_size=40)
    write_jsonl(data / "j0.jsonl", make_samples(250, seed=10, median=50))
    args = ["-L", "256", "--overlength", "split", "--block-size", "8KiB", "--shard-rows", "20"]
    root = str(Path(__file__).resolve().parent.parent)

    corpus = s3.put_dir(data, "corpus")  # read in place by the tasks, on Ray

    def pack(out: str, *extra: str, src=corpus) -> list[str]:
        return ["pack", str(src), "-o", out, *args, *extra]

    env = {**os.environ, "PYTHONPATH": root}
    local = tmp_path / "local"
    assert cli(*pack(str(local), src=data)).exit_code == 0  # in this process

    def records() -> int:
        return sum(k.split("/")[-1].startswith("done-") for k in s3.keys("packed/"))

    on_ray = ("--engine", "ray", "--ray-address", cluster, "--json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "packer", *pack(s3.url("packed"), *on_ray)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180
        while records() < 10:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    seen, still = -1, 0
    while still < 3:  # Ray ends the dead driver's tasks; wait until no record appears
        time.sleep(1)
        count = records()
        still, seen = (still + 1, seen) if count == seen else (0, count)
    assert "packed/manifest.json" not in s3.keys("packed/")
    r = cli(*pack(s3.url("packed"), *on_ray, "--resume"))  # in this process
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["tasks_reused"], report["tasks_run"]) == (seen, 27 + 5 - seen)
    here = json.loads((local / "manifest.json").read_text())
    remote = s3.manifest("packed")
    assert [s3.get(f"packed/{s['file']}") for s in remote["shards"]] == [
        (local / s["file"]).read_bytes() for s in here["shards"]
    ]
    assert remote["stats"] == here["stats"]
    assert records() == 0
