"""`--to megatron-bridge` through Megatron-Bridge's own data path (0.6.0, in the readers'
virtualenv): docs/export.md's recipe as Bridge's GPTSFTDatasetConfig and PackedSequenceSpecs,
validated; `build_gpt_sft_split`, the function its GPTSFTDatasetBuilder builds the training
split with, gives GPTSFTPackedParquetDataset, and its collate_fn builds the micro-batch the
model receives. What it yields is compared with packer's rows, with
the original samples, and with the independent reader in export_checks.py (which the other
export tests hold to packer's rows); every segment it gives the kernel fits its max_seqlen."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_samples, write_jsonl
from export_checks import (
    bridge_collate,
    bridge_collate_cp,
    bridge_read,
    consumer,
    original_piece,
    packer_rows,
    samples_of,
)

import packer
from packer.export import EXPORT_MANIFEST, export
from packer.hashing import file_digest

L, EOS = 256, 1000  # the samples' ids are below 1000
pytestmark = pytest.mark.xdist_group("export")
LAYOUTS = {  # packer's options -> Bridge's pad_seq_to_mult (2·cp, or lcm(2·cp, cp·tp) with SP)
    "plain": ({}, 1),
    "cp2": ({"cp_size": 2}, 4),
    "cp2-tp4-sp": ({"cp_size": 2, "tp_size": 4, "sequence_parallel": True}, 8),
}


@pytest.fixture(scope="module")
def samples():
    return make_samples(300, seed=11, median=24)


def bridge_export(tmp_path, samples, config: dict):
    src = write_jsonl(tmp_path / "in.jsonl", samples)
    out = tmp_path / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=L, overlength="split", **config))
    dest = tmp_path / "bridge"
    export(out, "megatron-bridge", dest, eos_id=EOS)
    return out, dest


def trimmed(cu: list[int], want: int) -> list[int]:
    """Bridge's boundaries without the zero-length segments pad_cu_seqlens appends."""
    assert all(x == cu[want - 1] for x in cu[want:]), cu
    return cu[:want]


@pytest.mark.parametrize("pad_cu", [False, True])
def test_bridge_feeds_packer_samples_unchanged(readers, samples, tmp_path, pad_cu):
    out, dest = bridge_export(tmp_path, samples, {})
    got = consumer(readers, "bridge", dest, L, EOS, 1, int(pad_cu))
    rows = packer_rows(out)
    assert got["class"] == "GPTSFTPackedParquetDataset" and got["rows"] == len(rows)
    metadata = json.loads((dest / "packing_metadata.json").read_text())[0]
    limit = max(metadata["dataset_max_seqlen"], L - metadata["min_packed_seqlen"])
    checked = 0
    for batch, row in zip(got["batches"], rows):
        width = len(batch["tokens"])
        if pad_cu:
            assert width == L
        else:  # the longest row's tokens, rounded up to 16 (at most L)
            assert width <= L and (width % 16 == 0 or width == L)
        cu = batch["cu_seqlens_q"]
        pieces = samples_of(row)
        cu = trimmed(cu, len(pieces) + 1 + (cu[len(pieces)] != width))
        assert batch["cu_seqlens_kv"] == batch["cu_seqlens_q"]
        assert batch.get("attention_mask") is None
        for j, (ids, labels, si, so) in enumerate(pieces):
            s, e = cu[j], cu[j + 1]
            assert e - s == len(ids) - 1  # the model sees n - 1 tokens, the last is a target
            assert batch["tokens"][s:e] == ids[:-1]
            assert batch["labels"][s:e] == ids[1:]
            assert batch["loss_mask"][s:e] == [int(x != -100) for x in labels[1:]]
            assert batch["position_ids"][s:e] == list(range(e - s))
            want_ids, want_labels = original_piece(samples, si, so, len(ids))
            assert (ids, labels) == (want_ids, want_labels)
            checked += 1
        tail = slice(cu[len(pieces)], width)  # padding: EOS, no loss
        assert set(batch["tokens"][tail]) <= {EOS} and not any(batch["loss_mask"][tail])
        segments = np.diff(batch["cu_seqlens_q"])
        assert batch["max_seqlen_q"] >= segments.max()
        if pad_cu:
            assert batch["max_seqlen_q"] == limit
        # the independent reader the other export tests use gives the same micro-batch
        mine = bridge_collate(bridge_read(dest)[got["batches"].index(batch)], width, EOS)
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert batch[key] == mine[key]
        assert cu == mine["cu_seqlens"]
    assert checked == sum(len(r["seq_lens"]) for r in rows) > len(rows)
    # the recipe leaves the export as written: Bridge appended nothing to its metadata
    recorded = json.loads((dest / EXPORT_MANIFEST).read_text())["files"]
    for entry in recorded:
        assert file_digest(dest / entry["file"]) == entry["xxh3_128"], entry["file"]
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        [EXPORT_MANIFEST, *(e["file"] for e in recorded)]
    )


@pytest.mark.parametrize("layout", ["cp2", "cp2-tp4-sp"])
def test_bridge_cp_layout_is_what_packer_padded(readers, samples, tmp_path, layout):
    config, mult = LAYOUTS[layout]
    out, dest = bridge_export(tmp_path, samples, config)
    assert json.loads((dest / "packing_metadata.json").read_text())[0]["pad_seq_to_mult"] == mult
    got = consumer(readers, "bridge", dest, L, EOS, mult, 1)
    rows, items = packer_rows(out), bridge_read(dest)
    assert got["rows"] == len(rows) == len(items)
    metadata = json.loads((dest / "packing_metadata.json").read_text())[0]
    limit = max(metadata["dataset_max_seqlen"], L - metadata["min_packed_seqlen"])
    for batch, row, item in zip(got["batches"], rows, items):
        mine = bridge_collate_cp(item, L, EOS)
        for key in ("tokens", "labels", "loss_mask", "position_ids"):
            assert batch[key] == mine[key]
        n = len(mine["cu_seqlens_padded"])
        padded = trimmed(batch["cu_seqlens_q_padded"], n)
        logical = trimmed(batch["cu_seqlens_q"], n)
        assert padded == mine["cu_seqlens_padded"] and logical == mine["cu_seqlens"]
        assert all(d % mult == 0 for d in np.diff(padded))
        for j, (ids, _, _, _) in enumerate(samples_of(row)):
            s = padded[j]
            real = logical[j + 1] - logical[j]
            assert real in (len(ids) - 1, len(ids))  # n - 1, or n where CP padding follows
            assert batch["tokens"][s : s + real] == ids[:real]
            assert batch["position_ids"][s : padded[j + 1]] == list(range(padded[j + 1] - s))
        assert batch["max_seqlen_q"] == limit >= np.diff(batch["cu_seqlens_q_padded"]).max()


def test_the_documented_recipe_runs_through_bridge(readers, tmp_path):
    """docs/export.md's Bridge recipe block, as written, sets a config that Bridge validates and
    builds its training split from; the paths it names are those of the page's export."""
    from test_doc_snippets import ROOT, read_blocks

    recipe = [
        b
        for b in read_blocks(ROOT / "docs" / "export.md")
        if b.lang == "python" and "GPTSFTDatasetConfig(" in b.code
    ]
    assert len(recipe) == 1
    code = tmp_path / "recipe.py"
    code.write_text(recipe[0].code)
    work = tmp_path / "work"
    src = ROOT / "data" / "sample.jsonl.gz"
    out = work / "out" / "demo"
    packer.pack([src], out, packer.PackConfig(max_len=4096, overlength="split"))
    export(out, "megatron-bridge", work / "out" / "export-bridge", eos_id=2)
    got = consumer(readers, "bridge-recipe", code, work, 2)
    rows = packer_rows(out)
    assert got["micro_batch_size"] == 1 and got["rows"] == len(rows)
    for batch, row in zip(got["batches"][:5], rows):
        pieces = samples_of(row)
        cu = batch["cu_seqlens_q"]
        for j, (ids, labels, _, _) in enumerate(pieces):
            assert batch["tokens"][cu[j] : cu[j + 1]] == ids[:-1]
            assert batch["loss_mask"][cu[j] : cu[j + 1]] == [int(x != -100) for x in labels[1:]]
