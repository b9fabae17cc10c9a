"""`packer.pack_dataset`: the same rows, bytes, statistics and errors as `packer pack`.

Every equivalence test writes the samples as JSONL, packs them with the real CLI, reads the
shards back and compares them with what `pack_dataset` returns for the same samples held as a
`datasets.Dataset`, an Arrow table, Python lists, numpy arrays or a generator.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import make_samples, python_script, read_shards, to_table, write_jsonl

import packer
from packer import pack_dataset
from packer.contract.schema import SCHEMA
from packer.errors import OptionError, OutputError, SampleError

datasets = pytest.importorskip("datasets")
datasets.disable_progress_bars()

CONTRACT = [f.name for f in SCHEMA]
REPORT_ONLY = ("seconds", "shards", "output", "timings", "skipped_inputs", "engine")


def cli_pack(cli, tmp_path, samples, *flags, name="out"):
    """(shards as one table, `--json` statistics) of `packer pack` on the samples as JSONL."""
    src = write_jsonl(tmp_path / f"{name}.jsonl", samples)
    result = cli("pack", src, "-o", tmp_path / name, "--json", *flags)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    return read_shards(tmp_path / name), {k: v for k, v in report.items() if k not in REPORT_ONLY}


def contract(table: pa.Table) -> pa.Table:
    return table.select(CONTRACT).combine_chunks()


def assert_seq_lengths(table: pa.Table) -> None:
    """seq_lengths is each row's cu_seqlens differences and sums to the row's length."""
    for row in table.select(["input_ids", "cu_seqlens", "seq_lengths"]).to_pylist():
        assert row["seq_lengths"] == list(np.diff(row["cu_seqlens"]))
        assert sum(row["seq_lengths"]) == len(row["input_ids"])


OPTIONS = [
    ("bfd", "split", False, None),
    ("bfd", "truncate", True, None),
    ("ffd", "drop", False, None),
    ("nf", "split", False, None),
    ("ff-shuffle", "split", False, 37),
    ("histogram", "truncate", False, 50),
    ("bfd", "split", True, 64),
]


@pytest.mark.parametrize(("strategy", "overlength", "pad", "window"), OPTIONS)
def test_same_rows_and_stats_as_the_cli(cli, tmp_path, strategy, overlength, pad, window):
    samples = make_samples(300, seed=4, median=30)
    flags = ["-L", "128", "--strategy", strategy, "--overlength", overlength, "--seed", "3"]
    flags += ["--pad", "--pad-id", "7"] if pad else []
    flags += ["--window", str(window)] if window else []
    shards, report = cli_pack(cli, tmp_path, samples, *flags)
    assert report["split"] + report["truncated"] + report["dropped"] > 0  # over-length present
    kwargs = dict(
        strategy=strategy, overlength=overlength, pad=pad, pad_id=7, seed=3, window=window
    )

    ds = datasets.Dataset.from_list(samples)
    packed, stats = pack_dataset(ds, 128, return_stats=True, **kwargs)
    assert isinstance(packed, datasets.Dataset)
    assert packed.column_names == CONTRACT + ["seq_lengths"]
    table = packed.data.table
    assert contract(table).equals(shards)
    assert stats == report
    assert_seq_lengths(table)

    from_table = pack_dataset(to_table(samples), 128, **kwargs)
    assert isinstance(from_table, pa.Table)
    assert from_table.equals(table)
    ids = [s["input_ids"] for s in samples]
    labels = [s["labels"] for s in samples]
    assert pack_dataset(ids, 128, labels=labels, **kwargs).equals(table)
    arrays = [np.asarray(x, np.int64) for x in ids]
    label_arrays = [np.asarray(x, np.int32) for x in labels]
    assert pack_dataset(arrays, 128, labels=label_arrays, **kwargs).equals(table)


@pytest.mark.parametrize(("strategy", "overlength"), [("bfd", "split"), ("ff-shuffle", "drop")])
@pytest.mark.parametrize("window", [40, 1000])
def test_iterable_is_packed_like_cli_window(cli, tmp_path, strategy, overlength, window):
    """A generator is packed in windows: the rows of `packer pack --window` (one window when
    the window holds everything), batch by batch."""
    samples = make_samples(400, seed=9, median=25)
    flags = ["-L", "96", "--strategy", strategy, "--overlength", overlength]
    shards, report = cli_pack(cli, tmp_path, samples, *flags, "--window", str(window))
    batches, stats = pack_dataset(
        (s["input_ids"] for s in samples),
        96,
        labels=(s["labels"] for s in samples),
        strategy=strategy,
        overlength=overlength,
        window=window,
        return_stats=True,
    )
    assert stats == {}  # filled once the iterator is exhausted
    got = list(batches)
    assert all(isinstance(b, pa.RecordBatch) for b in got)
    assert contract(pa.Table.from_batches(got)).equals(shards)
    if window == 1000:  # one window: the plan of the whole input
        report["global_rows"], report["window_cost"] = report["rows"], 0.0
    assert stats == report


def test_iterable_input_is_read_window_by_window(monkeypatch):
    """The first packed batch arrives before the input is read past its first window."""
    monkeypatch.setattr("packer.read.objects.READ_CHUNK", 50)
    pulled = [0]

    def source():
        rng = np.random.default_rng(0)
        for _ in range(5000):
            pulled[0] += 1
            yield rng.integers(0, 100, size=int(rng.integers(1, 40))).tolist()

    batches = pack_dataset(source(), 64, window=200)
    first = next(batches)
    assert first.num_rows > 0
    assert pulled[0] <= 200 + 2 * 50  # one window plus the chunk that completed it
    rest = list(batches)
    assert pulled[0] == 5000
    indices = np.concatenate([b.column("sample_index").values.to_numpy() for b in [first, *rest]])
    assert np.array_equal(np.sort(indices), np.arange(5000))  # every sample once


def test_iterable_dataset_matches_dataset_with_the_same_window():
    samples = make_samples(250, seed=2, median=20)
    ds = datasets.Dataset.from_list(samples)
    whole = pack_dataset(ds, 64, overlength="split", window=60)
    streamed = pack_dataset(ds.to_iterable_dataset(), 64, overlength="split", window=60)
    assert pa.Table.from_batches(list(streamed)).equals(whole.data.table.combine_chunks())


def test_dataset_row_order_after_select_and_shuffle():
    """A Dataset's indices mapping (select, shuffle) decides the samples and their numbering."""
    samples = make_samples(120, seed=5, median=20)
    ds = datasets.Dataset.from_list(samples).shuffle(seed=1).select(range(80))
    rows = [ds[i] for i in range(80)]
    expected = pack_dataset(
        [r["input_ids"] for r in rows], 64, labels=[r["labels"] for r in rows], overlength="split"
    )
    got = pack_dataset(ds, 64, overlength="split")
    assert got.data.table.equals(expected)


def test_other_columns_and_int64_labels(tmp_path, cli):
    """Other columns are not carried; int64 labels (datasets' default) are read like int32."""
    samples = make_samples(60, seed=8, median=20)
    rows = [dict(s, text="x" * len(s["input_ids"]), score=1.5) for s in samples]
    ds = datasets.Dataset.from_list(rows)
    assert ds.features["labels"].feature.dtype == "int64"
    shards, _ = cli_pack(cli, tmp_path, samples, "-L", "64", "--overlength", "split")
    got = pack_dataset(ds, 64, overlength="split")
    assert got.column_names == CONTRACT + ["seq_lengths"]
    assert contract(got.data.table).equals(shards)


def test_on_error_skip_names_samples(cli, tmp_path):
    samples = make_samples(50, seed=6, median=12)
    samples[3]["input_ids"] = []
    samples[3]["labels"] = []
    samples[7]["input_ids"][1] = -5
    samples[11]["labels"] = samples[11]["labels"][:-1]
    samples[20]["input_ids"][0] = 2**31
    shards, report = cli_pack(cli, tmp_path, samples, "-L", "64", "--on-error", "skip")
    packed, stats = pack_dataset(
        to_table(samples, pa.int64()), 64, on_error="skip", return_stats=True
    )
    rejects = stats.pop("rejects")
    assert stats == report
    assert contract(packed).equals(shards)
    assert [(r["sample"], r["sample_index"], r["reason"]) for r in rejects] == [
        (3, 3, "empty"),
        (7, 7, "negative_id"),
        (11, 11, "labels_length"),
        (20, 20, "id_out_of_range"),
    ]
    cli_rejects = [
        json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()
    ]
    assert [r["message"] for r in rejects] == [r["message"] for r in cli_rejects]


# --------------------------------------------------------------------------------------------
# Errors: packer's ValueError subclasses, the CLI's words, "sample N" for the place


def cli_error(cli, tmp_path, samples, *flags) -> str:
    """The problem part of the CLI's one error line (after `FILE: line N: `)."""
    src = write_jsonl(tmp_path / "bad.jsonl", samples)
    result = cli("pack", src, "-o", tmp_path / "bad-out", "-L", "16", *flags)
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    return line


BAD = {
    "negative id": (lambda s: s[4]["input_ids"].__setitem__(2, -3), 4),
    "id over int32": (lambda s: s[4]["input_ids"].__setitem__(0, 2**31), 4),
    "empty sample": (lambda s: s[6].update(input_ids=[], labels=[]), 6),
    "labels of another length": (lambda s: s[2].update(labels=s[2]["labels"] + [1]), 2),
    "negative label": (lambda s: s[5]["labels"].__setitem__(0, -7), 5),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_samples_raise_sample_error_with_the_cli_message(cli, tmp_path, case):
    samples = make_samples(10, seed=1, median=6, max_len=16)
    spoil, index = BAD[case]
    spoil(samples)
    line = cli_error(cli, tmp_path, samples)
    assert f"bad.jsonl: line {index + 1}: " in line
    problem = line.split(f"line {index + 1}: ", 1)[1]
    inputs = {
        "table": to_table(samples, pa.int64()),
        "lists": [s["input_ids"] for s in samples],
        "dataset": datasets.Dataset.from_list(samples),
    }
    for kind, data in inputs.items():
        extra = {"labels": [s["labels"] for s in samples]} if kind == "lists" else {}
        with pytest.raises(SampleError) as info:
            pack_dataset(data, 16, **extra)
        assert isinstance(info.value, ValueError)
        assert str(info.value) == f"sample {index}: {problem}", kind
        assert "Traceback" not in str(info.value)


def test_overlength_error_names_the_first_sample(cli, tmp_path):
    samples = make_samples(30, seed=3, median=10, max_len=16)
    samples[9]["input_ids"] = list(range(40))
    samples[9]["labels"] = list(range(40))
    line = cli_error(cli, tmp_path, samples)
    assert "1 sample(s) are longer than --max-len 16 (longest 40 tokens, first at " in line
    problem = line.split("error: ", 1)[1]
    with pytest.raises(SampleError) as info:
        pack_dataset([s["input_ids"] for s in samples], 16)
    cli_place = str(tmp_path / "bad.jsonl") + ": line 10"
    library = problem.replace(cli_place, "sample 9")  # the parameters where the CLI has flags
    library = library.replace("--max-len", "max_len").replace("--overlength", "overlength")
    assert str(info.value) == library


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([1, 2.5, 3], "'input_ids'[1] is 2.5, not an integer"),
        ([1, True], "'input_ids'[1] is true, not an integer"),
        ("abc", "'input_ids' must be a list of integers, got str"),
        ([1, "a"], "'input_ids'[1] is \"a\", not an integer"),
        ([1, 2**70], "does not fit a 32-bit token id"),
        (None, "no 'input_ids' in this sample"),
    ],
)
def test_python_values_that_are_not_token_lists(value, words):
    data = [[1, 2], [3], value, [4, 5]]
    with pytest.raises(SampleError) as info:
        pack_dataset(data, 8)
    assert str(info.value).startswith("sample 2: ")
    assert words in str(info.value)
    # skipped, the others are packed with their own indices
    packed, stats = pack_dataset(data, 8, on_error="skip", return_stats=True)
    assert stats["rejected"] == 1 and stats["samples_packed"] == 3
    assert sorted(packed.column("sample_index").combine_chunks().values.to_pylist()) == [0, 1, 3]


def test_missing_and_mistyped_columns():
    table = pa.table({"tokens": [[1, 2], [3]]})
    with pytest.raises(
        OptionError,
        match=r"^the input has no 'input_ids' column \(it has: tokens\); name the column with "
        "input_column$",
    ):
        pack_dataset(table, 8)
    assert pack_dataset(table, 8, input_column="tokens").num_rows == 1
    with pytest.raises(SampleError, match="column 'input_ids' has type string"):
        pack_dataset(pa.table({"input_ids": ["a", "b"]}), 8)
    with pytest.raises(OptionError, match="no 'input_ids' column .* tokenize them first"):
        pack_dataset(datasets.Dataset.from_dict({"text": ["a"]}), 8)


def test_bad_options_raise_option_error():
    for kwargs, words in [
        (dict(max_len=0), "max_len must be at least 1, got 0"),
        (dict(max_len="8"), "max_len must be an integer, got '8'"),
        (dict(max_len=8.0), "max_len must be an integer, got 8.0"),
        (dict(max_len=8, strategy="best"), "unknown strategy 'best'"),
        (dict(max_len=8, overlength="cut"), "unknown overlength 'cut'"),
        (dict(max_len=8, on_error="ignore"), "unknown on_error 'ignore'"),
        (dict(max_len=8, window=0), "window must be at least 1"),
        (dict(max_len=8, window="a"), "window must be an integer, got 'a'"),
        (dict(max_len=8, pad="yes"), "pad must be True or False, got 'yes'"),
        (dict(max_len=8, pad=True, pad_id=1.5), "pad_id must be an integer, got 1.5"),
        (dict(max_len=8, seed="a"), "seed must be an integer, got 'a'"),
        (dict(max_len=8, seed=-1), "seed must be at least 0, got -1"),
        (dict(max_len=8, input_column=3), "input_column must be a non-empty string, got 3"),
        (dict(max_len=8, workers=0), "workers must be at least 1, got 0"),
        (dict(max_len=8, workers="a"), "workers must be an integer, got 'a'"),
        (dict(max_len=8, labels=5), "labels must be label lists parallel to data's samples"),
        (dict(max_len=8, labels=[[1]]), "labels has 1 entries but there are 2 samples"),
    ]:
        with pytest.raises(OptionError) as info:
            pack_dataset([[1, 2], [3]], **kwargs)
        assert isinstance(info.value, ValueError)
        assert str(info.value).startswith(words), str(info.value)
        assert "--" not in str(info.value)  # the parameter, never the CLI's flag
    with pytest.raises(OptionError, match="data must be"):
        pack_dataset(42, 8)


def test_empty_inputs():
    with pytest.raises(SampleError, match="the dataset is empty"):
        pack_dataset([], 8)
    with pytest.raises(SampleError, match="the dataset is empty"):
        list(pack_dataset(iter([]), 8))
    with pytest.raises(SampleError, match=r"all 2 samples were rejected \(empty: 2\)"):
        list(pack_dataset(iter([[], []]), 8, on_error="skip"))
    # every sample dropped as over-length: no rows, but a valid (empty) table
    packed, stats = pack_dataset([[1] * 9], 8, overlength="drop", return_stats=True)
    assert packed.num_rows == 0 and stats["dropped"] == 1
    assert packed.schema.names == CONTRACT + ["seq_lengths"]


def test_errors_in_a_stream_are_raised_when_reached():
    batches = pack_dataset(iter([[1, 2], [3], [-1]]), 8, window=1)
    with pytest.raises(SampleError, match=r"^sample 2: 'input_ids'\[0\] = -1 is a negative"):
        list(batches)


def test_importing_packer_imports_neither_datasets_nor_torch():
    code = (
        "import sys, packer; packer.pack_dataset([[1, 2]], 4); "
        "print(sorted(m for m in ('datasets', 'torch', 'transformers') if m in sys.modules))"
    )
    out = python_script(code, check=True)
    assert out.stdout.strip() == "[]"


def test_output_is_built_on_one_set_of_buffers(monkeypatch):
    """No per-sample objects and no copy: the record batches (the shards' batches, here of
    16 rows) are consecutive views of one buffer per column."""
    monkeypatch.setattr("packer.write.shards.BATCH_TOKENS", 16 * 64)
    samples = make_samples(300, seed=7, median=40)
    table = pack_dataset(to_table(samples), 64, overlength="split")
    for name in ("input_ids", "labels", "position_ids", "sample_index"):
        chunks = table.column(name).chunks
        assert len(chunks) == -(-table.num_rows // 16) > 5
        starts = [c.values.buffers()[1].address + c.values.offset * 4 for c in chunks]
        ends = [a + c.values.nbytes for a, c in zip(starts, chunks)]
        assert starts[1:] == ends[:-1]  # each batch starts where the previous one ended
    assert packer.pack_dataset is pack_dataset


# --------------------------------------------------------------------------------------------
# A file-backed Dataset is packed to a cache file beside its own (as `Dataset.map` does), through
# reused buffers, and comes back memory-mapped: the same rows and bytes as in memory


def on_disk(samples: list[dict], directory, how: str):
    """The samples as a file-backed Dataset in `directory`: `Dataset.from_file` over an Arrow
    stream, or `save_to_disk` + `load_from_disk`."""
    if how == "from_file":
        directory.mkdir(parents=True)
        path = directory / "data.arrow"
        table = datasets.Dataset.from_list(samples).data.table
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table, max_chunksize=37)
        return datasets.Dataset.from_file(str(path))
    datasets.Dataset.from_list(samples).save_to_disk(str(directory))
    return datasets.load_from_disk(str(directory))


def cache_file(packed) -> Path:
    (entry,) = packed.cache_files
    return Path(entry["filename"])


def assert_same_tables(got: pa.Table, expected: pa.Table) -> None:
    """Equal tables, column by column, with the same record batches."""
    assert got.equals(expected)
    assert got.column_names == expected.column_names == CONTRACT + ["seq_lengths"]
    for name in expected.column_names:
        assert got.column(name).type == expected.column(name).type, name
        assert got.column(name).equals(expected.column(name)), name
    assert [b.num_rows for b in got.to_batches()] == [b.num_rows for b in expected.to_batches()]


def stream_bytes(table: pa.Table) -> bytes:
    """The table's record batches as one Arrow IPC stream of the result schema."""
    schema = SCHEMA.append(pa.field("seq_lengths", pa.list_(pa.int32())))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in table.replace_schema_metadata(None).to_batches():
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


FILE_OPTIONS = [
    dict(overlength="split"),
    dict(overlength="truncate", pad=True, pad_id=7),
    dict(strategy="ff-shuffle", overlength="drop", seed=3, shard_rows=None),
]


@pytest.mark.parametrize("io", ["direct", "buffered"])
@pytest.mark.parametrize("how", ["from_file", "load_from_disk"])
@pytest.mark.parametrize("options", FILE_OPTIONS, ids=["split", "pad", "shuffle-drop"])
def test_file_backed_dataset_is_packed_to_a_cache_file(monkeypatch, tmp_path, how, options, io):
    """Many record batches (of 4 rows), staged 8 KiB at a time around the page cache, or
    written through it (where the file system refuses O_DIRECT) with a flush every batch or
    so: the file holds the rows, record batches and bytes of the in-memory result, beside the
    input, with nothing else."""
    from packer.write import direct

    options = {k: v for k, v in options.items() if k != "shard_rows"}
    monkeypatch.setattr("packer.write.shards.BATCH_TOKENS", 4 * 128)
    monkeypatch.setattr("packer.write.cache_file.SYNC_BYTES", 4096)
    monkeypatch.setattr(direct, "STAGE_BYTES", 8192)
    if io == "buffered":
        monkeypatch.delattr(os, "O_DIRECT", raising=False)
    files = []
    real_close = direct.DirectFile.close

    def close(self):
        files.append((self.path.name, self.direct))
        real_close(self)

    monkeypatch.setattr(direct.DirectFile, "close", close)
    syncs, heads = [], []
    real_fsync = packer.write.shards.fsync_file

    def fsync_file(path, drop_cache=False, keep=()):
        syncs.append((Path(path).name, drop_cache))
        heads.append(list(keep))
        real_fsync(path, drop_cache, keep)

    monkeypatch.setattr(packer.write.shards, "fsync_file", fsync_file)
    samples = make_samples(300, seed=4, median=30)
    ds = on_disk(samples, tmp_path / "in", how)
    before = set(os.listdir(tmp_path / "in"))

    packed, stats = pack_dataset(ds, 128, return_stats=True, **options)
    memory, memory_stats = pack_dataset(ds, 128, return_stats=True, keep_in_memory=True, **options)

    path = cache_file(packed)
    assert path.parent == tmp_path / "in"
    assert path.name == f"cache-packer-{packed._fingerprint}.arrow"
    assert packed._fingerprint == memory._fingerprint
    assert set(os.listdir(tmp_path / "in")) == before | {path.name}  # no temporary file left
    assert memory.cache_files == []
    assert stats == memory_stats
    assert packed.num_rows == memory.num_rows == stats["rows"] > 10
    assert_same_tables(packed.data.table, memory.data.table)
    assert packed["sample_index"] == memory["sample_index"]  # the same rows in the same order
    assert path.read_bytes() == stream_bytes(memory.data.table)
    # read back on its own: what datasets and pyarrow find in the file
    again = datasets.Dataset.from_file(str(path))
    assert_same_tables(again.data.table, memory.data.table)
    assert pa.ipc.open_stream(str(path)).read_all().equals(memory.data.table)
    (name, went_direct), *others = files
    assert not others and name.startswith(f".{path.name}.packer-tmp-")
    if io == "direct":
        if not went_direct:
            pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT")
        assert len(path.read_bytes()) > 4 * 8192  # several stages, then a tail cut to size
        assert syncs == [(name, True)]  # synced once, complete; nothing was cached to drop
        return
    assert not went_direct
    # flushed and dropped from the page cache as it was written, not only once at the end
    assert len(syncs) > 2 and {s for s in syncs} == {(syncs[0][0], True)}
    assert syncs[0][0] == name
    # what stays cached: the start of every IPC message (schema, then one per record batch,
    # each opening with the 0xFFFFFFFF continuation marker), and the end-of-stream mark
    data = path.read_bytes()
    *messages, tail = heads[-1]
    assert len(messages) == 1 + len(memory.data.table.to_batches())
    assert all(data[m : m + 4] == b"\xff\xff\xff\xff" for m in messages)
    assert tail == max(0, len(data) - 8192) and data.endswith(b"\xff\xff\xff\xff\0\0\0\0")
    assert all(h == heads[-1][: len(h)] for h in heads[:-1])  # each sync keeps the heads so far


def test_cache_file_bytes_do_not_depend_on_the_workers(monkeypatch, tmp_path):
    """Every worker gathers (batch k on thread k % workers), the writes stay in order."""
    from packer import workers as workers_mod
    from packer.write import direct

    monkeypatch.setattr("packer.write.shards.BATCH_TOKENS", 4 * 128)
    monkeypatch.setattr(direct, "STAGE_BYTES", 8192)
    ds = on_disk(make_samples(400, seed=6, median=30), tmp_path / "in", "from_file")
    files = {}
    try:
        for workers in (1, 2, 3):
            target = tmp_path / f"w{workers}.arrow"
            pack_dataset(ds, 128, overlength="split", workers=workers, cache_file_name=target)
            files[workers] = target.read_bytes()
    finally:
        workers_mod.configure(None)
    assert len(files[1]) > 10 * 8192
    assert files[1] == files[2] == files[3]


def test_cache_file_is_written_afresh_with_the_same_bytes(tmp_path):
    """Same input and options, same bytes; a file already there (even a stale or broken one) is
    replaced, never reused."""
    ds = on_disk(make_samples(200, seed=1, median=30), tmp_path / "in", "from_file")
    first = pack_dataset(ds, 128, overlength="split")
    path = cache_file(first)
    data, inode = path.read_bytes(), path.stat().st_ino
    second = pack_dataset(ds, 128, overlength="split")
    assert cache_file(second) == path
    assert path.stat().st_ino != inode and path.read_bytes() == data
    assert first.data.table.equals(second.data.table)  # the first mapping is still intact
    path.write_bytes(b"not arrow")
    third = pack_dataset(ds, 128, overlength="split")
    assert path.read_bytes() == data and third.data.table.equals(first.data.table)
    other = pack_dataset(ds, 128, overlength="truncate")
    assert cache_file(other) != path and other._fingerprint != first._fingerprint


def test_selected_and_shuffled_file_backed_dataset(tmp_path):
    ds = on_disk(make_samples(150, seed=5, median=20), tmp_path / "in", "load_from_disk")
    ds = ds.shuffle(seed=1).select(range(90))
    packed = pack_dataset(ds, 64, overlength="split")
    memory = pack_dataset(ds, 64, overlength="split", keep_in_memory=True)
    assert cache_file(packed).parent == tmp_path / "in"
    assert_same_tables(packed.data.table, memory.data.table)


def test_no_rows_is_an_empty_cache_file(tmp_path):
    ds = on_disk([{"input_ids": [1] * 9}, {"input_ids": [2] * 10}], tmp_path / "in", "from_file")
    packed, stats = pack_dataset(ds, 8, overlength="drop", return_stats=True)
    assert packed.num_rows == 0 and stats["dropped"] == 2
    assert cache_file(packed).is_file()
    assert packed.column_names == CONTRACT + ["seq_lengths"]
    memory = pack_dataset(ds, 8, overlength="drop", keep_in_memory=True)
    assert cache_file(packed).read_bytes() == stream_bytes(memory.data.table)


def test_in_memory_inputs_and_keep_in_memory_write_no_file(tmp_path):
    samples = make_samples(80, seed=2, median=20)
    ds = on_disk(samples, tmp_path / "in", "from_file")
    before = sorted(os.listdir(tmp_path / "in"))
    kept = pack_dataset(ds, 64, overlength="split", keep_in_memory=True)
    assert kept.cache_files == [] and sorted(os.listdir(tmp_path / "in")) == before
    in_memory = pack_dataset(datasets.Dataset.from_list(samples), 64, overlength="split")
    assert in_memory.cache_files == []
    assert in_memory.data.table.equals(kept.data.table)
    assert isinstance(pack_dataset(to_table(samples), 64, overlength="split"), pa.Table)
    lists = [s["input_ids"] for s in samples]
    assert isinstance(pack_dataset(lists, 64, overlength="split", keep_in_memory=True), pa.Table)
    assert sorted(os.listdir(tmp_path / "in")) == before


def test_cache_file_name_chooses_the_path(tmp_path):
    samples = make_samples(80, seed=2, median=20)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for i, ds in enumerate(
        [on_disk(samples, tmp_path / "in", "from_file"), datasets.Dataset.from_list(samples)]
    ):
        target = elsewhere / f"packed-{i}.arrow"
        packed = pack_dataset(ds, 64, overlength="split", cache_file_name=str(target))
        assert cache_file(packed) == target
        memory = pack_dataset(ds, 64, overlength="split", keep_in_memory=True)
        assert packed.data.table.equals(memory.data.table)
    # an in-memory Dataset goes to a file only when asked
    assert pack_dataset(ds, 64, overlength="split").cache_files == []
    assert sorted(os.listdir(elsewhere)) == ["packed-0.arrow", "packed-1.arrow"]
    assert sorted(os.listdir(tmp_path / "in")) == ["data.arrow"]


def test_cache_options_that_cannot_work(tmp_path):
    ds = datasets.Dataset.from_list(make_samples(10, seed=2, median=5))
    with pytest.raises(OptionError, match="either keep_in_memory=True or cache_file_name="):
        pack_dataset(ds, 64, keep_in_memory=True, cache_file_name=str(tmp_path / "x.arrow"))
    with pytest.raises(OptionError, match="cache_file_name= is for a datasets.Dataset; a list"):
        pack_dataset([[1, 2]], 64, cache_file_name=str(tmp_path / "x.arrow"))
    assert list(tmp_path.iterdir()) == []


def test_disabled_caching_writes_to_the_temporary_cache_directory(tmp_path):
    """As `Dataset.map`: with caching off, the file goes to datasets' temporary directory."""
    ds = on_disk(make_samples(80, seed=2, median=20), tmp_path / "in", "from_file")
    datasets.disable_caching()
    try:
        packed = pack_dataset(ds, 64, overlength="split")
    finally:
        datasets.enable_caching()
    from datasets.fingerprint import get_temporary_cache_files_directory

    assert cache_file(packed).parent == Path(get_temporary_cache_files_directory())
    assert sorted(os.listdir(tmp_path / "in")) == ["data.arrow"]


def test_sample_errors_of_a_file_backed_dataset_write_nothing(tmp_path):
    samples = make_samples(40, seed=2, median=10)
    samples[6]["input_ids"] = []
    ds = on_disk(samples, tmp_path / "in", "from_file")
    with pytest.raises(SampleError, match=r"^sample 6: empty sample"):
        pack_dataset(ds, 64, overlength="split")
    assert sorted(os.listdir(tmp_path / "in")) == ["data.arrow"]


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to read-only dirs"
)
def test_read_only_cache_directory_is_an_output_error(tmp_path):
    ds = on_disk(make_samples(80, seed=2, median=20), tmp_path / "in", "from_file")
    (tmp_path / "in").chmod(0o555)
    try:
        with pytest.raises(OutputError) as info:
            pack_dataset(ds, 64, overlength="split")
        entries = sorted(os.listdir(tmp_path / "in"))
    finally:
        (tmp_path / "in").chmod(0o755)
    path = (
        tmp_path
        / "in"
        / f"cache-packer-{pack_dataset(ds, 64, overlength='split')._fingerprint}.arrow"
    )
    message = str(info.value)
    assert message.startswith(f"{path}: cannot write the packed dataset: Permission denied")
    assert message.endswith("; nothing was written") and "\n" not in message
    assert entries == ["data.arrow"]


def test_cache_file_in_a_missing_directory_is_an_output_error(tmp_path):
    """(Runs as root too, where a read-only directory is writable.)"""
    ds = datasets.Dataset.from_list(make_samples(20, seed=2, median=10))
    path = tmp_path / "missing" / "packed.arrow"
    with pytest.raises(OutputError) as info:
        pack_dataset(ds, 64, overlength="split", cache_file_name=path)
    message = str(info.value)
    assert message.startswith(f"{path}: cannot write the packed dataset: No such file or directory")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "error", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()]
)
def test_a_failed_write_leaves_nothing(monkeypatch, tmp_path, error):
    """A failure after some batches were written (a full disk, Ctrl-C) removes the temporary
    file, leaves no cache file, and does not replace an earlier complete one."""
    from packer.write.shard_file import ShardWriter

    monkeypatch.setattr("packer.write.shards.BATCH_TOKENS", 4 * 128)
    ds = on_disk(make_samples(300, seed=4, median=30), tmp_path / "in", "from_file")
    real_add, adds = ShardWriter.add, []

    def add(self, *args):
        adds.append(self.path.name)
        if len(adds) == 3:
            raise error
        return real_add(self, *args)

    monkeypatch.setattr(ShardWriter, "add", add)
    kind = OutputError if isinstance(error, OSError) else KeyboardInterrupt
    with pytest.raises(kind) as info:
        pack_dataset(ds, 128, overlength="split")
    if kind is OutputError:
        assert "cannot write the packed dataset: No space left on device" in str(info.value)
    assert sorted(os.listdir(tmp_path / "in")) == ["data.arrow"]
    # an earlier complete file stays as it was
    monkeypatch.setattr(ShardWriter, "add", real_add)
    path = cache_file(pack_dataset(ds, 128, overlength="split"))
    data = path.read_bytes()
    monkeypatch.setattr(ShardWriter, "add", add)
    adds.clear()
    with pytest.raises(kind):
        pack_dataset(ds, 128, overlength="split")
    assert path.read_bytes() == data
    assert sorted(os.listdir(tmp_path / "in")) == sorted(["data.arrow", path.name])


def test_temporary_files_of_dead_runs_are_removed(tmp_path):
    ds = on_disk(make_samples(80, seed=2, median=20), tmp_path / "in", "from_file")
    name = f"cache-packer-{pack_dataset(ds, 64, keep_in_memory=True, overlength='split')._fingerprint}.arrow"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = tmp_path / "in" / f".{name}.packer-tmp-{dead.stdout.strip()}-0badc0de"
    alive = tmp_path / "in" / f".{name}.packer-tmp-{os.getpid()}-0badc0de"
    stale.write_bytes(b"partial")
    alive.write_bytes(b"being written")
    pack_dataset(ds, 64, overlength="split")
    assert sorted(os.listdir(tmp_path / "in")) == sorted(["data.arrow", name, alive.name])


# --------------------------------------------------------------------------------------------
# Training on the returned Dataset: TRL's padding-free collator and packer's own collator give
# a tiny random Llama the loss of every sample run alone (CPU, fp32, sdpa)

VOCAB = 1000
TOL = 1e-5


@pytest.fixture(scope="module")
def training(one_torch_thread):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from packer.torch.tiny_model import build_tiny_model

    samples = make_samples(40, seed=11, median=16, vocab=VOCAB)  # a few longer than a row
    model = build_tiny_model(seed=0, vocab_size=VOCAB, hidden_size=32, max_positions=256)
    return samples, model


def reference_loss(model, samples, rows) -> float:
    """Token-weighted mean loss of every packed piece run alone, from the source samples."""
    import torch

    from packer.torch import sum_token_loss

    total, count = 0.0, 0
    for row in rows:
        n_real = len(row["sample_index"])
        for index, offset, n in zip(
            row["sample_index"], row["sample_offset"], row["seq_lengths"][:n_real]
        ):
            sample = samples[index]
            ids = torch.tensor(sample["input_ids"][offset : offset + n])[None]
            labels = torch.tensor(sample["labels"][offset : offset + n])[None]
            labels[0, 0] = -100  # the contract: a piece's first token is never a target
            with torch.no_grad():
                total += sum_token_loss(model(input_ids=ids).logits, labels).item()
            count += int((labels[0, 1:] != -100).sum())
    return total / count


def model_loss(model, batch) -> float:
    """The loss as a trainer computes it: HF Trainer and TRL call the model with use_cache=False
    (with the default cache, transformers skips its packed-sample detection and leaks)."""
    import torch

    with torch.no_grad():
        return model(**{**batch, "use_cache": False}).loss.item()


@pytest.mark.parametrize("pad", [False, True])
def test_trl_padding_free_collator_keeps_samples_apart(training, pad):
    pytest.importorskip("trl")
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from packer.torch import collate_packed

    samples, model = training
    packed = pack_dataset(datasets.Dataset.from_list(samples), 80, overlength="split", pad=pad)
    rows = [packed[i] for i in (0, 1, len(packed) - 1)]
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
    reference = reference_loss(model, samples, rows)
    assert abs(model_loss(model, batch) - reference) <= TOL
    # TRL rebuilds positions from seq_lengths: they are packer's position_ids, and its
    # boundaries are packer's (padding, when stored, is one more sequence of -100 labels)
    flat = [p for r in rows for p in r["position_ids"]]
    assert batch["position_ids"][0].tolist() == flat
    assert batch["labels"][0].tolist() == [x for r in rows for x in r["labels"]]
    if not pad:
        assert torch.equal(batch["cu_seq_lens_q"], collate_packed(rows)["cu_seq_lens_q"])
    # negative control: the same tokens as one sequence leak across samples
    plain = dict(batch, position_ids=torch.arange(len(flat))[None])
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx"):
        plain.pop(key)
    assert abs(model_loss(model, plain) - reference) > TOL


@pytest.mark.parametrize("mode", ["flatten", "pad"])
def test_packer_collator_on_the_returned_dataset(training, mode):
    from packer.torch import collate_packed, model_inputs

    samples, model = training
    packed = pack_dataset(datasets.Dataset.from_list(samples), 80, overlength="split")
    rows = [packed[i] for i in (0, 2, len(packed) - 1)]
    batch = collate_packed(rows, mode)
    assert batch["num_loss_tokens"] == sum(r["num_loss_tokens"] for r in rows)
    loss = model_loss(model, model_inputs(batch))
    assert abs(loss - reference_loss(model, samples, rows)) <= TOL


@pytest.mark.filterwarnings("ignore:'pin_memory' argument:UserWarning")  # CPU-only machine
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_sft_trainer_padding_free_batch_has_the_per_sample_loss(training, tmp_path):
    """SFTTrainer(padding_free=True) on the returned Dataset as is: its own collator and column
    handling; one batch holding every row gives the mean loss of every sample alone."""
    pytest.importorskip("trl")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    samples, model = training
    packed = pack_dataset(datasets.Dataset.from_list(samples), 80, overlength="split")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0, "<unk>": 1}, unk_token="<unk>")),
        pad_token="<pad>",
    )
    config = SFTConfig(
        output_dir=str(tmp_path / "sft"),
        padding_free=True,
        max_length=None,  # the rows are packed already
        per_device_train_batch_size=len(packed),
        report_to="none",
        bf16=False,
        dataset_kwargs={"skip_prepare_dataset": True},
    )
    trainer = SFTTrainer(model=model, args=config, processing_class=tokenizer, train_dataset=packed)
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape == (1, sum(len(ids) for ids in packed["input_ids"]))
    assert "attention_mask" not in batch
    model.eval()
    reference = reference_loss(model, samples, [packed[i] for i in range(len(packed))])
    assert abs(model_loss(model, batch) - reference) <= TOL


def test_readme_python_snippet_runs(capsys):
    """The README's `pack_dataset` example runs and prints what the text says it does."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Python: `pack_dataset`") :]
    section = section[: section.index("\n## ", 1)]
    (code,) = re.findall(r"<!-- runnable -->\n```python\n(.*?)```", section, re.S)
    scope: dict = {"__name__": "__snippet__"}
    exec(compile(code, "<README Python>", "exec"), scope)  # noqa: S102
    assert capsys.readouterr().out.split() == ["3", "0.833333", "[2]"]
    assert scope["table"].column("labels").to_pylist() == [[-100, 2, 3, -100, 5]]
