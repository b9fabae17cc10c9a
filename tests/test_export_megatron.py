"""`--to megatron`: the token dtype is picked from the vocabulary size as Megatron's own tools
pick it, so an export merges with data Megatron made for the same tokenizer; without
`--vocab-size` the export says, in one warning line, that the dtype followed the largest id."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import make_samples, write_jsonl
from export_checks import consumer, packer_rows, readers_python, samples_of

import packer
from packer.export import export

pytestmark = pytest.mark.xdist_group("export")
LLAMA3_VOCAB = 128256  # int32 in Megatron's tools; the samples' ids all fit uint16


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("megatron")
    src = write_jsonl(root / "in.jsonl", make_samples(60, seed=5, median=40))
    out = root / "packed"
    packer.pack([src], out, packer.PackConfig(max_len=128, overlength="split"))
    return out


def packer_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "packer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_no_vocab_size_warns_in_one_line_and_still_exports(packed, tmp_path):
    r = packer_cli("export", packed, "--to", "megatron", "-o", tmp_path / "m")
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert "--vocab-size" in warnings[0] and "uint16" in warnings[0]
    assert (tmp_path / "m" / "packer_export.json").is_file()
    r = packer_cli(
        "export", packed, "--to", "megatron", "-o", tmp_path / "v", "--vocab-size", LLAMA3_VOCAB
    )
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    # other formats have no vocabulary to size
    r = packer_cli("export", packed, "--to", "trl", "-o", tmp_path / "t")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_the_library_names_the_parameter_and_reports_the_warning_in_json(packed, tmp_path):
    result = export(packed, "megatron", tmp_path / "m")
    assert len(result.warnings) == 1 and "no vocab_size:" in result.warnings[0]
    assert result.to_dict()["warnings"] == list(result.warnings)
    assert export(packed, "megatron", tmp_path / "v", vocab_size=32000).warnings == ()


@pytest.mark.parametrize(("vocab", "dtype"), [(65499, "uint16"), (65500, "int32")])
def test_the_dtype_threshold_is_megatrons(packed, tmp_path, vocab, dtype):
    result = export(packed, "megatron", tmp_path / "m", vocab_size=vocab)
    assert result.details["dtype"] == dtype
    size = sum(n for r in packer_rows(packed) for n in r["seq_lens"]) * np.dtype(dtype).itemsize
    assert (tmp_path / "m" / "input_ids.bin").stat().st_size == size


def test_an_export_merges_with_data_megatron_made_for_the_same_tokenizer(packed, tmp_path):
    readers = readers_python()
    if readers is None:
        pytest.skip("the readers' virtualenv (scripts/readers_venv.py) cannot be built here")
    rows = packer_rows(packed)
    ours = [s[0] for row in rows for s in samples_of(row)]
    sized = tmp_path / "sized"
    export(packed, "megatron", sized, vocab_size=LLAMA3_VOCAB)
    (tmp_path / "merge-sized").mkdir()
    got = consumer(
        readers, "megatron-merge", LLAMA3_VOCAB, tmp_path / "merge-sized", sized / "input_ids"
    )
    assert got["merged"] and got["dtype"] == "int32"
    assert got["sequences"] == [[5, 6, 7], [8, 9], *ours]
    # Megatron's two documents, then packer's rows as documents
    ends = np.cumsum([len(r["seq_lens"]) for r in rows]) + 2
    assert got["document_indices"] == [0, 1, 2, *ends.tolist()]
    # left to the largest id, the dtype is uint16 and megatron-core's merge refuses it
    unsized = tmp_path / "unsized"
    export(packed, "megatron", unsized)
    (tmp_path / "merge-unsized").mkdir()
    got = consumer(
        readers, "megatron-merge", LLAMA3_VOCAB, tmp_path / "merge-unsized", unsized / "input_ids"
    )
    assert got == {"merged": False, "dtype": "int32"}


def test_pack_export_megatron_warns_too(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(30, seed=6, median=20))
    out = tmp_path / "out"
    r = packer_cli(
        "pack", src, "-L", 64, "--overlength", "split", "-o", out, "--export", "megatron"
    )
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "--vocab-size" in warnings[0]
