"""The `--input` check: the files given are the ones packed, and every piece equals the source.

The source is read as the output was packed (same columns, rejects skipped); `full_view`
numbers it as the output does, so a row's sample_index points straight at its source sample.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from packer.errors import option
from packer.read.samples import Samples
from packer.verify import kernels as K
from packer.verify.rejects import check_rejected_inputs
from packer.verify.result import CheckResult, Failure
from packer.verify.row_checks import RowStatus
from packer.verify.row_messages import sample_of, where


def source_to_compare(
    source: Samples, manifest: dict, rejected: np.ndarray | None, result: CheckResult
) -> tuple[Samples | None, np.ndarray | bool]:
    """(source numbered as the output is, which samples reading rejected), after checking the
    rejects against the manifest; (None, False) when the files are not the ones packed: their
    samples are not compared one by one."""
    if not check_fingerprints(source, manifest, result):
        result.details.update({"samples": None, "tokens": None})
        return None, False
    source, source_rejected = full_view(source)
    check_rejected_inputs(source_rejected, rejected, manifest, result)
    return source, source_rejected


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
        read = (
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
        )
        K.compare_source(
            *map(K.frozen, read),  # the argument types `K.load` loaded
            skip,
            *map(K.frozen, (source.tokens, src_labels, source.offsets)),
            code,
            a,
            b,
            c,
        )
        for r in np.flatnonzero(code):
            r = int(r)
            row = sh.row(r)
            k, j, v = int(a[r]), int(b[r]), int(c[r])
            idx, off = sample_of(row, k)
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
