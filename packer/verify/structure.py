"""Structure checks: every row of every shard, the manifest, sample provenance, and the source.

Runs on the CPU with the numba kernels of `kernels.py`; needs no torch. Each problem becomes a
`Failure` whose message names the shard, the row, the sample and what differs. This module reads
the shards and checks them against the manifest; the checks it runs live beside it:
`row_checks` (every row), `provenance` (every sample once), `rejects` and `source` (`--input`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from packer import hashing
from packer.contract.shards import ShardArrays, read_shard
from packer.planning.multiple import config_multiple, multiple_text
from packer.read.samples import Samples
from packer.verify import kernels as K
from packer.verify.cp_rows import check_cp_rows, real_lengths, unpadded
from packer.verify.mixture import mixture_counts
from packer.verify.provenance import check_provenance
from packer.verify.rejects import read_rejects
from packer.verify.result import CheckResult, Failure
from packer.verify.row_checks import RowStatus, check_shard_rows
from packer.verify.source import check_source, source_to_compare


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


def _shard_file_ok(path: Path, entry: dict, result: CheckResult) -> bool:
    """The shard file is there (else False, and a failure), with the manifest's bytes and hash."""
    name = entry["file"]
    if not path.is_file():
        result.fail(Failure(f"{name}: listed in the manifest but missing", shard=name))
        return False
    digest = hashing.recorded(entry)
    if digest and hashing.file_digest(path, digest[0]) != digest[1]:
        result.fail(
            Failure(
                f"{name}: {digest[0]} differs from the manifest (the shard changed after packing)",
                shard=name,
            )
        )
    if "bytes" in entry and path.stat().st_size != int(entry["bytes"]):
        result.fail(
            Failure(
                f"{name}: {path.stat().st_size} bytes, the manifest says {entry['bytes']}",
                shard=name,
            )
        )
    return True


def _check_shards(
    output_dir: Path,
    manifest: dict,
    structure: CheckResult,
    manifest_check: CheckResult,
    on_shard: Callable[[int, int], None] | None,
) -> tuple[list[RowStatus], int]:
    """Every shard the manifest lists, as it records it and row by row, and no .arrow file it
    does not list: (the row status of every record batch read, the number of shards read)."""
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
        if not _shard_file_ok(path, entry, manifest_check):
            continue
        try:
            batches = read_shard(path)
        except (ValueError, OSError) as exc:
            structure.fail(Failure(f"{name}: {exc}", shard=name))
            continue
        for b in batches:
            status = check_shard_rows(b, max_len, pad, pad_id, structure)
            if b.cu_real is not None or config_multiple(cfg) > 1:
                cp_view(status, cfg, pad_id, structure)
            statuses.append(status)
        shards_read += 1
        check_manifest_entry(entry, batches, manifest_check)
    for extra in sorted(p.name for p in output_dir.glob("*.arrow") if p.name not in listed):
        manifest_check.fail(
            Failure(
                f"{extra}: an .arrow file in the output that the manifest does not list",
                shard=extra,
            )
        )
    return statuses, shards_read


def _totals(statuses: list[RowStatus], prov: dict, pad: bool) -> dict:
    """What the shards hold, under the names of the manifest's stats."""
    real, pad_tokens = _token_totals(statuses, pad)
    return {
        "rows": sum(st.shard.rows for st in statuses),
        "segments": prov["segments"],
        "tokens": real,
        "pad_tokens": pad_tokens,
        "loss_tokens": sum(int(st.shard.num_loss.sum()) for st in statuses),
        "samples_packed": prov["samples"],
    }


def _check_stats(stats: dict, totals: dict, result: CheckResult) -> None:
    """The manifest's stats count what the shards hold."""
    for key, value in totals.items():
        if key in stats and int(stats[key]) != value:
            result.fail(
                Failure(
                    f"manifest stats say {stats[key]} {key} but the shards hold {value}",
                )
            )


def pair_segments_view(manifest: dict, rejected: np.ndarray | None):
    """A pairs output's manifest and rejects as provenance reads samples: each pair's two
    segments are samples 2p and 2p + 1, so inputs, drops and rejects count twice."""
    stats = dict(manifest["stats"])
    stats["samples_in"] = 2 * int(stats["samples_in"])
    stats["dropped"] = 2 * int(stats["dropped"])
    if rejected is not None:
        rejected = np.stack([2 * rejected, 2 * rejected + 1], 1).ravel()
    return {**manifest, "stats": stats}, rejected


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
    max_len, pad = cfg["max_len"], cfg["pad"]
    n_shards = len(manifest["shards"])
    statuses, shards_read = _check_shards(output_dir, manifest, structure, manifest_check, on_shard)
    rejected = read_rejects(output_dir, manifest, manifest_check)
    source_rejected: np.ndarray | bool = False
    if source is not None:
        source, source_rejected = source_to_compare(source, manifest, rejected, input_check)
    pairs = bool(cfg.get("pairs"))
    # provenance counts segments: pair p is samples 2p and 2p + 1
    seen, rejected = pair_segments_view(manifest, rejected) if pairs else (manifest, rejected)
    if manifest.get("mixture") is not None:  # repeats by design: `verify.mixture` checks
        prov = mixture_counts(statuses)
    else:
        prov = check_provenance(
            statuses,
            seen,
            source,
            max_len,
            input_check if source is not None else structure,
            rejected,
            source_rejected,
        )
    cp = config_multiple(cfg) > 1
    totals = _totals(statuses, prov, pad or cp)
    if pairs:
        totals["samples_packed"] //= 2
    if structure.ok:
        _check_stats(manifest["stats"], totals, manifest_check)
    if source is not None:
        check_source(
            [unpadded_status(st) for st in statuses] if cp else statuses, source, input_check
        )
        input_check.details.update({"samples": source.num_samples, "tokens": source.num_tokens})
    structure.details.update(
        {
            "shards": shards_read,
            "rows": totals["rows"],
            "samples": totals["samples_packed"],
            "segments": totals["segments"],
            "tokens": totals["tokens"],
            "pad_tokens": totals["pad_tokens"],
            "max_len": max_len,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )
    manifest_check.details.update({"shards": len(manifest["shards"])})
    if on_shard:
        on_shard(n_shards, n_shards)
    return statuses


def cp_view(status: RowStatus, cfg: dict, pad_id: int, structure: CheckResult) -> None:
    """A CP shard's rows checked for the CP layout (segments padded to the multiple that the
    manifest's cp_size, tp_size and sequence_parallel give); its sample entries' lengths become
    the real ones (what provenance counts). A shard of a CP output without `cu_seqlens_padded`
    fails."""
    shard = status.shard
    cp_size, tp_size = int(cfg.get("cp_size", 1)), int(cfg.get("tp_size", 1))
    sp = bool(cfg.get("sequence_parallel"))
    if shard.cu_real is None:
        what = f"cp_size {cp_size}" if cp_size > 1 else f"sequence_parallel with tp_size {tp_size}"
        structure.fail(
            Failure(
                f"{shard.name}: the manifest says {what} but the shard has no "
                "cu_seqlens_padded column",
                shard=shard.name,
            )
        )
        return
    if config_multiple(cfg) < 2:
        structure.fail(
            Failure(
                f"{shard.name}: a cu_seqlens_padded column, but the manifest records no cp_size",
                shard=shard.name,
            )
        )
        return
    what = multiple_text(cp_size, tp_size, sp)
    sound = check_cp_rows(shard, config_multiple(cfg), pad_id, status.cu_usable, structure, what)
    status.seg_len = real_lengths(shard, status.seg_len, sound)
    status.cp_sound = sound


def unpadded_status(status: RowStatus) -> RowStatus:
    """The status over the shard without its CP padding (CP-sound rows only are compared)."""
    shard = status.shard
    if shard.cu_real is None or status.cp_sound is None:
        return status
    code = np.where(status.cp_sound, status.code, K.CU_START)  # unsound rows: not compared
    return RowStatus(unpadded(shard), code, status.seg_len)
