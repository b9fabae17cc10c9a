"""What the tests of `packer export` share: packer's own rows read back, the samples they came
from, an independent reader of Megatron-Bridge's collate, and the adapter that runs packer's
verify checks (structure and attention) on rows as a trainer's reader yields them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packer.contract.schema import SCHEMA
from packer.contract.shards import arrays_from_table
from packer.verify.attention import run_attention
from packer.verify.backends import resolve
from packer.verify.picked_rows import RowInput
from packer.verify.result import CheckResult
from packer.verify.row_checks import check_shard_rows

ROOT = Path(__file__).resolve().parent.parent


def packer_rows(out: Path) -> list[dict]:
    """Every row of a packer output without its --pad tail (and, for a --cp-size output, without
    each sample's CP padding): tokens, labels, sample lengths and provenance, read with plain
    pyarrow."""
    manifest = json.loads((out / "manifest.json").read_text())
    rows = []
    for entry in manifest["shards"]:
        table = pa.ipc.open_stream(pa.memory_map(str(out / entry["file"]))).read_all()
        for row in table.to_pylist():
            n = len(row["sample_index"])
            cu = row["cu_seqlens"][: n + 1]
            # a --cp-size row: sample j starts at cu_seqlens_padded[j], real length from cu
            starts = row.get("cu_seqlens_padded") or cu
            take = [i for j in range(n) for i in range(starts[j], starts[j] + cu[j + 1] - cu[j])]
            rows.append(
                {
                    "input_ids": [row["input_ids"][i] for i in take],
                    "labels": [row["labels"][i] for i in take],
                    "position_ids": [row["position_ids"][i] for i in take],
                    "seq_lens": list(np.diff(cu)),
                    "sample_index": row["sample_index"],
                    "sample_offset": row["sample_offset"],
                }
            )
    return rows


def samples_of(row: dict) -> list[tuple[list[int], list[int], int, int]]:
    """(tokens, labels, sample_index, sample_offset) of each sample of a row."""
    out, start = [], 0
    for length, si, so in zip(row["seq_lens"], row["sample_index"], row["sample_offset"]):
        end = start + int(length)
        out.append((row["input_ids"][start:end], row["labels"][start:end], si, so))
        start = end
    return out


def original_piece(samples: list[dict], index: int, offset: int, length: int):
    """The tokens and packer labels a piece of input sample `index` must carry: the input's own
    tokens and labels from `offset`, the first label -100 (packer's rule at every boundary)."""
    sample = samples[index]
    ids = sample["input_ids"][offset : offset + length]
    labels = list(sample.get("labels", sample["input_ids"])[offset : offset + length])
    labels[0] = -100
    return ids, labels


def bridge_read(directory: Path) -> list[dict]:
    """Megatron-Bridge's packed Parquet read as its dataset reads it, independently written from
    megatron/bridge/data/packing/parquet.py (GPTSFTPackedParquetDataset._load_dataset and
    __getitem__: files `*.idx.parquet` of a directory, the columns input_ids, seq_start_id and
    loss_mask, seq_boundaries = seq_start_id + [len(input_ids)])."""
    items = []
    for path in sorted(directory.glob("*.idx.parquet")):
        schema = pq.read_schema(path)
        assert {"input_ids", "seq_start_id", "loss_mask"} <= set(schema.names)
        pf = pq.ParquetFile(path)
        for group in range(pf.metadata.num_row_groups):
            table = pf.read_row_group(group, columns=["input_ids", "seq_start_id", "loss_mask"])
            for row in table.to_pylist():
                items.append(
                    {
                        "input_ids": row["input_ids"],
                        "seq_boundaries": row["seq_start_id"] + [len(row["input_ids"])],
                        "loss_mask": row["loss_mask"],
                    }
                )
    return items


def bridge_collate_cp(item: dict, max_length: int, eos_id: int) -> dict:
    """One item as GPTSFTPackedDataset.collate_fn (megatron/bridge/data/packing/gpt_sft.py)
    builds it with answer_only_loss=True and pad_seq_to_mult > 1: tokens, targets,
    mask and positions as without CP; `cu_seqlens_padded` adds each sub-sequence's e-b-1 (and
    max_length at the end); `cu_seqlens` adds each sub-sequence's logical length, up to its last
    non-EOS token of input_ids[b:e-1] (and repeats its last value for the row's padding)."""
    plain = bridge_collate(item, max_length, eos_id)
    b, ids = item["seq_boundaries"], item["input_ids"]
    padded, logical = [0], [0]
    for s, e in zip(b[:-1], b[1:]):
        padded.append(padded[-1] + e - s - 1)
        seen = ids[s : e - 1]
        real = [i for i, t in enumerate(seen) if t != eos_id]
        logical.append(logical[-1] + (real[-1] + 1 if real else 0))
    if padded[-1] != max_length:
        padded.append(max_length)
    if len(padded) > len(logical):
        logical.append(logical[-1])
    return dict(plain, cu_seqlens_padded=padded, cu_seqlens=logical)


def bridge_collate(item: dict, max_length: int, eos_id: int) -> dict:
    """One item as GPTSFTPackedDataset.collate_fn (megatron/bridge/data/packing/gpt_sft.py)
    builds it with answer_only_loss=True, pad_seq_to_mult=1: each sub-sequence feeds
    input_ids[b:e-1], targets input_ids[b+1:e], loss_mask[b:e-1] (_build_loss_mask), positions
    range(e-b-1), cu_seqlens adding e-b-1 each and max_length at the end; padded with EOS."""
    b = item["seq_boundaries"]
    ids = item["input_ids"]
    spans = list(zip(b[:-1], b[1:]))
    tokens = [t for s, e in spans for t in ids[s : e - 1]]
    labels = [t for s, e in spans for t in ids[s + 1 : e]]
    mask = [m for s, e in spans for m in item["loss_mask"][s : e - 1]]
    positions = [p for s, e in spans for p in range(e - s - 1)]
    cu = [0]
    for s, e in spans:
        cu.append(cu[-1] + e - s - 1)
    if cu[-1] != max_length:
        cu.append(max_length)
    pad = max_length - len(tokens)
    return {
        "tokens": tokens + [eos_id] * pad,
        "labels": labels + [eos_id] * pad,
        "loss_mask": mask + [0] * pad,
        "position_ids": positions + [0] * pad,
        "cu_seqlens": cu,
        "real": len(tokens),
    }


def readers_python() -> Path | None:
    """The readers' virtualenv (built once by scripts/readers_venv.py), or None if it cannot be
    built here."""
    try:
        out = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "readers_venv.py")],
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    return Path(out.stdout.strip().splitlines()[-1])


def consumer(python: Path, *args: str):
    out = subprocess.run(
        [str(python), str(ROOT / "tests" / "consumer_readers.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        # packer itself (its collate, its checks) is imported from this checkout, not installed
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
        },
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout) if out.stdout else None


def verify_rows(rows: list[dict], max_len: int) -> tuple[CheckResult, CheckResult, CheckResult]:
    """packer's structure checks and attention isolation (with its negative control) on rows
    given as a trainer's reader yields them: input_ids, labels (aligned, -100 for no loss),
    position_ids and cu_seqlens per row. Provenance is not checked (sample_index is made up)."""
    columns = {name: [] for name in SCHEMA.names}
    counter = 0
    for row in rows:
        n = len(row["cu_seqlens"]) - 1
        columns["input_ids"].append(list(row["input_ids"]))
        columns["labels"].append(list(row["labels"]))
        columns["position_ids"].append(list(row["position_ids"]))
        columns["cu_seqlens"].append(list(row["cu_seqlens"]))
        columns["sample_index"].append(list(range(counter, counter + n)))
        columns["sample_offset"].append([0] * n)
        columns["num_loss_tokens"].append(sum(1 for x in row["labels"] if x != -100))
        counter += n
    table = pa.table(
        {name: pa.array(columns[name], SCHEMA.field(name).type) for name in SCHEMA.names}
    )
    shard = arrays_from_table(table, "reader")
    structure = CheckResult("structure")
    check_shard_rows(shard, max_len, False, 0, structure)
    isolation, control = CheckResult("attention"), CheckResult("negative control")
    backend, dtype = resolve("auto", "fp32")
    picked = [RowInput("reader", r, shard.row(r)) for r in range(shard.rows)]
    run_attention(picked, backend, dtype, 0, isolation, control)
    return structure, isolation, control
