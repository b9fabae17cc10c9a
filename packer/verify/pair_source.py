"""`verify --input` for a pairs output: every segment against the pair it came from.

The input pairs are read again and laid out as the manifest's configuration lays them out (the
same over-length rule and row length), which gives the exact tokens and labels each segment
must hold: prompt + chosen or prompt + rejected, the prompt labelled -100, the first label of
the segment -100. Every segment of the output must equal its expected one, and every pair of
the input must be in the output unless the manifest drops it or `rejects.jsonl` lists it.
"""

from __future__ import annotations

import numpy as np

from packer.contract.names import IGNORE_INDEX
from packer.contract.schema import PAIR_SIDES
from packer.errors import InputError
from packer.planning.pairs import resolve_pairs
from packer.read.pairs import Pairs, pair_samples
from packer.verify.result import CheckResult, Failure


def _side(sample: int) -> str:
    return f"pair {sample // 2} ({PAIR_SIDES[sample % 2]})"


def check_pair_source(source: Pairs, manifest: dict, statuses, segs, result: CheckResult) -> None:
    """Fill `result` (the `input` check): segments equal to the input's, none missing."""
    cfg = manifest["config"]
    try:
        kept = resolve_pairs(*source.lengths, cfg["max_len"], cfg["overlength"], source.locate)
    except InputError as exc:
        result.fail(Failure(f"the input does not pack as the manifest says: {exc}"))
        return
    expected, esegs = pair_samples(source, kept)
    labels = expected.labels.copy()
    labels[esegs.start] = IGNORE_INDEX  # the first label of every segment
    pos = np.searchsorted(esegs.sample, segs.sample)
    pos = np.minimum(pos, max(esegs.sample.size - 1, 0))
    found = esegs.sample.size > 0
    found = (esegs.sample[pos] == segs.sample) if found else np.zeros(segs.sample.size, bool)
    for i in np.flatnonzero(~found)[:100].tolist():
        _fail(result, statuses, segs, i, f"{_side(int(segs.sample[i]))} is not in the input")
    for i in np.flatnonzero(found).tolist():
        shard = statuses[int(segs.status[i])].shard
        e, n = int(esegs.start[pos[i]]), int(esegs.length[pos[i]])
        a, la, m = int(segs.start[i]), int(segs.label_start[i]), int(segs.length[i])
        if m != n:
            _fail(
                result,
                statuses,
                segs,
                i,
                f"{m} tokens, the input's {_side(int(segs.sample[i]))} packs to {n}",
            )
        elif not np.array_equal(shard.ids[a : a + m], expected.tokens[e : e + n]):
            _fail(
                result,
                statuses,
                segs,
                i,
                f"tokens differ from the input's {_side(int(segs.sample[i]))}",
            )
        elif not np.array_equal(shard.labels[la : la + m], labels[e : e + n]):
            _fail(
                result,
                statuses,
                segs,
                i,
                f"labels differ from the input's {_side(int(segs.sample[i]))}",
            )
    present = np.zeros(esegs.sample.size, bool)
    present[pos[found]] = True
    rejected = int(manifest["stats"].get("rejected", 0))
    if source.rejects is not None and source.rejects.total != rejected:
        result.fail(
            Failure(
                f"the input has {source.rejects.total} bad pair(s), the manifest says {rejected} "
                "were rejected"
            )
        )
    for j in np.flatnonzero(~present)[:100].tolist():
        sample = int(esegs.sample[j])
        result.fail(Failure(f"{_side(sample)} of the input is in no row", sample=sample))
    result.details.update({"samples": int(source.num_pairs), "segments": int(esegs.sample.size)})


def _fail(result: CheckResult, statuses, segs, i: int, problem: str) -> None:
    shard = statuses[int(segs.status[i])].shard
    row = shard.shard_row(int(segs.row[i]))
    result.fail(
        Failure(
            f"{shard.name} row {row} (segment {int(segs.k[i])}): {problem}",
            shard=shard.name,
            row=row,
            sample=int(segs.sample[i]),
            segment=int(segs.k[i]),
        )
    )
