"""`packer export`: every format read back by the trainer's own reader (or, where that cannot
run here, an independent reader written from its source), compared sample by sample with
packer's rows and with the original inputs, and checked by packer's verify on what the reader
yields."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_samples, write_jsonl
from export_checks import (
    bridge_collate,
    bridge_read,
    consumer,
    original_piece,
    packer_rows,
    samples_of,
    verify_rows,
)

import packer
from packer.cli import app
from packer.errors import InputError, UsageError
from packer.export import EXPORT_MANIFEST, export
from packer.hashing import file_digest

L = 256
pytestmark = pytest.mark.xdist_group("export")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A padded output whose long samples were split (non-zero sample offsets), with labels
    that mask each sample's prompt."""
    root = tmp_path_factory.mktemp("export")
    samples = make_samples(400, seed=3, median=60)
    src = write_jsonl(root / "in.jsonl", samples)
    out = root / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=L, pad=True, overlength="split"))
    return out, samples, packer_rows(out)


def check_against_inputs(rows, samples):
    """Every sample of packer's rows is its input (or the piece of it its offset names)."""
    seen = 0
    for row in rows:
        for ids, labels, si, so in samples_of(row):
            want_ids, want_labels = original_piece(samples, si, so, len(ids))
            assert ids == want_ids and labels == want_labels
            seen += 1
    return seen


def test_trl_collator_gets_packer_rows(packed, tmp_path):
    import datasets
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    out, samples, rows = packed
    dest = tmp_path / "trl"
    result = export(out, "trl", dest)
    ds = datasets.load_from_disk(str(dest))
    assert len(ds) == len(rows) == result.rows
    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    for start in range(0, len(ds), 7):
        batch_rows = rows[start : start + 7]
        batch = collate([ds[i] for i in range(start, min(start + 7, len(ds)))])
        ids = [t for r in batch_rows for t in r["input_ids"]]
        assert batch["input_ids"][0].tolist() == ids
        assert batch["labels"][0].tolist() == [x for r in batch_rows for x in r["labels"]]
        assert batch["position_ids"][0].tolist() == [
            p for r in batch_rows for p in r["position_ids"]
        ]
        lens = [n for r in batch_rows for n in r["seq_lens"]]
        assert batch["cu_seq_lens_q"].tolist() == [0, *np.cumsum(lens).tolist()]
    assert ds[3]["sample_index"] == rows[3]["sample_index"]
    assert check_against_inputs(rows, samples) == result.samples
    # packer's verify on what the collator feeds the model, a few rows at a time
    few = collate([ds[i] for i in range(3)])
    row = {
        "input_ids": few["input_ids"][0].tolist(),
        "labels": few["labels"][0].tolist(),
        "position_ids": few["position_ids"][0].tolist(),
        "cu_seqlens": few["cu_seq_lens_q"].tolist(),
    }
    structure, isolation, control = verify_rows([row], max_len=len(row["input_ids"]))
    assert structure.ok and isolation.ok and control.ok


def test_megatron_indexed_dataset_reads_samples_and_rows(packed, tmp_path, readers):
    out, samples, rows = packed
    dest = tmp_path / "megatron"
    export(out, "megatron", dest)
    got = consumer(readers, "megatron", dest)
    assert got["input_ids_dtype"] == "uint16" and got["labels_dtype"] == "int32"
    flat = [s for row in rows for s in samples_of(row)]
    assert got["input_ids"] == [s[0] for s in flat]
    assert got["labels"] == [s[1] for s in flat]
    # each row one document: document_indices are the rows' sample counts, summed
    assert got["document_indices"] == [0, *np.cumsum([len(r["seq_lens"]) for r in rows]).tolist()]
    wide = tmp_path / "megatron-wide"
    export(out, "megatron", wide, vocab_size=70000)
    assert consumer(readers, "megatron", wide)["input_ids_dtype"] == "int32"
    # verify on the first rows as Megatron's documents rebuild them
    docs = got["document_indices"]
    view = []
    for d in range(3):
        seqs = range(docs[d], docs[d + 1])
        view.append(
            {
                "input_ids": [t for i in seqs for t in got["input_ids"][i]],
                "labels": [t for i in seqs for t in got["labels"][i]],
                "position_ids": [p for i in seqs for p in range(len(got["input_ids"][i]))],
                "cu_seqlens": [0, *np.cumsum([len(got["input_ids"][i]) for i in seqs]).tolist()],
            }
        )
    structure, isolation, control = verify_rows(view, L)
    assert structure.ok and isolation.ok and control.ok


def _mds_rows(rows):
    out = []
    for row in rows:
        starts = np.cumsum([0, *row["seq_lens"]]).tolist()
        out.append(
            {
                "cu_seqlens": starts,
                "input_ids": row["input_ids"],
                "labels": row["labels"],
                "position_ids": row["position_ids"],
                "sample_index": row["sample_index"],
                "sample_offset": row["sample_offset"],
            }
        )
    return out


def test_mds_streaming_dataset_reads_rows_and_bytes_equal_its_writer(packed, tmp_path, readers):
    out, samples, rows = packed
    dest = tmp_path / "mds"
    limit = 40_000  # several shards
    export(out, "mds", dest, mds_size_limit=limit)
    got = consumer(readers, "mds", dest)
    assert got == _mds_rows(rows)
    index = json.loads((dest / "index.json").read_text())
    assert len(index["shards"]) > 1
    assert all(s["raw_data"]["bytes"] <= limit for s in index["shards"])
    # streaming's own MDSWriter, given the same rows, writes the same files
    rows_json = tmp_path / "rows.json"
    rows_json.write_text(json.dumps(_mds_rows(rows)))
    theirs = tmp_path / "theirs"
    consumer(readers, "mds-write", rows_json, theirs, limit)
    for shard in index["shards"]:
        name = shard["raw_data"]["basename"]
        assert (dest / name).read_bytes() == (theirs / name).read_bytes(), name
    assert json.loads((theirs / "index.json").read_text()) == index
    structure, isolation, control = verify_rows(got[:3], L)
    assert structure.ok and isolation.ok and control.ok


def test_megatron_bridge_collate_trains_on_the_same_targets(packed, tmp_path):
    out, samples, rows = packed
    dest = tmp_path / "bridge"
    export(out, "megatron-bridge", dest, eos_id=2)
    items = bridge_read(dest)
    assert len(items) == len(rows)
    for item, row in zip(items, rows):
        batch = bridge_collate(item, L, eos_id=2)
        want_tokens, want_targets, want_mask = [], [], []
        for ids, labels, _, _ in samples_of(row):
            want_tokens += ids[:-1]
            want_targets += ids[1:]
            want_mask += [int(x != -100) for x in labels[1:]]
        n = batch["real"]
        assert batch["tokens"][:n] == want_tokens
        assert batch["labels"][:n] == want_targets
        assert batch["loss_mask"][:n] == want_mask
        # the loss tokens are packer's: each counted label, never a first token
        assert sum(want_mask) == sum(
            1 for ids, labels, _, _ in samples_of(row) for x in labels[1:] if x != -100
        )
    metadata = json.loads((dest / "packing_metadata.json").read_text())
    assert metadata[0]["max_samples_per_bin"] == max(len(r["seq_lens"]) for r in rows)
    # runtime lengths: Bridge feeds each sample without its last token
    assert metadata[0]["dataset_max_seqlen"] == max(n - 1 for r in rows for n in r["seq_lens"])
    assert metadata[0]["pack_size"] == L
    manifest = json.loads((dest / EXPORT_MANIFEST).read_text())
    assert manifest["details"]["eos_id"] == 2
    # verify on what the collate feeds: aligned labels rebuilt from the shifted mask
    view = []
    for item in items[:3]:
        b = bridge_collate(item, L, eos_id=2)
        n, cu = b["real"], [c for c in b["cu_seqlens"] if c <= b["real"]]
        labels = [-100] * n
        for s, e in zip(cu[:-1], cu[1:]):
            for j in range(s + 1, e):
                if b["loss_mask"][j - 1]:
                    labels[j] = b["tokens"][j]
        view.append(
            {
                "input_ids": b["tokens"][:n],
                "labels": labels,
                "position_ids": b["position_ids"][:n],
                "cu_seqlens": cu,
            }
        )
    structure, isolation, control = verify_rows(view, L)
    assert structure.ok and isolation.ok and control.ok


def test_verify_adapter_catches_a_merged_boundary(packed):
    _, _, rows = packed
    row = next(r for r in rows if len(r["seq_lens"]) >= 3)
    cu = np.cumsum([0, *row["seq_lens"]]).tolist()
    good = {
        "input_ids": row["input_ids"],
        "labels": row["labels"],
        "position_ids": row["position_ids"],
        "cu_seqlens": cu,
    }
    structure, isolation, _ = verify_rows([good], L)
    assert structure.ok and isolation.ok
    merged = dict(good, cu_seqlens=[cu[0], *cu[2:]])  # two samples read as one
    structure, _, _ = verify_rows([merged], L)
    assert not structure.ok


def test_labels_that_are_not_input_ids_are_refused_for_bridge(tmp_path):
    samples = make_samples(60, seed=5, median=40, max_len=100)
    samples[7]["labels"] = [(x + 1) % 1000 for x in samples[7]["input_ids"]]
    src = write_jsonl(tmp_path / "in.jsonl", samples)
    out = tmp_path / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=L))
    dest = tmp_path / "bridge"
    with pytest.raises(UsageError, match="labels-from-ids") as err:
        export(out, "megatron-bridge", dest)
    assert "row " in str(err.value) and "nothing was written" in str(err.value)
    assert not dest.exists() and not list(tmp_path.glob(".bridge*"))
    # TRL and MDS carry the labels themselves
    export(out, "trl", tmp_path / "trl")
    result = export(out, "megatron-bridge", dest, accept=["labels-from-ids"])
    assert result.rows > 0 and (dest / EXPORT_MANIFEST).is_file()
    assert json.loads((dest / EXPORT_MANIFEST).read_text())["accepted"] == ["labels-from-ids"]


def test_exports_are_deterministic_and_name_their_source(packed, tmp_path):
    out, _, _ = packed
    for fmt in ("trl", "megatron", "mds", "megatron-bridge"):
        a, b = tmp_path / f"{fmt}-a", tmp_path / f"{fmt}-b"
        export(out, fmt, a)
        export(out, fmt, b)
        files = sorted(p.name for p in a.iterdir())
        assert files == sorted(p.name for p in b.iterdir())
        for name in files:
            if name != EXPORT_MANIFEST:
                assert (a / name).read_bytes() == (b / name).read_bytes(), (fmt, name)
        manifest = json.loads((a / EXPORT_MANIFEST).read_text())
        import hashlib

        digest = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
        assert manifest["source"]["manifest_sha256"] == digest
        assert {f["file"] for f in manifest["files"]} == set(files) - {EXPORT_MANIFEST}
        for entry in manifest["files"]:  # hashed while written or read back: the file's bytes
            assert entry["xxh3_128"] == file_digest(a / entry["file"]), (fmt, entry["file"])
            assert entry["bytes"] == (a / entry["file"]).stat().st_size


def test_a_broken_source_leaves_nothing(packed, tmp_path):
    out, _, _ = packed
    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(out, broken)
    shard = broken / json.loads((broken / "manifest.json").read_text())["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:100])
    dest = tmp_path / "dest"
    with pytest.raises(InputError, match="shard"):
        export(broken, "mds", dest)
    assert not dest.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".dest")]


def test_cli_export(packed, tmp_path, runner):
    out, _, rows = packed
    dest = tmp_path / "cli"
    r = runner.invoke(app, ["export", str(out), "--to", "trl", "-o", str(dest), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["rows"] == len(rows) and report["format"] == "trl"
    r = runner.invoke(app, ["export", str(out), "--to", "trl", "-o", str(dest)])
    assert r.exit_code == 2 and "--overwrite" in r.output
    r = runner.invoke(app, ["export", str(out), "--to", "trl", "-o", str(dest), "--overwrite"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", str(out), "--to", "parquet", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "--to must be one of" in r.output
    r = runner.invoke(
        app, ["export", str(tmp_path / "none"), "--to", "trl", "-o", str(tmp_path / "y")]
    )
    assert r.exit_code == 2 and "Traceback" not in r.output
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    r = runner.invoke(app, ["export", str(out), "--to", "mds", "-o", str(other), "--overwrite"])
    assert r.exit_code == 2 and "not a packer export" in r.output
    assert (other / "keep.txt").exists()


def _positions_ok_reference(pos_off, pos, cu_off, cu) -> int:
    """Plain Python: the first row whose positions do not restart per segment, or -1."""
    for r in range(len(pos_off) - 1):
        row = list(pos[pos_off[r] : pos_off[r + 1]])
        bounds = list(cu[cu_off[r] : cu_off[r + 1]])
        if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != len(row):
            return r
        want = []
        for s, e in zip(bounds[:-1], bounds[1:]):
            if e < s:
                return r
            want += list(range(e - s))
        if row != want:
            return r
    return -1


def test_position_kernel_matches_a_python_reference():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from packer.export.kernels import first_bad_position_row

    row = st.lists(st.integers(1, 6), min_size=1, max_size=4)

    @settings(max_examples=300, deadline=None)
    @given(st.lists(row, min_size=1, max_size=5), st.integers(0, 10**6), st.booleans())
    def check(rows, seed, corrupt):
        pos, pos_off, cu, cu_off = [], [0], [], [0]
        for lens in rows:
            bounds = np.cumsum([0, *lens]).tolist()
            cu += bounds
            cu_off.append(len(cu))
            for n in lens:
                pos += list(range(n))
            pos_off.append(len(pos))
        rng = np.random.default_rng(seed)
        if corrupt:
            if rng.random() < 0.5:
                pos[int(rng.integers(len(pos)))] += int(rng.integers(1, 3))
            else:
                cu[int(rng.integers(len(cu)))] += int(rng.integers(1, 3))
        arrays = [np.array(a, np.int32) for a in (pos_off, pos, cu_off, cu)]
        assert first_bad_position_row(*arrays) == _positions_ok_reference(*arrays)

    check()


def test_pack_export_packs_then_exports(tmp_path, runner):
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(80, seed=9, median=40, max_len=200))
    out = tmp_path / "packed"
    args = ["pack", str(src), "-o", str(out), "-L", "256", "--export", "mds", "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    dest = tmp_path / "packed-mds"
    assert report["export"]["output"] == str(dest) and report["export"]["rows"] == report["rows"]
    assert (dest / "index.json").is_file() and (dest / EXPORT_MANIFEST).is_file()
    alone = tmp_path / "alone"
    export(out, "mds", alone)
    assert (alone / "shard.00000.mds").read_bytes() == (dest / "shard.00000.mds").read_bytes()
    # refused before packing: nothing new is written
    r = runner.invoke(
        app, ["pack", str(src), "-o", str(tmp_path / "p2"), "-L", "256", "--export", "parquet"]
    )
    assert r.exit_code == 2 and "--export must be one of" in r.output
    assert not (tmp_path / "p2").exists()
    r = runner.invoke(
        app,
        [
            "pack",
            str(src),
            "-o",
            str(tmp_path / "p3"),
            "-L",
            "256",
            "--export",
            "trl",
            "--export-output",
            str(dest),
        ],
    )
    assert r.exit_code == 2 and "--overwrite" in r.output and not (tmp_path / "p3").exists()


def test_export_reads_an_output_on_object_storage(s3, tmp_path, runner):
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(120, seed=11, median=50, max_len=200))
    cfg = packer.PackConfig(max_len=L, pad=True)
    packer.pack([src], s3.url("packed"), cfg)
    packer.pack([src], tmp_path / "local", cfg)
    r = runner.invoke(
        app, ["export", s3.url("packed"), "--to", "mds", "-o", str(tmp_path / "remote-mds")]
    )
    assert r.exit_code == 0, r.output
    export(tmp_path / "local", "mds", tmp_path / "local-mds")
    for name in ("index.json", "shard.00000.mds"):
        assert (tmp_path / "remote-mds" / name).read_bytes() == (
            tmp_path / "local-mds" / name
        ).read_bytes()
    manifest = json.loads((tmp_path / "remote-mds" / EXPORT_MANIFEST).read_text())
    assert manifest["source"]["path"] == s3.url("packed")
    r = runner.invoke(app, ["export", s3.url("none"), "--to", "mds", "-o", str(tmp_path / "x")])
    assert r.exit_code == 1 and "no packer output here" in r.output
    assert "Traceback" not in r.output
    r = runner.invoke(app, ["export", s3.url("packed"), "--to", "mds", "-o", s3.url("mds")])
    assert r.exit_code == 2 and "local directory" in r.output
