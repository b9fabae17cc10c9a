"""Raw records that were trained wrongly, read wrongly or crashed: turn weights, JSON files with
more after their array, lone surrogate escapes, and tokenized JSONL lines holding two objects.

Each through the CLI on real files (a tiny tokenizer trained here), the packed labels read back
with pyarrow; the library's IterableDataset path where it applies.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import read_shards
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers_util import PLAIN, TAGGED, build_tokenizer

pytest.importorskip("transformers")

IGNORE = -100


@pytest.fixture(scope="module")
def toks(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("toks")
    return {
        name: build_tokenizer(root / name, t) for name, t in (("plain", PLAIN), ("tagged", TAGGED))
    }


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))


def one_error(res, exit_code: int = 1) -> str:
    assert res.exit_code == exit_code, res.stderr
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


def weighted_chat(weight=0, *, sharegpt: bool = True) -> dict:
    """Two exchanges; the first reply carries `weight` (no key when None is not meant: see
    `unweighted`)."""
    if sharegpt:
        turns = [
            {"from": "human", "value": "the way"},
            {"from": "gpt", "value": "the day", "weight": weight},
            {"from": "human", "value": "one more"},
            {"from": "gpt", "value": "water call", "weight": 1},
        ]
        return {"conversations": turns}
    turns = [
        {"role": "user", "content": "the way"},
        {"role": "assistant", "content": "the day", "weight": weight},
        {"role": "user", "content": "one more"},
        {"role": "assistant", "content": "water call"},
    ]
    return {"messages": turns}


def unweighted(chat: dict) -> dict:
    key = "conversations" if "conversations" in chat else "messages"
    return {key: [{k: v for k, v in t.items() if k != "weight"} for t in chat[key]]}


def packed_samples(out: Path) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) of every packed sample, cut at the rows' cu_seqlens."""
    table = read_shards(out)
    samples = []
    for ids, labels, cu in zip(
        table.column("input_ids").to_pylist(),
        table.column("labels").to_pylist(),
        table.column("cu_seqlens").to_pylist(),
    ):
        samples += [(ids[a:b], labels[a:b]) for a, b in zip(cu, cu[1:]) if b > a]
    return samples


def trained_text(tok, sample) -> str:
    ids, labels = sample
    assert all(lab in (IGNORE, i) for i, lab in zip(ids, labels))
    return tok.decode([lab for lab in labels if lab != IGNORE])


# ------------------------------------------------------------------------------- weights


@pytest.mark.parametrize("template", ["plain", "tagged"])
@pytest.mark.parametrize("sharegpt", [True, False], ids=["sharegpt", "openai"])
def test_a_turn_of_weight_0_is_not_trained_in_the_packed_labels(
    cli, toks, tmp_path, template, sharegpt
):
    from transformers import AutoTokenizer

    chats = tmp_path / "chats.json"
    weighted = weighted_chat(0, sharegpt=sharegpt)
    chats.write_text(json.dumps([weighted, unweighted(weighted)], indent=1))
    res = cli("pack", chats, "--tokenizer", toks[template], "-o", tmp_path / "out", "-L", "64")
    assert res.exit_code == 0, res.stderr
    tok = AutoTokenizer.from_pretrained(str(toks[template]))
    samples = packed_samples(tmp_path / "out")
    assert len(samples) == 2
    by_text = {trained_text(tok, s): s for s in samples}
    # the same ids both times; the weight-0 reply and its end-of-turn token are -100
    assert set(by_text) == {"water call<|im_end|>", "the day<|im_end|>water call<|im_end|>"}
    kept, full = by_text["water call<|im_end|>"], by_text["the day<|im_end|>water call<|im_end|>"]
    assert kept[0] == full[0]
    untrained = [i for i, (a, b) in enumerate(zip(kept[1], full[1])) if a != b]
    assert untrained and all(kept[1][i] == IGNORE for i in untrained)
    assert tok.decode([full[0][i] for i in untrained]) == "the day<|im_end|>"


def test_weight_1_and_no_weight_train_the_same_and_last_turn_weight_0_leaves_nothing(
    cli, toks, tmp_path
):
    rows = [weighted_chat(1), unweighted(weighted_chat(1)), weighted_chat(1.0)]
    raw = tmp_path / "chats.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = cli("tokenize", raw, "--tokenizer", toks["plain"], "-o", tmp_path / "out")
    assert res.exit_code == 0, res.stderr
    table = pq.read_table(sorted((tmp_path / "out").glob("part-*.parquet")))
    labels = table.column("labels").to_pylist()
    assert labels[0] == labels[1] == labels[2] and any(lab != IGNORE for lab in labels[0])
    # every reply of weight 0: no token is trained, which is refused unless allowed
    chat = weighted_chat(0)
    chat["conversations"][3]["weight"] = 0
    raw.write_text(json.dumps({"text": "the way"}) + "\n" + json.dumps(chat) + "\n")
    args = ("tokenize", raw, "--tokenizer", toks["plain"])
    assert one_error(cli(*args, "-o", tmp_path / "o2")).startswith(
        f"error: {raw}:2: no token is trained"
    )
    res = cli(*args, "-o", tmp_path / "o3", "--allow-empty-mask")
    assert res.exit_code == 0, res.stderr
    # --train-on last trains the last reply or, when its weight is 0, nothing
    chat = weighted_chat(1)
    chat["conversations"][3]["weight"] = 0
    raw.write_text(json.dumps(chat) + "\n")
    assert one_error(cli(*args, "-o", tmp_path / "o4", "--train-on", "last")).startswith(
        f"error: {raw}:1: no token is trained"
    )


def test_parquet_weights_null_where_a_turn_has_none(cli, toks, tmp_path):
    """In a Parquet column of turns, a turn without a weight reads as null: no weight."""
    from transformers import AutoTokenizer

    rows = [weighted_chat(0), unweighted(weighted_chat(0))]
    for row in rows:
        for turn in row["conversations"]:
            turn.setdefault("weight", None)
    rows[0]["conversations"][3]["weight"] = None  # the second reply: null, trained
    raw = tmp_path / "chats.parquet"
    pq.write_table(pa.Table.from_pylist(rows), raw)
    assert pa.types.is_integer(
        pq.read_schema(raw).field("conversations").type.value_type["weight"].type
    )
    res = cli("tokenize", raw, "--tokenizer", toks["plain"], "-o", tmp_path / "out")
    assert res.exit_code == 0, res.stderr
    table = pq.read_table(sorted((tmp_path / "out").glob("part-*.parquet")))
    tok = AutoTokenizer.from_pretrained(str(toks["plain"]))
    trained = [
        trained_text(tok, s)
        for s in zip(table.column("input_ids").to_pylist(), table.column("labels").to_pylist())
    ]
    assert trained == ["water call<|im_end|>", "the day<|im_end|>water call<|im_end|>"]


@pytest.mark.parametrize(
    ("value", "shown"),
    [(0.5, "0.5"), ("0", '"0"'), (True, "true"), (None, "null"), (2, "2"), (-1, "-1")],
)
def test_a_weight_other_than_0_or_1_is_refused_naming_file_line_and_turn(
    cli, toks, tmp_path, value, shown
):
    chats = tmp_path / "chats.json"
    good = unweighted(weighted_chat())
    chats.write_text("[\n" + json.dumps(good) + ",\n" + json.dumps(weighted_chat(value)) + "\n]\n")
    res = cli("pack", chats, "--tokenizer", toks["plain"], "-o", tmp_path / "out", "-L", "64")
    assert one_error(res) == (
        f"error: {chats}:3: conversations[1].weight is {shown}: a turn's weight is 0 (not "
        "trained) or 1 (trained)"
    )
    assert not (tmp_path / "out").exists()
    res = cli(
        "pack", chats, "--tokenizer", toks["plain"], "-o", tmp_path / "out", "-L", "64",
        "--on-error", "skip",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert len(packed_samples(tmp_path / "out")) == 1


def test_weight_0_with_train_on_all_is_refused(cli, toks, tmp_path):
    raw = tmp_path / "chats.jsonl"
    raw.write_text(json.dumps(weighted_chat(0)) + "\n")
    args = ("tokenize", raw, "--tokenizer", toks["plain"], "-o", tmp_path / "out")
    line = one_error(cli(*args, "--train-on", "all"))
    assert line == (
        f"error: {raw}:1: turn 1 of the chat (counting from 0) has weight 0, and --train-on all "
        "trains every token"
    )


def test_weights_in_a_conversational_completion(toks):
    from packer.tokenize.encode import Encoder
    from packer.tokenize.records import RawRecordError, to_record

    prompt = [{"role": "user", "content": "the way", "weight": 0}]
    completion = [{"role": "assistant", "content": "the day", "weight": 0}]
    record = to_record({"prompt": prompt, "completion": completion})
    assert record.untrained == {0, 1} and record.train_from == 1
    with pytest.raises(RawRecordError, match="no token is trained"):
        Encoder(toks["plain"]).encode_batch([record])
    bad = [{"role": "assistant", "content": "the day", "weight": "1"}]
    with pytest.raises(RawRecordError, match=r'^completion\[0\]\.weight is "1"'):
        to_record({"prompt": prompt, "completion": bad})


# ------------------------------------------------------------------ .json with more after it


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ('[{"text": "the way"}, {"text": "the day"}] garbage\n', 1),
        (
            '[{"text": "the way"}, {"text": "the day"}]\n[{"text": "a"}, {"text": "b"}, {"text": "c"}]\n',
            2,
        ),
        ('[{"text": "the way"}]\n\n  ,\n', 3),
    ],
    ids=["garbage", "second-array", "comma"],
)
def test_a_json_file_with_more_after_its_array_is_refused(cli, toks, tmp_path, text, line):
    raw = tmp_path / "data.json"
    raw.write_text(text)
    for skip in ((), ("--on-error", "skip")):
        res = cli("tokenize", raw, "--tokenizer", toks["plain"], "-o", tmp_path / "out", *skip)
        assert one_error(res) == (
            f"error: {raw}:{line}: more after the JSON array's closing ']': a .json file holds "
            "one array of records (records one per line are .jsonl)"
        )
        assert not (tmp_path / "out").exists()


def test_a_json_array_followed_by_whitespace_only_is_read(cli, toks, tmp_path):
    raw = tmp_path / "data.json"
    raw.write_text('\ufeff[{"text": "the way"},\n {"text": "the day"}]\n \n\t\r\n')
    res = cli("tokenize", raw, "--tokenizer", toks["plain"], "-o", tmp_path / "out")
    assert res.exit_code == 0, res.stderr
    assert pq.read_table(sorted((tmp_path / "out").glob("part-*.parquet"))).num_rows == 2


# ----------------------------------------------------------------------- lone surrogates

ESC = "\\ud800"  # as the JSON text holds it: json.loads makes a lone surrogate of it
ROWS = {  # a row with the escape somewhere, and where the message says it is
    "text": ('{"text": "a%sb"}', "text"),
    "reply": (
        '{"messages": [{"role": "user", "content": "the"}, {"role": "assistant", "content": "x%s"}]}',
        "messages[1].content",
    ),
    "system": (
        '{"messages": [{"role": "system", "content": "%s"}, {"role": "user", "content": "the"},'
        ' {"role": "assistant", "content": "way"}]}',
        "messages[0].content",
    ),
    "part": (
        '{"messages": [{"role": "user", "content": [{"type": "text", "text": "%s"}]},'
        ' {"role": "assistant", "content": "way"}]}',
        "messages[0].content[0].text",
    ),
    "prompt": ('{"prompt": "the %s", "completion": " way"}', "prompt"),
    "completion": ('{"prompt": "the", "completion": " way%s"}', "completion"),
    "sharegpt": (
        '{"conversations": [{"from": "human", "value": "the"}, {"from": "gpt", "value": "%s"}]}',
        "conversations[1].value",
    ),
    "arguments": (
        '{"messages": [{"role": "user", "content": "the"}, {"role": "assistant", "content": "",'
        ' "tool_calls": [{"function": {"name": "f", "arguments": {"city": "%s"}}}]}]}',
        "messages[1].tool_calls[0].function.arguments.city",
    ),
    "tools": (
        '{"text": "the", "tools": [{"type": "function", "function": {"name": "f%s"}}]}',
        "tools[0].function.name",
    ),
}


@pytest.mark.parametrize("kind", sorted(ROWS))
def test_a_lone_surrogate_is_named_by_file_line_and_field(cli, toks, tmp_path, kind):
    row, field = ROWS[kind]
    raw = tmp_path / "raw.jsonl"
    raw.write_text('{"text": "the way"}\n' + row % ESC + "\n")
    res = cli("tokenize", raw, "--tokenizer", toks["plain"], "-o", tmp_path / "out")
    assert one_error(res) == (
        f"error: {raw}:2: {field} holds a lone surrogate (\\ud800: half of a UTF-16 pair, not "
        "a character)"
    )
    assert not (tmp_path / "out").exists()


def test_a_lone_surrogate_in_a_key_and_a_low_one_are_named(cli, toks, tmp_path):
    raw = tmp_path / "raw.jsonl"
    key = '{"text": "the", "te\\udc00xt": 1}'
    nested = '{"text": "the", "tools": [{"na\\uDFFFme": "f"}]}'
    raw.write_text(key + "\n" + nested + "\n")
    res = cli(
        "tokenize", raw, "--tokenizer", toks["plain"], "-o", tmp_path / "out", "--on-error", "skip"
    )
    assert res.exit_code == 1  # both rows rejected: the dataset is empty
    assert "all 2 records were rejected" in res.stderr
    assert (
        f"{raw}:1: a key of the row ('te\\udc00xt') holds a lone surrogate (\\udc00" in res.stderr
    )


def test_on_error_skip_leaves_a_lone_surrogate_out_and_counts_it(cli, toks, tmp_path):
    raw = tmp_path / "raw.jsonl"
    pair = '{"text": "the \\ud83d\\ude42 way"}'  # an escaped pair is one character: kept
    raw.write_text(f'{{"text": "the way"}}\n{{"text": "a{ESC}b"}}\n{pair}\n')
    res = cli(
        "pack", raw, "--tokenizer", toks["plain"], "-o", tmp_path / "out", "-L", "64",
        "--on-error", "skip",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert "1 raw record left out" in res.stderr
    assert len(packed_samples(tmp_path / "out")) == 2
    res = cli(
        "tokenize", raw, "--tokenizer", toks["plain"], "-o", tmp_path / "t", "--on-error", "skip"
    )
    assert res.exit_code == 0 and "1 rejected" in res.stderr, res.stderr
    rejects = (tmp_path / "t" / "rejects.txt").read_text().splitlines()
    assert rejects == [
        f"{raw}:2: text holds a lone surrogate (\\ud800: half of a UTF-16 pair, not a character)"
    ]


def test_a_lone_surrogate_in_a_json_array_is_named(cli, toks, tmp_path):
    raw = tmp_path / "raw.json"
    raw.write_text(f'[\n{{"text": "the way"}},\n\n{{"text": "{ESC}"}}\n]\n')
    res = cli("tokenize", raw, "--tokenizer", toks["plain"], "-o", tmp_path / "out")
    assert one_error(res).startswith(f"error: {raw}:4: text holds a lone surrogate (\\ud800")


def test_an_iterable_dataset_row_with_a_lone_surrogate_is_named(toks):
    datasets = pytest.importorskip("datasets")
    import packer
    from packer.errors import InputError

    def rows():
        for _ in range(3):
            yield {"text": "the way"}
        yield {"text": "a\ud800b"}

    ds = datasets.IterableDataset.from_generator(rows)
    with pytest.raises(InputError) as caught:
        list(packer.pack_dataset(ds, tokenizer=str(toks["plain"]), max_len=16))
    assert str(caught.value) == (
        "row 3: text holds a lone surrogate (\\ud800: half of a UTF-16 pair, not a character)"
    )


_text = st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=4)
_json = st.recursive(
    st.none() | st.integers() | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


def _has_surrogate(value) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_text, _json, max_size=4))
def test_decoding_refuses_a_row_exactly_when_a_string_or_key_holds_a_lone_surrogate(row):
    """Whichever way the row is written (escaped, as ensure_ascii writes pairs too, or as
    UTF-8 text where it can be) and read (a JSONL line or a parsed .json item)."""
    from packer.tokenize.files import RawBatch, decode_rows

    line = json.dumps(row).encode()
    read = json.loads(line)  # a high and a low surrogate side by side are one character
    decoded = decode_rows(RawBatch(0, 0, "f", [1, 2], [line, read]))
    bad = _has_surrogate(read)
    for got in decoded:
        assert isinstance(got, str) == bad, (row, got)
        if bad:
            assert "holds a lone surrogate" in got
        else:
            assert got == read
    if not bad:  # no escapes at all: the line is not walked, and reads the same
        text = json.dumps(read, ensure_ascii=False).encode()
        assert decode_rows(RawBatch(0, 0, "f", [1], [text])) == [read]


# ------------------------------------------------------- tokenized JSONL: two objects a line


def test_two_objects_on_one_tokenized_jsonl_line_are_refused_naming_the_line(cli, tmp_path):
    raw = tmp_path / "t.jsonl"
    raw.write_text('{"input_ids": [1, 2, 3]} {"input_ids": [4, 5]}\n{"input_ids": [6, 7]}\n')
    res = cli("pack", raw, "-o", tmp_path / "out", "-L", "8")
    assert one_error(res).startswith(f"error: {raw}: line 1: malformed JSON (Extra data")
    res = cli("pack", raw, "-o", tmp_path / "out", "-L", "8", "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    assert read_shards(tmp_path / "out").column("input_ids").to_pylist()[0][:2] == [6, 7]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [i["samples"] for i in manifest["inputs"]] == [2]
    # a bad line after it is named by its own line (it was "line -1", the samples 4 of 3 lines)
    raw.write_text(raw.read_text() + '{"input_ids": [-6, 7]}\n')
    res = cli("pack", raw, "-o", tmp_path / "o2", "-L", "8", "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    rejects = (tmp_path / "o2" / "rejects.jsonl").read_text().splitlines()
    assert [(r["line"], r["reason"]) for r in map(json.loads, rejects)] == [
        (1, "malformed_json"),
        (3, "negative_id"),
    ]


@pytest.mark.parametrize("out_of_core", [False, True])
def test_two_objects_on_one_line_in_memory_and_out_of_core(tmp_path, out_of_core):
    import packer
    from packer.config import PackConfig
    from packer.errors import InputError

    raw = tmp_path / "t.jsonl"
    rows = [json.dumps({"input_ids": [i + 1, i + 2]}) for i in range(40)]
    rows[30] += ' {"input_ids": [9, 9, 9]}'
    raw.write_text("\n".join(rows) + "\n")
    with pytest.raises(InputError, match=r"line 31: malformed JSON"):
        packer.pack(
            [raw],
            tmp_path / "out",
            PackConfig(max_len=8),
            memory_budget="1MiB",
            out_of_core=out_of_core,
        )


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from([b'{"a":1}', b"", b" ", b"\r", b" \t", b"x"]), max_size=12),
    st.sampled_from([b"", b"\n", b"\n\n", b" "]),
    st.integers(1, 9),
)
def test_count_lines_counts_the_lines_a_line_scan_finds(tmp_path_factory, parts, end, chunk):
    from packer.read import formats

    data = b"\n".join(parts) + end
    path = tmp_path_factory.mktemp("c") / "c.jsonl"
    path.write_bytes(data)
    before = formats._COUNT_CHUNK
    formats._COUNT_CHUNK = chunk  # chunk edges at every place
    try:
        assert formats.count_lines(path, None) == len(formats._line_spans(data)[2])
    finally:
        formats._COUNT_CHUNK = before
