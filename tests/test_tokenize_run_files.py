"""Raw inputs for `packer tokenize`: every format read as rows that know their file and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packer.errors import InputError
from packer.tokenize.files import decode_rows, raw_inputs, read_batches

ROWS = [
    {"text": "one"},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
    {"prompt": "p", "completion": "c"},
]
COLUMNS = ["messages", "text", "prompt", "completion"]


def _rows(path, batch_rows: int = 1024) -> list[tuple[str, dict | str]]:
    out = []
    for i, raw in enumerate(raw_inputs([path])):
        for batch in read_batches(raw, i, COLUMNS, batch_rows=batch_rows):
            out.extend((batch.where(j), row) for j, row in enumerate(decode_rows(batch)))
    return out


def _jsonl_bytes() -> bytes:
    # a blank line keeps the line numbers of the lines after it
    return (
        json.dumps(ROWS[0]) + "\n\n" + "\n".join(json.dumps(r) for r in ROWS[1:]) + "\n"
    ).encode()


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_jsonl_rows_keep_their_line_numbers(tmp_path: Path, suffix: str):
    path = tmp_path / f"raw{suffix}"
    data = _jsonl_bytes()
    if suffix.endswith(".gz"):
        path.write_bytes(gzip.compress(data, mtime=0))
    elif suffix.endswith(".zst"):
        with pa.output_stream(str(path), compression="zstd") as out:
            out.write(data)
    else:
        path.write_bytes(data)
    got = _rows(path, batch_rows=2)
    assert [w for w, _ in got] == [f"{path}:1", f"{path}:3", f"{path}:4"]
    assert [r for _, r in got] == ROWS


def test_json_array_items_are_placed_at_their_line(tmp_path: Path):
    path = tmp_path / "raw.json"
    path.write_text('[\n  {"text": "one"},\n  {"prompt": "p",\n   "completion": "c"},\n  7\n]\n')
    got = _rows(path)
    assert got == [
        (f"{path}:2", {"text": "one"}),
        (f"{path}:3", {"prompt": "p", "completion": "c"}),
        (f"{path}:5", "expected a JSON object, got a number"),
    ]


def test_json_that_is_not_an_array_is_refused(tmp_path: Path):
    path = tmp_path / "raw.json"
    path.write_text('{"text": "one"}\n')
    with pytest.raises(InputError, match=r"raw\.json: expected a JSON array"):
        _rows(path)


def test_bad_lines_are_named_not_fatal_to_reading(tmp_path: Path):
    path = tmp_path / "raw.jsonl"
    path.write_bytes(b'{"text": "a"}\n{"text": \n[1, 2]\n\xff\xfe\n')
    got = dict(_rows(path))
    assert got[f"{path}:1"] == {"text": "a"}
    assert got[f"{path}:2"].startswith("malformed JSON (Expecting value at column")
    assert got[f"{path}:3"] == "expected a JSON object, got an array"
    assert got[f"{path}:4"].startswith("not UTF-8 text")


def test_parquet_and_arrow_rows_drop_absent_struct_fields(tmp_path: Path):
    table = pa.table(
        {
            "messages": [
                [{"role": "user", "content": "a", "name": None}],
                [{"role": "user", "content": "b", "name": "bob"}],
            ],
            "unrelated": [1, 2],
        }
    )
    pq.write_table(table, tmp_path / "raw.parquet")
    with (
        pa.OSFile(str(tmp_path / "raw.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, table.schema) as w,
    ):
        w.write_table(table)
    for name in ("raw.parquet", "raw.arrow"):
        got = _rows(tmp_path / name, batch_rows=1)
        assert got == [
            (f"{tmp_path / name}:row 1", {"messages": [{"role": "user", "content": "a"}]}),
            (
                f"{tmp_path / name}:row 2",
                {"messages": [{"role": "user", "content": "b", "name": "bob"}]},
            ),
        ]


def test_columnar_file_without_raw_columns_is_refused(tmp_path: Path):
    pq.write_table(pa.table({"input_ids": [[1, 2]]}), tmp_path / "ids.parquet")
    with pytest.raises(InputError, match="has none of the raw columns"):
        _rows(tmp_path / "ids.parquet")


def test_batches_are_cut_by_rows_and_bytes_only(tmp_path: Path):
    path = tmp_path / "raw.jsonl"
    path.write_text("".join(json.dumps({"text": "x" * (i % 7)}) + "\n" for i in range(50)))
    (raw,) = raw_inputs([path])
    sizes = [len(b.lines) for b in read_batches(raw, 0, COLUMNS, batch_rows=16)]
    assert sizes == [16, 16, 16, 2]
    small = [len(b.lines) for b in read_batches(raw, 0, COLUMNS, batch_rows=16, batch_bytes=100)]
    assert sum(small) == 50 and max(small) < 16
    assert [b.batch_index for b in read_batches(raw, 3, COLUMNS, batch_rows=16)] == [0, 1, 2, 3]


def test_directories_and_globs_expand_in_order(tmp_path: Path):
    (tmp_path / "d").mkdir()
    for name in ("b.jsonl", "a.jsonl.gz"):
        data = _jsonl_bytes()
        (tmp_path / "d" / name).write_bytes(gzip.compress(data) if name.endswith("gz") else data)
    files = raw_inputs([tmp_path / "d"])
    assert [f.path.name for f in files] == ["a.jsonl.gz", "b.jsonl"]
    with pytest.raises(InputError, match="named twice"):
        raw_inputs([tmp_path / "d", tmp_path / "d" / "b.jsonl"])
    with pytest.raises(InputError, match="no such file"):
        raw_inputs([tmp_path / "missing.json"])


def test_remote_jsonl_is_read_from_the_store(tmp_path: Path, s3):
    local = tmp_path / "src"
    local.mkdir()
    (local / "raw.jsonl").write_bytes(_jsonl_bytes())
    url = s3.put_dir(local, "raw")
    got = _rows(url + "/raw.jsonl")
    assert [w for w, _ in got] == [f"{url}/raw.jsonl:{n}" for n in (1, 3, 4)]
    assert [r for _, r in got] == ROWS
