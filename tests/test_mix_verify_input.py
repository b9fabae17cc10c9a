"""`verify --input` on a mixture whose sources differ in columns and labels.

pack reads every source with its own columns (a JSONL source of its own input column without
labels, a labelled Parquet source); verify's re-read of the inputs must do the same, on a
one-plan run as on a block run, and a changed token in a copy of the shards must fail the
input check at its row, so the check is not vacuous.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_samples, to_table

from packer.verify import verify


@pytest.fixture(scope="module")
def mixture(tmp_path_factory) -> tuple[Path, list[Path]]:
    """A config of two sources: `ids.jsonl` (column `ids`, no labels, a few bad lines skipped)
    and `lab/` (two labelled Parquet files); and the --input paths in the config's order."""
    d = tmp_path_factory.mktemp("mix")
    rng = np.random.default_rng(5)
    lines = []
    for i in range(400):
        ids = rng.integers(0, 1000, int(rng.integers(1, 300))).tolist()
        lines.append('{"input_ids": "bad"}' if i % 97 == 5 else json.dumps({"ids": ids}))
    chats = d / "ids.jsonl"
    chats.write_text("\n".join(lines) + "\n")
    labelled = d / "lab"
    labelled.mkdir()
    for i in range(2):
        samples = make_samples(200, seed=10 + i, median=60, max_len=512)
        pq.write_table(to_table(samples), labelled / f"s{i}.parquet", row_group_size=50)
    config = d / "mix.yaml"
    config.write_text(
        "max_len: 512\non_error: skip\ndatasets:\n"
        f"  - {{path: {chats}, weight: 1, input_column: ids, labels_column: null}}\n"
        f"  - {{path: {labelled}, weight: 1}}\n"
    )
    return config, [chats, labelled]


def _tamper(out: Path) -> tuple[str, int]:
    """Change one token of the second row of the first shard in place (same size):
    (shard, row)."""
    manifest = json.loads((out / "manifest.json").read_text())
    name = manifest["shards"][0]["file"]
    shard = out / name
    with pa.memory_map(str(shard)) as src:
        batch = pa.ipc.open_stream(src).read_next_batch()
    assert batch.schema.names[0] == "input_ids"  # its values come first in the file
    ids = batch.column("input_ids")[1].values.to_numpy()[3:11].astype("<i4")
    data = bytearray(shard.read_bytes())
    at = data.find(ids.tobytes())
    assert at >= 0
    changed = ids.copy()
    changed[0] += 1
    data[at : at + 32] = changed.tobytes()
    shard.write_bytes(bytes(data))
    return name, 1


@pytest.mark.parametrize("layout", [[], ["--block-size", "16KiB"]], ids=["one-plan", "blocks"])
def test_verify_input_reads_each_source_with_its_own_columns(cli, mixture, tmp_path, layout):
    config, inputs = mixture
    out = tmp_path / "out"
    r = cli("pack", "-c", config, "-o", out, *layout, "--json")
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["has_labels"] for i in manifest["inputs"]] == [False, True, True]
    if layout:
        assert manifest["stats"]["blocks"] > 2
    args = ["verify", out, "--no-attention", "--json"]
    r = cli(*args, *[a for p in inputs for a in ("--input", p)])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["checks"]["input"]["ok"], report["checks"]["input"]

    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    shard, row = _tamper(copy)
    result = verify(copy, inputs, attention=False)
    assert not result.ok
    failures = result.checks["input"].failures
    assert failures and all(f.shard == shard and f.row == row for f in failures), failures
    assert f"{shard} row {row}" in failures[0].message
    assert "of the sample is" in failures[0].message and "but the source has" in failures[0].message
    # fewer files than the sources were read from: refused in one line, nothing compared
    r = cli("verify", copy, "--no-attention", "--input", inputs[0])
    assert r.exit_code == 1 and "the mixture was packed from 3" in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1
