"""Rejected samples: rejects.jsonl as the manifest records it, and the inputs' rejects against both.

The manifest counts rejected samples three times (per input, in its stats, and in the `rejects`
entry that names the file); they must agree with each other and with the file's lines, and with
`--input`, with the samples reading the inputs rejects again.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from packer import hashing
from packer.verify.result import CheckResult, Failure


def read_rejects(output_dir: Path, manifest: dict, result: CheckResult) -> np.ndarray | None:
    """The sample indices rejects.jsonl lists, checked against its recorded hash and counts
    (None when the manifest records no rejects file or it cannot be read: a failure then)."""
    entry = manifest.get("rejects")
    stats_rejected = int(manifest["stats"].get("rejected", 0))
    prior = int(((manifest.get("repacked_from") or {}).get("absent") or {}).get("rejected", 0))
    per_input = sum(int(inp.get("rejected", 0)) for inp in manifest.get("inputs", []))
    if per_input != stats_rejected + prior:
        before = f" (and {prior} before a repack)" if prior else ""
        result.fail(
            Failure(
                f"manifest inputs record {per_input} rejected sample(s) but its stats "
                f"{stats_rejected}{before}"
            )
        )
    if not entry:
        if stats_rejected:
            result.fail(
                Failure(f"manifest stats record {stats_rejected} rejected but no rejects file")
            )
        return None
    name = entry.get("file", "rejects.jsonl")
    path = output_dir / name
    try:
        data = path.read_bytes()
    except OSError as exc:
        result.fail(Failure(f"{name}: listed in the manifest but unreadable ({exc.strerror})"))
        return None
    digest = hashing.recorded(entry)
    if digest:
        h = hashing.new(digest[0])
        h.update(data)
        if h.hexdigest() != digest[1]:
            result.fail(
                Failure(f"{name}: {digest[0]} differs from the manifest (changed after packing)")
            )
    try:
        index = np.array(
            [int(json.loads(line)["sample_index"]) for line in data.splitlines() if line.strip()],
            np.int64,
        )
    except (ValueError, KeyError, TypeError):
        result.fail(Failure(f"{name}: not a JSON line with a sample_index on every line"))
        return None
    for what, count in (("rejects.count", entry.get("count")), ("stats", stats_rejected)):
        if count is not None and int(count) != index.size:
            result.fail(
                Failure(f"{name}: lists {index.size} sample(s) but the manifest's {what} {count}")
            )
    if np.unique(index).size != index.size:
        result.fail(Failure(f"{name}: lists a sample more than once"))
    return index


def check_rejected_inputs(
    source_rejected: np.ndarray, rejected: np.ndarray | None, manifest: dict, result: CheckResult
) -> None:
    """The input samples that reading rejects (`source_rejected`, per sample) are as many as
    the manifest accounts for, and the ones rejects.jsonl lists (`rejected`, when read)."""
    n_prior = int(((manifest.get("repacked_from") or {}).get("absent") or {}).get("rejected", 0))
    expected = int(manifest["stats"].get("rejected", 0)) + n_prior
    found = np.flatnonzero(source_rejected)
    if found.size != expected:
        result.fail(
            Failure(
                f"the inputs hold {found.size} sample(s) that packer "
                f"rejects, but the manifest accounts for {expected}"
            )
        )
    elif rejected is not None and not np.array_equal(np.sort(rejected), found):
        result.fail(
            Failure(
                "rejects.jsonl lists samples "
                + ", ".join(str(int(i)) for i in np.setdiff1d(rejected, found)[:10])
                + " that the inputs hold as valid (it should list "
                + ", ".join(str(int(i)) for i in np.setdiff1d(found, rejected)[:10])
                + ")"
            )
        )
