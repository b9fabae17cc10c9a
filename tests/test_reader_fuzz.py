"""Hypothesis-generated JSONL, some lines broken, fed to the reader.

The reader must either return exactly the valid samples (with `--on-error skip`, or when all are
valid) or raise `InputError` naming the first bad line; never any other exception.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packer.errors import InputError, OptionError
from packer.read.assemble import read_samples

ids = st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=8)
valid_line = ids.map(lambda x: json.dumps({"input_ids": x}))
printable = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=30)
broken_line = st.one_of(
    valid_line.flatmap(lambda s: st.integers(1, len(s) - 1).map(lambda k: s[:k])),  # truncated
    st.lists(st.integers(-(2**70), -1), min_size=1, max_size=3).map(
        lambda x: json.dumps({"input_ids": [1, *x]})
    ),  # negative ids
    st.lists(st.integers(2**31, 2**70), min_size=1, max_size=3).map(
        lambda x: json.dumps({"input_ids": x})
    ),  # too large
    st.just('{"input_ids": []}'),
    st.just('{"input_ids": null}'),
    st.just('{"other": [1, 2]}'),
    st.just("[1, 2, 3]"),
    st.just('{"input_ids": [1, null]}'),
    st.floats(allow_nan=False, allow_infinity=False).map(
        lambda f: json.dumps({"input_ids": [1, f]})
    ),
    printable.map(lambda t: json.dumps({"input_ids": t})),  # a string, not a list
    st.just('{"input_ids": [true]}'),
    st.just('{"input_ids": [[1]]}'),
    printable,  # anything, sometimes blank, sometimes valid JSON that is not a sample
)
line = st.one_of(valid_line, valid_line, valid_line, broken_line, st.just(""))


def reference(lines: list[str]) -> tuple[list[tuple[int, list[int] | None]], int | None]:
    """[(line number, ids or None if bad)] for the non-blank lines, and the first bad line."""
    out, first_bad = [], None
    for n, text in enumerate(lines, start=1):
        if not text.strip(" \t"):
            continue
        ok = None
        try:
            obj = json.loads(text)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            v = obj.get("input_ids")
            if (
                isinstance(v, list)
                and v
                and all(
                    isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**31 for x in v
                )
            ):
                ok = v
        out.append((n, ok))
        if ok is None and first_bad is None:
            first_bad = n
    return out, first_bad


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(line, max_size=25), on_error=st.sampled_from(["error", "skip"]))
def test_reader_packs_valid_samples_or_fails_cleanly(tmp_path, lines, on_error):
    path = tmp_path / "fuzz.jsonl"
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    expected, first_bad = reference(lines)
    valid = [(i, v) for i, (_, v) in enumerate(expected) if v is not None]
    try:
        samples = read_samples([path], labels_column=None, on_error=on_error)
    except OptionError as exc:  # no line has the key: a column option names no column
        assert not valid and "has no 'input_ids' column (no line has it" in str(exc)
        return
    except InputError as exc:
        message = str(exc)
        assert "\n" not in message
        if "no sample has 'input_ids'" in message:  # a file-level error: no line has the key
            assert not valid and exc.where == str(path)
        elif on_error == "error" and first_bad is not None:
            assert exc.where == f"{path}: line {first_bad}", message
        else:
            assert not valid, message  # the only other failure: nothing valid to pack
            assert "the dataset is empty" in message
        return
    assert valid, "an empty or all-bad input must fail"
    assert on_error == "skip" or first_bad is None
    got = [samples.tokens[a:b].tolist() for a, b in zip(samples.offsets[:-1], samples.offsets[1:])]
    assert got == [v for _, v in valid]
    index = samples.index if samples.index is not None else np.arange(samples.num_samples)
    assert index.tolist() == [i for i, _ in valid]
    assert samples.num_input_samples == len(expected)
    if on_error == "skip":
        bad_lines = [n for n, v in expected if v is None]
        assert [r["line"] for r in samples.rejects.records] == bad_lines
        assert sum(samples.rejects.counts.values()) == len(bad_lines)


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_compressed_file_with_a_broken_line(tmp_path, compress):
    from conftest import write_jsonl

    samples = [{"input_ids": [i + 1] * (i + 1)} for i in range(50)]
    path = write_jsonl(
        tmp_path / f"a.jsonl.{'gz' if compress == 'gzip' else 'zst'}", samples, compress=compress
    )
    import gzip

    import pyarrow as pa

    text = b"".join(json.dumps(s).encode() + b"\n" for s in samples)
    text = text.replace(b'{"input_ids": [7, 7, 7, 7, 7, 7, 7]}', b'{"input_ids": [7, 7,')
    if compress == "gzip":
        path.write_bytes(gzip.compress(text))
    else:
        with pa.output_stream(str(path), compression="zstd") as out:
            out.write(text)
    with pytest.raises(InputError) as err:
        read_samples([path])
    assert err.value.where == f"{path}: line 7"
    got = read_samples([path], on_error="skip")
    assert got.num_samples == 49 and got.index.tolist() == [i for i in range(50) if i != 6]
