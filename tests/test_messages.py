"""What the commands say, read by people and by scripts: counts in the singular where there is
one, a JSON error object on stdout under --json, notes that concern the output at hand, and
source names as the user gave them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_jsonl

import packer
from packer.errors import count


def run_packer(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="100")
    cmd = [sys.executable, "-m", "packer", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_count():
    assert [count(0, "row"), count(1, "row"), count(1500, "sample")] == [
        "0 rows",
        "1 row",
        "1,500 samples",
    ]
    assert count(1, "later sample") == "1 later sample"


@pytest.fixture
def one_row(tmp_path: Path) -> Path:
    src = write_jsonl(tmp_path / "a.jsonl", [{"input_ids": [1, 2, 3]}])
    packer.pack([src], tmp_path / "out", packer.PackConfig(max_len=8))
    return tmp_path / "out"


def test_one_row_is_one_row(cli, one_row: Path, tmp_path: Path):
    r = cli("verify", one_row, "--input", tmp_path / "a.jsonl", "--no-attention")
    assert r.exit_code == 0, r.output
    assert "1 row, 1 sample, 3 tokens in 1 shard" in " ".join(r.stderr.split())
    assert "1 source sample," in r.stderr
    r = cli("export", one_row, "--to", "mds", "-o", tmp_path / "mds")
    assert "exported 1 row (1 sample, 3 tokens)" in r.stderr
    r = cli("inspect", one_row, "--row", "5")
    assert r.exit_code == 2 and "(the output has 1 row)" in r.stderr
    assert " 1 rows" not in r.stderr


@pytest.mark.parametrize(
    "args, code",
    [
        (["pack", "missing.jsonl", "-o", "out/x", "-L", "8", "--json"], 1),
        (["pack", "a.jsonl", "-o", "out/x", "-L", "8", "--json", "--no-such-flag"], 2),
        (["verify", "out/none", "--json", "--no-attention"], 2),
        (["plan", "a.jsonl", "-L", "eight", "--json"], 2),
        (["inspect", "out/one", "--row", "9", "--json"], 2),
    ],
)
def test_json_commands_fail_with_a_json_object(one_row: Path, tmp_path: Path, args, code):
    """A script that parses stdout gets {"error", "exit_code"}, and stderr keeps its one line."""
    (tmp_path / "out").rename(tmp_path / "one")
    (tmp_path / "out").mkdir()
    (tmp_path / "one").rename(tmp_path / "out" / "one")
    r = run_packer(*args, cwd=tmp_path)
    assert r.returncode == code, r.stderr
    reply = json.loads(r.stdout)
    assert set(reply) == {"error", "exit_code"} and reply["exit_code"] == code
    assert r.stderr == f"error: {reply['error']}\n"


def test_without_json_stdout_stays_empty_on_failure(tmp_path: Path):
    r = run_packer("pack", "missing.jsonl", "-o", "out/x", "-L", "8", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""


@pytest.mark.parametrize("pad", [False, True])
def test_mds_pad_note_only_on_padded_outputs(cli, tmp_path: Path, pad: bool):
    src = write_jsonl(tmp_path / "a.jsonl", [{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    packer.pack([src], tmp_path / "out", packer.PackConfig(max_len=8, pad=pad))
    r = cli("export", tmp_path / "out", "--to", "mds", "-o", tmp_path / "mds")
    assert r.exit_code == 0, r.output
    assert ("--pad tail is not kept" in r.stderr) is pad


def test_inspect_names_an_s3_source_whole(cli, s3, tmp_path: Path):
    (tmp_path / "in").mkdir()
    src = write_jsonl(tmp_path / "in" / "a.jsonl", [{"input_ids": [1, 2, 3]}, {"input_ids": [4]}])
    url = s3.put_dir(tmp_path / "in", "corpus")
    r = cli("pack", f"{url}/a.jsonl", "-o", tmp_path / "out", "-L", "8")
    assert r.exit_code == 0, r.output
    assert src.exists()
    report = json.loads(cli("inspect", tmp_path / "out", "--row", "0", "--json").stdout)
    files = {seg["source"]["file"] for seg in report["row_views"][0]["segments"]}
    assert files == {"s3://bkt/corpus/a.jsonl"}
    r = cli("inspect", tmp_path / "out", "--row", "0")
    assert "s3://bkt/corpus/a.jsonl" in "".join(r.stdout.split())
