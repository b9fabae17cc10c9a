"""`packer inspect`: look at a packed dataset before training on it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from packer.cli.app import DEBUG, JSON, STORAGE_OPTION, app, set_storage_options, user_errors


@app.command("inspect")
def inspect_command(
    directory: str = typer.Argument(
        ...,
        metavar="DIR",
        help="A packer output directory or URL (s3://...; shards and manifest.json).",
    ),
    rows: Optional[list[int]] = typer.Option(
        None,
        "--row",
        "-r",
        help="Row to draw segment by segment (repeatable; rows are numbered across shards). "
        "[default: 0]",
    ),
    tokenizer: Optional[Path] = typer.Option(
        None,
        "--tokenizer",
        help="A local tokenizer.json (or a directory holding one): show each segment's text, "
        "special tokens included; label-masked text (-100) is dimmed on a terminal and "
        "between « » when piped or with NO_COLOR. Needs the tokenizers package: pip install tokenizers. "
        "[default: none]",
    ),
    html: Optional[Path] = typer.Option(
        None,
        "--html",
        help="Also write the same views as one self-contained HTML page (inline SVG, nothing "
        "fetched). [default: none]",
    ),
    world_size: Optional[int] = typer.Option(
        None,
        "--world-size",
        help="Report the modeled data-parallel efficiency of this many ranks (1 row each), "
        "batches balanced by tokens and by attention. [default: none]",
    ),
    hidden_size: int = typer.Option(
        4096, "--hidden-size", help="Hidden size d of the cost model, for --world-size."
    ),
    storage_option: list[str] = STORAGE_OPTION,
    json_out: bool = JSON,
    debug: bool = DEBUG,
) -> None:
    """Summary, row fill and segments-per-row histograms, and rows drawn segment by segment."""
    from packer.cli.render import stderr
    from packer.cli.render_inspect import draw
    from packer.inspection import inspect, load_tokenizer

    with user_errors(debug):
        set_storage_options(storage_option)
        tok = load_tokenizer(tokenizer) if tokenizer is not None else None
        report = inspect(directory, rows, tok, world_size, hidden_size)
        for view in report["row_views"]:
            if view.get("ids_outside_vocab"):
                stderr.print(
                    f"warning: row {view['row']:,}: {view['ids_outside_vocab']:,} token ids are "
                    f">= the tokenizer's vocabulary size {view['vocab_size']:,}; their text is "
                    "not what was trained on (another tokenizer?)",
                    highlight=False,
                    markup=False,
                    soft_wrap=True,
                )
        if world_size is not None and world_size > report["rows"]:
            stderr.print(
                f"warning: --world-size {world_size} is more ranks than the {report['rows']:,} "
                "rows: each step is filled with repeated rows, so the DP efficiency models a "
                "padded epoch",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )
        if html is not None:
            from packer.inspect_html import render_html

            # written beside, then renamed: an interrupted run leaves no half page
            tmp = html.with_name(f".{html.name}.tmp")
            try:
                tmp.write_text(render_html(report), encoding="utf-8")
                tmp.replace(html)
            except BaseException:  # Ctrl-C or SIGTERM too: no temporary page is left
                tmp.unlink(missing_ok=True)
                raise
            stderr.print(f"wrote {html}", highlight=False, markup=False, soft_wrap=True)
        if json_out:
            sys.stdout.write(json.dumps(report) + "\n")
            return
        draw(report)
