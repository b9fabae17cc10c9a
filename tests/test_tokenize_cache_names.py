"""Messages and manifests name the user's raw files, never packer's tokenize cache entries.

The tokenizer is tests/test_tokenize_run.py's (made in the test, never fetched).
"""

from __future__ import annotations

import json

import pytest
from test_tokenize_run import records, write_jsonl
from test_tokenize_run import tokenizer as tokenizer  # the module fixture

pytest.importorskip("transformers")


@pytest.fixture
def raw(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    return write_jsonl(tmp_path / "raw.jsonl", records(80, seed=21))


def _one_line(res) -> str:
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_the_same_raw_file_twice_in_a_mix_names_it(cli, tokenizer, tmp_path, raw):
    mix = ("--mix", f"{raw}=1", "--mix", f"{raw}=2")
    res = cli("pack", *mix, "--tokenizer", tokenizer, "-o", tmp_path / "out", "-L", "256")
    assert res.exit_code == 2
    assert (
        _one_line(res) == f"error: --mix: {raw} is in sources 0 and 1; a file belongs to one source"
    )
    assert "part-" not in res.stderr and "tokenized" not in res.stderr  # nothing was tokenized


def test_two_mix_sources_with_the_same_bytes_name_both_files(cli, tokenizer, tmp_path, raw):
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(raw.read_bytes())
    mix = ("--mix", f"{raw}=1", "--mix", f"{copy}=1")
    res = cli("pack", *mix, "--tokenizer", tokenizer, "-o", tmp_path / "out", "-L", "256")
    assert res.exit_code == 2
    assert _one_line(res) == (
        f"error: --mix: sources 0 and 1 ({raw} and {copy}) hold the same bytes; "
        "a file belongs to one source"
    )
    assert "part-" not in _one_line(res)
    assert not (tmp_path / "out").exists()


def test_a_file_in_two_mix_globs_is_named(cli, tokenizer, tmp_path, raw):
    other = write_jsonl(tmp_path / "other.jsonl", records(40, seed=22))
    mix = ("--mix", f"{tmp_path}/*.jsonl=1", "--mix", f"{other}=1")
    res = cli("pack", *mix, "--tokenizer", tokenizer, "-o", tmp_path / "out", "-L", "256")
    assert res.exit_code == 2
    assert _one_line(res) == (
        f"error: --mix: {other} is in sources 0 and 1; a file belongs to one source"
    )


def test_the_same_file_twice_to_tokenize_is_a_usage_error(cli, tokenizer, tmp_path, raw):
    res = cli("tokenize", raw, raw, "--tokenizer", tokenizer, "-o", tmp_path / "tok")
    assert res.exit_code == 2
    assert res.stderr == f"error: {raw}: the same file is named twice in the inputs\n"
    assert not (tmp_path / "tok").exists()


def test_a_directory_and_a_file_in_it_to_tokenize_is_a_usage_error(cli, tokenizer, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    inside = write_jsonl(data / "raw.jsonl", records(20, seed=24))
    res = cli("tokenize", data, inside, "--tokenizer", tokenizer, "-o", tmp_path / "tok")
    assert res.exit_code == 2
    assert res.stderr == f"error: {inside}: the same file is named twice in the inputs\n"
    assert not (tmp_path / "tok").exists()
    res = cli("pack", inside, data, "--tokenizer", tokenizer, "-o", tmp_path / "p", "-L", "256")
    assert res.exit_code == 2
    assert res.stderr == f"error: {inside}: the same file is named twice in the inputs\n"
    assert not (tmp_path / "p").exists()


def test_a_pack_from_an_entry_made_under_another_name_records_the_users_file(
    cli, tokenizer, tmp_path, raw
):
    first = cli("pack", raw, "--tokenizer", tokenizer, "-o", tmp_path / "p1", "-L", "256")
    assert first.exit_code == 0, first.stderr
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_bytes(raw.read_bytes())
    res = cli("pack", renamed, "--tokenizer", tokenizer, "-o", tmp_path / "p2", "-L", "256")
    assert res.exit_code == 0, res.stderr
    assert "reused from the cache" in res.stderr
    manifest = json.loads((tmp_path / "p2" / "manifest.json").read_text())
    assert manifest["tokenized_from"]["inputs"] == [{"format": "jsonl", "path": str(renamed)}]
    shards = sorted((tmp_path / "p1").glob("shard-*"))
    assert [p.read_bytes() for p in shards] == [
        p.read_bytes() for p in sorted((tmp_path / "p2").glob("shard-*"))
    ]


def test_a_raw_mixture_from_entries_made_under_other_names_records_the_users_files(
    cli, tokenizer, tmp_path, raw
):
    texts = write_jsonl(tmp_path / "texts.jsonl", records(60, seed=23))
    base = ("--tokenizer", tokenizer, "-L", "256")
    first = cli("pack", "--mix", f"{raw}=1", "--mix", f"{texts}=1", *base, "-o", tmp_path / "m1")
    assert first.exit_code == 0, first.stderr
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(raw.read_bytes())
    b.write_bytes(texts.read_bytes())
    res = cli("pack", "--mix", f"{a}=1", "--mix", f"{b}=1", *base, "-o", tmp_path / "m2")
    assert res.exit_code == 0, res.stderr
    manifest = json.loads((tmp_path / "m2" / "manifest.json").read_text())
    assert [s["inputs"] for s in manifest["tokenized_from"]["sources"]] == [
        [{"format": "jsonl", "path": str(a)}],
        [{"format": "jsonl", "path": str(b)}],
    ]
    assert [s["path"] for s in manifest["mixture"]["sources"]] == [str(a), str(b)]
