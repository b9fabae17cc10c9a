"""`pack_dataset(raw rows, tokenizer=...)`: 🤗 datasets of chats and texts, as TRL's SFT users
hold them, packed to the rows `packer pack RAW --tokenizer` writes for the same records.

The tokenizer is a byte-level BPE trained here (`tokenizers_util`), with a ChatML template
without generation tags; nothing comes from the hub.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import read_shards
from tokenizers_util import PLAIN, TAGGED, build_tokenizer, generated_chat, sentence

from packer import pack_dataset
from packer.contract.schema import SCHEMA
from packer.errors import OptionError, SampleError

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

CONTRACT = [f.name for f in SCHEMA]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "plain", PLAIN)


def raw_rows(n: int, seed: int = 0) -> list[dict]:
    """Every kind TRL's users hold: messages, ShareGPT, text, prompt/completion, Alpaca."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            rows.append({"messages": generated_chat(rng)})
        elif kind == 1:
            turns = generated_chat(rng, turns=rng.randint(1, 2))
            names = {"system": "system", "user": "human", "assistant": "gpt"}
            rows.append(
                {
                    "conversations": [
                        {"from": names[m["role"]], "value": m["content"]} for m in turns
                    ]
                }
            )
        elif kind == 2:
            rows.append({"text": sentence(rng, 3, 40)})
        elif kind == 3:
            rows.append({"prompt": sentence(rng), "completion": " " + sentence(rng)})
        else:
            rows.append({"instruction": sentence(rng), "input": "", "output": sentence(rng)})
    return rows


def as_dataset(rows: list[dict]):
    """A Dataset with every row's columns (nulls where a row lacks one)."""
    keys = sorted({k for r in rows for k in r})
    return datasets.Dataset.from_dict({k: [r.get(k) for r in rows] for k in keys})


def cli_pack_raw(cli, tmp_path: Path, rows: list[dict], tokenizer: Path, *flags) -> pa.Table:
    src = tmp_path / "raw.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    res = cli("pack", src, "--tokenizer", tokenizer, "-o", out, "-L", "256", *flags)
    assert res.exit_code == 0, res.stderr
    return read_shards(out)


def contract(table: pa.Table) -> pa.Table:
    return table.select(CONTRACT).combine_chunks()


def test_a_raw_dataset_packs_to_the_shards_of_pack_raw_tokenizer(
    cli, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    rows = raw_rows(150, seed=1)
    shards = cli_pack_raw(cli, tmp_path, rows, tokenizer, "--seed", "5")
    assert shards.num_rows > 1

    ds = as_dataset(rows)
    packed, stats = pack_dataset(ds, 256, seed=5, tokenizer=tokenizer, return_stats=True)
    assert isinstance(packed, datasets.Dataset)
    assert contract(packed.data.table).equals(shards)
    assert stats["samples_in"] == 150 and "raw_rejects" not in stats

    # the same rows as an Arrow table, shuffled then restored through the Dataset's indices,
    # and streamed as an IterableDataset: the same packed rows
    table = ds.data.table
    assert contract(pack_dataset(table, 256, seed=5, tokenizer=tokenizer)).equals(shards)
    shuffled = ds.shuffle(seed=3)
    order = shuffled._indices.column(0).to_pylist()
    restored = shuffled.select([order.index(i) for i in range(len(order))])
    assert contract(pack_dataset(restored, 256, seed=5, tokenizer=tokenizer).data.table).equals(
        shards
    )
    streamed = pack_dataset(ds.to_iterable_dataset(), 256, seed=5, tokenizer=tokenizer)
    assert contract(pa.Table.from_batches(list(streamed))).equals(shards)


def test_a_tokenizer_object_and_template_text_tokenize_like_their_files(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tagged = build_tokenizer(tmp_path / "tagged", TAGGED)
    template = tmp_path / "plain.jinja"
    template.write_text(PLAIN)
    ds = as_dataset(raw_rows(40, seed=2))
    by_files = pack_dataset(ds, 256, tokenizer=tagged, chat_template=template, train_on="last")
    by_objects = pack_dataset(
        ds,
        256,
        tokenizer=AutoTokenizer.from_pretrained(str(tagged)),
        chat_template=PLAIN,
        train_on="last",
    )
    assert by_files.data.table.equals(by_objects.data.table)
    # another template (tags, train_on) gives other labels and another fingerprint
    other = pack_dataset(ds, 256, tokenizer=tagged)
    assert other._fingerprint != by_files._fingerprint
    assert not other.data.table.equals(by_files.data.table)


def test_two_worker_processes_give_the_rows_of_one(tokenizer):
    """Over 1,024 rows: two batches, tokenized by two processes, each with its tokenizer."""
    ds = as_dataset(raw_rows(1100, seed=3))
    one = pack_dataset(ds, 512, tokenizer=tokenizer, workers=1)
    two = pack_dataset(ds, 512, tokenizer=tokenizer, workers=2)
    assert one.num_rows > 50 and one.data.table.equals(two.data.table)


def bad_rows() -> list[dict]:
    rows = raw_rows(30, seed=4)
    rows[17] = {"messages": [{"role": "user", "content": "no reply"}]}
    return rows


def test_a_bad_row_is_named_by_its_index(tokenizer, monkeypatch):
    ds = as_dataset(bad_rows())
    with pytest.raises(SampleError, match=r"^row 17: .*assistant") as err:
        pack_dataset(ds, 256, tokenizer=tokenizer)
    assert "\n" not in str(err.value)
    # streamed in chunks of 10 rows: row 17 is the 8th of the second chunk, still `row 17`
    monkeypatch.setattr("packer.read.objects.READ_CHUNK", 10)
    with pytest.raises(SampleError, match=r"^row 17: "):
        list(pack_dataset(ds.to_iterable_dataset(), 256, tokenizer=tokenizer))


def test_a_file_backed_dataset_is_packed_to_a_cache_file_keyed_by_the_tokenizer(
    tokenizer, tmp_path
):
    ds = as_dataset(raw_rows(60, seed=5))
    ds.save_to_disk(str(tmp_path / "ds"))
    on_disk = datasets.load_from_disk(str(tmp_path / "ds"))
    packed = pack_dataset(on_disk, 256, tokenizer=tokenizer)
    assert packed.cache_files and Path(packed.cache_files[0]["filename"]).parent == tmp_path / "ds"
    assert packed.data.table.equals(pack_dataset(ds, 256, tokenizer=tokenizer).data.table)
    last = pack_dataset(on_disk, 256, tokenizer=tokenizer, train_on="last")
    assert last.cache_files[0]["filename"] != packed.cache_files[0]["filename"]


def test_on_error_skip_leaves_the_row_out_and_lists_it(tokenizer):
    ds = as_dataset(bad_rows())
    packed, stats = pack_dataset(ds, 256, tokenizer=tokenizer, on_error="skip", return_stats=True)
    assert stats["raw_rejected"] == 1 and stats["raw_rejects"][0].startswith("row 17: ")
    assert stats["samples_in"] == 29
    batches, streamed = pack_dataset(
        ds.to_iterable_dataset(), 256, tokenizer=tokenizer, on_error="skip", return_stats=True
    )
    assert pa.Table.from_batches(list(batches)).equals(packed.data.table)
    assert streamed["raw_rejects"] == stats["raw_rejects"]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"tokenizer": "/no/such/dir"}, OptionError, r"^tokenizer: /no/such/dir"),
        ({"train_on": "everything"}, OptionError, r"train_on"),
        ({"tokenizer": None, "chat_template": "{{ x }}"}, OptionError, r"^chat_template needs"),
        ({"raw_columns": {"dialog": "messages"}}, OptionError, r"^raw_columns must map"),
        ({"input_column": "tokens"}, OptionError, r"input_column and labels_column"),
        ({"tokenizer": 3}, OptionError, r"^tokenizer must be"),
    ],
)
def test_bad_options_name_the_parameter(tokenizer, kwargs, error, message):
    ds = as_dataset(raw_rows(5))
    with pytest.raises(error, match=message):
        pack_dataset(ds, 256, **{"tokenizer": tokenizer, **kwargs})


def test_data_without_raw_columns_or_of_another_type_is_refused(tokenizer):
    with pytest.raises(SampleError, match=r"none of the raw columns .*its columns: input_ids"):
        pack_dataset(datasets.Dataset.from_dict({"input_ids": [[1, 2]]}), 8, tokenizer=tokenizer)
    with pytest.raises(OptionError, match=r"with tokenizer=, data must be"):
        pack_dataset([{"text": "hello"}], 8, tokenizer=tokenizer)
