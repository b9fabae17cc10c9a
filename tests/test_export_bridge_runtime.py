"""Megatron-Bridge's packing metadata in runtime lengths: with `pad_cu_seqlens` (which CUDA
graphs require) Bridge's collate gives the attention kernel one `max_seqlen` for every batch,
`max(dataset_max_seqlen, max_length - min_packed_seqlen)` (megatron/bridge/data/packing/
gpt_sft.py, GPTSFTPackedDataset.collate_fn). Every segment the collate builds, the row's
trailing padding segment included, must fit it, or the kernel reads past its buffers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_samples, write_jsonl
from export_checks import bridge_collate, bridge_collate_cp, bridge_read

import packer
from packer.export import export

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.xdist_group("export")


def collate_max_seqlen(metadata: list[dict], max_length: int) -> int:
    """The collate's max_seqlen under pad_cu_seqlens, from the metadata list it loads."""
    dataset_max = max(m["dataset_max_seqlen"] for m in metadata)
    min_packed = min(m["min_packed_seqlen"] for m in metadata)
    return max(dataset_max, max_length - min_packed)


def collate_segments(dest: Path, max_length: int, eos_id: int, cp: bool) -> list[list[int]]:
    """Each row's segment lengths as the collate lays them out for the kernel: the physical
    (padded) boundaries under CP, the plain ones otherwise; the padding is the last segment."""
    rows = []
    for item in bridge_read(dest):
        if cp:
            cu = bridge_collate_cp(item, max_length, eos_id)["cu_seqlens_padded"]
        else:
            cu = bridge_collate(item, max_length, eos_id)["cu_seqlens"]
        rows.append(np.diff(cu).tolist())
    return rows


def exported(tmp_path: Path, src: Path, max_len: int, eos_id: int, **config) -> Path:
    out = tmp_path / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=max_len, overlength="split", **config))
    dest = tmp_path / "bridge"
    export(out, "megatron-bridge", dest, eos_id=eos_id)
    return dest


CASES = {
    # the bundled sample at 4k rows, and short samples at 256 (ids under 1000, EOS above them)
    "sample": (ROOT / "data" / "sample.jsonl.gz", 4096, 2),
    "short": (None, 256, 1000),
}


LAYOUTS = {  # plain, CP, and sequence parallelism (tp 4) at cp 1 and 2: multiples 1, 4, 8, 4, 8
    "plain": {},
    "cp2": {"cp_size": 2},
    "cp4": {"cp_size": 4},
    "tp4-sp": {"tp_size": 4, "sequence_parallel": True},
    "cp2-tp4-sp": {"cp_size": 2, "tp_size": 4, "sequence_parallel": True},
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_segment_fits_the_collates_max_seqlen(case, layout, tmp_path):
    src, max_len, eos = CASES[case]
    if src is None:
        src = write_jsonl(tmp_path / "in.jsonl", make_samples(600, seed=5, median=12))
    dest = exported(tmp_path, src, max_len, eos, **LAYOUTS[layout])
    metadata = json.loads((dest / "packing_metadata.json").read_text())
    multiple = metadata[0].get("pad_seq_to_mult", 1)
    assert multiple == {"plain": 1, "cp2": 4, "cp4": 8, "tp4-sp": 4, "cp2-tp4-sp": 8}[layout]
    segments = collate_segments(dest, max_len, eos, cp=multiple > 1)
    limit = collate_max_seqlen(metadata, max_len)
    too_long = [(r, s) for r, row in enumerate(segments) for s in row if s > limit]
    assert not too_long, f"max_seqlen {limit}: (row, segment) {too_long[:5]}"
    # and the values are Bridge's own: the longest sub-sequence the model sees and the fewest
    # tokens it sees in a row (each sub-sequence one token shorter than stored)
    items = bridge_read(dest)
    fed = [[e - s - 1 for s, e in zip(i["seq_boundaries"], i["seq_boundaries"][1:])] for i in items]
    assert metadata[0]["dataset_max_seqlen"] == max(n for row in fed for n in row)
    assert metadata[0]["min_packed_seqlen"] == min(sum(row) for row in fed)
    assert metadata[0]["max_samples_per_bin"] == max(len(row) for row in fed)
    assert all(n % multiple == 0 for row in fed for n in row)


def test_stored_lengths_would_cut_a_padding_segment(tmp_path):
    """The negative control: the bundled sample at --cp-size 2 with the metadata counted in
    stored lengths (max n, min sum of n) gives a max_seqlen shorter than a row's padding."""
    src, max_len, eos = CASES["sample"]
    dest = exported(tmp_path, src, max_len, eos, cp_size=2)
    items = bridge_read(dest)
    stored = [
        {
            "dataset_max_seqlen": max(
                e - s for i in items for s, e in zip(i["seq_boundaries"], i["seq_boundaries"][1:])
            ),
            "min_packed_seqlen": min(len(i["input_ids"]) for i in items),
        }
    ]
    limit = collate_max_seqlen(stored, max_len)
    segments = collate_segments(dest, max_len, eos, cp=True)
    assert any(s > limit for row in segments for s in row)
