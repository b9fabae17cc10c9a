"""`packer export` of `--cp-size` outputs: Megatron-Bridge gets the CP layout in its own
convention (pad_seq_to_mult), every other format gets each sample's real tokens exactly, and
nothing carries CP padding as if it were a sample's tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_samples, write_jsonl
from export_checks import (
    bridge_collate_cp,
    bridge_read,
    original_piece,
    packer_rows,
    samples_of,
    verify_rows,
)

import packer
from packer.cli import app
from packer.errors import UsageError
from packer.export import EXPORT_MANIFEST, export

L = 256
EOS = 1000  # outside make_samples' vocabulary: no sample's tokens end in it
pytestmark = pytest.mark.xdist_group("export")


@pytest.fixture(scope="module", params=[2, 4])
def cp_packed(request, tmp_path_factory):
    """A padded CP output whose long samples were split, and the same inputs packed plainly."""
    cp = request.param
    root = tmp_path_factory.mktemp(f"export-cp{cp}")
    samples = make_samples(300, seed=11, median=50)
    src = write_jsonl(root / "in.jsonl", samples)
    out = root / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=L, pad=True, overlength="split", cp_size=cp))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stats"]["cp_pad_tokens"] > 0  # the padding is there to be left out
    return cp, out, samples, packer_rows(out)


def _inputs_match(rows, samples) -> int:
    seen = 0
    for row in rows:
        for ids, labels, si, so in samples_of(row):
            assert (ids, labels) == original_piece(samples, si, so, len(ids))
            seen += 1
    return seen


def test_trl_gets_real_samples_without_cp_padding(cp_packed, tmp_path):
    import datasets
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    cp, out, samples, rows = cp_packed
    result = export(out, "trl", tmp_path / "trl")
    assert any(f"--cp-size {cp}" in note for note in result.notes)
    ds = datasets.load_from_disk(str(tmp_path / "trl"))
    assert len(ds) == len(rows)
    manifest = json.loads((out / "manifest.json").read_text())
    assert result.tokens == manifest["stats"]["tokens"]  # real tokens, no CP padding
    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    for i in range(0, len(ds), 5):
        batch = collate([ds[i]])
        assert batch["input_ids"][0].tolist() == rows[i]["input_ids"]
        assert batch["labels"][0].tolist() == rows[i]["labels"]
        assert ds[i]["seq_lengths"] == rows[i]["seq_lens"]
        assert batch["position_ids"][0].tolist() == [
            p for n in rows[i]["seq_lens"] for p in range(n)
        ]
    assert _inputs_match(rows, samples) == result.samples == manifest["stats"]["segments"]


def test_row_batches_and_megatron_carry_real_samples(cp_packed, tmp_path):
    from packer.export.source import open_source

    _, out, samples, rows = cp_packed
    source = open_source(out)
    got = [b for name in source.shards for b in source.batches_of(name)]
    lens = np.concatenate([b.seq_lens for b in got])
    assert lens.tolist() == [n for r in rows for n in r["seq_lens"]]
    assert np.concatenate([b.ids for b in got]).tolist() == [
        t for r in rows for t in r["input_ids"]
    ]
    export(out, "megatron", tmp_path / "megatron")
    tokens = np.fromfile(tmp_path / "megatron" / "input_ids.bin", dtype=np.uint16)
    labels = np.fromfile(tmp_path / "megatron" / "labels.bin", dtype=np.int32)
    assert tokens.tolist() == [t for r in rows for t in r["input_ids"]]
    assert labels.tolist() == [t for r in rows for t in r["labels"]]


def test_megatron_bridge_gets_its_own_cp_layout(cp_packed, tmp_path):
    cp, out, samples, rows = cp_packed
    dest = tmp_path / "bridge"
    result = export(out, "megatron-bridge", dest, eos_id=EOS)
    assert any(f"pad_seq_to_mult = {2 * cp}" in note for note in result.notes)
    metadata = json.loads((dest / "packing_metadata.json").read_text())[0]
    assert metadata["pad_seq_to_mult"] == 2 * cp and metadata["pack_size"] == L
    items = bridge_read(dest)
    assert len(items) == len(rows)
    view = []
    for item, row in zip(items, rows):
        b = bridge_collate_cp(item, L, eos_id=EOS)
        padded, logical = b["cu_seqlens_padded"], b["cu_seqlens"]
        assert padded[-1] == L and all(d % (2 * cp) == 0 for d in np.diff(padded))
        want = samples_of(row)
        assert len(want) in (len(padded) - 1, len(padded) - 2)
        for j, (ids, labels, _, _) in enumerate(want):
            s, n = padded[j], len(ids)
            # real tokens the model sees: all but the last, and the last too where CP padding
            # follows it (its target is then EOS, without loss)
            assert logical[j + 1] - logical[j] == min(n, padded[j + 1] - s)
            m = padded[j + 1] - s  # the sample as stored: its tokens, then EOS up to m + 1
            stored = ids + [EOS] * (m + 1 - n)
            assert b["tokens"][s : s + m] == stored[:m]
            assert b["labels"][s : s + m] == stored[1:]
            mask = [int(x != -100) for x in labels[1:]] + [0] * (m + 1 - n)  # padding: no loss
            assert b["loss_mask"][s : s + m] == mask
            assert b["position_ids"][s : padded[j + 1]] == list(range(padded[j + 1] - s))
        assert sum(b["loss_mask"]) == sum(1 for x in row["labels"] if x != -100) - sum(
            1 for ids, labels, _, _ in want if labels[0] != -100
        )
        if len(view) < 3:  # packer's verify on the real tokens the collate feeds
            toks, labs, pos, cu = [], [], [], [0]
            for j in range(len(want)):
                s, n = padded[j], logical[j + 1] - logical[j]
                toks += b["tokens"][s : s + n]
                labs += [-100] + [
                    b["tokens"][s + k] if b["loss_mask"][s + k - 1] else -100 for k in range(1, n)
                ]
                pos += list(range(n))
                cu.append(cu[-1] + n)
            view.append({"input_ids": toks, "labels": labs, "position_ids": pos, "cu_seqlens": cu})
    structure, isolation, control = verify_rows(view, L)
    assert structure.ok and isolation.ok and control.ok


def test_bridge_cp_export_needs_the_eos_id(cp_packed, tmp_path, runner):
    _, out, _, _ = cp_packed
    dest = tmp_path / "bridge"
    with pytest.raises(UsageError, match="eos_id"):
        export(out, "megatron-bridge", dest)
    r = runner.invoke(app, ["export", str(out), "--to", "megatron-bridge", "-o", str(dest)])
    assert r.exit_code == 2 and "--eos-id" in r.stderr and r.stderr.count("\n") == 1
    assert not dest.exists() and not list(tmp_path.glob(".bridge*"))


def test_bridge_cp_refuses_loss_that_its_eos_rule_would_drop(tmp_path):
    samples = make_samples(40, seed=2, median=30, max_len=100)
    ids = samples[5]["input_ids"]
    ids[-3:] = [EOS, EOS, EOS]  # the model-seen part ends in EOS and the targets count
    samples[5]["labels"] = list(ids)
    src = write_jsonl(tmp_path / "in.jsonl", samples)
    out = tmp_path / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=L, cp_size=2))
    dest = tmp_path / "bridge"
    with pytest.raises(UsageError, match="row .*EOS.*nothing was written"):
        export(out, "megatron-bridge", dest, eos_id=EOS)
    assert not dest.exists()
    export(out, "megatron-bridge", dest, eos_id=EOS + 1)  # another EOS id: nothing to drop
    assert (dest / EXPORT_MANIFEST).is_file()


def test_plain_outputs_export_as_before(tmp_path):
    """cp_size 1 keeps the non-CP Bridge layout: every sample stored whole, no EOS padding."""
    samples = make_samples(50, seed=4, median=30, max_len=100)
    src = write_jsonl(tmp_path / "in.jsonl", samples)
    out = tmp_path / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=L))
    export(out, "megatron-bridge", tmp_path / "bridge", eos_id=EOS)
    metadata = json.loads((tmp_path / "bridge" / "packing_metadata.json").read_text())[0]
    assert "pad_seq_to_mult" not in metadata
    items = bridge_read(tmp_path / "bridge")
    rows = packer_rows(out)
    assert [i["input_ids"] for i in items] == [r["input_ids"] for r in rows]


def test_pack_export_to_bridge_with_cp_is_refused_before_packing(tmp_path, runner):
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(30, seed=1, max_len=100))
    out = tmp_path / "packed"
    args = ["pack", str(src), "-o", str(out), "-L", str(L), "--cp-size", "2"]
    r = runner.invoke(app, [*args, "--export", "megatron-bridge"])
    assert r.exit_code == 2 and "--eos-id" in r.stderr and r.stderr.count("\n") == 1
    assert not out.exists()
    r = runner.invoke(app, [*args, "--export", "trl"])
    assert r.exit_code == 0, r.stderr
    assert (tmp_path / "packed-trl" / EXPORT_MANIFEST).is_file()
