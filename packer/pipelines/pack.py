"""`pack`: read, resolve over-length samples, plan, gather and write, atomically.

This is the library entry point behind `packer pack`; it knows nothing about the terminal.
Progress is reported through an optional callback so the CLI can draw bars. `pack` checks its
arguments and hands the run to one driver: `repack`, `blocks` (on an engine it opens) or
`one_plan`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from packer import arguments as A
from packer.arguments import column_option, named, parse_size
from packer.config import PackConfig
from packer.contract.names import MANIFEST
from packer.errors import UsageError, option
from packer.pipelines.one_plan import pack_one_plan
from packer.pipelines.result import PackResult, Progress
from packer.read.cache import default_budget
from packer.read.columns import check_columns
from packer.read.files import check_local_inputs, expand_inputs
from packer.storage import is_url, parse_url, set_options
from packer.storage.names import named_errors
from packer.storage.progress import reporting
from packer.workers import configure as configure_workers
from packer.write import commit as output
from packer.write.remote import RemoteOutput


def pack(
    inputs: Iterable[str | Path],
    output_dir: str | Path,
    config: PackConfig,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
    workers: int | None = None,
    memory_budget: int | str | None = None,
    out_of_core: bool | None = None,
    repack: bool = False,
    engine: str | None = None,
    ray_address: str | None = None,
    storage_options: Mapping[str, str] | None = None,
    resume: bool = False,
    mix=None,
    mix_tokens: int | None = None,
    validation_split: float | int | None = None,
    validation_output: str | Path | None = None,
) -> PackResult:
    """Pack token datasets into Arrow shards plus `manifest.json` under `output_dir`.

    The output appears only when complete: it is built in a hidden sibling directory and
    renamed into place, so a failed or killed run never leaves shards that look finished.

    Packer outputs are never read as samples (their rows are already packed): inside
    directories and globs they are skipped, named directly they are refused. `repack=True`
    reads one packer output back into its original samples instead (see `packer.read.repack`).

    With `config.pairs` the inputs are preference pairs (`packer.pipelines.pairs`): each pair
    becomes two adjacent segments of one row. With `config.block_size` or `engine="ray"` the
    block pipeline runs (`packer.pipelines.blocks`): both
    engines write the same bytes for the same configuration.

    Inputs and `output_dir` may be URLs (`s3://`, `gs://`, `hf://`, `file://`, any fsspec
    protocol; see docs/storage.md): a remote output is complete when its manifest exists, written
    last and only if absent (or unchanged, with `overwrite`). `storage_options` are passed to
    the stores by hand (endpoint, keys), for this process; never printed or recorded.

    `resume=True` (block runs) keeps every block and tail task that a killed run to the same
    output finished, when its inputs and configuration are the same (`packer.pipelines.resume`);
    `PackResult.tasks_reused` and `tasks_run` say how many were kept and how many ran.

    `mix` ({path: weight} or [(path, weight), ...], no `inputs`; a weight is a share of the
    tokens), `mix_tokens` and `validation_split` (into `validation_output`, by default
    `OUTPUT-validation`): a mixture and a validation split (`packer.pipelines.mixture`).
    """
    t0 = time.perf_counter()
    inputs = _checked_inputs(inputs, output_dir, config, storage_options)
    overwrite = A.boolean(overwrite, "overwrite")
    repack = A.boolean(repack, "repack")
    resume = A.boolean(resume, "resume")
    runtime = {"engine": engine, "ray_address": ray_address}
    cfg = replace(config, **{k: v for k, v in runtime.items() if v is not None}).validate()
    workers = configure_workers(A.integer(workers, "workers", minimum=1, none=True))
    out = Path(output_dir)
    mixing = (mix, mix_tokens, validation_split, validation_output)
    if any(v is not None for v in mixing):
        more = (memory_budget, out_of_core, repack, resume, t0)
        return _pack_mixture(inputs, output_dir, cfg, mixing, overwrite, progress, workers, more)
    remote = None
    blocks = cfg.block_size is not None or cfg.engine != "local"
    if (
        isinstance(output_dir, str)
        and is_url(output_dir)
        and parse_url(output_dir, option("output_dir", "--output")).protocol != "file"
    ):
        if resume:
            _check_resume(blocks and not repack and not cfg.pairs)
        remote = RemoteOutput(output_dir, overwrite or resume)  # resume: refused below
        if resume and remote.previous is not None and not overwrite:
            raise _complete(remote.shown)
        out, overwrite = remote.local, False
    elif isinstance(output_dir, str) and is_url(output_dir):
        out = Path(parse_url(output_dir).path)
    if resume and remote is None:
        _check_resume(blocks and not repack and not cfg.pairs)
        if not overwrite and (out / MANIFEST).is_file():
            raise _complete(str(out))
    output.check_target(out, overwrite)
    skip = str(remote.url) if remote else out
    run_args = (inputs, out, cfg, overwrite, progress, workers, memory_budget, out_of_core)
    try:
        with reporting(progress), named_errors():
            result = _run(*run_args, repack, resume, t0, skip, remote)
            if remote is not None:
                remote.commit()
                result.output = output_dir
                result.seconds = time.perf_counter() - t0
    finally:
        if remote is not None:
            remote.discard()
    return result


def _run(
    inputs,
    out,
    cfg,
    overwrite,
    progress,
    workers,
    memory_budget,
    out_of_core,
    repack,
    resume,
    t0,
    skip,
    remote,
):
    """The run on a local output directory (a remote output's local build directory; block
    runs upload their shards beside `remote` from their tasks)."""
    blocks = cfg.block_size is not None or cfg.engine != "local"
    if repack and blocks:
        raise UsageError(
            f"{option('repack=True', '--repack')} runs on the local engine with one global plan "
            f"(no {option('block_size')})"
        )
    run = {"overwrite": overwrite, "progress": progress, "workers": workers, "t0": t0}
    if repack and cfg.pairs:
        raise UsageError(
            f"{option('repack=True', '--repack')} reads samples back; {option('pairs')} is for "
            "pair files"
        )
    if repack and cfg.segment_multiple > 1:
        what = option("cp_size") if cfg.cp_size > 1 else option("sequence_parallel")
        raise UsageError(
            f"{option('repack=True', '--repack')} cannot be used with {what} "
            "(repack the samples first, then pack them with it)"
        )
    _check_unused(cfg, repack, blocks, memory_budget, out_of_core)
    if repack:
        from packer.pipelines.repack import pack_repack

        return pack_repack(inputs, out, cfg, **run)

    skipped: list[Path] = []
    # block runs read remote inputs in place, each task its own block; other runs stage them
    stage = not blocks or bool(cfg.pairs)
    inputs = expand_inputs(inputs, skip=skip, skipped=skipped, stage=stage)
    check_columns(inputs, cfg)  # a column option naming no column: refused before any read
    if cfg.pairs:
        from packer.pipelines.pairs import pack_pairs

        result = pack_pairs(inputs, out, cfg, **run)
    elif blocks:
        from packer.engines import open_engine
        from packer.pipelines.blocks import pack_blocks

        budget = parse_size(memory_budget) if memory_budget is not None else default_budget()
        with open_engine(cfg.engine, cfg.ray_address, workers) as tasks:
            result = pack_blocks(
                tasks, inputs, out, cfg, budget=budget, resume_run=resume, remote=remote, **run
            )
        result.seconds = time.perf_counter() - t0  # the engine's shutdown included
    else:
        result = pack_one_plan(
            inputs, out, cfg, memory_budget=memory_budget, out_of_core=out_of_core, **run
        )
    result.skipped_inputs = [str(p) for p in skipped]
    return result


def _checked_inputs(inputs, output_dir, config, storage_options) -> list:
    """The inputs as a list, each checked to exist, after the output and config are checked."""
    if storage_options is not None:
        set_options(storage_options)
    if not isinstance(config, PackConfig):
        raise UsageError(f"config must be a PackConfig, got {type(config).__name__}")
    if isinstance(inputs, (str, os.PathLike)):  # one path, not a sequence of characters
        inputs = [inputs]
    inputs = inputs if isinstance(inputs, list) else list(inputs)
    check_local_inputs(inputs)  # a missing input is named before anything about the output
    if not isinstance(output_dir, (str, os.PathLike)) or not str(output_dir):
        raise UsageError(f"output_dir must be a path, got {output_dir!r}")
    return inputs


def _pack_mixture(inputs, output_dir, cfg, args, overwrite, progress, workers, more):
    """A mixture or a validation split: one plan (`packer.pipelines.mixture`), or block runs
    on any engine (`packer.pipelines.mixture.blocks`)."""
    from packer.pipelines.mixture.one_plan import check_mixture_run, pack_mixture

    memory_budget, out_of_core, repack, resume, t0 = more
    mixing = args[0] is not None or args[1] is not None
    mix, mix_tokens, split, split_output = args
    check_mixture_run(cfg, str(output_dir), repack=repack, resume=resume, mixing=mixing)
    out = Path(output_dir)
    if out_of_core is not None:
        raise UsageError(f"{option('out_of_core')} is for one-plan sample runs, not mixtures")
    if resume and not overwrite and (out / MANIFEST).is_file():
        raise _complete(str(out))
    output.check_target(out, overwrite)
    run, extra = pack_mixture, {}
    if cfg.block_size is not None or cfg.engine != "local":
        from packer.pipelines.mixture.blocks import pack_mixture_blocks

        run, extra = pack_mixture_blocks, {"resume": resume}  # block runs resume; one plan not
    with reporting(progress), named_errors():
        return run(
            inputs,
            out,
            cfg,
            mix=mix,
            mix_tokens=mix_tokens,
            validation_split=split,
            validation_output=split_output,
            overwrite=overwrite,
            progress=progress,
            workers=workers,
            memory_budget=memory_budget,
            t0=t0,
            **extra,
        )


def _check_unused(cfg, repack: bool, blocks: bool, memory_budget, out_of_core) -> None:
    """Options this run would not use are refused rather than ignored."""
    rp = option("repack=True", "--repack")
    for name in ("input_column", "labels_column"):
        value = getattr(cfg, name)
        if repack and value and named(value):
            raise UsageError(
                f"{column_option(name, value)} cannot be used with {rp}: a packer output's "
                "columns are read as it wrote them"
            )
    mode = rp if repack else option("pairs") if cfg.pairs else None
    if mode is not None and memory_budget is not None:
        raise UsageError(
            f"{option('memory_budget')} cannot be used with {mode}, which reads its input in memory"
        )
    if (mode is not None or blocks) and out_of_core is not None:
        raise UsageError(
            f"{option('out_of_core')} is for one-plan sample runs (not {mode or 'block runs'})"
        )


def _check_resume(blocks: bool) -> None:
    """`resume` is for block runs."""
    if not blocks:
        raise UsageError(
            f"{option('resume=True', '--resume')} picks up block runs: pass "
            f"{option('block_size')} or {option('engine')} ray (not with "
            f"{option('repack=True', '--repack')} or {option('pairs')})"
        )


def _complete(where: str) -> UsageError:
    """`resume` on an output that is complete already."""
    return UsageError(
        f"the output is complete (it has {MANIFEST}): nothing to resume; pass "
        f"{option('overwrite=True', '--overwrite')} to pack it again",
        where=where,
    )
