"""Object-store keys are names: a URL with a '.' or '..' segment is refused everywhere.

pyarrow's S3 readers resolve `dd/../in1/x.jsonl` to `in1/x.jsonl` while writes keep the literal
key, so one URL would read one object and write another. Every command refuses such a URL
before any work, in one line naming the argument, exit 2 (the CLI, the local S3 server).
"""

from __future__ import annotations

import subprocess

import pytest
from conftest import make_samples, write_jsonl
from typer.testing import CliRunner

from packer.cli import app

pytest.importorskip("boto3")
pytest.importorskip("moto")

REASON = (
    "'.' and '..' are not allowed in an object-store URL (a key is a name, not a path); "
    "write the key without them"
)


def packer(*args) -> subprocess.CompletedProcess:
    """`packer ARGS` in this process (typer's runner: the exit code, stdout and stderr)."""
    args = [str(a) for a in args]
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def test_dot_segments_are_refused_by_every_command(s3, tmp_path):
    data = write_jsonl(tmp_path / "x.jsonl", make_samples(50, seed=0, median=30))
    s3.client.upload_file(str(data), s3.bucket, "in1/x.jsonl")
    before = s3.keys()
    cases = [
        (("pack", "s3://bkt/dd/../in1/x.jsonl", "-o", tmp_path / "o", "-L", "128"), "INPUT "),
        (("pack", "s3://bkt/./in1/x.jsonl", "-o", tmp_path / "o", "-L", "128"), "INPUT "),
        (("pack", data, "-o", "s3://bkt/a/../out", "-L", "128"), "--output "),
        (("verify", "s3://bkt/a/../out", "--no-attention"), ""),
        (("inspect", "s3://bkt/out/."), ""),
    ]
    for args, named in cases:
        url = next(a for a in args if str(a).startswith("s3://"))
        r = packer(*args)
        assert (r.returncode, r.stderr) == (2, f"error: {named}{url}: {REASON}\n"), args
        assert r.stdout == ""
    assert s3.keys() == before  # nothing was written
    assert not (tmp_path / "o").exists()


def test_the_library_refuses_them_too(s3):
    from packer.errors import UsageError
    from packer.storage import parse_url
    from packer.torch import PackedDataset

    with pytest.raises(UsageError, match=r"^s3://bkt/a/\.\./out: '\.' and '\.\.' are not"):
        PackedDataset("s3://bkt/a/../out")
    assert parse_url("s3://bkt/a..b/c.").path == "bkt/a..b/c."  # dots inside a name are fine
    assert parse_url("file:///tmp/a/../b").path == "/tmp/a/../b"  # a local path resolves alike
