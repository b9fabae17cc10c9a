"""`packer verify` on pairs outputs: the pair checks pass on real outputs and catch planted faults.

Each fault is planted in the packer's own write path (the plan spelled out per segment, the
pair columns, the laid-out tokens), so the output is otherwise consistent: its manifest, hashes
and row structure are right, and only the pair checks (or `--input`) can tell.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packer.pipelines.pairs as pairs_pipeline
from packer.config import PackConfig
from packer.pipelines.pack import pack
from packer.planning.strategies import Plan
from packer.verify import verify

COLS = ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")


def _pairs(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{c: rng.integers(3, 500, rng.integers(1, 9)).tolist() for c in COLS} for _ in range(n)]


@pytest.fixture
def data(tmp_path):
    pairs = _pairs(10)
    pairs[3][COLS[1]] = []  # a bad pair, skipped
    path = write_jsonl(tmp_path / "p.jsonl", pairs)
    return path


def _pack(path, out, **kw):
    cfg = PackConfig(max_len=kw.pop("max_len", 4096), pairs=True, on_error="skip", **kw)
    return pack(path, out, cfg)


def _failures(result, check):
    return [f.message for f in result.checks[check].failures]


@pytest.mark.parametrize(
    "options",
    [{}, {"max_len": 24, "overlength": "drop"}, {"max_len": 20, "overlength": "truncate"}],
)
def test_real_outputs_pass_with_and_without_input(data, tmp_path, options):
    _pack(data, tmp_path / "o", **options)
    result = verify(tmp_path / "o", [data], attention=False)
    assert result.ok, [f.message for c in result.checks.values() for f in c.failures]
    assert (
        result.checks["pairs"].details["pairs"]
        == 9 - json.loads((tmp_path / "o" / "manifest.json").read_text())["stats"]["dropped"]
    )
    assert result.checks["input"].ran and result.checks["input"].ok


def test_attention_checks_run_on_pairs(data, tmp_path):
    _pack(data, tmp_path / "o", max_len=64)
    result = verify(tmp_path / "o", rows="all")
    assert result.ok and result.checks["attention"].ok and result.checks["negative_control"].ok


def test_a_pair_split_across_rows_is_caught(data, tmp_path, monkeypatch, cli):
    real = pairs_pipeline.segment_plan

    def split(items):
        pl = real(items)
        assert pl.num_rows == 1  # everything fits one row; cut its last segment off
        n = pl.order.size
        return Plan(order=pl.order, row_starts=np.array([0, n - 1, n], np.int64))

    monkeypatch.setattr(pairs_pipeline, "segment_plan", split)
    _pack(data, tmp_path / "o")
    result = verify(tmp_path / "o", attention=False)
    assert result.checks["structure"].ok and result.checks["manifest"].ok
    (message,) = _failures(result, "pairs")
    from conftest import read_shards

    cut = read_shards(tmp_path / "o")["pair_index"][0].as_py()[-1]  # row 0's last pair
    assert f"shard-00000.arrow row 0, pair {cut} (segment 16): split across rows" in message
    assert "its rejected side is in shard-00000.arrow row 1" in message
    monkeypatch.undo()
    out = cli("verify", tmp_path / "o", "--no-attention")
    assert out.exit_code == 1 and "split across rows" in out.output


def test_swapped_sides_are_caught(data, tmp_path, monkeypatch):
    real = pairs_pipeline.segment_plan

    def swap(items):
        pl = real(items)
        order = pl.order.copy()
        order[[0, 1]] = order[[1, 0]]
        return Plan(order=order, row_starts=pl.row_starts)

    monkeypatch.setattr(pairs_pipeline, "segment_plan", swap)
    _pack(data, tmp_path / "o")
    result = verify(tmp_path / "o", attention=False)
    assert result.checks["structure"].ok
    assert _failures(result, "pairs") == [
        f"shard-00000.arrow row 0, pair {_first_pair(tmp_path)} (segment 1): sides swapped: "
        "the rejected segment comes first"
    ]


def _first_pair(tmp_path) -> int:
    from conftest import read_shards

    return read_shards(tmp_path / "o")["pair_index"][0].as_py()[0]


def test_a_wrong_pair_side_column_is_caught(data, tmp_path, monkeypatch):
    def flip(buf, rows, tokens, cu_entries):
        buf.sample[0] ^= 1  # pair_side of segment 0 is read off it, then sample_index restored
        batch = pairs_pipeline.pair_batch(buf, rows, tokens, cu_entries)
        buf.sample[0] ^= 1
        return batch.set_column(4, "sample_index", _sample_column(buf, rows))

    monkeypatch.setattr(
        pairs_pipeline, "PAIR_SHARDS", dataclasses.replace(pairs_pipeline.PAIR_SHARDS, batch=flip)
    )
    _pack(data, tmp_path / "o")
    result = verify(tmp_path / "o", attention=False)
    (message,) = _failures(result, "pairs")
    assert "(segment 0): pair_index" in message and "disagree with sample_index" in message


def _sample_column(buf, rows):
    import pyarrow as pa

    segs = int(buf.sample_row_offsets[rows])
    return pa.ListArray.from_arrays(
        pa.array(buf.sample_row_offsets[: rows + 1]), pa.array(buf.sample[:segs].copy())
    )


def test_different_prompts_are_caught_and_input_names_the_side(data, tmp_path, monkeypatch):
    real = pairs_pipeline.pair_samples

    def corrupt(pairs, kept):
        samples, segs = real(pairs, kept)
        samples.tokens[segs.start[1]] += 1  # the first prompt token of pair 0's rejected side
        return samples, segs

    monkeypatch.setattr(pairs_pipeline, "pair_samples", corrupt)
    _pack(data, tmp_path / "o")
    result = verify(tmp_path / "o", [data], attention=False)
    assert result.checks["structure"].ok
    (message,) = _failures(result, "pairs")
    assert "pair 0 (segment" in message and "different prompts" in message
    (message,) = _failures(result, "input")
    assert "tokens differ from the input's pair 0 (rejected)" in message


def test_input_with_a_missing_pair_is_caught(data, tmp_path):
    _pack(data, tmp_path / "o")
    more = write_jsonl(tmp_path / "more.jsonl", _pairs(11))  # one pair more than was packed
    result = verify(tmp_path / "o", [more], attention=False)
    assert any(
        "pair 10 (chosen) of the input is in no row" in m for m in _failures(result, "input")
    )


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lengths=st.lists(
        st.tuples(st.integers(1, 30), st.integers(1, 30), st.integers(1, 30)),
        min_size=1,
        max_size=30,
    ),
    max_len=st.integers(8, 120),
    strategy=st.sampled_from(["bfd", "ffd", "nf", "ff-shuffle", "histogram"]),
    overlength=st.sampled_from(["drop", "truncate"]),
)
def test_any_pairs_pack_into_outputs_verify_passes(
    tmp_path, lengths, max_len, strategy, overlength
):
    """Property: whatever the pairs, row length, strategy and over-length rule, the output
    holds every kept pair whole and adjacent in one row, and verify (with --input) passes."""
    import shutil

    rng = np.random.default_rng(len(lengths))
    pairs = [{c: rng.integers(3, 500, n).tolist() for c, n in zip(COLS, lens)} for lens in lengths]
    work = tmp_path / "prop"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    path = write_jsonl(work / "p.jsonl", pairs)
    need = [2 * p + c + r for p, c, r in lengths]
    if overlength == "drop" and all(n > max_len for n in need):
        return  # nothing left to pack: an empty output is refused elsewhere
    cfg = PackConfig(max_len=max_len, pairs=True, strategy=strategy, overlength=overlength)
    stats = pack(path, work / "o", cfg).stats
    result = verify(work / "o", [path], attention=False)
    assert result.ok, [f.message for c in result.checks.values() for f in c.failures]
    kept = [i for i, n in enumerate(need) if n <= max_len or overlength == "truncate"]
    assert result.checks["pairs"].details["pairs"] == len(kept) == stats["samples_packed"]
