"""`pack_dataset(None, ..., mix=...)`: mixtures of data held in memory, the same rows as
`packer.pack(mix=...)` on the same samples written one file per source."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from conftest import make_samples, read_shards, to_table, write_jsonl

import packer
from packer import pack_dataset
from packer.contract.schema import SCHEMA, SOURCE_COLUMN
from packer.errors import OptionError, SampleError

COLUMNS = [f.name for f in SCHEMA] + [SOURCE_COLUMN]


def two_sources():
    """A short-sample source and one with 4x the tokens."""
    short = make_samples(300, seed=1, median=40, max_len=400)
    long = make_samples(300, seed=2, median=160, max_len=1000)
    return short, long


def packed_on_disk(tmp_path, sources, weights, window=None, **kwargs):
    """(shards as one table, manifest) of `packer.pack(mix=...)` on the sources as JSONL."""
    mix = [
        (str(write_jsonl(tmp_path / f"s{i}.jsonl", s)), w)
        for i, (s, w) in enumerate(zip(sources, weights))
    ]
    out = tmp_path / "out"
    cfg = packer.PackConfig(max_len=1024, overlength="split", window=window)
    packer.pack([], out, cfg, mix=mix, **kwargs)
    return read_shards(out), json.loads((out / "manifest.json").read_text())


@pytest.mark.parametrize(("mix_tokens", "window"), [(None, None), (90_000, None), (None, 100)])
def test_same_rows_as_pack_on_files(tmp_path, mix_tokens, window):
    short, long = two_sources()
    table, stats = pack_dataset(
        None,
        1024,
        overlength="split",
        mix=[(to_table(short), 0.5), (to_table(long), 0.5)],
        mix_tokens=mix_tokens,
        window=window,
        return_stats=True,
    )
    disk, manifest = packed_on_disk(
        tmp_path, [short, long], [0.5, 0.5], window=window, mix_tokens=mix_tokens
    )
    assert table.select(COLUMNS).combine_chunks().equals(disk.select(COLUMNS).combine_chunks())
    got = stats["mixture"]["sources"]
    want = manifest["mixture"]["sources"]
    for key in ("tokens", "samples", "repeats", "epochs", "share", "first_index"):
        assert [s[key] for s in got] == [s[key] for s in want], key
    assert [s["name"] for s in got] == ["source 0", "source 1"]
    assert abs(got[0]["share"] - 0.5) < 0.01
    if mix_tokens is not None:  # twice the default size: the short source is repeated
        assert got[0]["repeats"] > 0
    assert stats["rows"] == table.num_rows == manifest["stats"]["rows"]


def test_datasets_give_a_dataset_and_a_dataset_dict_with_a_split(tmp_path):
    datasets = pytest.importorskip("datasets")
    short, long = two_sources()
    mix = {"chat": (datasets.Dataset.from_list(short), 0.7), "web": (to_table(long), 0.3)}
    table = pack_dataset(None, 1024, overlength="split", mix=mix)
    assert isinstance(table, pa.Table)  # not every source is a Dataset
    mix["web"] = (datasets.Dataset.from_list(long), 0.3)
    packed, stats = pack_dataset(
        None, 1024, overlength="split", mix=mix, validation_split=0.1, return_stats=True
    )
    assert isinstance(packed, datasets.DatasetDict)
    train, held = packed["train"], packed["validation"]
    train_ids = {i for row in train["sample_index"] for i in row}
    held_ids = {i for row in held["sample_index"] for i in row}
    assert not train_ids & held_ids
    assert [s["held_out"] for s in stats["mixture"]["sources"]] == [30, 30]
    assert stats["validation"]["samples_packed"] == 60
    assert [s["name"] for s in stats["mixture"]["sources"]] == ["chat", "web"]
    disk, _ = packed_on_disk(tmp_path, [short, long], [0.7, 0.3], validation_split=0.1)
    assert (
        train.data.table.select(COLUMNS)
        .combine_chunks()
        .equals(disk.select(COLUMNS).combine_chunks())
    )


def test_validation_split_of_plain_data_returns_two_tables():
    samples = make_samples(100, seed=3)
    packed = pack_dataset(to_table(samples), 512, overlength="split", validation_split=10)
    assert set(packed) == {"train", "validation"}
    held = [i for row in packed["validation"]["sample_index"].to_pylist() for i in row]
    train = [i for row in packed["train"]["sample_index"].to_pylist() for i in row]
    assert len(set(held)) == 10 and not set(held) & set(train)
    assert len(set(held) | set(train)) == 100


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"mix": [(to_table(make_samples(5)), 0)]}, "mix source 0: the weight must be a number"),
        ({"mix": [(to_table(make_samples(5)), "a")]}, "mix source 0: the weight must be a number"),
        ({"mix": [to_table(make_samples(5))]}, "mix source 0: an entry must be a (data, weight)"),
        ({"mix": {"x": ("nope", 1)}}, "mix x: a source must be a datasets.Dataset"),
        ({"mix": []}, "mix is empty"),
        ({"mix": "a.jsonl"}, "mix must be a list of (data, weight) pairs"),
        ({"mix_tokens": 100}, "data is None"),
        ({"mix": [([[1, 2]], 1)], "cache_file_name": "x.arrow"}, "cache_file_name="),
        ({"mix": [([[1, 2]], 1)], "tokenizer": "gpt2"}, "tokenizer= cannot be used with mix"),
        ({"mix": [([[1, 2]], 1)], "validation_split": 1.5}, "validation_split"),
    ],
)
def test_bad_mixtures_raise_one_option_error(kwargs, words):
    with pytest.raises(OptionError) as err:
        pack_dataset(None, 512, **kwargs)
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_data_with_mix_is_refused():
    with pytest.raises(OptionError, match="pass data=None with mix"):
        pack_dataset([[1, 2]], 512, mix=[([[1, 2]], 1)])


def test_a_bad_sample_is_named_within_its_source():
    with pytest.raises(SampleError) as err:
        pack_dataset(None, 16, mix={"a": ([[1, 2]], 1), "b": ([[1, 2], [3, "x"]], 1)})
    assert str(err.value).startswith("mix b, sample 1: 'input_ids'[1] is \"x\"")
    with pytest.raises(SampleError, match="^mix source 1: the dataset is empty"):
        pack_dataset(None, 16, mix=[([[1, 2]], 1), ([], 1)])


def test_skipped_samples_name_their_source():
    table, stats = pack_dataset(
        None, 16, mix=[([[1, 2]], 1), ([[1, 2], []], 1)], on_error="skip", return_stats=True
    )
    assert [(r["source"], r["sample_index"]) for r in stats["rejects"]] == [(1, 2)]
    assert [s["samples"] for s in stats["mixture"]["sources"]] == [1, 1]
    (row,) = table.column(SOURCE_COLUMN).to_pylist()  # both samples in one row of 16
    assert sorted(row) == [0, 1]
