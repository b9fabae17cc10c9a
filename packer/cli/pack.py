"""`packer pack`: build packed Arrow shards and manifest.json from token datasets."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from packer.cli.app import (
    DEBUG,
    JSON,
    OFF,
    STORAGE_OPTION,
    app,
    choices,
    config_default,
    set_storage_options,
    user_errors,
)
from packer.cli.chat_options import raw_option
from packer.cli.mix import (
    cfg_mix,
    mix_option,
    mix_tokens_option,
    mixture_args,
    mixture_table,
    split_option,
    split_output_option,
    validation_export_target,
)
from packer.cli.pack_export import check_export_config, export_outputs, export_target
from packer.cli.raw import (
    TOKENIZER_ENGINE_HELP,
    TOKENIZER_ENGINES,
    PackTokenizing,
    raw_source,
    tokenize_for_pack,
)
from packer.config import ENGINES, ON_ERROR, build_config
from packer.contract.names import POLICIES
from packer.hashing import ALGORITHMS
from packer.planning.choices import ROW_ORDERS, STRATEGIES


@app.command()
def pack(
    inputs: Optional[list[str]] = typer.Argument(
        None,
        metavar="INPUT...",
        help="JSONL (.jsonl, .jsonl.gz, .jsonl.zst), Parquet or Arrow files, directories or "
        "globs (or --mix).",
    ),
    output: str = typer.Option(
        ...,
        "--output",
        "-o",
        help="Output directory or URL (s3://, gs://, hf://...) for shards and manifest.json "
        "(complete only when its manifest is: renamed into place, or written last on a store).",
    ),
    max_len: Optional[int] = typer.Option(
        None,
        "--max-len",
        "-L",
        help="Row length L in tokens. [required, here or in --config]",
    ),
    strategy: Optional[str] = typer.Option(
        None,
        "--strategy",
        metavar=choices(STRATEGIES),
        help=f"Packing strategy (see docs/strategies.md). {config_default('bfd')}",
    ),
    overlength: Optional[str] = typer.Option(
        None,
        "--overlength",
        metavar=choices(POLICIES),
        help="Samples longer than L: error (stop and say so), drop, truncate, or split into "
        f"pieces of L. Every affected sample is counted. {config_default('error')}",
    ),
    pad: Optional[bool] = typer.Option(
        None,
        "--pad/--no-pad",
        help="Pad every row to exactly L tokens (padding is one final cu_seqlens segment, "
        f"labelled -100). {config_default('no-pad')}",
    ),
    pad_id: Optional[int] = typer.Option(
        None, "--pad-id", help=f"Token id used for padding. {config_default('0')}"
    ),
    cp_size: Optional[int] = typer.Option(
        None,
        "--cp-size",
        help="Context-parallel size N: pad every sample (every piece) at its end to a "
        "multiple of 2N (pad id, labels -100), plan the padded lengths and add "
        "cu_seqlens_padded; L must be a multiple of 2N (docs/context-parallel.md). "
        + config_default("1, no CP padding"),
    ),
    tp_size: Optional[int] = typer.Option(
        None,
        "--tp-size",
        help="Tensor-parallel size T; with --sequence-parallel, samples pad to "
        "lcm(2N, N x T) for --cp-size N (T at N = 1), as Megatron-Bridge asks. Without "
        "--sequence-parallel it changes nothing. " + config_default("1"),
    ),
    sequence_parallel: Optional[bool] = typer.Option(
        None,
        "--sequence-parallel/--no-sequence-parallel",
        help="Sequence parallelism is on in training: pad every sample for --tp-size too "
        "(recorded in the manifest; the export and verify use it). "
        + config_default("no-sequence-parallel"),
    ),
    seed: Optional[int] = typer.Option(
        None,
        "--seed",
        help=f"Seed for ff-shuffle and the shuffled row order. {config_default('0')}",
    ),
    row_order: Optional[str] = typer.Option(
        None,
        "--row-order",
        metavar=choices(ROW_ORDERS),
        help="Order of the rows in the shards: shuffle (seeded by --seed, no length "
        "curriculum for a reader that reads in order) or plan (the planner's order, longest "
        f"rows first). See docs/format.md. {config_default('shuffle')}",
    ),
    window: Optional[int] = typer.Option(
        None,
        "--window",
        help="Pack within consecutive "
        "windows of W samples (bounded memory, parallel; costs some rows). "
        + config_default("none, one global plan"),
    ),
    input_column: Optional[str] = typer.Option(
        None,
        "--input-column",
        help=f"Column holding the token ids. {config_default('input_ids')}",
    ),
    labels_column: Optional[str] = typer.Option(
        None,
        "--labels-column",
        help="Column holding labels (-100 = no loss). The default is read where the input has "
        "it (elsewhere labels are the input ids); a column named here must be in every sample. "
        + config_default("labels"),
    ),
    pairs: Optional[bool] = typer.Option(
        None,
        "--pairs/--no-pairs",
        help="The inputs are preference pairs (prompt, chosen and rejected token ids, TRL's "
        "tokenized DPO form): each pair becomes two adjacent segments of one row, prompt + "
        "chosen and prompt + rejected, never split across rows; prompt tokens are labelled -100. "
        f"--overlength drop or truncate applies to whole pairs. {config_default('no-pairs')}",
    ),
    prompt_column: Optional[str] = typer.Option(
        None,
        "--prompt-column",
        help=f"With --pairs: column of the prompt's token ids. {config_default('prompt_input_ids')}",
    ),
    chosen_column: Optional[str] = typer.Option(
        None,
        "--chosen-column",
        help="With --pairs: column of the chosen completion's token ids (without the prompt). "
        + config_default("chosen_input_ids"),
    ),
    rejected_column: Optional[str] = typer.Option(
        None,
        "--rejected-column",
        help="With --pairs: column of the rejected completion's token ids (without the "
        f"prompt). {config_default('rejected_input_ids')}",
    ),
    on_error: Optional[str] = typer.Option(
        None,
        "--on-error",
        metavar=choices(ON_ERROR),
        help="Bad samples (malformed line, empty, bad ids, labels length...): error stops at "
        "the first and names it; skip leaves them out, counts them per reason and lists them "
        f"in rejects.jsonl in the output. {config_default('error')}",
    ),
    shard_rows: Optional[int] = typer.Option(
        None,
        "--shard-rows",
        help=f"Rows per output shard. {config_default('rows holding about 16M tokens')}",
    ),
    hash_: Optional[str] = typer.Option(
        None,
        "--hash",
        metavar=choices(ALGORITHMS),
        help="Content hash of each shard in the manifest: xxh3_128 (fast) or sha256. "
        + config_default("xxh3_128"),
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help=f"Replace an existing output (kept in place until the new one is complete). {OFF}",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Block runs: pick up a killed run to the same output, keeping every block and tail "
        "task it finished (same inputs and options, else refused); the bytes are those of an "
        f"uninterrupted run. Without it a killed run's leftovers are removed. {OFF}",
    ),
    repack: bool = typer.Option(
        False,
        "--repack",
        help="INPUT is a packer output: read its rows back into the original samples (split "
        "pieces joined, padding dropped, sample_index kept) and pack them again, e.g. with "
        f"another L. Without it, packer outputs are never read as input. {OFF}",
    ),
    config: Optional[Path] = typer.Option(
        None,
        "--config",
        "-c",
        help="YAML preset of these options; flags given here override it. [default: none]",
    ),
    workers: Optional[int] = typer.Option(
        None,
        "--workers",
        min=1,
        help="Cores to use for reading, validation, gather and shard writing (output is the "
        "same for any value). [default: all available]",
    ),
    memory_budget: Optional[str] = typer.Option(
        None,
        "--memory-budget",
        help="Cap on packer's own memory, e.g. 2GiB: larger inputs are streamed to a "
        "memory-mapped cache and packed out of core. [default: min(8GiB, half of available "
        "memory)]",
    ),
    block_size: Optional[str] = typer.Option(
        None,
        "--block-size",
        help="Cut the inputs into blocks of about this many input bytes (e.g. 64MiB; blocks "
        "follow files, Parquet row groups, JSONL lines), plan each block, then pack every "
        "block's under-filled tail rows together. Part of the output's identity: both engines "
        "give the same bytes for the same value. "
        + config_default("none, one global plan; 64MiB with --engine ray"),
    ),
    engine: Optional[str] = typer.Option(
        None,
        "--engine",
        metavar=choices(ENGINES),
        help="Where the work runs: local (this process) or ray (Ray tasks, one per block; "
        f"needs Ray, packer's ray extra). The output is the same. {config_default('local')}",
    ),
    ray_address: Optional[str] = typer.Option(
        None,
        "--ray-address",
        help="With --engine ray: auto, host:port or ray://host:port joins that cluster (the "
        "output must be on storage every node sees). "
        + config_default("none: start a local Ray with --workers CPUs"),
    ),
    export_to: Optional[str] = typer.Option(
        None,
        "--export",
        metavar="[megatron-bridge|megatron|mds|trl]",
        help="Then export the output in this trainer's format, as `packer export` does with its "
        "defaults (docs/export.md). [default: none]",
    ),
    export_output: Optional[Path] = typer.Option(
        None,
        "--export-output",
        help="Where --export writes (replaced with --overwrite). [default: OUTPUT-FORMAT beside "
        "the output]",
    ),
    tokenizer: Optional[str] = typer.Option(
        None,
        "--tokenizer",
        help="INPUT is raw chats or text: tokenize it first with this tokenizer (a local "
        "directory, or a hub name), through a cache reused by later packs (docs/tokenize.md). "
        "[default: none, INPUT holds token ids]",
    ),
    chat_template: Optional[Path] = raw_option("chat_template"),
    train_on: Optional[str] = raw_option("train_on"),
    train_reasoning: Optional[bool] = raw_option("train_reasoning"),
    train_tool_calls: Optional[bool] = raw_option("train_tool_calls"),
    turns: Optional[str] = raw_option("turns"),
    tokenizer_engine: Optional[str] = typer.Option(
        None,
        "--tokenizer-engine",
        metavar=choices(TOKENIZER_ENGINES),
        help="With --tokenizer: " + TOKENIZER_ENGINE_HELP,
    ),
    template_date: Optional[str] = raw_option("template_date"),
    mix: Optional[list[str]] = mix_option(),
    mix_tokens: Optional[int] = mix_tokens_option(),
    validation_split: Optional[str] = split_option(),
    validation_output: Optional[str] = split_output_option(),
    storage_option: list[str] = STORAGE_OPTION,
    json_out: bool = JSON,
    debug: bool = DEBUG,
) -> None:
    """Pack token datasets into Arrow shards ready for varlen flash-attention."""
    from packer.interrupts import preparing

    with preparing(json_out=json_out):  # a signal in rich's imports ends the command at once
        from packer.cli import render  # noqa: F401 (the steps below use it)
    with user_errors(debug):
        set_storage_options(storage_option)
        if not inputs and not mix and config is None:
            mixture_args(inputs, mix, None, None, None)  # refuses: no INPUT
        export_dest = export_target(export_to, export_output, output, overwrite)
        cfg = build_config(
            config,
            {
                "max_len": max_len,
                "strategy": strategy,
                "overlength": overlength,
                "pad": pad,
                "pad_id": pad_id,
                "cp_size": cp_size,
                "tp_size": tp_size,
                "sequence_parallel": sequence_parallel,
                "seed": seed,
                "row_order": row_order,
                "window": window,
                "input_column": input_column,
                "labels_column": labels_column,
                "shard_rows": shard_rows,
                "on_error": on_error,
                "hash": hash_,
                "block_size": block_size,
                "engine": engine,
                "ray_address": ray_address,
                "pairs": pairs,
                "prompt_column": prompt_column,
                "chosen_column": chosen_column,
                "rejected_column": rejected_column,
            },
        )
        check_export_config(export_to, cfg, memory_budget)
        _check_unused_flags(cfg, pad_id, on_error, repack)
        refused = {"--repack": repack}
        inputs, mixing = mixture_args(
            inputs, mix, mix_tokens, validation_split, validation_output, cfg_mix(config), refused
        )
        held_export = validation_export_target(export_to, mixing, output, overwrite)
        tokenizing = PackTokenizing(
            tokenizer=tokenizer,
            chat_template=chat_template,
            train_on=train_on,
            train_reasoning=train_reasoning,
            train_tool_calls=train_tool_calls,
            turns=turns,
            tokenizer_engine=tokenizer_engine,
            template_date=template_date,
            workers=workers,
            memory_budget=memory_budget,
            resume=resume,
            json_out=json_out,
        )
        # None without --tokenizer
        raw = tokenize_for_pack(inputs, output, cfg, repack, mixing, tokenizing)
        result = _run_pack(
            raw.inputs if raw is not None else inputs,
            output,
            cfg,
            raw,
            raw.mixing if raw is not None else mixing,
            overwrite=overwrite,
            workers=workers,
            # with --repack, --memory-budget is the export's: a repack reads in memory
            memory_budget=None if export_to is not None and repack else memory_budget,
            repack=repack,
            resume=resume,
            show=not json_out,
        )
        report = result.report()
        if export_to is not None:  # the validation output's too, beside it
            targets = [("export", output, export_dest)] + (held_export or [])
            report |= export_outputs(targets, export_to, overwrite, memory_budget)
        _print_report(report, result, cfg, export_to, json_out)


def _run_pack(inputs, output: str, cfg, raw, mixing: dict, *, show: bool, **options):
    """The packing step, with progress bars (when `show`), SIGTERM taken as Ctrl-C, and a
    tokenized cache entry's raw source recorded; `options`: `pipelines.pack.pack`'s own."""
    from packer.cli.render import progress_bars
    from packer.interrupts import sigterm_as_interrupt
    from packer.pipelines.pack import pack as run_pack  # numba: after the tokenizer's fork

    with progress_bars(show) as progress, sigterm_as_interrupt(), raw_source(raw):
        return run_pack(inputs, output, cfg, progress=progress, **options, **mixing)


def _print_report(report: dict, result, cfg, export_to: str | None, json_out: bool) -> None:
    """The run's report: one JSON object on stdout, or the table (and notes) on stderr."""
    from packer.cli.render import pack_table, split_note, stderr

    if json_out:
        sys.stdout.write(json.dumps(report) + "\n")
        return
    for skipped in result.skipped_inputs:
        stderr.print(f"note: skipped {skipped}: a packer output, not samples", highlight=False)
    stderr.print(pack_table(report, cfg.max_len, pairs=cfg.pairs))
    if "mixture" in report:
        stderr.print(mixture_table(report["mixture"]))
    note = split_note(report)
    if note is not None:
        stderr.print(note, highlight=False, markup=False, soft_wrap=True)
    for key in ("export", "validation_export") if export_to is not None else ():
        if key in report:
            done = report[key]
            stderr.print(
                f"exported as {export_to} to {done['output']} in {done['seconds']:.2f} s",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )


def _check_unused_flags(cfg, pad_id, on_error, repack: bool) -> None:
    """Flags this run would not use are refused rather than ignored."""
    from packer.errors import UsageError

    if pad_id is not None and not cfg.pad and cfg.cp_size == 1:
        raise UsageError(
            "--pad-id is the token of --pad's row padding and --cp-size's sample padding; "
            "without either nothing is padded"
        )
    if on_error is not None and repack:
        raise UsageError(
            "--on-error cannot be used with --repack: a packer output holds only the samples "
            "that passed when it was packed"
        )
