"""Structure checks: every row of every shard, the manifest, sample provenance, and the source.

Runs on the CPU with the numba kernels of `kernels.py`; needs no torch. Each problem becomes a
`Failure` whose message names the shard, the row, the sample and what differs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from packer import hashing
from packer.errors import option
from packer.read.samples import Samples
from packer.verify import kernels as K
from packer.verify.result import MAX_LISTED, CheckResult, Failure
from packer.verify.shards import ShardArrays, read_shard


@dataclass
class RowStatus:
    """Per-batch kernel output kept for the later checks (attention rows are picked from it)."""

    shard: ShardArrays
    code: np.ndarray
    seg_len: np.ndarray

    @property
    def cu_usable(self) -> np.ndarray:
        """Rows whose cu_seqlens can drive an attention kernel (0, increasing, row length)."""
        return ~np.isin(self.code, K.CU_CODES)


def _sample_of(row: dict, k: int) -> tuple[int | None, int | None]:
    if 0 <= k < len(row["sample_index"]):
        off = int(row["sample_offset"][k]) if k < len(row["sample_offset"]) else None
        return int(row["sample_index"][k]), off
    return None, None


def describe_sample(row: dict, k: int) -> str:
    """'sample 17' / 'sample 17 (piece at token 4096)' / 'the padding segment'."""
    idx, off = _sample_of(row, k)
    if idx is None:
        return "the padding segment" if k == len(row["cu_seqlens"]) - 2 else f"segment {k}"
    return f"sample {idx}" + (f" (piece at token {off})" if off else "")


def where(shard: str, r: int, row: dict | None = None, k: int | None = None) -> str:
    text = f"{shard} row {r}"
    if row is not None and k is not None:
        cu = row["cu_seqlens"]
        span = f", tokens {int(cu[k])}..{int(cu[k + 1]) - 1}" if k + 1 < len(cu) else ""
        text += f", {describe_sample(row, k)} (segment {k}{span})"
    return text


def _boundary_message(row: dict, code: int, t: int, k: int, p: int) -> str:
    """Explain a position error by comparing cu_seqlens boundaries with position restarts."""
    cu = [int(x) for x in row["cu_seqlens"]]
    pos = row["position_ids"]
    cu_inner = set(cu[1:-1])
    restarts = {int(x) for x in np.flatnonzero(pos == 0)} - {0}
    missing = sorted(cu_inner - restarts)  # cu boundaries where positions go on
    extra = sorted(restarts - cu_inner)  # restarts with no cu boundary
    s, e = cu[k], cu[k + 1]
    if code == K.POS_RESTART_INSIDE:
        near = [u for u in missing if u in (s, e)]
        if near:
            u = near[0]
            return (
                f"cu_seqlens[{cu.index(u)}] = {u} but position_ids restart at token {t}: the "
                f"boundary is shifted by {u - t:+d}, so tokens of two samples attend to each "
                "other"
            )
        nxt = _sample_of(row, k + 1)[0]
        pair = f" (samples {_sample_of(row, k)[0]} and {nxt})" if nxt is not None else ""
        return (
            f"position_ids restart at token {t} inside cu_seqlens segment {s}..{e - 1} but "
            f"cu_seqlens has no boundary there: two samples{pair} are merged into one "
            "attention segment"
        )
    if code == K.POS_NO_RESTART:
        near = [x for x in extra if s < x < e]
        if near:
            return (
                f"cu_seqlens[{k}] = {t} but position_ids restart at token {near[0]}: the "
                f"boundary is shifted by {t - near[0]:+d}, so tokens of two samples attend "
                "to each other"
            )
        return (
            f"position_ids do not restart at the start of {describe_sample(row, k)}: token "
            f"{t} has position {p}, expected 0"
        )
    return f"position_ids[{t}] = {p}, expected {t - s} (position {t - s} of its sample)"


def row_message(
    shard: str, r: int, row: dict, code: int, a: int, b: int, c: int, max_len: int, pad_id: int
) -> Failure:
    """The `Failure` for one kernel row code."""
    seg = None
    if code == K.LENGTHS_DIFFER:
        col = {1: "labels", 2: "position_ids", 3: "sample_offset"}[a]
        ref = "sample_index" if a == 3 else "input_ids"
        text = f"{col} has {c} entries but {ref} has {b}"
    elif code == K.EMPTY_ROW:
        text = "the row is empty"
    elif code == K.OVER_MAX_LEN:
        text = f"the row holds {a} tokens, more than max_len {max_len}"
    elif code == K.PAD_LENGTH:
        text = f"the output is padded but the row holds {a} tokens, not max_len {max_len}"
    elif code == K.CU_START:
        text = f"cu_seqlens must start at 0 and have at least 2 entries, got first entry {a} of {b}"
    elif code == K.CU_NOT_INCREASING:
        text = (
            f"cu_seqlens is not strictly increasing: entry {a} is {c} after {b} "
            "(an empty or backwards segment)"
        )
    elif code == K.CU_END:
        text = f"cu_seqlens ends at {a} but the row holds {b} tokens"
    elif code == K.SEGMENT_COUNT:
        text = (
            f"cu_seqlens has {a} segments but sample_index lists {b} samples "
            "(padding, when stored, is one extra final segment)"
        )
    elif code in (K.POS_NO_RESTART, K.POS_RESTART_INSIDE, K.POS_WRONG):
        seg = b
        text = _boundary_message(row, code, a, b, c)
    elif code == K.FIRST_LABEL:
        seg = b
        prev = f"the last token of {describe_sample(row, b - 1)}" if b > 0 else "nothing"
        text = (
            f"the first label is {c}, expected -100: after the model's shift {prev} would be "
            f"trained to predict token {a} of another sample"
            if b > 0
            else f"the first label is {c}, expected -100 (the first token of a sample is never "
            "a target)"
        )
    elif code == K.PAD_LABEL:
        seg = b
        text = f"padding token {a} has label {c}, expected -100"
    elif code == K.PAD_TOKEN:
        seg = b
        text = f"padding token {a} is {c}, expected the pad id {pad_id}"
    elif code == K.LOSS_COUNT:
        text = f"num_loss_tokens is {a} but {b} labels are not -100"
    elif code == K.BAD_LABEL:
        seg = b
        text = f"label at token {a} is {c}: negative and not -100"
    elif code == K.BAD_TOKEN:
        seg = b
        text = f"token {a} has the negative id {c}"
    else:  # pragma: no cover - every kernel code is handled above
        text = f"structure check code {code} ({a}, {b}, {c})"
    idx, off = _sample_of(row, seg) if seg is not None else (None, None)
    return Failure(
        f"{where(shard, r, row, seg)}: {text}",
        shard=shard,
        row=r,
        sample=idx,
        sample_offset=off,
        segment=seg,
    )


def check_shard_rows(
    shard: ShardArrays, max_len: int, pad: bool, pad_id: int, result: CheckResult
) -> RowStatus:
    rows = shard.rows
    code = np.zeros(rows, np.int64)
    a, b, c = (np.zeros(rows, np.int64) for _ in range(3))
    seg_len = np.zeros(shard.sample_index.size, np.int64)
    K.check_rows(
        shard.ids_off,
        shard.ids,
        shard.lab_off,
        shard.labels,
        shard.pos_off,
        shard.pos,
        shard.cu_off,
        shard.cu,
        shard.si_off,
        shard.so_off,
        shard.num_loss,
        max_len,
        pad,
        pad_id,
        seg_len,
        code,
        a,
        b,
        c,
    )
    for r in np.flatnonzero(code):
        r = int(r)
        result.fail(
            row_message(
                shard.name,
                shard.shard_row(r),
                shard.row(r),
                int(code[r]),
                int(a[r]),
                int(b[r]),
                int(c[r]),
                max_len,
                pad_id,
            )
        )
    return RowStatus(shard, code, seg_len)


def _num_tokens(shard: ShardArrays) -> int:
    return int(shard.ids_off[-1] - shard.ids_off[0]) if shard.rows else 0


def check_manifest_entry(entry: dict, batches: list[ShardArrays], result: CheckResult) -> None:
    """Counts the manifest records for a shard against the shard's record batches."""
    shard = batches[0]
    found = {
        "rows": sum(b.rows for b in batches),
        "tokens": sum(_num_tokens(b) for b in batches),
        "segments": sum(int(b.sample_index.size) for b in batches),
        "loss_tokens": sum(int(b.num_loss.sum()) for b in batches),
    }
    for key, value in found.items():
        if key in entry and int(entry[key]) != value:
            result.fail(
                Failure(
                    f"{shard.name}: manifest says {entry[key]} {key} but the shard holds {value}",
                    shard=shard.name,
                )
            )


def _token_totals(statuses: list[RowStatus], pad: bool) -> tuple[int, int]:
    """(sample tokens, padding tokens) over all shards."""
    real = pad_total = 0
    for st in statuses:
        seg = st.seg_len[st.seg_len > 0]
        real += int(seg.sum())
        pad_total += _num_tokens(st.shard) - int(seg.sum()) if pad else 0
    return real, pad_total


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    """np.concatenate, which refuses an empty list: an output may list no shard at all."""
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


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
    index = _cat([K.as_int64(st.shard.sample_index) for st in statuses])
    offset = _cat(
        [K.as_int64(st.shard.sample_offset[: st.shard.sample_index.size]) for st in statuses]
    )
    length = _cat([st.seg_len for st in statuses])
    shard_no = _cat(
        [np.full(st.shard.sample_index.size, i, np.int64) for i, st in enumerate(statuses)]
    )
    row_no = _cat(
        [np.repeat(np.arange(st.shard.rows), np.diff(st.shard.si_off)) for st in statuses]
    )
    seg_no = _cat(
        [
            np.arange(st.shard.sample_index.size)
            - np.repeat(st.shard.si_off[:-1], np.diff(st.shard.si_off))
            for st in statuses
        ]
    )
    order = np.lexsort((offset, index))
    code = np.zeros(index.size, np.int64)
    K.check_coverage(index[order], offset[order], length[order], n_samples, code)

    def fail_at(pos: int, text: str) -> None:
        i = int(order[pos])
        st = statuses[int(shard_no[i])]
        r, k = int(row_no[i]), int(seg_no[i])
        row = st.shard.row(r)
        result.fail(
            Failure(
                f"{where(st.shard.name, st.shard.shard_row(r), row, k)}: {text}",
                shard=st.shard.name,
                row=st.shard.shard_row(r),
                sample=int(index[i]),
                sample_offset=int(offset[i]),
                segment=k,
            )
        )

    for pos in np.flatnonzero(code):
        pos = int(pos)
        i = int(order[pos])
        kind = int(code[pos])
        if kind == K.INDEX_RANGE:
            fail_at(pos, f"sample_index {index[i]} is outside the {n_samples} input samples")
        elif kind == K.DUPLICATE:
            j = int(order[pos - 1])
            other = statuses[int(shard_no[j])].shard.name  # a batch: name + first_row
            fail_at(
                pos,
                f"sample {index[i]} at offset {offset[i]} appears twice (also in "
                f"{other} row {statuses[int(shard_no[j])].shard.shard_row(int(row_no[j]))})",
            )
        elif kind == K.FIRST_PIECE:
            fail_at(
                pos,
                f"the first piece of sample {index[i]} starts at token {offset[i]}, "
                "not 0: its beginning is missing",
            )
        else:
            j = int(order[pos - 1])
            end = int(offset[j] + length[j])
            fail_at(
                pos,
                f"this piece of sample {index[i]} starts at token {offset[i]} but the "
                f"previous piece ends at token {end}",
            )

    valid = (index >= 0) & (index < n_samples)
    present = np.zeros(n_samples, bool)
    present[index[valid]] = True
    missing = np.flatnonzero(~present)
    dropped = int(stats["dropped"]) + int(prior.get("dropped", 0))
    rejected = rejected if rejected is not None else np.zeros(0, np.int64)
    listed = rejected[(rejected >= 0) & (rejected < n_samples)]
    for i in np.flatnonzero(present[listed])[:MAX_LISTED]:
        result.fail(
            Failure(
                f"sample {int(listed[i])} is listed in rejects.jsonl but appears in a row",
                sample=int(listed[i]),
            )
        )
    result.failure_count += max(0, int(present[listed].sum()) - MAX_LISTED)
    is_rejected = np.zeros(n_samples, bool)
    is_rejected[listed] = True
    missing = missing[~is_rejected[missing]]
    n_rejected_before = int(prior.get("rejected", 0))
    if source is not None:
        src_len = source.lengths
        covered = np.bincount(
            index[valid & (length >= 0)], weights=length[valid & (length >= 0)], minlength=n_samples
        )
        drop_over = [max_len] if overlength == "drop" else []
        drop_over += [prior["dropped_over"]] if prior.get("dropped_over") is not None else []
        allowed_drop = (
            src_len > min(drop_over) if drop_over else np.zeros(n_samples, bool)
        ) | source_rejected
        for i in missing[~allowed_drop[missing]][:MAX_LISTED]:
            i = int(i)
            result.fail(
                Failure(
                    f"sample {i} ({source.locate(i)}, {int(src_len[i])} tokens) appears in no row",
                    sample=i,
                )
            )
        n_bad = int((~allowed_drop[missing]).sum())
        result.failure_count += max(0, n_bad - MAX_LISTED)
        cut = [max_len] if overlength == "truncate" else []
        cut += [prior["truncated_to"]] if prior.get("truncated_to") is not None else []
        limit = min(cut) if cut else None
        truncated_ok = (src_len > limit) & (covered == limit) if cut else False
        short = present & (covered != src_len) & ~truncated_ok
        if (length < 0).any():
            short &= False  # unusable rows are reported already; lengths are not known
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
    elif missing.size != dropped + n_rejected_before:
        shown = ", ".join(str(int(i)) for i in missing[:10])
        more = f" and {missing.size - 10} more" if missing.size > 10 else ""
        before = f" and {n_rejected_before} rejected before a repack" if n_rejected_before else ""
        result.fail(
            Failure(
                f"sample{'s' if missing.size > 1 else ''} {shown}{more} "
                f"appear{'s' if missing.size == 1 else ''} in no row, but the "
                f"manifest records {dropped} dropped sample(s){before} "
                f"({missing.size} of {n_samples} are missing"
                + (" and not in rejects.jsonl)" if listed.size else ")"),
                sample=int(missing[0]) if missing.size else None,
            )
        )
    return {
        "samples": int(present.sum()),
        "segments": int(index.size),
    }


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


def check_fingerprints(source: Samples, manifest: dict, result: CheckResult) -> bool:
    """The --input files are the ones packed: bytes and fingerprint as manifest["inputs"] records
    them, in order. One failure naming the first file that differs, instead of one per sample."""
    recorded = manifest.get("inputs", [])
    given = source.sources
    if len(given) != len(recorded):
        result.fail(
            Failure(
                f"{option('inputs', '--input')} names {len(given)} file(s) but the manifest's "
                f"inputs are "
                f"{len(recorded)}: " + ", ".join(str(e.get("path")) for e in recorded)
            )
        )
        return False
    for src, entry in zip(given, recorded):
        if int(entry.get("bytes", -1)) != src.size or entry.get("fingerprint") != src.fingerprint:
            result.fail(
                Failure(
                    f"{src.path}: its fingerprint does not match the manifest's input "
                    f"{entry.get('path')} (another file, or changed since packing); "
                    "the samples were not compared"
                )
            )
            return False
    return True


def full_view(source: Samples) -> tuple[Samples, np.ndarray]:
    """The source numbered as the output is (every input sample, rejected ones empty), and
    which samples reading rejected."""
    if source.index is None:
        return source, np.zeros(source.num_samples, bool)
    n = source.num_input_samples
    lengths = np.zeros(n, np.int64)
    lengths[source.index] = source.lengths
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    rejected = np.ones(n, bool)
    rejected[source.index] = False
    return replace(source, offsets=offsets, index=None), rejected


def check_source(statuses: list[RowStatus], source: Samples, result: CheckResult) -> None:
    """Every piece's tokens and labels equal the source's (labels: all but the first)."""
    src_labels = source.labels if source.labels is not None else source.tokens
    for st in statuses:
        sh = st.shard
        code = np.zeros(sh.rows, np.int64)
        a, b, c = (np.zeros(sh.rows, np.int64) for _ in range(3))
        skip = ~st.cu_usable
        K.compare_source(
            sh.ids_off,
            sh.ids,
            sh.lab_off,
            sh.labels,
            sh.cu_off,
            sh.cu,
            sh.si_off,
            sh.sample_index,
            sh.so_off,
            sh.sample_offset,
            skip,
            source.tokens,
            src_labels,
            source.offsets,
            code,
            a,
            b,
            c,
        )
        for r in np.flatnonzero(code):
            r = int(r)
            row = sh.row(r)
            k, j, v = int(a[r]), int(b[r]), int(c[r])
            idx, off = _sample_of(row, k)
            kind = int(code[r])
            if kind == K.SRC_INDEX:
                text = f"sample_index {j} is outside the {source.num_samples} input samples"
            elif kind == K.SRC_RANGE:
                text = (
                    f"the piece ends at token {j} but the source sample has only {v} "
                    f"tokens ({source.locate(idx)})"
                )
            else:
                col = "token" if kind == K.SRC_TOKEN else "label"
                arr = source.tokens if kind == K.SRC_TOKEN else src_labels
                want = int(arr[int(source.offsets[idx]) + (off or 0) + j])
                text = (
                    f"{col} {(off or 0) + j} of the sample is {v} but the source has {want} "
                    f"({source.locate(idx)})"
                )
            result.fail(
                Failure(
                    f"{where(sh.name, sh.shard_row(r), row, k)}: {text}",
                    shard=sh.name,
                    row=sh.shard_row(r),
                    sample=idx,
                    sample_offset=off,
                    segment=k,
                )
            )


def check_structure(
    output_dir: Path,
    manifest: dict,
    source: Samples | None,
    structure: CheckResult,
    manifest_check: CheckResult,
    input_check: CheckResult,
    on_shard: Callable[[int, int], None] | None = None,
) -> list[RowStatus]:
    """Run all CPU checks; fill the three results (`input_check` only when there is a
    `source`); return the per-shard row status. `on_shard(done, total)` follows the shards read
    (the long part on a large output)."""
    t0 = time.perf_counter()
    cfg = manifest["config"]
    max_len, pad, pad_id = cfg["max_len"], cfg["pad"], cfg["pad_id"]
    statuses: list[RowStatus] = []
    shards_read = 0
    listed = set()
    n_shards = len(manifest["shards"])
    if on_shard:
        on_shard(0, n_shards)
    for done, entry in enumerate(manifest["shards"], 1):
        if on_shard and done > 1:
            on_shard(done - 1, n_shards)
        name = entry["file"]
        listed.add(name)
        path = output_dir / name
        if not path.is_file():
            manifest_check.fail(Failure(f"{name}: listed in the manifest but missing", shard=name))
            continue
        digest = hashing.recorded(entry)
        if digest and hashing.file_digest(path, digest[0]) != digest[1]:
            manifest_check.fail(
                Failure(
                    f"{name}: {digest[0]} differs from the "
                    "manifest (the shard changed after packing)",
                    shard=name,
                )
            )
        if "bytes" in entry and path.stat().st_size != int(entry["bytes"]):
            manifest_check.fail(
                Failure(
                    f"{name}: {path.stat().st_size} bytes, the manifest says {entry['bytes']}",
                    shard=name,
                )
            )
        try:
            batches = read_shard(path)
        except (ValueError, OSError) as exc:
            structure.fail(Failure(f"{name}: {exc}", shard=name))
            continue
        statuses += [check_shard_rows(b, max_len, pad, pad_id, structure) for b in batches]
        shards_read += 1
        check_manifest_entry(entry, batches, manifest_check)
    for extra in sorted(p.name for p in output_dir.glob("*.arrow") if p.name not in listed):
        manifest_check.fail(
            Failure(
                f"{extra}: an .arrow file in the output that the manifest does not list",
                shard=extra,
            )
        )

    rejected = read_rejects(output_dir, manifest, manifest_check)
    if source is not None and not check_fingerprints(source, manifest, input_check):
        source = None  # another file: its samples are not compared one by one
        input_check.details.update({"samples": None, "tokens": None})
    source_rejected: np.ndarray | bool = False
    if source is not None:
        source, source_rejected = full_view(source)
        n_prior = int(
            ((manifest.get("repacked_from") or {}).get("absent") or {}).get("rejected", 0)
        )
        expected = int(manifest["stats"].get("rejected", 0)) + n_prior
        found = np.flatnonzero(source_rejected)
        if found.size != expected:
            input_check.fail(
                Failure(
                    f"the inputs hold {found.size} sample(s) that packer "
                    f"rejects, but the manifest accounts for {expected}"
                )
            )
        elif rejected is not None and not np.array_equal(np.sort(rejected), found):
            input_check.fail(
                Failure(
                    "rejects.jsonl lists samples "
                    + ", ".join(str(int(i)) for i in np.setdiff1d(rejected, found)[:10])
                    + " that the inputs hold as valid (it should list "
                    + ", ".join(str(int(i)) for i in np.setdiff1d(found, rejected)[:10])
                    + ")"
                )
            )
    prov = check_provenance(
        statuses,
        manifest,
        source,
        max_len,
        input_check if source is not None else structure,
        rejected,
        source_rejected,
    )
    real, pad_tokens = _token_totals(statuses, pad)
    stats = manifest["stats"]
    totals = {
        "rows": sum(st.shard.rows for st in statuses),
        "segments": prov["segments"],
        "tokens": real,
        "pad_tokens": pad_tokens,
        "loss_tokens": sum(int(st.shard.num_loss.sum()) for st in statuses),
        "samples_packed": prov["samples"],
    }
    if structure.ok:
        for key, value in totals.items():
            if key in stats and int(stats[key]) != value:
                manifest_check.fail(
                    Failure(
                        f"manifest stats say {stats[key]} {key} but the shards hold {value}",
                    )
                )
    if source is not None:
        check_source(statuses, source, input_check)
        input_check.details.update({"samples": source.num_samples, "tokens": source.num_tokens})
    structure.details.update(
        {
            "shards": shards_read,
            "rows": totals["rows"],
            "samples": totals["samples_packed"],
            "segments": totals["segments"],
            "tokens": real,
            "pad_tokens": pad_tokens,
            "max_len": max_len,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )
    manifest_check.details.update({"shards": len(manifest["shards"])})
    if on_shard:
        on_shard(n_shards, n_shards)
    return statuses
