"""`packer verify s3://...` checks what the store holds now, not the local copy an earlier
verify (or reader) left in `PACKER_CACHE_DIR`: an object changed on the store after a cached
verify fails the next one, in one line naming the object.

Against the local S3 server (moto on 127.0.0.1, tests/conftest.py's `s3` fixture).
"""

from __future__ import annotations

import pytest
from conftest import make_samples, write_jsonl

pytest.importorskip("boto3")
pytest.importorskip("moto")

PACK = ["-L", "256", "--overlength", "split", "--shard-rows", "16"]


def _packed(cli, s3, tmp_path) -> str:
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "part-0.jsonl", make_samples(200, seed=3, median=50))
    r = cli("pack", data, "-o", s3.url("packed"), *PACK)
    assert r.exit_code == 0, r.output
    return s3.url("packed")


def _verify(cli, url):
    return cli("verify", url, "--no-attention")


def test_an_object_changed_on_the_store_after_a_cached_verify_fails(cli, s3, tmp_path):
    url = _packed(cli, s3, tmp_path)
    first = _verify(cli, url)
    assert first.exit_code == 0, first.stderr  # the local copy is made and cached
    name = s3.manifest("packed")["shards"][1]["file"]
    data = bytearray(s3.get(f"packed/{name}"))
    data[len(data) // 2] ^= 0x01  # one bit: the same size
    s3.client.put_object(Bucket=s3.bucket, Key=f"packed/{name}", Body=bytes(data))
    again = _verify(cli, url)
    assert (again.exit_code, again.stderr) == (
        1,
        f"error: s3://bkt/packed/{name}: the object's bytes do not match the hash its manifest "
        "records (it changed after the output was written); nothing of it was kept\n",
    )


def test_an_object_of_another_size_on_the_store_fails(cli, s3, tmp_path):
    url = _packed(cli, s3, tmp_path)
    assert _verify(cli, url).exit_code == 0
    shard = s3.manifest("packed")["shards"][0]
    name = shard["file"]
    s3.client.put_object(Bucket=s3.bucket, Key=f"packed/{name}", Body=s3.get(f"packed/{name}")[:-8])
    again = _verify(cli, url)
    assert again.exit_code == 1
    assert again.stderr == (
        f"error: s3://bkt/packed/{name}: the object holds {shard['bytes'] - 8:,} bytes but its "
        f"manifest records {shard['bytes']:,} (it changed after the output was written)\n"
    )


def test_an_object_deleted_on_the_store_after_a_cached_verify_fails(cli, s3, tmp_path):
    url = _packed(cli, s3, tmp_path)
    assert _verify(cli, url).exit_code == 0
    name = s3.manifest("packed")["shards"][0]["file"]
    s3.client.delete_object(Bucket=s3.bucket, Key=f"packed/{name}")
    again = _verify(cli, url)
    assert again.exit_code == 1
    assert f"{name}: listed in the manifest but missing on the store" in again.stderr


def test_a_sound_store_verifies_again(cli, s3, tmp_path):
    url = _packed(cli, s3, tmp_path)
    assert _verify(cli, url).exit_code == 0
    again = _verify(cli, url)
    assert again.exit_code == 0, again.stderr
