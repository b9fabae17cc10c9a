"""Pair checks of a `pack --pairs` output: every pair whole, adjacent, in one row, one prompt.

DPO compares the two sides of a pair, so a pair split across rows, its sides swapped or out of
place, or a prompt that differs between them corrupts the preference signal without any error
in training. Over every segment of every shard: the segments of pair p are samples 2p (chosen)
and 2p + 1 (rejected); both must be present, in the same row, chosen immediately before
rejected; the rows' `pair_index` and `pair_side` must say the same; and the two segments must
hold the same prompt (the tokens before the first label that is not -100). That the sides
cannot see each other is the attention check's (each side is a segment of its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from packer.contract.names import IGNORE_INDEX
from packer.contract.schema import PAIR_SIDES
from packer.verify.result import CheckResult, Failure
from packer.verify.row_checks import RowStatus


@dataclass
class _Segments:
    """Every segment of the output, flat: where it is and where its tokens lie."""

    sample: np.ndarray  # int64
    status: np.ndarray  # which RowStatus (record batch) holds it
    row: np.ndarray  # row within its record batch
    k: np.ndarray  # position within its row
    start: np.ndarray  # first token, in the batch's flat token array
    label_start: np.ndarray  # its first label, in the batch's flat label array
    length: np.ndarray
    prompt: np.ndarray  # tokens before the first target


def _segments_of(statuses: list[RowStatus]) -> _Segments:
    parts = {name: [] for name in _Segments.__dataclass_fields__}
    for s, st in enumerate(statuses):
        sh = st.shard
        si_off = sh.si_off.astype(np.int64)
        n_seg = np.diff(si_off)
        n = int(n_seg.sum())
        rows = np.repeat(np.arange(sh.rows, dtype=np.int64), n_seg)
        k = np.arange(n, dtype=np.int64) - np.repeat(si_off[:-1] - si_off[0], n_seg)
        cu_first = sh.cu_off[:-1].astype(np.int64)[rows] + k
        start = sh.ids_off[:-1].astype(np.int64)[rows] + sh.cu[cu_first]
        label_start = sh.lab_off[:-1].astype(np.int64)[rows] + sh.cu[cu_first]
        length = sh.cu[cu_first + 1].astype(np.int64) - sh.cu[cu_first]
        parts["sample"].append(sh.sample_index[si_off[0] : si_off[-1]].astype(np.int64))
        parts["status"].append(np.full(n, s, np.int64))
        parts["row"].append(rows)
        parts["k"].append(k)
        parts["start"].append(start)
        parts["label_start"].append(label_start)
        parts["length"].append(length)
        parts["prompt"].append(_prompt_lengths(sh.labels, label_start, length))
    return _Segments(
        **{k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in parts.items()}
    )


def _prompt_lengths(labels: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Per segment, the tokens before its first target (the whole segment if it has none)."""
    prompt = length.copy()
    targets = np.flatnonzero(labels != IGNORE_INDEX)
    if targets.size == 0 or start.size == 0:
        return prompt
    seg = np.searchsorted(start, targets, side="right") - 1
    inside = (seg >= 0) & (targets < start[np.maximum(seg, 0)] + length[np.maximum(seg, 0)])
    seg, targets = seg[inside], targets[inside]
    first_seg, first = np.unique(seg, return_index=True)
    prompt[first_seg] = targets[first] - start[first_seg]
    return prompt


def _where(statuses, segs: _Segments, i: int) -> tuple[str, int]:
    shard = statuses[int(segs.status[i])].shard
    return shard.name, shard.shard_row(int(segs.row[i]))


def _fail(result: CheckResult, statuses, segs: _Segments, i: int, problem: str) -> None:
    name, row = _where(statuses, segs, i)
    pair = int(segs.sample[i]) // 2
    result.fail(
        Failure(
            f"{name} row {row}, pair {pair} (segment {int(segs.k[i])}): {problem}",
            shard=name,
            row=row,
            sample=int(segs.sample[i]),
            segment=int(segs.k[i]),
        )
    )


def _check_placement(statuses, segs: _Segments, result: CheckResult) -> np.ndarray:
    """Both sides present, one row, chosen right before rejected: the chosen segments of the
    pairs that are placed right (for the prompt check). Vectorized; Python only per failure."""
    order = np.argsort(segs.sample, kind="stable")
    sample = segs.sample[order]
    _, first, count = np.unique(sample // 2, return_index=True, return_counts=True)
    two = count == 2
    c_at = np.where(two, first, 0)
    whole = (
        two
        & (sample[c_at] % 2 == 0)
        & (sample[np.minimum(c_at + 1, sample.size - 1)] == sample[c_at] + 1)
    )
    for g in np.flatnonzero(~whole).tolist():
        here = order[first[g] : first[g] + count[g]]
        sides = (segs.sample[here] % 2).tolist()
        missing = [PAIR_SIDES[s] for s in (0, 1) if s not in sides]
        what = f"its {missing[0]} side is in no row" if missing else "a side appears twice"
        _fail(result, statuses, segs, int(here[0]), what)
    c, r = order[first[whole]], order[first[whole] + 1]
    same_row = (segs.status[c] == segs.status[r]) & (segs.row[c] == segs.row[r])
    adjacent = same_row & (segs.k[r] == segs.k[c] + 1)
    for i in np.flatnonzero(~adjacent).tolist():
        ci, ri = int(c[i]), int(r[i])
        if not same_row[i]:
            name, row = _where(statuses, segs, ri)
            _fail(
                result,
                statuses,
                segs,
                ci,
                f"split across rows: its rejected side is in {name} row {row}",
            )
        elif segs.k[ri] == segs.k[ci] - 1:
            _fail(result, statuses, segs, ci, "sides swapped: the rejected segment comes first")
        else:
            _fail(
                result,
                statuses,
                segs,
                ci,
                f"its sides are not adjacent (rejected is segment {int(segs.k[ri])})",
            )
    return np.sort(c[adjacent])


def _check_prompts(statuses, segs: _Segments, chosen: np.ndarray, result: CheckResult) -> None:
    """The two sides of each well-placed pair hold the same prompt."""
    for c in chosen.tolist():
        r = c + 1 if c + 1 < segs.sample.size and segs.sample[c + 1] == segs.sample[c] + 1 else None
        if r is None:  # the sides are adjacent in their row, so adjacent in the flat arrays
            continue
        shard = statuses[int(segs.status[c])].shard
        pc, pr = int(segs.prompt[c]), int(segs.prompt[r])
        a = shard.ids[int(segs.start[c]) : int(segs.start[c]) + pc]
        b = shard.ids[int(segs.start[r]) : int(segs.start[r]) + pr]
        if pc != pr or not np.array_equal(a, b):
            _fail(
                result,
                statuses,
                segs,
                c,
                f"the chosen and rejected segments hold different prompts ({pc} and {pr} tokens)",
            )


def _check_columns(output_dir: Path, statuses, segs: _Segments, result: CheckResult) -> None:
    """`pair_index` and `pair_side` agree with `sample_index` (2 x pair + side)."""
    pair_index, pair_side = [], []
    for name in dict.fromkeys(st.shard.name for st in statuses):
        table = pa.ipc.open_stream(pa.memory_map(str(output_dir / name))).read_all()
        for column, out in (("pair_index", pair_index), ("pair_side", pair_side)):
            if column not in table.column_names:
                result.fail(Failure(f"{name}: no '{column}' column in a pairs output", shard=name))
                return
            out.append(table.column(column).combine_chunks().values.to_numpy().astype(np.int64))
    pair_index, pair_side = np.concatenate(pair_index), np.concatenate(pair_side)
    if pair_index.size != segs.sample.size:
        result.fail(
            Failure(
                f"the pair columns hold {pair_index.size} entries for {segs.sample.size} segments"
            )
        )
        return
    bad = np.flatnonzero((pair_index != segs.sample // 2) | (pair_side != segs.sample % 2))
    for i in bad[:1000].tolist():
        said = PAIR_SIDES[pair_side[i]] if pair_side[i] in (0, 1) else str(pair_side[i])
        _fail(
            result,
            statuses,
            segs,
            i,
            f"pair_index {pair_index[i]} / pair_side {said} disagree with sample_index "
            f"{int(segs.sample[i])} (pair {int(segs.sample[i]) // 2}, "
            f"{PAIR_SIDES[int(segs.sample[i]) % 2]})",
        )


def check_pairs(
    output_dir: Path,
    statuses: list[RowStatus],
    result: CheckResult,
    manifest: dict | None = None,
    source=None,
    input_check: CheckResult | None = None,
) -> None:
    """Run the pair checks over the record batches `check_structure` read; with `source` (the
    `--input` pairs, `packer.read.pairs.Pairs`), every segment against its input pair too."""
    segs = _segments_of(statuses)
    _check_columns(Path(output_dir), statuses, segs, result)
    chosen = _check_placement(statuses, segs, result)
    _check_prompts(statuses, segs, chosen, result)
    result.details.update({"pairs": int(chosen.size), "segments": int(segs.sample.size)})
    if source is not None:
        from packer.verify.pair_source import check_pair_source

        check_pair_source(source, manifest, statuses, segs, input_check)
