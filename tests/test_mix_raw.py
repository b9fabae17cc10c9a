"""Mixtures of raw data: `packer pack --mix RAW=WEIGHT --tokenizer DIR`.

Each raw source is tokenized through the cache on its own, then mixed by tokens as tokenized
sources are; the manifest names the raw sources, and verify re-renders them. The tokenizer is
made in the test (tests/test_tokenize_run.py's, a ChatML template without generation tags).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from test_tokenize_run import digests, records, write_jsonl
from test_tokenize_run import tokenizer as tokenizer  # the module fixture

pytest.importorskip("transformers")


def _sources(tmp_path):
    chats = [r for r in records(240, seed=5) if "messages" in r]
    texts = [r for r in records(240, seed=6) if "text" in r]
    return write_jsonl(tmp_path / "chats.jsonl", chats), write_jsonl(
        tmp_path / "texts.jsonl", texts
    )


def _source_tokens(out):
    """Tokens per `sample_source`, counted from the rows."""
    manifest = json.loads((out / "manifest.json").read_text())
    counts = [0] * len(manifest["mixture"]["sources"])
    for shard in manifest["shards"]:
        table = pa.ipc.open_stream(pa.memory_map(str(out / shard["file"]))).read_all()
        for row in table.select(["cu_seqlens", "sample_source"]).to_pylist():
            cu = row["cu_seqlens"]
            for j, s in enumerate(row["sample_source"]):
                counts[s] += cu[j + 1] - cu[j]
    return manifest, counts


def test_a_raw_mixture_names_its_raw_sources_and_equals_the_two_step_path(
    cli, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    chats, texts = _sources(tmp_path)
    mix = ("--mix", f"{chats}=1", "--mix", f"{texts}=1")
    res = cli("pack", *mix, "--tokenizer", tokenizer, "-o", tmp_path / "one", "-L", "512")
    assert res.exit_code == 0, res.stderr
    manifest, counts = _source_tokens(tmp_path / "one")
    sources = manifest["mixture"]["sources"]
    assert [s["path"] for s in sources] == [str(chats), str(texts)]
    assert counts == [s["tokens"] for s in sources]
    assert abs(counts[0] - counts[1]) <= max(s["tokens"] for s in sources) * 0.2
    raw = manifest["tokenized_from"]
    assert [s["inputs"] for s in raw["sources"]] == [
        [{"format": "jsonl", "path": str(chats)}],
        [{"format": "jsonl", "path": str(texts)}],
    ]
    assert [s["cache"] for s in raw["sources"]] == [s["tokenized"] for s in sources]
    assert raw["encoder"]["mask_method"] == "full-render"
    # two steps: each source tokenized, then the tokenized sources mixed: the same shards
    for name, path in (("tc", chats), ("tt", texts)):
        res = cli("tokenize", path, "--tokenizer", tokenizer, "-o", tmp_path / name)
        assert res.exit_code == 0, res.stderr
    two = ("--mix", f"{tmp_path / 'tc'}=1", "--mix", f"{tmp_path / 'tt'}=1")
    res = cli("pack", *two, "-o", tmp_path / "two", "-L", "512")
    assert res.exit_code == 0, res.stderr
    assert digests(tmp_path / "one", "shard-*") == digests(tmp_path / "two", "shard-*")
    # verify re-renders the raw records of both sources
    res = cli(
        "verify", tmp_path / "one", "--input", chats, "--input", texts,
        "--tokenizer", tokenizer, "--no-attention",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    # the manifest as a config, with the tokenizer: the same bytes again
    res = cli(
        "pack", "-c", tmp_path / "one" / "manifest.json", "--tokenizer", tokenizer,
        "-o", tmp_path / "again",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert digests(tmp_path / "again", "shard-*") == digests(tmp_path / "one", "shard-*")


def test_a_bad_raw_record_in_a_source_is_one_line_and_nothing_is_written(
    cli, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    chats, _ = _sources(tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hello world"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    res = cli(
        "pack", "--mix", f"{chats}=1", "--mix", f"{bad}=1", "--tokenizer", tokenizer,
        "-o", tmp_path / "out", "-L", "512",
    )  # fmt: skip
    assert res.exit_code == 1
    assert res.stderr.strip().splitlines()[-1] == (
        f"error: {bad}:2: the chat has no assistant turn: nothing to train on"
    )
    assert not (tmp_path / "out").exists()


def test_token_columns_of_a_raw_dataset_are_refused(cli, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    chats, texts = _sources(tmp_path)
    config = tmp_path / "mix.yaml"
    config.write_text(
        f"max_len: 512\ndatasets:\n  - {{path: {chats}, weight: 1, input_column: ids}}\n"
        f"  - {{path: {texts}, weight: 1}}\n"
    )
    res = cli("pack", "-c", config, "--tokenizer", tokenizer, "-o", tmp_path / "out")
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        f"error: datasets: {chats} names input_column, columns of token ids; with --tokenizer "
        "the raw columns are found by name (--column KEY=NAME)"
    )
    assert not (tmp_path / "out").exists()


def test_a_split_of_raw_data_names_the_raw_input_and_its_cache_entry(
    cli, tokenizer, tmp_path, monkeypatch
):
    """`pack RAW --tokenizer --validation-split`: both manifests' mixture names RAW as its
    source and the cache entry under `tokenized`, as a raw mixture does."""
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    chats, _ = _sources(tmp_path)
    out = tmp_path / "train"
    res = cli(
        "pack", chats, "--tokenizer", tokenizer, "--validation-split", "0.05",
        "-o", out, "-L", "512", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    for packed in (out, tmp_path / "train-validation"):
        manifest = json.loads((packed / "manifest.json").read_text())
        (source,) = manifest["mixture"]["sources"]
        assert source["path"] == str(chats)
        assert source["tokenized"] == manifest["tokenized_from"]["cache"]
        assert source["files"] != [str(chats)]  # the entry's files were read
