"""`packer tokenize`: raw chats, texts and prompt/completion pairs to tokenized Parquet shards,
and the options `packer pack RAW --tokenizer` shares with it."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
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

TRAIN_ON = ("assistant", "last", "all")
ON_ERROR = ("error", "skip")
RAW_KEYS = (
    "messages",
    "conversations",
    "text",
    "prompt",
    "completion",
    "instruction",
    "input",
    "output",
)

TOKENIZER_HELP = (
    "A local tokenizer directory (save_pretrained layout; works offline) or a hub name "
    "(needs the hub)."
)
TEMPLATE_HELP = (
    "A Jinja chat template file that replaces the tokenizer's. [default: the tokenizer's]"
)
TRAIN_ON_HELP = (
    "Which chat tokens carry labels: every assistant turn, the last assistant turn, or all "
    "tokens; each trained turn includes its end-of-turn token. [default: assistant]"
)
COLUMN_HELP = (
    "A raw column under another name, KEY=NAME (e.g. messages=dialog); KEY is one of "
    + ", ".join(RAW_KEYS)
    + "; repeatable. [default: the KEY names]"
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
    storage_option: list[str] = STORAGE_OPTION,
    json_out: bool = JSON,
    debug: bool = DEBUG,
) -> None:
    """Tokenize raw chats and texts into Parquet shards that packer pack reads."""
    from packer.tokenize.run import tokenize as run_tokenize

    with user_errors(debug):
        set_storage_options(storage_option)
        encoder = make_encoder(tokenizer, chat_template, train_on, allow_empty_mask)
        columns = raw_columns(column)
        with tokenize_progress(not json_out) as progress:
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
            )
        report = result.report()
        if json_out:
            sys.stdout.write(json.dumps(report) + "\n")
        else:
            say(summary(report))


def make_encoder(tokenizer: str, chat_template, train_on: str | None, allow_empty_mask: bool):
    """The encoder the flags describe (errors name --tokenizer, --chat-template, --train-on)."""
    from packer import arguments as A
    from packer.tokenize.encode import Encoder

    train_on = A.choice(train_on or "assistant", "train_on", TRAIN_ON)
    return Encoder(
        tokenizer,
        chat_template=str(chat_template) if chat_template is not None else None,
        train_on=train_on,
        allow_empty_mask=allow_empty_mask,
    )


def raw_columns(pairs: list[str]):
    """`RawColumns` with the --column KEY=NAME renames applied."""
    from dataclasses import fields, replace

    from packer.errors import UsageError
    from packer.tokenize.records import RawColumns

    columns = RawColumns()
    keys = {f.name for f in fields(columns)}
    renames = {}
    for pair in pairs:
        key, sep, name = pair.partition("=")
        if not sep or not name or key not in keys:
            raise UsageError(
                f"--column must be KEY=NAME with KEY one of {', '.join(sorted(keys))}, got {pair!r}"
            )
        renames[key] = name
    return replace(columns, **renames)


def summary(report: dict) -> str:
    if report["reused"]:
        return f"tokenized output reused from the cache: {report['output']}"
    rate = f", {report['tokens_per_second']:,} tokens/s" if report["tokens_per_second"] else ""
    rejected = f", {report['rejected']:,} rejected" if report["rejected"] else ""
    return (
        f"tokenized {report['lines']:,} lines into {report['samples']:,} samples, "
        f"{report['tokens']:,} tokens ({report['trained_tokens']:,} trained){rejected} in "
        f"{report['seconds']:.2f} s{rate}, {report['workers']} workers: {report['output']}"
    )


def say(text: str) -> None:
    from packer.cli.render import stderr

    stderr.print(text, highlight=False, markup=False, soft_wrap=True)


@contextmanager
def tokenize_progress(enabled: bool):
    """A `progress(stage, done, total, label)` for tokenizing: a spinner with lines and tokens
    per second on a terminal, a line every PACKER_PROGRESS_INTERVAL seconds elsewhere."""
    from packer.cli.render import ProgressLines, stderr

    if not enabled:
        yield None
        return
    if not stderr.is_terminal:
        yield ProgressLines(lambda stage, done, total, label: f"tokenizing: {label}")
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    bars = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
    )
    task = bars.add_task("tokenizing")
    last = [0.0]

    def update(stage: str, done: int, total: int, label: str = "") -> None:
        now = time.monotonic()
        if now - last[0] >= 0.2:
            last[0] = now
            bars.update(task, description=f"tokenizing: {label}")

    with bars:
        yield update
