"""`packer tokenize --resume` keeps a finished batch only where the input bytes it covers are
the ones it tokenized: an input edited in place, its size and modification time put back, is
tokenized again where it changed, and the output is a clean run's on the edited input.

The kill is real (PACKER_FAULT_KILL_AT_TOKENIZED, as tests/test_tokenize_ray_resume.py uses it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_tokenize_ray_resume import ROWS, digests, leftovers, packer, write_raw
from test_tokenize_ray_resume import tokenizer as tokenizer  # the module fixture

pytest.importorskip("transformers")


def _as_json_array(path: Path) -> Path:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    target = path.with_suffix(".json")
    target.write_text("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")
    return target


def _edit_in_place(path: Path, line: int) -> None:
    """One character of line `line` (1-based) changed; the size and mtime put back."""
    st = os.stat(path)
    lines = path.read_bytes().split(b"\n")
    text = lines[line - 1]
    at = text.index(b'"text": "') + len(b'"text": "')
    swapped = b"q" if text[at : at + 1] != b"q" else b"z"
    lines[line - 1] = text[:at] + swapped + text[at + 1 :]
    path.write_bytes(b"\n".join(lines))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("kind", ["jsonl", "json"])
def test_an_input_edited_in_a_finished_batch_is_tokenized_again(tokenizer, tmp_path, kind):
    raw = write_raw(tmp_path / "raw.jsonl", 3 * ROWS + 10, seed=5)  # four batches
    if kind == "json":
        raw = _as_json_array(raw)
    out = tmp_path / "out"
    flags = ["tokenize", raw, "--tokenizer", tokenizer, "-o", out, "--workers", "1"]
    killed = packer(*flags, env={"PACKER_FAULT_KILL_AT_TOKENIZED": "2"})  # batches 0 and 1
    assert killed.returncode == -9, killed.stderr
    _edit_in_place(raw, 3 if kind == "jsonl" else 4)  # a text record of batch 0
    resumed = packer(*flags, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["batches_reused"] == 1  # batch 1 only

    clean = tmp_path / "clean"
    res = packer("tokenize", raw, "--tokenizer", tokenizer, "-o", clean, "--workers", "1")
    assert res.returncode == 0, res.stderr
    assert digests(out) == digests(clean) and len(digests(out)) == 4
    assert leftovers(tmp_path) == []


def test_an_unchanged_input_keeps_its_batches(tokenizer, tmp_path):
    """The hash is of the batch's bytes only: the same bytes keep every finished batch."""
    raw = write_raw(tmp_path / "raw.jsonl", 2 * ROWS + 10, seed=6)
    out = tmp_path / "out"
    flags = ["tokenize", raw, "--tokenizer", tokenizer, "-o", out, "--workers", "1"]
    assert packer(*flags, env={"PACKER_FAULT_KILL_AT_TOKENIZED": "2"}).returncode == -9
    resumed = packer(*flags, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["batches_reused"] == 2
