"""`--to megatron` through Megatron-LM's own pretraining loader: megatron-core's GPTDataset
(0.19.2, in the readers' virtualenv), built as BlendedMegatronDatasetBuilder builds it for
`--data-path .../input_ids --dataloader-inter-document-masking`. What docs/export.md says a
Megatron-LM user gets, shown on what its windows hold: every packer sample is a document with
its own cu_seqlens segment and positions, but windows are cut across rows and samples, each
sample's last token is trained on the next sample's first (unless it is EOD and
`--eod-mask-loss` is set), and labels.bin is not read (prompts are trained)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import write_jsonl
from export_checks import consumer, packer_rows, samples_of

import packer
from packer.export import export

SEQ, EOD, WINDOWS = 64, 2, 12
pytestmark = pytest.mark.xdist_group("export")


def samples(end_with_eod: bool) -> list[dict]:
    """SFT-like samples (a masked prompt), ids 3..29999 so that EOD (2) is only where put."""
    rng = np.random.default_rng(21)
    out = []
    for _ in range(150):
        ids = rng.integers(3, 30000, size=int(rng.integers(6, 40))).tolist()
        if end_with_eod:
            ids.append(EOD)
        prompt = len(ids) // 2
        out.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return out


def windows(readers, tmp_path, end_with_eod: bool, eod_mask: bool):
    src = write_jsonl(tmp_path / "in.jsonl", samples(end_with_eod))
    out = tmp_path / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=128))
    dest = tmp_path / "megatron"
    export(out, "megatron", dest, vocab_size=32000)
    got = consumer(readers, "gpt-dataset", dest / "input_ids", SEQ, EOD, int(eod_mask), WINDOWS)
    rows = packer_rows(out)
    flat = [s for row in rows for s in samples_of(row)]  # the IndexedDataset's sequences
    assert got["documents"] == len(flat)
    row_of = [r for r, row in enumerate(rows) for _ in row["seq_lens"]]
    return got["windows"], flat, row_of


def check_window(w: dict, flat: list) -> list[tuple[int, int]]:
    """Each segment is a piece of the document it names; returns (boundary, previous doc)."""
    cu, tokens = w["cu_seqlens"], w["tokens"]
    segments = list(zip(cu[:-1], cu[1:]))
    assert w["max_seqlen"] == max(e - s for s, e in segments)
    assert w["labels"][:-1] == tokens[1:]  # next token of the stream, across boundaries too
    boundaries = []
    for k, (s, e) in enumerate(segments):
        ids = flat[w["documents"][k]][0]
        piece = tokens[s:e]
        if k == 0:  # a window may start inside a sample
            assert any(ids[o : o + len(piece)] == piece for o in range(len(ids)))
        else:  # later segments start at the sample's start, positions at 0
            assert ids[: len(piece)] == piece
            boundaries.append((s, w["documents"][k - 1]))
        if 0 < k < len(segments) - 1:
            assert len(piece) == len(ids)  # whole samples between the window's ends
        assert w["position_ids"][s:e] == list(range(e - s))
    return boundaries


def test_gpt_dataset_isolates_documents_but_trains_across_them_and_ignores_labels(
    readers, tmp_path
):
    ws, flat, row_of = windows(readers, tmp_path, end_with_eod=False, eod_mask=False)
    crossing = 0
    for w in ws:
        for b, _ in check_window(w, flat):
            # the previous sample's last token has this sample's first token as target
            assert w["labels"][b - 1] == w["tokens"][b] and w["loss_mask"][b - 1] == 1
            crossing += 1
        assert all(m == 1 for m in w["loss_mask"])  # labels.bin's -100 (the prompts) not read
    assert crossing > WINDOWS
    # packer's rows are not kept: windows join samples of different rows
    assert any(len({row_of[d] for d in w["documents"]}) > 1 for w in ws)


def test_eod_mask_loss_masks_the_cross_sample_target_of_eod_ended_samples(readers, tmp_path):
    ws, flat, _ = windows(readers, tmp_path, end_with_eod=True, eod_mask=True)
    crossing = 0
    for w in ws:
        for b, _ in check_window(w, flat):
            assert w["tokens"][b - 1] == EOD and w["loss_mask"][b - 1] == 0
            crossing += 1
        masked = [j for j, t in enumerate(w["tokens"]) if t == EOD]
        assert [j for j, m in enumerate(w["loss_mask"]) if m == 0] == masked
    assert crossing > WINDOWS


def test_the_documented_reader_keeps_packer_rows(readers, tmp_path):
    """docs/export.md's IndexedDataset block, as written, on the page's out/export-megatron:
    row r's sequences are packer row r's samples, with their labels."""
    from test_doc_snippets import ROOT, read_blocks

    block = [
        b
        for b in read_blocks(ROOT / "docs" / "export.md")
        if b.lang == "python" and "IndexedDataset(" in b.code
    ]
    assert len(block) == 1
    code = tmp_path / "reader.py"
    code.write_text(block[0].code)
    work = tmp_path / "work"
    src = write_jsonl(tmp_path / "in.jsonl", samples(end_with_eod=False))
    out = work / "out" / "demo"
    packer.pack([src], out, packer.PackConfig(max_len=128))
    export(out, "megatron", work / "out" / "export-megatron", vocab_size=32000)
    got = consumer(readers, "megatron-recipe", code, work)
    want = [[[ids, labels] for ids, labels, _, _ in samples_of(row)] for row in packer_rows(out)]
    assert got["rows"] == want
