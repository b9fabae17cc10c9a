"""`--to mds` through streaming's own StreamingDataset (mosaicml-streaming, in the readers'
virtualenv) in a torch DataLoader whose collate is `packer.torch.collate_packed`: what a
PyTorch or Composer training loop receives, compared with packer's rows and the original
samples, and a tiny model giving every sample of a batch what it gives the sample alone."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_samples, write_jsonl
from export_checks import consumer, original_piece, packer_rows, samples_of

import packer
from packer.export import export

L, BATCH = 256, 3
pytestmark = pytest.mark.xdist_group("export")


@pytest.mark.parametrize("config", [{"pad": True}, {"cp_size": 2}], ids=["padded", "cp2"])
def test_streaming_loader_with_packer_collate_keeps_every_sample(readers, tmp_path, config):
    samples = make_samples(200, seed=13, median=30)
    src = write_jsonl(tmp_path / "in.jsonl", samples)
    out = tmp_path / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=L, overlength="split", **config))
    dest = tmp_path / "mds"
    export(out, "mds", dest)
    got = consumer(readers, "mds-loader", dest, BATCH)
    rows = packer_rows(out)  # without --pad tails and CP padding: what the export carries
    assert len(got["batches"]) == -(-len(rows) // BATCH)
    seen = 0
    for b, batch in enumerate(got["batches"]):
        group = rows[b * BATCH : (b + 1) * BATCH]
        pieces = [p for row in group for p in samples_of(row)]
        lengths = [len(ids) for ids, _, _, _ in pieces]
        assert batch["cu_seq_lens_q"] == [0, *np.cumsum(lengths).tolist()]
        assert batch["cu_seq_lens_k"] == batch["cu_seq_lens_q"]
        assert batch["max_length_q"] == max(lengths)
        assert batch["input_ids"] == [[t for ids, _, _, _ in pieces for t in ids]]
        assert batch["labels"] == [[x for _, labels, _, _ in pieces for x in labels]]
        assert batch["position_ids"] == [[p for n in lengths for p in range(n)]]
        assert batch["num_loss_tokens"] == sum(
            1 for _, labels, _, _ in pieces for x in labels if x != -100
        )
        for ids, labels, si, so in pieces:
            assert (ids, labels) == original_piece(samples, si, so, len(ids))
            seen += 1
    assert seen == sum(len(r["seq_lens"]) for r in rows)
    assert got["isolated"] and got["samples"] > 0


def test_the_documented_loader_runs(readers, tmp_path):
    """docs/export.md's streaming block, as written, on the page's out/export-mds."""
    from test_doc_snippets import ROOT, read_blocks

    block = [
        b
        for b in read_blocks(ROOT / "docs" / "export.md")
        if b.lang == "python" and "StreamingDataset(" in b.code
    ]
    assert len(block) == 1
    code = tmp_path / "loader.py"
    code.write_text(block[0].code)
    work = tmp_path / "work"
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(120, seed=17, median=30))
    out = work / "out" / "demo"
    packer.pack([src], out, packer.PackConfig(max_len=L, overlength="split"))
    export(out, "mds", work / "out" / "export-mds")
    got = consumer(readers, "mds-recipe", code, work)
    rows = packer_rows(out)[:8]  # the block's batch_size
    assert got["input_ids"] == [[t for row in rows for t in row["input_ids"]]]
    lengths = [n for row in rows for n in row["seq_lens"]]
    assert got["cu_seq_lens_q"] == [0, *np.cumsum(lengths).tolist()]
    assert got["logits_shape"][:2] == [1, sum(lengths)]
