"""`packer tokenize`: raw chats, texts and prompt/completion pairs to tokenized Parquet shards."""

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
    set_storage_options,
    user_errors,
)
from packer.cli.chat_options import (
    TEMPLATE_HELP,
    TRAIN_ON,
    TRAIN_ON_HELP,
    TRAIN_REASONING_HELP,
    TRAIN_TOOL_CALLS_HELP,
    TURNS,
    TURNS_HELP,
    mask_options,
    template_date_option,
)
from packer.cli.raw import (
    COLUMN_HELP,
    ENGINES,
    ON_ERROR,
    TOKENIZER_ENGINE_HELP,
    TOKENIZER_ENGINES,
    TOKENIZER_HELP,
    engine_runner,
    make_encoder,
    raw_columns,
    say,
    summary,
    tokenize_progress,
)


@app.command()
def tokenize(
    inputs: list[str] = typer.Argument(
        ...,
        metavar="RAW...",
        help="Raw records: JSONL (.jsonl, .gz, .zst), .json arrays, Parquet or Arrow files, "
        "directories or globs; chats (messages, ShareGPT conversations), Alpaca, text, "
        "prompt/completion, mixed per file.",
    ),
    tokenizer: str = typer.Option(..., "--tokenizer", help=TOKENIZER_HELP),
    output: Path = typer.Option(
        ...,
        "--output",
        "-o",
        help="Output directory: part-*.parquet shards (input_ids, labels) and tokenized.json, "
        "renamed into place when complete; `packer pack DIR` reads it.",
    ),
    chat_template: Optional[Path] = typer.Option(None, "--chat-template", help=TEMPLATE_HELP),
    train_on: Optional[str] = typer.Option(
        None, "--train-on", metavar=choices(TRAIN_ON), help=TRAIN_ON_HELP
    ),
    train_reasoning: Optional[bool] = typer.Option(
        None, "--train-reasoning/--no-train-reasoning", help=TRAIN_REASONING_HELP
    ),
    train_tool_calls: Optional[bool] = typer.Option(
        None, "--train-tool-calls/--no-train-tool-calls", help=TRAIN_TOOL_CALLS_HELP
    ),
    turns: Optional[str] = typer.Option(None, "--turns", metavar=choices(TURNS), help=TURNS_HELP),
    tokenizer_engine: Optional[str] = typer.Option(
        None,
        "--tokenizer-engine",
        metavar=choices(TOKENIZER_ENGINES),
        help=TOKENIZER_ENGINE_HELP,
    ),
    template_date: Optional[str] = template_date_option(),
    allow_empty_mask: bool = typer.Option(
        False,
        "--allow-empty-mask",
        help=f"Keep samples with no trained token instead of refusing them. {OFF}",
    ),
    column: list[str] = typer.Option([], "--column", metavar="KEY=NAME", help=COLUMN_HELP),
    on_error: Optional[str] = typer.Option(
        None,
        "--on-error",
        metavar=choices(ON_ERROR),
        help="Bad records: error stops at the first and names its FILE:LINE; skip leaves them "
        "out and lists them in rejects.txt in the output. [default: error]",
    ),
    workers: Optional[int] = typer.Option(
        None,
        "--workers",
        min=1,
        help="Worker processes, one tokenizer each (the output is the same for any value). "
        "[default: all available cores]",
    ),
    memory_budget: Optional[str] = typer.Option(
        None,
        "--memory-budget",
        help="Cap on memory, e.g. 2GiB: fewer workers where each would not fit (~512 MiB "
        "each); the input is streamed whatever its size. [default: none]",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help=f"Replace an existing tokenized output. {OFF}"
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Pick up a killed run to the same output: keep every batch it finished, tokenize "
        f"the rest; refused in one line when an input or an option changed. {OFF}",
    ),
    engine: Optional[str] = typer.Option(
        None,
        "--engine",
        metavar=choices(ENGINES),
        help="Where the batches are tokenized: local (worker processes) or ray (one Ray task "
        "per batch, one tokenizer per Ray worker; the output must be on storage every node "
        "sees). The output is the same. [default: local]",
    ),
    ray_address: Optional[str] = typer.Option(
        None,
        "--ray-address",
        help="With --engine ray: auto, host:port or ray://host:port joins that cluster. "
        "[default: none: start a local Ray with --workers CPUs]",
    ),
    storage_option: list[str] = STORAGE_OPTION,
    json_out: bool = JSON,
    debug: bool = DEBUG,
) -> None:
    """Tokenize raw chats and texts into Parquet shards that packer pack reads."""
    from packer.interrupts import preparing, sigterm_as_interrupt

    with preparing(json_out=json_out):  # a signal in the imports ends the command at once
        from packer.tokenize.run import tokenize as run_tokenize
    with user_errors(debug):
        set_storage_options(storage_option)
        runs_on = engine_runner(engine, ray_address, workers)
        encoder = make_encoder(
            tokenizer,
            chat_template,
            train_on,
            allow_empty_mask,
            mask_options(locals()),
            tokenizer_engine,
        )
        columns = raw_columns(column)
        with tokenize_progress(not json_out) as progress, sigterm_as_interrupt(), runs_on as runner:
            result = run_tokenize(
                inputs,
                output,
                encoder,
                columns,
                workers=workers,
                memory_budget=memory_budget,
                on_error=on_error or "error",
                overwrite=overwrite,
                progress=progress,
                resume=resume,
                runner=runner,
            )
        report = result.report()
        if json_out:
            sys.stdout.write(json.dumps(report) + "\n")
        else:
            say(summary(report))
