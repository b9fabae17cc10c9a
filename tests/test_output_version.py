"""`OutputVersion` (one version of an output, held open while verify reads it) and verify's small
argument helpers, called directly: fast enough for the mutation selection."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import packer
from packer.errors import UsageError, flag_names
from packer.verify import DEFAULT_ROWS, _stage, parse_rows, torch_missing
from packer.verify.output_version import OutputVersion


def make_output(root: Path, name: str = "out", n: int = 5) -> Path:
    src = root / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"input_ids": [1, 2, 3 + i]}) + "\n" for i in range(n)))
    packer.pack(src, root / name, packer.PackConfig(max_len=8), overwrite=True)
    return root / name


def test_a_version_reads_through_the_open_directory(tmp_path):
    out = make_output(tmp_path)
    with OutputVersion(out) as version:
        assert version.fd >= 0 and version.shown == out
        assert version.manifest == json.loads((out / "manifest.json").read_text())
        assert version.manifest_bytes == (out / "manifest.json").read_bytes()
        st = os.stat(out)
        assert version.identity == (st.st_dev, st.st_ino)
        assert version.path == Path(f"/proc/self/fd/{version.fd}")
        assert (version.path / "manifest.json").read_bytes() == version.manifest_bytes
        assert not version.changed() and not version._moved()
        inner = f"{version.path}{os.sep}shard-00000.arrow: bad"
        assert version.shown_path(inner) == f"{out}{os.sep}shard-00000.arrow: bad"
        assert version.shown_path("no path here") == "no path here"
    assert version.fd == -1
    version.close()  # closing twice is harmless
    assert version.fd == -1


def test_a_replaced_or_rewritten_output_is_noticed(tmp_path):
    out = make_output(tmp_path)
    version = OutputVersion(out)
    try:
        (out / "manifest.json").write_bytes(version.manifest_bytes + b" ")
        assert version.changed() and not version._moved()
        (out / "manifest.json").write_bytes(version.manifest_bytes)
        assert not version.changed()
        (out / "manifest.json").unlink()
        assert version.changed()
        shutil.rmtree(out)
        make_output(tmp_path, n=6)  # a new directory at the same path
        assert version._moved() and version.changed()
        shutil.rmtree(out)
        assert version._moved() and version.changed()
    finally:
        version.close()


def test_what_is_not_an_output_is_one_line(tmp_path):
    with pytest.raises(UsageError) as info:
        OutputVersion(tmp_path / "absent")
    assert str(info.value) == f"{tmp_path / 'absent'}: no such directory"
    with pytest.raises(UsageError) as info:
        OutputVersion(tmp_path)
    assert str(info.value) == f"{tmp_path}: no manifest.json: not a packer output"
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(UsageError) as info:
        OutputVersion(tmp_path)
    assert str(info.value) == f"{tmp_path}: no manifest.json: not a packer output"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text("{")
    with pytest.raises(UsageError, match="manifest.json is not valid JSON"):
        OutputVersion(bad)


def test_rows_and_the_torch_hint():
    assert parse_rows(None) == DEFAULT_ROWS
    assert parse_rows(3) == 3 and parse_rows("7") == 7 and parse_rows(" ALL ") is None
    for bad in (0, "0", -2, "x", "1.5"):
        with pytest.raises(UsageError) as info:
            parse_rows(bad)
        assert str(info.value) == f"rows must be a positive integer or 'all', got {bad!r}"
    assert torch_missing() == (
        "the attention check needs torch (packer's 'verify' extra): pip install torch, or pass "
        "attention=False for the structural checks alone"
    )
    with flag_names():
        assert torch_missing().endswith("or pass --no-attention for the structural checks alone")


def test_stage_reports_to_progress():
    assert _stage(None, "x") is None
    seen = []
    on_row = _stage(lambda *a: seen.append(a), "attention rows")
    on_row(2, 9)
    assert seen == [("attention rows", 2, 9)]
