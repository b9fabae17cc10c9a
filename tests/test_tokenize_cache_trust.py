"""The tokenize cache is an optimisation, never a source of truth: `packer pack RAW --tokenizer`
uses an entry only when every shard its `tokenized.json` lists is there with its recorded hash;
a damaged entry is tokenized again and the run says so in one line.

The tokenizer is tests/test_tokenize_run.py's (made in the test, never fetched).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_tokenize_run import digests, records, write_jsonl
from test_tokenize_run import tokenizer as tokenizer  # the module fixture

pytest.importorskip("transformers")

N = 1500  # two shards of the entry: 1,024 samples and 476


def _packed_samples(out: Path) -> int:
    return json.loads((out / "manifest.json").read_text())["stats"]["samples_packed"]


def _entry(tmp_path: Path) -> Path:
    (entry,) = (tmp_path / "cache" / "tokenized").iterdir()
    return entry


@pytest.fixture
def packed(cli, tokenizer, tmp_path, monkeypatch):
    """(pack again into `name`, the entry, the first pack's shard digests)."""
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    raw = write_jsonl(tmp_path / "raw.jsonl", records(N, seed=11))

    def pack(name: str):
        return cli("pack", raw, "--tokenizer", tokenizer, "-o", tmp_path / name, "-L", "512")

    first = pack("first")
    assert first.exit_code == 0, first.stderr
    assert _packed_samples(tmp_path / "first") == N
    return pack, _entry(tmp_path), digests(tmp_path / "first", "shard-*")


def _note_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "tokenize cache entry" in line]


def test_an_entry_with_a_deleted_shard_is_tokenized_again(packed, tmp_path):
    pack, entry, clean = packed
    (entry / "part-00000-000001.parquet").unlink()
    res = pack("again")
    assert res.exit_code == 0, res.stderr
    assert _note_lines(res.stderr) == [
        f"note: tokenize cache entry {entry} tokenized again: part-00000-000001.parquet is missing"
    ]
    assert f"tokenized {N:,} lines" in res.stderr
    assert _packed_samples(tmp_path / "again") == N
    assert digests(tmp_path / "again", "shard-*") == clean
    third = pack("third")  # the rebuilt entry is sound: reused, silently
    assert "reused from the cache" in third.stderr and not _note_lines(third.stderr)


def test_an_entry_with_a_changed_token_is_tokenized_again(packed, tmp_path):
    pack, entry, clean = packed
    shard = entry / "part-00000-000000.parquet"
    table = pq.read_table(shard)
    ids = table.column("input_ids").to_pylist()
    ids[7][0] = ids[7][0] + 1  # one token
    column = pa.array(ids, table.schema.field("input_ids").type)
    pq.write_table(table.set_column(0, table.schema.field("input_ids"), column), shard)
    res = pack("again")
    assert res.exit_code == 0, res.stderr
    assert _note_lines(res.stderr) == [
        f"note: tokenize cache entry {entry} tokenized again: "
        "part-00000-000000.parquet does not match the hash its tokenized.json records"
    ]
    assert digests(tmp_path / "again", "shard-*") == clean


def test_an_entry_with_a_shard_it_does_not_list_is_tokenized_again(packed, tmp_path):
    pack, entry, clean = packed
    stray = entry / "part-00000-000009.parquet"
    stray.write_bytes((entry / "part-00000-000000.parquet").read_bytes())
    res = pack("again")
    assert res.exit_code == 0, res.stderr
    assert "part-00000-000009.parquet is not listed in its tokenized.json" in res.stderr
    assert not stray.exists()
    assert _packed_samples(tmp_path / "again") == N
    assert digests(tmp_path / "again", "shard-*") == clean


@pytest.mark.parametrize("damage", ["removed", "corrupt", "other format"])
def test_an_entry_without_a_readable_tokenized_json_is_a_miss(packed, tmp_path, damage):
    pack, entry, clean = packed
    manifest = entry / "tokenized.json"
    if damage == "removed":
        manifest.unlink()
    elif damage == "corrupt":
        manifest.write_text(manifest.read_text()[:40])
    else:
        manifest.write_text(json.dumps({"format": "something-else"}))
    res = pack("again")
    assert res.exit_code == 0, res.stderr
    assert "--overwrite" not in res.stderr
    assert _note_lines(res.stderr) == [
        f"note: tokenize cache entry {entry} tokenized again: "
        "its tokenized.json is missing or unreadable"
    ]
    assert _packed_samples(tmp_path / "again") == N
    assert digests(tmp_path / "again", "shard-*") == clean
    assert json.loads(manifest.read_text())["stats"]["samples"] == N


def test_an_empty_entry_directory_is_a_miss(packed, tmp_path):
    pack, entry, clean = packed
    for path in entry.iterdir():
        path.unlink()
    res = pack("again")
    assert res.exit_code == 0, res.stderr
    assert "tokenized again: its tokenized.json is missing or unreadable" in res.stderr
    assert digests(tmp_path / "again", "shard-*") == clean


@pytest.mark.parametrize("kind", ["a link to nothing", "a file"])
def test_an_entry_that_is_not_a_directory_is_a_miss(packed, tmp_path, kind):
    import shutil

    pack, entry, clean = packed
    shutil.rmtree(entry)
    if kind == "a file":
        entry.write_text("not an entry")
    else:
        entry.symlink_to(tmp_path / "gone")
    res = pack("again")
    assert res.exit_code == 0, res.stderr
    assert "tokenized again: its tokenized.json is missing or unreadable" in res.stderr
    assert not entry.is_symlink() and digests(tmp_path / "again", "shard-*") == clean
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name]  # no old link left


# A user's -o is not a cache: it is refused whenever it exists, also when it appears meanwhile


def _tokenize(tokenizer, raw: Path, out: Path, pause: float | None = None):
    import os
    import subprocess
    import sys

    from test_tokenize_run import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_PROGRESS_INTERVAL": "3600"}
    env.pop("PACKER_FAULT_COMMIT_PAUSE", None)
    if pause is not None:
        env["PACKER_FAULT_COMMIT_PAUSE"] = str(pause)
    cmd = [sys.executable, "-m", "packer", "tokenize", str(raw), "--tokenizer", str(tokenizer)]
    cmd += ["-o", str(out), "--workers", "1"]
    return subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _wait_for(proc, line: str) -> None:
    for got in proc.stderr:
        if got.strip() == line:
            return
    raise AssertionError(f"the run ended before {line!r}")


def _samples(directory: Path) -> list:
    import pyarrow.parquet as pq

    return pq.read_table(sorted(directory.glob("part-*.parquet"))).column("input_ids").to_pylist()


def test_a_second_run_into_one_output_fails_and_leaves_the_winners(tokenizer, tmp_path):
    x = write_jsonl(tmp_path / "x.jsonl", records(600, seed=1))
    y = write_jsonl(tmp_path / "y.jsonl", records(300, seed=2))
    out = tmp_path / "out"
    slow = _tokenize(tokenizer, x, out, pause=3)  # stops at its commit point
    _wait_for(slow, "packer-fault: commit before")
    fast = _tokenize(tokenizer, y, out)
    _, fast_err = fast.communicate(timeout=120)
    assert fast.returncode == 0, fast_err
    wins = _samples(out)
    _, slow_err = slow.communicate(timeout=120)
    assert slow.returncode == 1, slow_err
    lines = [line for line in slow_err.splitlines() if not line.startswith("packer-fault")]
    assert lines == [
        f"error: {out}: output directory appeared while tokenizing (another run's, or one made "
        "meanwhile); it is left as it is and nothing was written: pass --overwrite to replace it"
    ]
    assert "reused from the cache" not in slow_err
    assert _samples(out) == wins and len(wins) == 300  # y's, whole
    assert not [p for p in tmp_path.iterdir() if ".packer-" in p.name]


@pytest.mark.parametrize("files", [{"mine.txt": "a user's file"}, {}], ids=["a file", "empty"])
def test_an_output_made_while_the_run_runs_is_left_and_the_run_fails(tokenizer, tmp_path, files):
    x = write_jsonl(tmp_path / "x.jsonl", records(300, seed=1))
    out = tmp_path / "out"
    run = _tokenize(tokenizer, x, out, pause=2)
    _wait_for(run, "packer-fault: commit before")
    out.mkdir()  # empty, or with a user's file in it: not replaced either way
    for name, text in files.items():
        (out / name).write_text(text)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 1, err
    assert "output directory appeared while tokenizing" in err
    assert "reused from the cache" not in err
    assert sorted(p.name for p in out.iterdir()) == sorted(files)


def test_two_runs_at_once_into_one_output_one_wins(tokenizer, tmp_path):
    x = write_jsonl(tmp_path / "x.jsonl", records(600, seed=1))
    y = write_jsonl(tmp_path / "y.jsonl", records(300, seed=2))
    out = tmp_path / "out"
    runs = [_tokenize(tokenizer, raw, out) for raw in (x, y)]
    errs = [run.communicate(timeout=120)[1] for run in runs]
    codes = [run.returncode for run in runs]
    assert sorted(codes) in ([0, 1], [0, 2]), errs  # 2: the output existed when it started
    winner = codes.index(0)
    assert len(_samples(out)) == (600, 300)[winner]
    loser = errs[1 - winner]
    assert "output directory" in loser and "reused" not in loser, loser


def test_an_existing_output_is_refused_without_overwrite(cli, tokenizer, tmp_path):
    x = write_jsonl(tmp_path / "x.jsonl", records(30, seed=1))
    out = tmp_path / "out"
    assert cli("tokenize", x, "--tokenizer", tokenizer, "-o", out).exit_code == 0
    before = digests(out, "*")
    again = cli("tokenize", x, "--tokenizer", tokenizer, "-o", out)
    assert again.exit_code == 2 and "output directory exists" in again.stderr
    assert "reused" not in again.stderr and digests(out, "*") == before


# The entry check as a property: any damage to any shard is found, no damage passes


@pytest.fixture(scope="module")
def sound_entry(tokenizer, tmp_path_factory) -> Path:
    from packer.tokenize.encode import Encoder
    from packer.tokenize.run import tokenize

    tmp = tmp_path_factory.mktemp("entry")
    raw = write_jsonl(tmp / "raw.jsonl", records(2100, seed=12))  # three shards
    tokenize([raw], tmp / "tok", Encoder(str(tokenizer)), workers=1)
    return tmp / "tok"


def test_every_damage_to_an_entry_is_found(sound_entry, tmp_path_factory):
    import shutil

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from packer.tokenize.output import read_tokenized, unsound

    manifest = read_tokenized(sound_entry)
    names = [s["file"] for s in manifest["shards"]]
    assert len(names) == 3 and unsound(sound_entry, manifest) is None

    @settings(max_examples=40, deadline=None)
    @given(
        st.sampled_from(names),
        st.sampled_from(["delete", "flip", "truncate", "extra"]),
        st.floats(0, 1, exclude_max=True),
    )
    def check(name, damage, where):
        copy = tmp_path_factory.mktemp("copy") / "tok"
        shutil.copytree(sound_entry, copy)
        shard = copy / name
        data = bytearray(shard.read_bytes())
        if damage == "delete":
            shard.unlink()
        elif damage == "flip":
            data[int(where * len(data))] ^= 0x40
            shard.write_bytes(bytes(data))
        elif damage == "truncate":
            shard.write_bytes(bytes(data[: int(where * len(data))]))
        else:
            name = "part-00000-000099.parquet"
            (copy / name).write_bytes(bytes(data))
        problem = unsound(copy, manifest)
        assert problem is not None and problem.startswith(name)
        shutil.rmtree(copy.parent)

    check()


def test_overwrite_replaces_an_output_and_a_link_without_its_target(cli, tokenizer, tmp_path):
    x = write_jsonl(tmp_path / "x.jsonl", records(30, seed=1))
    y = write_jsonl(tmp_path / "y.jsonl", records(20, seed=2))
    out = tmp_path / "out"
    assert cli("tokenize", x, "--tokenizer", tokenizer, "-o", out).exit_code == 0
    res = cli("tokenize", y, "--tokenizer", tokenizer, "-o", out, "--overwrite")
    assert res.exit_code == 0, res.stderr
    assert len(_samples(out)) == 20
    before = digests(out, "*")
    link = tmp_path / "link"
    link.symlink_to(out)  # a link to a tokenized output: the link is replaced, not `out`
    res = cli("tokenize", x, "--tokenizer", tokenizer, "-o", link, "--overwrite")
    assert res.exit_code == 0, res.stderr
    assert not link.is_symlink() and len(_samples(link)) == 30
    assert digests(out, "*") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "out", "x.jsonl", "y.jsonl"]
