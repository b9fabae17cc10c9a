"""A mixture on a block run: one global mixture chosen from every block's lengths.

The sources' files are cut into blocks as in any block run (source 0's files first, so
`sample_index` numbers the inputs as the one-plan mixture does). A length pass, one
`block_lengths` task per block on the run's engine, sends back the length of every kept sample
as it will be packed (4 bytes a sample, never tokens). The driver joins them per source and
chooses with the one-plan mixture's own core (`select.choose_samples`), so the shares
and the per-source report are the ones a one-plan run of the same sources reports, on any
engine and with any number of workers. Every block then packs its take list: the positions
it gives, in selection order, repeats included (`block_task.BlockTake`), and its shards name
each segment's source (`sample_source`). A take list is hashed into the block's completion
record, and the mixture into the run record, so `resume` keeps a block only for the same
choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from packer import hashing
from packer.config import PackConfig
from packer.pipelines.block_task import BlockTake
from packer.pipelines.mixture.one_plan import check_mix_tokens
from packer.pipelines.mixture.report import describe_sources, mixture_report, validation_report
from packer.pipelines.mixture.select import MixSource, choose_samples, packed_lengths
from packer.planning.overlength import resolve
from packer.read.blocks import BlockSpec, block_samples
from packer.read.samples import Rejects
from packer.storage.options import carried, carry_in

DROPPED = -1  # the length pass's mark of a sample `overlength` drop leaves out


def block_lengths(settings: dict, spec: BlockSpec, cfg: PackConfig) -> tuple[np.ndarray, str]:
    """The length pass for one block: int32 per kept sample (rejected ones are not there), its
    length as packed (after `overlength`), or `DROPPED`; and where its first over-length
    sample is ("" when none). With `overlength` error a block does not raise: the driver
    counts the over-length samples of every block (`over_length`), so the message is one
    plan's, whichever block an engine finishes first."""
    carry_in(settings)
    rejects = Rejects() if cfg.on_error == "skip" else None
    samples, _ = block_samples(spec, cfg, rejects)
    if samples is None:
        return np.zeros(0, np.int32), ""
    if cfg.overlength == "error":
        lengths = samples.lengths
        over = np.flatnonzero(lengths > cfg.max_len)
        first = samples.locate(int(over[0])) if over.size else ""
        return lengths.astype(np.int32), first
    keep, lengths, _ = packed_lengths(samples, 0, samples.num_samples, cfg)
    out = np.full(samples.num_samples, DROPPED, np.int32)
    out[keep] = lengths
    return out, ""


def over_length(lengths: list[np.ndarray], firsts: list[str], cfg: PackConfig) -> None:
    """`overlength` error on a block run: one line counting the over-length samples of all
    blocks (the longest, and the first in input order), as one plan's `resolve` says it."""
    if cfg.overlength != "error" or not any(firsts):
        return
    at = next(f for f in firsts if f)
    resolve(_joined(lengths), cfg.max_len, "error", locate=lambda _: at)


@dataclass
class BlockMixture:
    """A mixture (or a validation split) run on blocks: the sources, the files of each (in the
    run's input order), which output this run builds (`side`), and what was chosen once
    `choose` ran. The two outputs of a split share one choice (`for_validation`)."""

    sources: list[MixSource]
    files: list[list]
    mix_tokens: int | None
    split: float | int | None
    side: str = "train"  # or "validation"
    validation: dict | None = None  # the training manifest's `mixture.validation`
    train_output: str | None = None  # the validation manifest's `validation_of`
    bounds: np.ndarray | None = None
    report: dict | None = None
    _chosen: dict = field(default_factory=dict)  # shared by both sides of a split
    _source_of_file: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._source_of_file = [i for i, part in enumerate(self.files) for _ in part]

    def for_validation(self, train_output: str) -> BlockMixture:
        """The validation output's run: the same choice, its held-out samples."""
        return replace(self, side="validation", train_output=train_output, validation=None)

    def key(self) -> dict:
        """The mixture as the run record holds it: a resume with other sources, weights,
        size or split is refused, naming the option."""
        mix = ", ".join(_named(s) for s in self.sources)
        return {"mix": mix, "mix_tokens": self.mix_tokens, "validation_split": self.split}

    def block_cfg(self, spec: BlockSpec, cfg: PackConfig) -> PackConfig:
        """The configuration a block is read with: its source's own columns, if any."""
        columns = self.sources[self._source_of_file[spec.file]].columns
        return replace(cfg, **columns) if columns else cfg

    def source_blocks(self, specs: list[BlockSpec]) -> list[list[int]]:
        """The blocks of every source, by position in `specs`."""
        groups: list[list[int]] = [[] for _ in self.sources]
        for k, spec in enumerate(specs):
            groups[self._source_of_file[spec.file]].append(k)
        return groups

    def choose(
        self, engine, scans, specs: list[BlockSpec], cfg: PackConfig, memory: int, progress=None
    ):
        """The length pass on `engine` and the global choice (once for both outputs of a
        split), then every block's `BlockTake` for this run's output. `progress("lengths",
        blocks done, blocks)` as the length pass goes."""
        if not self._chosen:
            self._chosen.update(self._length_pass(engine, scans, specs, cfg, memory, progress))
        c = self._chosen
        planned, described, starts = c["planned"], c["described"], c["starts"]
        self.bounds = c["bounds"]
        if self.side == "validation":
            self.report = validation_report(planned, described, cfg, self.split, self.train_output)
            positions = planned.validation.positions
        else:
            self.report = mixture_report(planned, described, cfg, self.split, self.mix_tokens)
            if self.validation is not None:
                self.report["validation"] = self.validation
            positions = planned.train.positions
        return takes_of(positions, starts, self.bounds, self.side == "train")

    def _length_pass(self, engine, scans, specs, cfg: PackConfig, memory: int, progress) -> dict:
        settings = carried()
        done = [0]

        def on_done(_: int) -> None:
            done[0] += 1
            if progress:
                progress("lengths", done[0], len(specs))

        passed = engine.map(
            block_lengths,
            [(settings, s, self.block_cfg(s, cfg)) for s in specs],
            on_done=on_done,
            memory=memory,
        )
        lengths = [a for a, _ in passed]
        over_length(lengths, [first for _, first in passed], cfg)
        per_file = [sum(b.rows for b in scan.blocks) for scan in scans]
        counts, k = [], 0
        for part in self.files:
            counts.append(sum(per_file[k : k + len(part)]))
            k += len(part)
        bounds = np.cumsum([0, *counts], dtype=np.int64)
        starts = np.zeros(len(specs) + 1, np.int64)
        np.cumsum([a.size for a in lengths], out=starts[1:])
        kept: list[list[np.ndarray]] = [[] for _ in self.sources]
        packed: list[list[np.ndarray]] = [[] for _ in self.sources]
        dropped = 0
        for b, (spec, a) in enumerate(zip(specs, lengths)):
            s = self._source_of_file[spec.file]
            ok = np.flatnonzero(a != DROPPED)
            kept[s].append(starts[b] + ok)
            packed[s].append(a[ok].astype(np.int64))
            dropped += a.size - ok.size
        planned = choose_samples(
            [_joined(k) for k in kept],
            [_joined(p) for p in packed],
            dropped,
            [s.weight for s in self.sources],
            cfg,
            self.mix_tokens,
            self.split,
        )
        described = describe_sources(self.sources, self.files, bounds)
        return {"planned": planned, "described": described, "starts": starts, "bounds": bounds}

    def manifest(self) -> dict:
        """What the block run's manifest adds: the `mixture` and the shards' columns."""
        from packer.write.shards import SHARDS
        from packer.write.source_column import with_source_column

        schema = with_source_column(SHARDS, self.bounds).schema
        return {"columns": {f.name: str(f.type) for f in schema}, "mixture": self.report}


def _named(source: MixSource) -> str:
    """A source as a resume's refusal shows it: PATH=WEIGHT, and its own columns."""
    columns = "".join(f" {k}={v}" for k, v in sorted(source.columns.items()))
    return f"{','.join(source.paths)}={source.weight:g}{columns}"


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def takes_of(
    positions: np.ndarray, starts: np.ndarray, bounds: np.ndarray, counts_dropped: bool = True
) -> list[BlockTake]:
    """Every block's take list from the selection's positions (numbered over the blocks' kept
    samples, `starts` the first of each block), each block's in selection order."""
    block = np.searchsorted(starts, positions, side="right") - 1
    order = np.argsort(block, kind="stable")
    cuts = np.searchsorted(block[order], np.arange(starts.size))
    takes = []
    for b in range(starts.size - 1):
        mine = order[cuts[b] : cuts[b + 1]]
        local = np.ascontiguousarray(positions[mine] - starts[b], np.int64)
        digest = hashing.new("xxh3_128")
        digest.update(local.tobytes())
        digest.update(b"|")
        digest.update(np.ascontiguousarray(bounds, np.int64).tobytes())
        takes.append(BlockTake(local, bounds, digest.hexdigest(), counts_dropped))
    return takes


def pack_mixture_blocks(
    inputs: list,
    out,
    cfg: PackConfig,
    *,
    mix,
    mix_tokens,
    validation_split,
    validation_output,
    overwrite: bool,
    progress,
    workers: int,
    memory_budget,
    resume: bool,
    t0: float,
):
    """`pack(mix=..., block_size=...)` or on Ray: the block pipeline packing one global
    mixture (`BlockMixture`). With a validation split, the validation output is a second
    block run over the same blocks; both are built before either is committed, the
    validation output first (as `packer.pipelines.mixture.one_plan` does)."""
    import time

    from packer.arguments import parse_size
    from packer.engines import open_engine
    from packer.interrupts import interrupt_once
    from packer.pipelines.blocks import pack_blocks
    from packer.pipelines.mixture.one_plan import validation_target
    from packer.pipelines.mixture.read import check_source_columns
    from packer.pipelines.mixture.resume import check_finished_validation, finished_validation
    from packer.pipelines.mixture.select import expand_sources, mix_sources
    from packer.read.cache import default_budget
    from packer.storage import display
    from packer.write import commit as output

    check_mix_tokens(mix, mix_tokens)
    sources = mix_sources(mix, inputs)
    vout = finished = None
    if validation_split is not None:
        # a resume may find the validation output committed by the killed run: kept if alike
        finished = finished_validation(out, validation_output, resume, overwrite)
        vout = finished or validation_target(out, validation_output, overwrite)
    files = expand_sources(sources, stage=False)  # a block task reads its block in place
    check_source_columns(sources, files, cfg)
    mixture = BlockMixture(sources, files, mix_tokens, validation_split)
    if finished is not None:
        mixture.validation = check_finished_validation(
            finished, out, cfg, sources, files, validation_split
        )
    budget = parse_size(memory_budget) if memory_budget is not None else default_budget()
    flat = [f for part in files for f in part]
    run = {"progress": progress, "workers": workers, "budget": budget, "t0": t0}
    held: list = []
    try:
        with open_engine(cfg.engine, cfg.ray_address, workers) as engine:
            if vout is not None and finished is None:
                held_out = mixture.for_validation(display(out))
                vresult = pack_blocks(
                    engine, flat, vout, cfg, overwrite=overwrite, resume_run=resume,
                    mixture=held_out, held=held, **run,
                )  # fmt: skip
                mixture.validation = {
                    "output": display(vout),
                    "split": validation_split,
                    "seed": cfg.seed,
                }
            result = pack_blocks(
                engine, flat, out, cfg, overwrite=overwrite, resume_run=resume,
                mixture=mixture, held=held if vout is not None else None, **run,
            )  # fmt: skip
        with interrupt_once():
            for tmp, dest, synced in held:  # the validation output first
                output.commit(tmp, dest, overwrite=overwrite, synced=synced)
            held.clear()
    finally:
        for tmp, _, _ in held:
            output.discard(tmp)
    result.seconds = time.perf_counter() - t0
    if vout is not None and finished is None:  # the tasks of both outputs
        result.tasks_reused += vresult.tasks_reused
        result.tasks_run += vresult.tasks_run
    return result
