"""The shared cache of remote outputs: many readers of one machine, and bytes that changed.

Real processes read one `s3://` output from the local S3 server (moto on 127.0.0.1) through
one cold `PACKER_CACHE_DIR`, released together and slowed by a proxy so that their downloads
overlap: every one must succeed and read the same rows. A shard replaced on the store by bytes
of the same size is refused by every reader and never lands in the cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl

pytest.importorskip("boto3")
pytest.importorskip("moto")

ROOT = Path(__file__).resolve().parent.parent
PACK = ["-L", "256", "--overlength", "split", "--shard-rows", "16"]

# each process imports what it runs, says so in a `ready-PID` file and waits for the `go`
# file, so all of them start reading in the same instant
_GATED = """
import os, runpy, sys, time
go = sys.argv[1]
if sys.argv[2] == "dataset":
    from packer.torch import PackedDataset
else:
    import packer.cli
open(f"{go}.ready-{os.getpid()}", "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
if sys.argv[2] == "dataset":
    ds = PackedDataset(sys.argv[3])
    print(len(ds), int(ds[len(ds) - 1]["input_ids"].sum()))
else:
    sys.argv = ["packer", *sys.argv[2:]]
    runpy.run_module("packer", run_name="__main__")
"""


def packed_output(cli, s3, tmp_path: Path) -> str:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(2):
        write_jsonl(data / f"part-{i}.jsonl", make_samples(200, seed=i, median=50))
    r = cli("pack", data, "-o", s3.url("packed"), *PACK)
    assert r.exit_code == 0, r.output
    assert len(s3.manifest("packed")["shards"]) >= 4
    return s3.url("packed")


def test_concurrent_readers_share_a_cold_cache(cli, s3, tmp_path):
    pytest.importorskip("torch")
    from s3_proxy import Proxy, Rule

    url = packed_output(cli, s3, tmp_path)
    cache = tmp_path / "shared-cache"
    go = tmp_path / "go"
    proxy = Proxy(s3.endpoint)
    proxy.rules.append(Rule("slow", method="GET", contains=".arrow", seconds=0.2))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AWS_ENDPOINT_URL": proxy.endpoint,
        "PACKER_CACHE_DIR": str(cache),
        "OMP_NUM_THREADS": "1",
    }
    commands = [["dataset", url]] * 2 + [["verify", url, "--no-attention"]] * 2
    procs: list[subprocess.Popen] = []
    try:
        for args in commands:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", _GATED, str(go), *args],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("go.ready-*"))) < len(procs):
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
            time.sleep(0.05)
        go.touch()
        outputs = [p.communicate(timeout=300) for p in procs]
        results = [(p.returncode, *o) for p, o in zip(procs, outputs)]
    finally:
        for p in procs:
            p.kill()  # a no-op for those that ended; none is left waiting for `go`
        proxy.close()
    for code, _out, err in results:
        assert code == 0, err
        assert "Traceback" not in err
    lengths = {out for (_, out, _), args in zip(results, commands) if args[0] == "dataset"}
    assert len(lengths) == 1  # every rank read the same rows
    (copy,) = [p for p in cache.iterdir() if p.is_dir()]
    manifest = json.loads((copy / "manifest.json").read_text())
    names = {s["file"] for s in manifest["shards"]} | {manifest["split_labels"]["file"]}
    assert {p.name for p in copy.iterdir()} == names | {"manifest.json", ".lock"}
    # the readers' copy of each file crossed the network once (the others waited for it and
    # reused it); each verify reads every object from the store again, to check what it holds
    # now: 3 reads of each file, or 2 where a verify made the copy
    gets = [p for m, p in proxy.requests if m == "GET" and ".arrow" in p]
    assert len(gets) in (2 * len(manifest["shards"]), 3 * len(manifest["shards"]))
    assert all(gets.count(p) in (2, 3) for p in gets)


def test_a_shard_changed_on_the_store_is_refused_and_never_cached(cli, s3, tmp_path):
    from packer.errors import InputError
    from packer.torch import PackedDataset

    url = packed_output(cli, s3, tmp_path)
    name = s3.manifest("packed")["shards"][1]["file"]
    data = bytearray(s3.get(f"packed/{name}"))
    data[len(data) // 2] ^= 0x01  # one bit of one token: the same size
    s3.client.put_object(Bucket=s3.bucket, Key=f"packed/{name}", Body=bytes(data))

    line = (
        f"error: s3://bkt/packed/{name}: the object's bytes do not match the hash its manifest "
        "records (it changed after the output was written); nothing of it was kept\n"
    )
    for _ in range(2):  # the second reader downloads again: nothing was kept to reuse
        with pytest.raises(InputError, match="do not match the hash"):
            PackedDataset(url)
        r = cli("verify", url, "--no-attention")
        assert (r.exit_code, r.stderr) == (1, line)
    cached = [p.name for p in Path(os.environ["PACKER_CACHE_DIR"]).rglob("*") if p.is_file()]
    assert name not in cached and not [n for n in cached if n.endswith(".part")]
