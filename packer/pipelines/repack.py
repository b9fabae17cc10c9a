"""Repack: a packer output read back into its original samples (`packer.read.repack`) and
packed again with other options, on the local engine with one global plan."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

from packer.config import PackConfig
from packer.pipelines.one_plan import pack_samples
from packer.pipelines.result import PackResult, Progress
from packer.read.repack import check_repack_inputs, read_packed


def pack_repack(
    inputs: Iterable[str | Path],
    out: Path,
    cfg: PackConfig,
    *,
    overwrite: bool,
    progress: Progress | None,
    workers: int,
    t0: float,
) -> PackResult:
    """Read the one packer output among `inputs` back and pack its samples into `out`; the
    manifest records where they came from (`repacked_from`)."""
    samples, origin = read_packed(check_repack_inputs(list(inputs)))
    timings = {"read": time.perf_counter() - t0}
    return pack_samples(samples, out, cfg, overwrite, progress, workers, timings, t0, False, origin)
