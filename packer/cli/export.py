"""`packer export`: a committed packer output in the format another trainer reads."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from packer.cli.app import DEBUG, JSON, app, choices, user_errors
from packer.errors import count

FORMATS = ("megatron-bridge", "megatron", "mds", "trl")


@app.command("export")
def export_command(
    directory: str = typer.Argument(
        ...,
        metavar="OUT",
        help="A committed packer output: a directory, or a URL (s3://, gs://, hf://, ...).",
    ),
    to: str = typer.Option(
        ..., "--to", help=f"The trainer's format: {choices(FORMATS)}. See docs/export.md."
    ),
    output: str = typer.Option(
        ...,
        "--output",
        "-o",
        metavar="DIR",
        help="The local export directory to create (atomically).",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace an existing export in --output. [default: off]"
    ),
    vocab_size: Optional[int] = typer.Option(
        None,
        "--vocab-size",
        help="megatron: the vocabulary size that picks the token dtype (uint16 below 65500, "
        "else int32); an id at or above it is refused. [default: the largest token id + 1]",
    ),
    eos_id: Optional[int] = typer.Option(
        None,
        "--eos-id",
        help="megatron-bridge: the tokenizer's EOS id, which Bridge pads rows with; recorded in "
        "the export's manifest. [default: none]",
    ),
    accept: Optional[list[str]] = typer.Option(
        None,
        "--accept",
        help="Accept a change the format forces on training (repeatable): labels-from-ids "
        "(megatron-bridge: train on the next input id where a label differs from it). "
        "[default: none: such an output is refused]",
    ),
    mds_size_limit: int = typer.Option(
        1 << 26, "--mds-size-limit", help="mds: the largest shard file in bytes."
    ),
    memory_budget: Optional[str] = typer.Option(
        None,
        "--memory-budget",
        help="Cap on the export's working memory, e.g. 512MiB: rows are taken in batches that "
        "fit it. [default: min(8GiB, half of available memory)]",
    ),
    json_out: bool = JSON,
    debug: bool = DEBUG,
) -> None:
    """Write a packer output as Megatron-Bridge, Megatron-LM, MosaicML MDS or TRL data."""
    from packer.interrupts import preparing

    with preparing(json_out=json_out):  # a signal in the imports and loads exits at once
        from packer.cli.render import print_warnings, stderr
        from packer.export import export
        from packer.export.kernels import load

        load()
    with user_errors(debug):
        result = export(
            directory,
            to,
            output,
            overwrite=overwrite,
            vocab_size=vocab_size,
            eos_id=eos_id,
            accept=tuple(accept or ()),
            mds_size_limit=mds_size_limit,
            memory_budget=memory_budget,
        )
    print_warnings(result.warnings)
    if json_out:
        sys.stdout.write(json.dumps(result.to_dict()) + "\n")
        return
    for note in result.notes:
        stderr.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    stderr.print(
        f"exported {count(result.rows, 'row')} ({count(result.samples, 'sample')}, "
        f"{count(result.tokens, 'token')}) "
        f"as {to} to {result.dest} in {result.seconds:.2f} s",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
