"""`packer verify` on CP outputs (`pack --cp-size N`) and `verify --cp-size N` on others.

Real outputs are packed, then one CP fault at a time is planted in a copy (the shard rewritten
with its new hash, so the check under test is reached) and verify must name it: a padding token
that is not pad_id, a padding label that counts, padding positions that restart, a real length
beyond its padded one, a padded length that does not divide, `cu_seqlens_padded` missing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import make_samples, write_jsonl

from packer.config import PackConfig
from packer.contract.schema import CP_SCHEMA, SCHEMA
from packer.hashing import file_digest
from packer.pipelines.pack import pack
from packer.verify import verify

CP = 2


@pytest.fixture(scope="module")
def cp_out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cp")
    samples = make_samples(120, seed=5, median=40, max_len=120)
    src = write_jsonl(tmp / "in.jsonl", samples)
    pack([src], tmp / "out", PackConfig(max_len=128, cp_size=CP, pad=True, pad_id=3, shard_rows=8))
    pack([src], tmp / "plain", PackConfig(max_len=128))
    return tmp / "out", src, tmp / "plain"


def rows_of(out: Path, name: str = "shard-00000.arrow") -> list[dict]:
    with pa.memory_map(str(out / name)) as f:
        return pa.ipc.open_stream(f).read_all().to_pylist()


def save(out: Path, rows: list[dict], schema=CP_SCHEMA, name: str = "shard-00000.arrow"):
    path = out / name
    table = pa.Table.from_pylist([{k: r[k] for k in schema.names} for r in rows], schema=schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table)
    manifest = json.loads((out / "manifest.json").read_text())
    entry = next(e for e in manifest["shards"] if e["file"] == name)
    entry["xxh3_128"], entry["bytes"] = file_digest(path), path.stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest))


def padded_row(rows: list[dict]) -> tuple[int, int, int]:
    """(row, segment, first padding token) of a sample with CP padding after it."""
    for r, row in enumerate(rows):
        cu, cup = row["cu_seqlens"], row["cu_seqlens_padded"]
        for k in range(len(row["sample_index"])):
            if cup[k + 1] - cup[k] > cu[k + 1] - cu[k]:
                return r, k, cup[k] + cu[k + 1] - cu[k]
    raise AssertionError("no padded sample")


def failures(result, check: str = "structure") -> list[str]:
    return [f.message for f in result.checks[check].failures]


def test_cp_output_passes_with_its_input(cp_out):
    out, src, _ = cp_out
    result = verify(out, [src], attention=False)
    assert result.ok, result.failures
    assert result.checks["cp"].details["splits"] == "packed for it"
    assert result.checks["input"].ok and result.checks["structure"].details["tokens"] == sum(
        len(json.loads(line)["input_ids"]) for line in src.read_text().splitlines()
    )


@pytest.mark.parametrize(
    "fault, expected",
    [
        ("pad_id", "is not pad_id 3"),
        ("pad_label", "has a label other than -100"),
        ("pad_position", "do not continue the segment's count"),
        ("real_too_long", "does not fit its padded length"),
    ],
)
def test_planted_cp_faults(cp_out, tmp_path, fault, expected):
    out = Path(shutil.copytree(cp_out[0], tmp_path / "bad"))
    rows = rows_of(out)
    r, k, t = padded_row(rows)
    row = rows[r]
    if fault == "pad_id":
        row["input_ids"][t] = 4
    elif fault == "pad_label":
        row["labels"][t] = row["input_ids"][t]
        row["num_loss_tokens"] += 1
    elif fault == "pad_position":
        row["position_ids"][t] = 0
    else:
        row["cu_seqlens"] = [c + (j > k) * 40 for j, c in enumerate(row["cu_seqlens"])]
    save(out, rows)
    result = verify(out, attention=False)
    msgs = failures(result)
    assert not result.ok and any(expected in m for m in msgs), msgs
    assert any(m.startswith(f"shard-00000.arrow row {r}") for m in msgs), msgs


def test_padded_length_not_a_multiple(cp_out, tmp_path):
    """A sample whose padding was cut short (and the row with it) fails divisibility."""
    out = Path(shutil.copytree(cp_out[0], tmp_path / "bad"))
    rows = rows_of(out)
    r, k, t = padded_row(rows)
    row = rows[r]
    for col in ("input_ids", "labels", "position_ids"):
        del row[col][t]
    row["cu_seqlens_padded"] = [c - (j > k) for j, c in enumerate(row["cu_seqlens_padded"])]
    save(out, rows)
    msgs = failures(verify(out, attention=False))
    assert any("not a multiple of 2 x cp_size = 4" in m for m in msgs), msgs


def test_missing_padded_column(cp_out, tmp_path):
    out = Path(shutil.copytree(cp_out[0], tmp_path / "bad"))
    save(out, rows_of(out), schema=SCHEMA)
    msgs = failures(verify(out, attention=False))
    assert any("has no cu_seqlens_padded column" in m for m in msgs), msgs


def test_cp_size_on_a_plain_output(cp_out, cli):
    _, _, plain = cp_out
    result = verify(plain, attention=False, cp_size=2)
    msgs = failures(result, "cp")
    assert not result.ok and msgs
    assert "is not a multiple of 2 x cp_size = 4" in msgs[0] and "pack with --cp-size 2" in msgs[0]
    assert "cp" not in verify(plain, attention=False).checks
    assert verify(cp_out[0], attention=False, cp_size=1).ok  # 2 divides the packed size
    res = cli("verify", plain, "--no-attention", "--cp-size", "2")
    assert res.exit_code == 1 and "[cp]" in res.stderr
    res = cli("verify", cp_out[0], "--no-attention", "--cp-size", "3", "--json")
    assert res.exit_code == 1
    [msg] = [f["message"] for f in json.loads(res.stdout)["checks"]["cp"]["failures"]]
    assert "packed with cp_size 2" in msg
