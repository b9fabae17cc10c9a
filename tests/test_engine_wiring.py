"""The tokenizer engine in packer's raw front end (`--tokenizer-engine`, `tokenizer_engine=`):
the same ids, labels and bytes with `hf` and `fastokens`; `auto` falls back to `hf` with one
line per run; `fastokens` refuses in one line naming the flag; the tokenize cache is shared by
the engines; and a `tokenizer.json` that turns padding or truncation on changes no sample.

The tokenizer is a byte-level BPE trained here (tests/tokenizers_util.py), which fastokens
loads; with an NFKC normalizer added, it is one fastokens cannot load."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("fastokens")

from tokenizers_util import EOS, TEMPLATES, build_tokenizer, generated_chat  # noqa: E402

from packer.errors import EXIT_FAILURE  # noqa: E402
from packer.tokenize import Encoder, to_record  # noqa: E402
from packer.tokenize.engines import EngineError, FastokensEngine, NotProven  # noqa: E402

FALLBACK = "--tokenizer-engine auto: tokenizing with hf, not fastokens ("


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "plain", TEMPLATES["plain"])


@pytest.fixture(scope="module")
def nfkc(tok, tmp_path_factory) -> Path:
    """The same tokenizer with an NFKC normalizer: fastokens 0.3.5 cannot load it."""
    return edited(tok, tmp_path_factory.mktemp("nfkc") / "tok", normalizer={"type": "NFKC"})


def edited(source: Path, target: Path, **fields) -> Path:
    shutil.copytree(source, target)
    path = target / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(fields)
    path.write_text(json.dumps(data), encoding="utf-8")
    return target


def rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 7 == 3:
            out.append({"text": f"the water {i} and the oil"})
        elif i % 7 == 5:
            out.append({"prompt": f"what is {i}", "completion": " the answer is yes"})
        else:
            out.append({"messages": generated_chat(rng)})
    return out


def raw_file(path: Path, n: int, seed: int = 0) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(n, seed)), encoding="utf-8")
    return path


def encoded(encoder, records) -> list[tuple[list, list]]:
    return [(ids.tolist(), labels.tolist()) for ids, labels in encoder.encode_batch(records)]


@pytest.mark.parametrize("train_on", ["assistant", "last", "all"])
def test_both_engines_give_the_same_samples(tok, train_on):
    records = [to_record(r) for r in rows(200)]
    hf = Encoder(tok, train_on=train_on, tokenizer_engine="hf")
    fast = Encoder(tok, train_on=train_on, tokenizer_engine="fastokens")
    auto = Encoder(tok, train_on=train_on)
    assert encoded(hf, records) == encoded(fast, records) == encoded(auto, records)
    assert (hf.engine_name, fast.engine_name, auto.engine_name) == ("hf", "fastokens", "fastokens")
    assert hf.fingerprint == fast.fingerprint == auto.fingerprint  # never part of the identity
    assert hf.describe() == fast.describe()
    assert auto.take_note() is None


def test_padding_and_truncation_never_change_a_sample(tok, tmp_path):
    """A tokenizer.json that pads every text of a batch to the longest and cuts it at 8
    tokens: no engine pads or cuts a sample."""
    padded = edited(
        tok,
        tmp_path / "padded",
        padding={
            "strategy": "BatchLongest",
            "direction": "Right",
            "pad_to_multiple_of": None,
            "pad_id": 0,
            "pad_type_id": 0,
            "pad_token": EOS,
        },
        truncation={"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0},
    )
    records = [to_record(r) for r in rows(60)]
    want = encoded(Encoder(tok, tokenizer_engine="hf"), records)
    assert max(len(ids) for ids, _ in want) > 8
    assert len({len(ids) for ids, _ in want}) > 1  # padding to the longest would show
    for engine in ("auto", "hf", "fastokens"):
        assert encoded(Encoder(padded, tokenizer_engine=engine), records) == want, engine
    assert encoded(Encoder(padded), records) == want


def test_auto_falls_back_where_fastokens_cannot_load(tok, nfkc):
    records = [to_record(r) for r in rows(30)]
    auto = Encoder(nfkc)
    assert encoded(auto, records) == encoded(Encoder(nfkc, tokenizer_engine="hf"), records)
    assert auto.engine_name == "hf"
    note = auto.take_note()
    assert note.startswith("tokenizer_engine auto: tokenizing with hf, not fastokens (")
    assert "NFKC" in note and "\n" not in note
    assert auto.take_note() is None  # said once
    with pytest.raises(EngineError, match="^tokenizer_engine fastokens: fastokens cannot load"):
        Encoder(nfkc, tokenizer_engine="fastokens").encode_batch(records)


def test_a_difference_on_the_first_batch_falls_back_or_fails(tok, monkeypatch):
    """The batch's own renders are part of the proof: a difference there (planted) makes
    `auto` tokenize with hf and `fastokens` fail (exit 1: a failed check, not a usage error)."""
    records = [to_record(r) for r in rows(40)]
    want = encoded(Encoder(tok, tokenizer_engine="hf"), records)
    cached = Encoder(tok)
    cached.resolve_engine()  # the probes, proven and cached before the run's texts are seen
    real = FastokensEngine.encode_batch

    def planted(self, texts, *, add_special_tokens):
        ids = real(self, texts, add_special_tokens=add_special_tokens)
        return [i[:-1] + [0] if "oil" in t else i for t, i in zip(texts, ids)]

    monkeypatch.setattr(FastokensEngine, "encode_batch", planted)
    for auto in (Encoder(tok), cached):
        assert encoded(auto, records) == want
        assert auto.engine_name == "hf"
        assert "gives other ids than tokenizers on text" in auto.take_note()
    with pytest.raises(NotProven) as raised:
        Encoder(tok, tokenizer_engine="fastokens").encode_batch(records)
    assert raised.value.exit_code == EXIT_FAILURE
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("planted_in", ["texts", "prompts"])
def test_a_first_batch_difference_in_what_gets_special_tokens_falls_back(
    tok, monkeypatch, planted_in
):
    """A batch's plain texts and prompts are compared as they are tokenized, special tokens
    added: a difference planted only there (only with `add_special_tokens=True`) is found."""
    records = [to_record(r) for r in rows(40)]
    want = encoded(Encoder(tok, tokenizer_engine="hf"), records)
    auto = Encoder(tok)
    auto.resolve_engine()  # as the driver does before its workers start
    real = FastokensEngine.encode_batch
    word = "oil" if planted_in == "texts" else "what is"

    def planted(self, texts, *, add_special_tokens):
        ids = real(self, texts, add_special_tokens=add_special_tokens)
        hit = add_special_tokens and planted_in
        return [i[:-1] + [0] if hit and word in t else i for t, i in zip(texts, ids)]

    monkeypatch.setattr(FastokensEngine, "encode_batch", planted)
    assert encoded(auto, records) == want and auto.engine_name == "hf"
    assert "add_special_tokens=True" in auto.take_note()


def test_the_spec_carries_the_resolved_engine(tok, nfkc):
    fast = Encoder(tok)
    assert fast.spec["tokenizer_engine"] == "auto"  # resolved in each worker, on its texts
    fast.resolve_engine()
    assert fast.spec["tokenizer_engine"] == "auto" and fast.engine_name == "fastokens"
    rebuilt = Encoder.from_spec(fast.spec)
    assert rebuilt.fingerprint == fast.fingerprint
    fell_back = Encoder(nfkc)
    fell_back.resolve_engine()
    assert fell_back.spec["tokenizer_engine"] == "hf"  # workers need not try fastokens again
    assert Encoder.from_spec(fell_back.spec).resolve_engine().reason is None
    assert Encoder(tok, tokenizer_engine="fastokens").spec["tokenizer_engine"] == "fastokens"


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_tokenize_writes_the_same_bytes_with_either_engine(cli, tok, tmp_path):
    raw = raw_file(tmp_path / "raw.jsonl", 2500)  # three batches
    outputs = {}
    for engine in ("hf", "fastokens"):
        out = tmp_path / engine
        res = cli("tokenize", raw, "--tokenizer", tok, "-o", out, "--tokenizer-engine", engine)
        assert res.exit_code == 0, res.output
        assert FALLBACK not in res.stderr
        outputs[engine] = files_of(out)
    assert outputs["hf"] == outputs["fastokens"]
    assert sum(name.startswith("part-") for name in outputs["hf"]) == 3
    shards = sorted((tmp_path / "hf").glob("part-*.parquet"))
    ids = pq.read_table(shards).column("input_ids").to_pylist()
    assert len(ids) == 2500 and all(ids)


def test_pack_bytes_and_the_cache_are_shared_by_the_engines(cli, tok, tmp_path, monkeypatch):
    raw = raw_file(tmp_path / "raw.jsonl", 400)
    pack = ("pack", raw, "--tokenizer", tok, "-L", "512", "--tokenizer-engine")
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache-hf"))
    first = cli(*pack, "hf", "-o", tmp_path / "hf")
    assert first.exit_code == 0, first.output
    assert "reused from the cache" not in first.stderr
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache-fast"))
    fresh = cli(*pack, "fastokens", "-o", tmp_path / "fast")
    assert fresh.exit_code == 0, fresh.output
    assert "reused from the cache" not in fresh.stderr  # tokenized by fastokens
    hf, fast = files_of(tmp_path / "hf"), files_of(tmp_path / "fast")
    # the same bytes, and the same cache entry's name: only the cache's directory differs
    fast["manifest.json"] = fast["manifest.json"].replace(b"/cache-fast/", b"/cache-hf/")
    assert hf == fast and len(hf) > 1
    # the hf run's cache entry serves a fastokens run: the engine is not in the key
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache-hf"))
    again = cli(*pack, "fastokens", "-o", tmp_path / "again")
    assert again.exit_code == 0, again.output
    assert "tokenized output reused from the cache" in again.stderr
    assert files_of(tmp_path / "again") == files_of(tmp_path / "hf")


def test_the_fallback_line_is_said_once_per_run(cli, nfkc, tmp_path):
    raw = raw_file(tmp_path / "raw.jsonl", 2500)  # three batches, on two workers
    res = cli("tokenize", raw, "--tokenizer", nfkc, "-o", tmp_path / "out", "--workers", "2")
    assert res.exit_code == 0, res.output
    lines = [line for line in res.stderr.splitlines() if "tokenizing with hf" in line]
    assert len(lines) == 1 and lines[0].startswith(FALLBACK) and "NFKC" in lines[0]
    packed = cli("pack", raw, "--tokenizer", nfkc, "-L", "512", "-o", tmp_path / "p")
    assert packed.exit_code == 0, packed.output
    assert sum("tokenizing with hf" in line for line in packed.stderr.splitlines()) == 1
    # verify re-tokenizes with hf whatever the output was made with: nothing to fall back from
    check = ("verify", tmp_path / "p", "--input", raw, "--tokenizer", nfkc, "--no-attention")
    verified = cli(*check)
    assert verified.exit_code == 0, verified.output
    assert "tokenizing with hf" not in verified.stderr


def test_fastokens_refused_in_one_line_naming_the_flag(cli, nfkc, tmp_path):
    raw = raw_file(tmp_path / "raw.jsonl", 20)
    for command in (
        ("tokenize", raw, "--tokenizer", nfkc, "-o", tmp_path / "out"),
        ("pack", raw, "--tokenizer", nfkc, "-L", "512", "-o", tmp_path / "out"),
    ):
        res = cli(*command, "--tokenizer-engine", "fastokens")
        assert res.exit_code == 2, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(
            "error: --tokenizer-engine fastokens: fastokens cannot load this tokenizer"
        )
        assert "Traceback" not in res.output and not (tmp_path / "out").exists()


def test_the_option_is_checked(cli, tok, tmp_path):
    raw = raw_file(tmp_path / "raw.jsonl", 5)
    res = cli("tokenize", raw, "--tokenizer", tok, "-o", tmp_path / "o", "--tokenizer-engine", "x")
    assert res.exit_code == 2 and "unknown --tokenizer-engine 'x'" in res.stderr
    res = cli("pack", raw, "-L", "64", "-o", tmp_path / "p", "--tokenizer-engine", "hf")
    assert res.exit_code == 2
    assert "--tokenizer-engine needs --tokenizer" in res.stderr


def test_pack_dataset_takes_the_engine(tok):
    pytest.importorskip("datasets")
    import pyarrow as pa

    from packer import pack_dataset

    table = pa.Table.from_pylist([r for r in rows(60) if "messages" in r])
    packed = {
        engine: pack_dataset(table, 512, tokenizer=str(tok), tokenizer_engine=engine)
        for engine in ("hf", "fastokens")
    }
    assert packed["hf"].equals(packed["fastokens"])
    assert np.asarray(packed["hf"].column("input_ids").combine_chunks().flatten()).size > 0
    with pytest.raises(ValueError, match="unknown tokenizer_engine 'x'"):
        pack_dataset(table, 512, tokenizer=str(tok), tokenizer_engine="x")
    with pytest.raises(ValueError, match="tokenizer_engine needs tokenizer="):
        pack_dataset([[1, 2, 3]], 8, tokenizer_engine="hf")


def test_the_config_file_key(cli, nfkc, tmp_path):
    """`tokenizer_engine:` in a --config file, overridden by the flag, left out of the manifest's
    config (it never changes the bytes)."""
    raw = raw_file(tmp_path / "raw.jsonl", 20)
    config = tmp_path / "c.yaml"
    config.write_text("max_len: 512\ntokenizer_engine: fastokens\n")
    pack = ("pack", raw, "--tokenizer", nfkc, "--config", config)
    res = cli(*pack, "-o", tmp_path / "p")
    assert res.exit_code == 2 and "fastokens cannot load this tokenizer" in res.stderr
    res = cli(*pack, "-o", tmp_path / "p", "--tokenizer-engine", "hf")
    assert res.exit_code == 0, res.output
    assert "tokenizing with hf" not in res.stderr
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert "tokenizer_engine" not in manifest["config"]
    config.write_text("max_len: 512\ntokenizer_engine: fast\n")
    res = cli(*pack, "-o", tmp_path / "q")
    assert res.exit_code == 2 and "unknown --tokenizer-engine 'fast'" in res.stderr


def test_auto_takes_hf_for_an_input_too_small_to_repay_the_build(cli, tok, nfkc, tmp_path):
    """fastokens' build costs about what hf takes to encode AUTO_BYTES_PER_ENTRY bytes a
    vocabulary entry: `auto` builds it only for an input at least that large, and below says
    nothing (nothing was refused); a size not known (a library call) leaves the proof to decide."""
    from tokenizers import Tokenizer

    from packer.tokenize.engines import AUTO_BYTES_PER_ENTRY, resolve_engine

    backend = Tokenizer.from_file(str(tok / "tokenizer.json"))
    bound = AUTO_BYTES_PER_ENTRY * backend.get_vocab_size(with_added_tokens=True)
    small = resolve_engine("auto", backend, input_bytes=bound - 1)
    assert (small.name, small.reason) == ("hf", None)
    assert resolve_engine("auto", backend, input_bytes=bound).name == "fastokens"
    assert resolve_engine("auto", backend).name == "fastokens"
    assert resolve_engine("fastokens", backend, input_bytes=1).name == "fastokens"  # as asked

    raw = raw_file(tmp_path / "raw.jsonl", 20)
    assert raw.stat().st_size < bound
    big = raw_file(tmp_path / "big.jsonl", 2500)
    assert big.stat().st_size >= bound
    for source, name, engine in ((raw, "small", "hf"), (big, "big", "fastokens")):
        res = cli("tokenize", source, "--tokenizer", tok, "-o", tmp_path / name, "--json")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["tokenizer_engine"] == engine
    # a tokenizer fastokens cannot load: on the small input, nothing to say
    res = cli("tokenize", raw, "--tokenizer", nfkc, "-o", tmp_path / "nfkc")
    assert res.exit_code == 0, res.output
    assert "tokenizing with hf" not in res.stderr
