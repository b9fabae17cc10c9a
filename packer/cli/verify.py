"""`packer verify`: registered on the main typer app (imported by packer/cli/__init__.py)."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
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
    set_storage_options,
    user_errors,
)
from packer.cli.chat_options import mask_options, raw_option
from packer.cli.raw import retokenized
from packer.errors import EXIT_FAILURE
from packer.verify.choices import BACKENDS, DTYPES

MAX_PRINTED = 10


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Callable[[str, int, int], None] | None]:
    """Yield `verify`'s progress callback, drawing on stderr when it is a terminal (transient).

    A stage without a total (the structure checks) is a spinner; the others count rows.
    """
    from packer.cli.render import ProgressLines, stderr

    if not enabled:
        yield None
        return
    if not stderr.is_terminal:  # a log: a line every PACKER_PROGRESS_INTERVAL seconds
        yield ProgressLines(lambda stage, done, total, label="": f"{stage} {done:,}/{total or '?'}")
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bars = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
    )
    tasks: dict[str, int] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(stage, total=total or None)
        bars.update(tasks[stage], completed=done, total=total or None)

    with bars:
        yield update


@app.command()
def verify(
    output: str = typer.Argument(
        ...,
        metavar="DIR",
        help="A packer output directory or URL (s3://...; shards and manifest.json).",
    ),
    inputs: Optional[list[str]] = typer.Option(
        None,
        "--input",
        "-i",
        metavar="INPUT",
        help="The packed source files (repeatable): every sample's tokens and labels must equal "
        "the source's. [default: none]",
    ),
    backend: str = typer.Option(
        "auto",
        "--backend",
        "-b",
        metavar=choices(("auto", *BACKENDS)),
        help="Attention backend. auto takes the first this GPU can run of flash-attn-3 "
        "(Hopper), flash-attn, torch varlen (both sm80+), FlexAttention (sm70+), else the CPU "
        "reference; one asked for by name that cannot run here is refused (exit 2).",
    ),
    rows: str = typer.Option(
        "16",
        "--rows",
        "-n",
        metavar="N|all",
        help="Rows the attention and model checks run (picked with --seed, rows with several "
        "samples first), or 'all'. The structure checks always cover every row.",
    ),
    dtype: Optional[str] = typer.Option(
        None,
        "--dtype",
        metavar=choices(DTYPES),
        help="Attention dtype; the tolerance follows from it and the rows' longest sample. "
        "[default: bf16 on a GPU backend (fp16 on a GPU without bf16), fp32 on the CPU]",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed for the row pick, q/k/v and the model."),
    model_check: bool = typer.Option(
        False,
        "--model-check",
        help="Also compare per-sample losses of a tiny random transformers model, packed vs "
        f"alone. {OFF}",
    ),
    model_dir: Optional[Path] = typer.Option(
        None,
        "--model",
        metavar="MODEL_DIR",
        help="A local transformers checkpoint or config directory (config only: random "
        "weights): its model, in train mode through model(**model_inputs(batch)), must give "
        "every sample of the picked rows the same logits packed as alone. Nothing is "
        "downloaded. [default: none]",
    ),
    cp_size: Optional[int] = typer.Option(
        None,
        "--cp-size",
        help="On an output packed without --cp-size: check that every row can be split for "
        "context parallelism of this size (every sample a multiple of 2N), and simulate its "
        "N ranks' ring attention on the rows that split (cp_attention). A CP output is "
        "checked for its own size without it. [default: none]",
    ),
    no_attention: bool = typer.Option(
        False,
        "--no-attention",
        help="Run the structure, manifest and input checks alone (no torch needed); the "
        f"attention and model checks are reported as not run. {OFF}",
    ),
    memory_budget: Optional[str] = typer.Option(
        None,
        "--memory-budget",
        help="Cap on the attention checks' working memory, e.g. 4GiB: the CPU attention runs "
        "in query blocks that fit it (a smaller budget: more, smaller blocks); a budget below "
        "what the rows need at least is refused. [default: min(8GiB, half of available "
        "memory)]",
    ),
    tokenizer: Optional[str] = typer.Option(
        None,
        "--tokenizer",
        help="--input is raw chats or text: tokenize it afresh with this tokenizer (no cache) "
        "and check every packed sample's ids and labels against that; the output must have "
        "been packed with the same tokenizer and template. [default: none]",
    ),
    chat_template: Optional[Path] = raw_option("chat_template"),
    train_on: Optional[str] = raw_option("train_on"),
    train_reasoning: Optional[bool] = raw_option("train_reasoning"),
    train_tool_calls: Optional[bool] = raw_option("train_tool_calls"),
    turns: Optional[str] = raw_option("turns"),
    template_date: Optional[str] = raw_option("template_date"),
    storage_option: list[str] = STORAGE_OPTION,
    json_out: bool = JSON,
    debug: bool = DEBUG,
) -> None:
    """Prove that no packed sample can see or predict another. Exit 0: all checks that ran pass;
    1: a check failed (each failure names shard, row and sample); 2: usage error (also: the
    attention check without torch; pass --no-attention; a --memory-budget below what the rows
    need; or the output was replaced twice while it was checked).

    On the CPU the attention and model checks run torch on every core: OMP_NUM_THREADS=N sets
    how many (on a busy machine 1 is often fastest)."""
    from packer.interrupts import preparing

    with preparing(json_out=json_out):  # a signal in the imports and loads ends it at once
        from rich.markup import escape

        from packer.cli.render import stderr
        from packer.cli.render_verify import verify_table
        from packer.verify import verify as run_verify
        from packer.verify.kernels import load

        load()

        if not no_attention:  # torch too: a signal inside its init aborts the process
            with suppress(ImportError):
                importlib.import_module("torch")
    raw = (tokenizer, chat_template, train_on, mask_options(locals()))
    with (
        user_errors(debug),
        retokenized(output, inputs, *raw) as inputs,
        progress_bars(not json_out) as progress,
    ):
        set_storage_options(storage_option)
        result = run_verify(
            output,
            inputs or None,
            backend=backend,
            rows=rows,
            dtype=dtype,
            seed=seed,
            model_check=model_check,
            attention=not no_attention,
            model_dir=model_dir,
            progress=progress,
            cp_size=cp_size,
            memory_budget=memory_budget,
        )
    if json_out:
        sys.stdout.write(json.dumps(result.to_dict()) + "\n")
    else:
        stderr.print(verify_table(result))
        for failure in result.failures[:MAX_PRINTED]:
            stderr.print(
                f"[red]✗[/] {escape(f'[{failure.check}] {failure.message}')}",
                highlight=False,
                soft_wrap=True,
            )
        if result.failure_count > MAX_PRINTED:
            more = result.failure_count - MAX_PRINTED
            listed = result.failures_listed
            where = (
                "--json lists all"
                if listed == result.failure_count
                else f"--json lists {listed - MAX_PRINTED} of them"
            )
            stderr.print(f"… and {more} more ({where})")
    if not result.ok:
        if not json_out:
            stderr.print(
                f"[bold red]error:[/] verification failed: {result.failure_count} problem(s)",
                highlight=False,
            )
        raise typer.Exit(EXIT_FAILURE)
