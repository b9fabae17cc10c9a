"""`packer plan`: compare packing strategies on a dataset's lengths, without writing anything."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from packer.cli.app import (
    DEBUG,
    JSON,
    STORAGE_OPTION,
    app,
    choices,
    set_storage_options,
    user_errors,
)
from packer.cli.mix import (
    mix_option,
    mix_tokens_option,
    mixture_args,
    mixture_table,
    split_option,
)
from packer.contract.names import POLICIES
from packer.planning.choices import ROW_ORDERS, STRATEGIES


@app.command("plan")
def plan_command(
    inputs: Optional[list[str]] = typer.Argument(
        None,
        metavar="INPUT...",
        help="JSONL (.jsonl, .jsonl.gz, .jsonl.zst), Parquet or Arrow files, directories or "
        "globs (or --mix).",
    ),
    max_len: int = typer.Option(..., "--max-len", "-L", help="Row length L in tokens."),
    strategy: str = typer.Option(
        "all",
        "--strategy",
        metavar=choices(("all", *STRATEGIES)),
        help="One strategy, or 'all' to compare them.",
    ),
    window: Optional[int] = typer.Option(
        None,
        "--window",
        help="Pack within consecutive windows of W samples; the table then also shows the "
        "global rows and the cost of windowing. [default: none, one global plan]",
    ),
    seed: int = typer.Option(
        0, "--seed", help="Seed for ff-shuffle, the row order and the batch plans."
    ),
    row_order: str = typer.Option(
        "shuffle",
        "--row-order",
        metavar=choices(ROW_ORDERS),
        help="Order of the rows the --world-size batches are planned over, as `packer pack "
        "--row-order` writes them: shuffle (seeded by --seed) or plan.",
    ),
    overlength: str = typer.Option(
        "error",
        "--overlength",
        metavar=choices(POLICIES),
        help="Samples longer than L: error, drop, truncate or split (as in `packer pack`).",
    ),
    world_size: Optional[int] = typer.Option(
        None,
        "--world-size",
        help="Also plan one epoch of batches for this many data-parallel ranks and report the "
        "modeled efficiency of balancing them by tokens and by attention. [default: none]",
    ),
    batch_size: int = typer.Option(
        1, "--batch-size", help="Rows per rank per step for --world-size."
    ),
    hidden_size: int = typer.Option(
        4096,
        "--hidden-size",
        help="Model hidden size d in the cost model tokens + Σ l² / (12·d), for --world-size.",
    ),
    cp_size: int = typer.Option(
        1,
        "--cp-size",
        help="Context-parallel size N: plan every sample padded to a multiple of 2N (as "
        "`packer pack --cp-size`) and report what that padding costs.",
    ),
    tp_size: int = typer.Option(
        1,
        "--tp-size",
        help="Tensor-parallel size T: with --sequence-parallel, plan every sample padded to "
        "lcm(2N, N x T) (as `packer pack --tp-size`); without it, T changes nothing.",
    ),
    sequence_parallel: bool = typer.Option(
        False,
        "--sequence-parallel",
        help="Sequence parallelism is on in training: pad for --tp-size too. [default: off]",
    ),
    input_column: str = typer.Option(
        "input_ids", "--input-column", help="Column holding the token ids."
    ),
    pairs: bool = typer.Option(
        False,
        "--pairs",
        help="The inputs are preference pairs (as `packer pack --pairs`): plan each pair as one "
        "item of its packed length, prompt twice plus both completions; --overlength drop or "
        "truncate applies to whole pairs. [default: off]",
    ),
    prompt_column: str = typer.Option(
        "prompt_input_ids", "--prompt-column", help="With --pairs: the prompt's token ids."
    ),
    chosen_column: str = typer.Option(
        "chosen_input_ids", "--chosen-column", help="With --pairs: the chosen completion's ids."
    ),
    rejected_column: str = typer.Option(
        "rejected_input_ids",
        "--rejected-column",
        help="With --pairs: the rejected completion's ids.",
    ),
    mix: Optional[list[str]] = mix_option(),
    mix_tokens: Optional[int] = mix_tokens_option(),
    validation_split: Optional[str] = split_option(),
    storage_option: list[str] = STORAGE_OPTION,
    json_out: bool = JSON,
    debug: bool = DEBUG,
) -> None:
    """Plan rows from the sample lengths alone: a length histogram and, for each strategy, rows,
    efficiency, rows / best lower bound and seconds (with --world-size, also the modeled
    data-parallel efficiency of batches balanced by tokens and by attention)."""
    from rich.markup import escape

    from packer.cli.render import stderr
    from packer.cli.render_plan import (
        balance_warning,
        cp_line,
        histogram_lines,
        pairs_line,
        strategy_table,
    )
    from packer.config import PackConfig
    from packer.errors import UsageError
    from packer.pipelines.mixture.plan import mixture_lengths
    from packer.pipelines.pairs import pair_item_lengths
    from packer.planning.compare import compare_strategies
    from packer.planning.overlength import resolve
    from packer.read.assemble import read_samples

    with user_errors(debug):
        set_storage_options(storage_option)
        _check_options(max_len, window, world_size, batch_size, hidden_size, seed)
        _check_choices(row_order, strategy)
        _check_multiple(max_len, cp_size, tp_size, sequence_parallel, pairs)
        inputs, mixing = mixture_args(inputs, mix, mix_tokens, validation_split, None)
        if mixing and pairs:
            raise UsageError("--mix and --validation-split cannot be used with --pairs")
        names = STRATEGIES if strategy == "all" else (strategy,)
        if pairs:
            columns = (prompt_column, chosen_column, rejected_column)
            lengths, pair_counts = pair_item_lengths(inputs, columns, max_len, overlength)
        elif mixing:
            cfg = PackConfig(max_len, overlength=overlength, seed=seed, input_column=input_column)
            lengths, mixture = mixture_lengths(inputs, cfg.validate(), **mixing)
            pair_counts = None
        else:
            samples = read_samples(inputs, input_column, labels_column=None, chunked=True)
            lengths = resolve(samples.lengths, max_len, overlength, locate=samples.locate).length
            pair_counts = None
        report = compare_strategies(
            lengths,
            max_len,
            names,
            seed=seed,
            window=window,
            world_size=world_size,
            batch_size=batch_size,
            hidden_size=hidden_size,
            cp_size=cp_size,
            tp_size=tp_size,
            sequence_parallel=sequence_parallel,
            row_order=row_order,
        )
        report["pairs"] = pair_counts
        if mixing:
            report["mixture"] = mixture
        warning = balance_warning(report)
        if warning is not None:
            stderr.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
        if json_out:
            sys.stdout.write(json.dumps(report) + "\n")
        else:
            stderr.print("\n".join(histogram_lines(report)), highlight=False)
            stderr.print(strategy_table(report), crop=False)  # wrapped by the terminal, not cut
            if pair_counts is not None:
                stderr.print(pairs_line(pair_counts), highlight=False, soft_wrap=True)
            if report["cp"] is not None:
                stderr.print(cp_line(report["cp"]), highlight=False, soft_wrap=True)
            if mixing:
                stderr.print(mixture_table(mixture))


def _check_multiple(max_len: int, cp_size: int, tp_size: int, sp: bool, pairs: bool) -> None:
    """--cp-size, --tp-size and --sequence-parallel: sizes, the padding multiple, no pairs."""
    from packer.errors import UsageError
    from packer.planning.multiple import cp_multiple, multiple_text

    for flag, value in (("--cp-size", cp_size), ("--tp-size", tp_size)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    mult = cp_multiple(cp_size, tp_size, sp)
    if mult > 1 and max_len % mult:
        what = multiple_text(cp_size, tp_size, sp, lambda name: "--" + name.replace("_", "-"))
        raise UsageError(f"--max-len {max_len} must be a multiple of {what}")
    if pairs and mult > 1:
        flag = "--cp-size" if cp_size > 1 else "--sequence-parallel"
        raise UsageError(f"{flag} cannot be used with --pairs")


def _check_options(max_len, window, world_size, batch_size, hidden_size, seed) -> None:
    """The sizes and the seed: one line naming the flag."""
    from packer.errors import UsageError

    if max_len < 1:
        raise UsageError(f"--max-len must be at least 1, got {max_len}")
    if window is not None and window < 1:
        raise UsageError(f"--window must be at least 1, got {window}")
    for flag, value in (
        ("--world-size", world_size),
        ("--batch-size", batch_size),
        ("--hidden-size", hidden_size),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if seed < 0:
        raise UsageError(f"--seed must be non-negative, got {seed}")


def _check_choices(row_order: str, strategy: str) -> None:
    from packer.errors import UsageError

    if row_order not in ROW_ORDERS:
        raise UsageError(f"unknown --row-order '{row_order}' (choose from {', '.join(ROW_ORDERS)})")
    if strategy != "all" and strategy not in STRATEGIES:
        raise UsageError(
            f"unknown --strategy '{strategy}' (choose from all, {', '.join(STRATEGIES)})"
        )
