"""verify's `cp_attention` check: CP ranks simulated on the CPU (zigzag shares, ring pass, LSE
merge) against every sample alone.

The ring simulation is compared with plain block-diagonal causal attention on random rows; real
CP outputs packed with the CLI pass; a boundary moved in the shard bytes is caught; both
negative controls (a key/value chunk exchanged between samples, a wrong zigzag order) change
the result, and a control that is not caught fails verify.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import make_samples, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cp_verify import rows_of, save

from packer.config import PackConfig
from packer.pipelines.pack import pack
from packer.planning.cp import zigzag_index
from packer.verify import cp_attention as C
from packer.verify import verify

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def block_causal(q, k, v, cu: list[int]):
    """Each segment's causal attention alone (SDPA), concatenated: the plain reference."""
    outs = []
    for a, b in zip(cu, cu[1:]):
        x = [t[a:b].transpose(0, 1) for t in (q, k, v)]
        outs.append(F.scaled_dot_product_attention(*x, is_causal=True).transpose(0, 1))
    return torch.cat(outs)


def random_row(cp_size: int, chunks: list[int], seed: int):
    cu = np.concatenate([[0], np.cumsum(np.asarray(chunks) * 2 * cp_size)]).astype(np.int64)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, int(cu[-1]), 2, 8, generator=gen)
    return q, k, v, cu


@settings(max_examples=60, deadline=None)
@given(
    cp_size=st.integers(1, 4),
    chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    seed=st.integers(0, 2**31),
)
def test_ring_equals_block_causal_attention(cp_size, chunks, seed):
    q, k, v, cu = random_row(cp_size, chunks, seed)
    ring = C.ring_attention(q, k, v, cu, cp_size)
    assert torch.allclose(ring, block_causal(q, k, v, cu.tolist()), atol=1e-5)


@pytest.mark.parametrize("scores", [1, 7, 100])
def test_long_rows_go_in_query_blocks(monkeypatch, scores):
    """Queries in blocks (to bound memory on long rows) give the same attention."""
    monkeypatch.setattr(C, "QUERY_BLOCK_SCORES", scores)
    q, k, v, cu = random_row(4, [8, 4, 8], seed=scores)
    ring = C.ring_attention(q, k, v, cu, 4)
    assert torch.allclose(ring, block_causal(q, k, v, cu.tolist()), atol=1e-5)


@pytest.mark.parametrize("cp_size", [2, 3, 4])
def test_both_controls_change_the_ring(cp_size):
    q, k, v, cu = random_row(cp_size, [2, 1, 3], seed=cp_size)
    plain = block_causal(q, k, v, cu.tolist())
    row = C.RingRow(None, np.zeros(int(cu[-1])), np.zeros(0), cu, np.diff(cu), 3)
    for name, plant in C.CONTROLS.items():
        fault = plant(row, cp_size, k)
        assert fault is not None, name
        faulty = C.ring_attention(q, k, v, cu, cp_size, **fault)
        assert float((faulty - plain).abs().max()) > 100 * C.THRESHOLD, name


def test_wrong_zigzag_layout_and_its_range():
    cu = np.array([0, 8, 24])  # cp_size 2: chunks of 2 and 4
    assert zigzag_index(cu, 0, 2, 2).tolist() == [0, 1, 4, 5, 8, 9, 10, 11, 16, 17, 18, 19]
    assert zigzag_index(cu, 1, 2, 2).tolist() == zigzag_index(cu, 1, 2).tolist()
    with pytest.raises(ValueError, match="second_chunk must be in"):
        zigzag_index(cu, 0, 2, 4)


def test_controls_need_something_to_move():
    """A lone one-token sample: no second sample to exchange with, no real token moved."""
    cu = np.array([0, 4])
    row = C.RingRow(None, np.arange(4), np.arange(4), cu, np.array([1]), 1)
    k = torch.randn(4, 2, 8)
    assert C.chunk_exchange(row, 2, k) is None and C.wrong_zigzag(row, 2, k) is None


# --------------------------------------------------------------------------------------------
# verify on real outputs


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    samples = make_samples(80, seed=5, median=40, max_len=120)
    return write_jsonl(tmp_path_factory.mktemp("cpa") / "in.jsonl", samples)


@pytest.fixture(scope="module")
def cp2_out(src):
    out = src.parent / "cp2"
    pack([src], out, PackConfig(max_len=128, cp_size=2, pad_id=3, shard_rows=8))
    return out


@pytest.mark.parametrize("cp_size, pad", [(2, False), (4, True)])
def test_cli_cp_output_passes(src, tmp_path, cli, cp_size, pad):
    out = tmp_path / f"cp{cp_size}"
    args = ["pack", src, "-o", out, "--max-len", "128", "--cp-size", str(cp_size)]
    assert cli(*args, *(["--pad"] if pad else [])).exit_code == 0
    res = cli("verify", out, "--rows", "all", "--json")
    assert res.exit_code == 0, res.stdout
    check = json.loads(res.stdout)["checks"]["cp_attention"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert check["ok"] and check["cp_size"] == cp_size
    assert check["rows"] == manifest["stats"]["rows"] and check["samples"] == 80
    assert 0 <= check["max_diff"] <= check["tolerance"] == 1e-5
    for control in check["controls"].values():
        assert control["caught"] and control["rows"] > 0 and control["min_diff"] > 1e-4
    res = cli("verify", out, "--rows", "2")
    assert res.exit_code == 0 and "cp_attention" in res.stderr and "wrong zigzag" in res.stderr


def moved(rows: list[dict], cp_size: int, shift: int) -> int:
    """Move one inner cu_seqlens_padded boundary by `shift` tokens; return the row."""
    mult = 2 * cp_size
    for r, row in enumerate(rows):
        cup = row["cu_seqlens_padded"]
        for j in range(1, len(cup) - 1):
            if cup[j] - cup[j - 1] > mult and cup[j + 1] - cup[j] > mult:
                row["cu_seqlens_padded"] = cup[:j] + [cup[j] + shift] + cup[j + 1 :]
                return r
    raise AssertionError("no row with two long samples")


@pytest.mark.parametrize(
    "shift",
    [4, -4],  # the next sample's first tokens in this one's span, or this one's tail in the next
)
def test_moved_boundary_is_caught(cp2_out, tmp_path, shift):
    out = Path(shutil.copytree(cp2_out, tmp_path / "bad"))
    rows = rows_of(out)
    r = moved(rows, 2, shift)
    save(out, rows)
    check = verify(out, rows="all").checks["cp_attention"]
    assert check.ran and not check.ok
    msgs = [f.message for f in check.failures]
    assert msgs and all(f.row == r and f.shard == "shard-00000.arrow" for f in check.failures)
    assert "ring attention over 2 CP ranks (zigzag chunks) differs from the sample" in msgs[0]
    assert check.details["controls"]["wrong_zigzag"]["caught"]


def test_a_control_not_caught_fails_loudly(cp2_out, monkeypatch):
    # the "wrong" order planted is the right one: the simulation cannot differ
    monkeypatch.setitem(
        C.CONTROLS, "wrong_zigzag", lambda row, n, k: {"second_chunk": lambda r: 2 * n - 1 - r}
    )
    result = verify(cp2_out, rows=3, backend="cpu")
    check = result.checks["cp_attention"]
    assert not result.ok and not check.details["controls"]["wrong_zigzag"]["caught"]
    assert check.failure_count == check.details["controls"]["wrong_zigzag"]["rows"] > 0
    assert "the wrong_zigzag control changes its samples by only " in check.failures[0].message
    assert "could not see that fault here, so it proves nothing" in check.failures[0].message
    monkeypatch.setitem(C.CONTROLS, "wrong_zigzag", lambda row, n, k: None)
    check = verify(cp2_out, rows=3, backend="cpu").checks["cp_attention"]
    msgs = [f.message for f in check.failures]
    assert msgs == ["the wrong_zigzag control could not be planted in any row"]


def test_rows_of_one_sample_get_a_joined_control_row(tmp_path):
    samples = [{"input_ids": list(range(1, n + 1))} for n in (100, 110, 117, 120)]
    out = tmp_path / "single"
    pack([write_jsonl(tmp_path / "in.jsonl", samples)], out, PackConfig(max_len=128, cp_size=2))
    check = verify(out, rows="all").checks["cp_attention"]
    assert check.ok and check.details["rows"] == 4 and check.details["synthetic_control"]
    assert check.details["controls"]["chunk_exchange"]["rows"] == 1  # the joined row only
    assert check.details["controls"]["wrong_zigzag"]["rows"] == 5


def test_cp_size_on_a_plain_output_simulates_splittable_rows(tmp_path, cli):
    rng = np.random.default_rng(0)
    samples = [
        {"input_ids": rng.integers(0, 500, int(n)).tolist()} for n in rng.choice([4, 8, 16, 20], 60)
    ]
    plain = tmp_path / "plain"
    pack([write_jsonl(tmp_path / "in.jsonl", samples)], plain, PackConfig(max_len=64))
    res = cli("verify", plain, "--cp-size", "2", "--rows", "5", "--json")
    assert res.exit_code == 0, res.stdout
    checks = json.loads(res.stdout)["checks"]
    assert checks["cp"]["splits"] == "every row"
    assert checks["cp_attention"]["ran"] and checks["cp_attention"]["rows"] == 5
    assert checks["cp_attention"]["cp_size"] == 2
    assert all(c["caught"] for c in checks["cp_attention"]["controls"].values())
    result = verify(plain, cp_size=3)  # 4, 8, 16, 20: no sample splits in 6 chunks
    assert not result.checks["cp"].ok
    assert not result.checks["cp_attention"].ran
    assert result.checks["cp_attention"].skipped_reason == "no row splits for cp_size 3"
    assert "cp_attention" not in verify(plain).checks
    assert not verify(plain, cp_size=2, attention=False).checks["cp_attention"].ran


def test_a_ring_off_by_ten_times_the_tolerance_fails(cp2_out, monkeypatch):
    ring = C.ring_attention
    monkeypatch.setattr(C, "ring_attention", lambda *a, **kw: ring(*a, **kw) + 1e-4)
    check = verify(cp2_out, rows=2).checks["cp_attention"]
    assert not check.ok and check.failure_count == check.details["samples"] > 0
    assert all(c["caught"] for c in check.details["controls"].values())
    assert "differs from the sample run alone by 0.0001" in check.failures[0].message
