"""Provenance: every input sample is in the rows once, whole, or accounted for by the manifest.

The rows' (sample_index, sample_offset) pairs are flattened over all shards and sorted, so one
kernel pass (`check_coverage`) finds duplicates and gaps; a sample in no row must be one the
manifest says was dropped or rejected, and with `--input` the source says how long each is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from packer.read.samples import Samples
from packer.verify import kernels as K
from packer.verify.result import MAX_LISTED, CheckResult, Failure
from packer.verify.row_checks import RowStatus
from packer.verify.row_messages import where


@dataclass
class _Pieces:
    """Every segment of every row, in shard order: its sample, offset and length, and where it
    is (the number of its batch in the statuses, its row, its segment in the row)."""

    index: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    shard_no: np.ndarray
    row_no: np.ndarray
    seg_no: np.ndarray


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    """np.concatenate, which refuses an empty list: an output may list no shard at all."""
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _pieces_of(statuses: list[RowStatus]) -> _Pieces:
    """The segments of all the batches checked, flattened."""
    return _Pieces(
        index=_cat([K.as_int64(st.shard.sample_index) for st in statuses]),
        offset=_cat(
            [K.as_int64(st.shard.sample_offset[: st.shard.sample_index.size]) for st in statuses]
        ),
        length=_cat([st.seg_len for st in statuses]),
        shard_no=_cat(
            [np.full(st.shard.sample_index.size, i, np.int64) for i, st in enumerate(statuses)]
        ),
        row_no=_cat(
            [np.repeat(np.arange(st.shard.rows), np.diff(st.shard.si_off)) for st in statuses]
        ),
        seg_no=_cat(
            [
                np.arange(st.shard.sample_index.size)
                - np.repeat(st.shard.si_off[:-1], np.diff(st.shard.si_off))
                for st in statuses
            ]
        ),
    )


def check_provenance(
    statuses: list[RowStatus],
    manifest: dict,
    source: Samples | None,
    max_len: int,
    result: CheckResult,
    rejected: np.ndarray | None = None,
    source_rejected: np.ndarray | bool = False,
) -> dict:
    """Every (sample_index, sample_offset) once, pieces contiguous, no sample lost: a sample in
    no row is one the manifest accounts for (dropped, listed in rejects.jsonl, or left out by the
    pack a repack read, `repacked_from.absent`), and a listed reject is in no row."""
    stats = manifest["stats"]
    overlength = manifest["config"]["overlength"]
    n_samples = source.num_samples if source is not None else stats["samples_in"]
    prior = (manifest.get("repacked_from") or {}).get("absent") or {}
    pieces = _pieces_of(statuses)
    _check_pieces(statuses, pieces, n_samples, result)

    index = pieces.index
    valid = (index >= 0) & (index < n_samples)
    present = np.zeros(n_samples, bool)
    present[index[valid]] = True
    missing = np.flatnonzero(~present)
    dropped = int(stats["dropped"]) + int(prior.get("dropped", 0))
    rejected = rejected if rejected is not None else np.zeros(0, np.int64)
    listed = rejected[(rejected >= 0) & (rejected < n_samples)]
    _check_listed_rejects(listed, present, result)
    is_rejected = np.zeros(n_samples, bool)
    is_rejected[listed] = True
    missing = missing[~is_rejected[missing]]
    n_rejected_before = int(prior.get("rejected", 0))
    if source is not None:
        limits = (overlength, max_len, prior)
        _check_against_source(
            source, pieces, valid, present, missing, source_rejected, limits, result
        )
    elif missing.size != dropped + n_rejected_before:
        result.fail(_unaccounted(missing, dropped, n_rejected_before, n_samples, listed))
    return {
        "samples": int(present.sum()),
        "segments": int(index.size),
    }


def _check_pieces(
    statuses: list[RowStatus], pieces: _Pieces, n_samples: int, result: CheckResult
) -> None:
    """Sorted by (sample, offset), each piece is a sample of the inputs, once, and starts where
    the one before it ends (the first at 0): a failure at every piece that does not."""
    index, offset, length = pieces.index, pieces.offset, pieces.length
    order = np.lexsort((offset, index))
    code = np.zeros(index.size, np.int64)
    sorted_pieces = (K.frozen(x[order]) for x in (index, offset, length))
    K.check_coverage(*sorted_pieces, int(n_samples), code)  # the types `K.load` loaded
    for pos in np.flatnonzero(code):
        pos = int(pos)
        i = int(order[pos])
        j = int(order[pos - 1])  # the piece before it in (sample, offset) order
        text = _piece_problem(int(code[pos]), statuses, pieces, i, j, n_samples)
        _fail_piece(statuses, pieces, i, text, result)


def _piece_problem(
    kind: int, statuses: list[RowStatus], pieces: _Pieces, i: int, j: int, n_samples: int
) -> str:
    """What is wrong with piece i (a `check_coverage` code), j being the piece before it."""
    index, offset = pieces.index, pieces.offset
    if kind == K.INDEX_RANGE:
        return f"sample_index {index[i]} is outside the {n_samples} input samples"
    if kind == K.DUPLICATE:
        other = statuses[int(pieces.shard_no[j])].shard  # a batch: name + first_row
        return (
            f"sample {index[i]} at offset {offset[i]} appears twice (also in "
            f"{other.name} row {other.shard_row(int(pieces.row_no[j]))})"
        )
    if kind == K.FIRST_PIECE:
        return (
            f"the first piece of sample {index[i]} starts at token {offset[i]}, "
            "not 0: its beginning is missing"
        )
    end = int(offset[j] + pieces.length[j])
    return (
        f"this piece of sample {index[i]} starts at token {offset[i]} but the "
        f"previous piece ends at token {end}"
    )


def _fail_piece(
    statuses: list[RowStatus], pieces: _Pieces, i: int, text: str, result: CheckResult
) -> None:
    """A failure placed at piece i: its shard, row, sample and segment."""
    st = statuses[int(pieces.shard_no[i])]
    r, k = int(pieces.row_no[i]), int(pieces.seg_no[i])
    row = st.shard.row(r)
    result.fail(
        Failure(
            f"{where(st.shard.name, st.shard.shard_row(r), row, k)}: {text}",
            shard=st.shard.name,
            row=st.shard.shard_row(r),
            sample=int(pieces.index[i]),
            sample_offset=int(pieces.offset[i]),
            segment=k,
        )
    )


def _check_listed_rejects(listed: np.ndarray, present: np.ndarray, result: CheckResult) -> None:
    """A sample rejects.jsonl lists is in no row."""
    for i in np.flatnonzero(present[listed])[:MAX_LISTED]:
        result.fail(
            Failure(
                f"sample {int(listed[i])} is listed in rejects.jsonl but appears in a row",
                sample=int(listed[i]),
            )
        )
    result.failure_count += max(0, int(present[listed].sum()) - MAX_LISTED)


def _check_against_source(
    source: Samples,
    pieces: _Pieces,
    valid: np.ndarray,
    present: np.ndarray,
    missing: np.ndarray,
    source_rejected: np.ndarray | bool,
    limits: tuple[str, int, dict],
    result: CheckResult,
) -> None:
    """With the source's lengths: a sample in no row was rejected by reading or is longer than a
    drop limit, and a sample in a row is covered for all its tokens, or for the limit it was
    truncated to. `limits`: (overlength, max_len, the manifest's `repacked_from.absent`)."""
    overlength, max_len, prior = limits
    n_samples = present.size
    index, length = pieces.index, pieces.length
    src_len = source.lengths
    covered = np.bincount(
        index[valid & (length >= 0)], weights=length[valid & (length >= 0)], minlength=n_samples
    )
    drop_over = [max_len] if overlength == "drop" else []
    drop_over += [prior["dropped_over"]] if prior.get("dropped_over") is not None else []
    allowed_drop = (
        src_len > min(drop_over) if drop_over else np.zeros(n_samples, bool)
    ) | source_rejected
    _check_absent(source, src_len, missing[~allowed_drop[missing]], result)
    cut = [max_len] if overlength == "truncate" else []
    cut += [prior["truncated_to"]] if prior.get("truncated_to") is not None else []
    limit = min(cut) if cut else None
    truncated_ok = (src_len > limit) & (covered == limit) if cut else False
    short = present & (covered != src_len) & ~truncated_ok
    if (length < 0).any():
        short &= False  # unusable rows are reported already; lengths are not known
    _check_short(source, src_len, covered, short, result)


def _check_absent(
    source: Samples, src_len: np.ndarray, absent: np.ndarray, result: CheckResult
) -> None:
    """A failure for each sample in no row that nothing accounts for."""
    for i in absent[:MAX_LISTED]:
        i = int(i)
        result.fail(
            Failure(
                f"sample {i} ({source.locate(i)}, {int(src_len[i])} tokens) appears in no row",
                sample=i,
            )
        )
    result.failure_count += max(0, int(absent.size) - MAX_LISTED)


def _check_short(
    source: Samples, src_len: np.ndarray, covered: np.ndarray, short, result: CheckResult
) -> None:
    """A failure for each sample whose pieces cover fewer tokens than it holds."""
    result.failure_count += max(0, int(short.sum()) - MAX_LISTED)
    for i in np.flatnonzero(short)[:MAX_LISTED]:
        i = int(i)
        result.fail(
            Failure(
                f"sample {i} ({source.locate(i)}) is covered for "
                f"{int(covered[i])} of its {int(src_len[i])} tokens",
                sample=i,
            )
        )


def _unaccounted(
    missing: np.ndarray, dropped: int, n_rejected_before: int, n_samples: int, listed: np.ndarray
) -> Failure:
    """Without the source: the samples in no row are more (or fewer) than the manifest drops."""
    shown = ", ".join(str(int(i)) for i in missing[:10])
    more = f" and {missing.size - 10} more" if missing.size > 10 else ""
    before = f" and {n_rejected_before} rejected before a repack" if n_rejected_before else ""
    return Failure(
        f"sample{'s' if missing.size > 1 else ''} {shown}{more} "
        f"appear{'s' if missing.size == 1 else ''} in no row, but the "
        f"manifest records {dropped} dropped sample(s){before} "
        f"({missing.size} of {n_samples} are missing"
        + (" and not in rejects.jsonl)" if listed.size else ")"),
        sample=int(missing[0]) if missing.size else None,
    )
