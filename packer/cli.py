"""The `packer` command: a thin typer layer over the library.

Each command parses options, calls one library function and renders its result. Failures the
user can act on (`PackerError`) become one line on stderr and a non-zero exit code.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer

from packer import __version__
from packer.config import ENGINES, ON_ERROR
from packer.errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    PackerError,
    Terminated,
    flag_names,
)
from packer.hashing import ALGORITHMS
from packer.planning.overlength import POLICIES
from packer.planning.strategies import STRATEGIES

app = typer.Typer(
    name="packer",
    help="Offline sample packing for LLM training: pack token datasets into Arrow shards whose "
    "samples stay isolated (cu_seqlens, per-sample positions, boundary-masked labels).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain click help: "[default: ...]" in help texts is shown as written
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"packer {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """packer: offline sample packing for LLM training."""


def fail(message: str, code: int = EXIT_FAILURE) -> typer.Exit:
    from rich.markup import escape

    from packer.report import stderr

    # escaped: a message may hold brackets ('packer-llm[verify]', a file name) that are not markup
    stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def user_errors(debug: bool):
    """Turn expected failures into one line and an exit code; --debug shows the traceback.
    Messages name options by their flags here (`flag_names`), by their parameters in Python."""
    try:
        with flag_names():
            yield
    except typer.Exit:
        raise
    except PackerError as exc:
        if debug:
            raise
        raise fail(str(exc), exc.exit_code) from None
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as `Terminated`: clean-up has run
        if debug:
            raise
        if isinstance(exc, Terminated):
            raise fail("terminated; no partial output was left", EXIT_TERMINATED) from None
        raise fail("interrupted; no partial output was left", EXIT_INTERRUPTED) from None
    except OSError as exc:
        if debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        raise fail(f"{where}{exc.strerror or exc}") from None
    except MemoryError:
        if debug:
            raise
        raise fail("out of memory") from None
    except Exception as exc:  # a bug: still one line, and a way to see more
        if debug:
            raise
        raise fail(
            f"internal error ({type(exc).__name__}: {exc}); rerun with --debug for the traceback"
        ) from None


OFF = "[default: off]"
DEBUG = typer.Option(False, "--debug", help=f"Show the full traceback on errors. {OFF}")
JSON = typer.Option(
    False, "--json", help=f"Print one JSON object on stdout instead of a table. {OFF}"
)


def choices(values) -> str:
    """The metavar of an option with a closed set of values: `[a|b|c]`."""
    return "[" + "|".join(values) + "]"


def config_default(value: str) -> str:
    """Help text for a default that a --config file may override."""
    return f"[default: {value}, or the config's]"


@app.command()
def pack(
    inputs: list[str] = typer.Argument(
        ...,
        metavar="INPUT...",
        help="JSONL (.jsonl, .jsonl.gz, .jsonl.zst), Parquet or Arrow files, directories or globs.",
    ),
    output: Path = typer.Option(
        ...,
        "--output",
        "-o",
        help="Output directory for shards and manifest.json (created atomically).",
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
    seed: Optional[int] = typer.Option(
        None, "--seed", help=f"Seed for strategies that use randomness. {config_default('0')}"
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
        help="Column holding labels (-100 = no loss); when absent, labels are the input ids. "
        + config_default("labels"),
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
        f"needs packer-llm[ray]). The output is the same. {config_default('local')}",
    ),
    ray_address: Optional[str] = typer.Option(
        None,
        "--ray-address",
        help="With --engine ray: auto, host:port or ray://host:port joins that cluster (the "
        "output must be on storage every node sees). "
        + config_default("none: start a local Ray with --workers CPUs"),
    ),
    json_out: bool = JSON,
    debug: bool = DEBUG,
) -> None:
    """Pack token datasets into Arrow shards ready for varlen flash-attention."""
    from packer.config import build_config
    from packer.pipeline import pack as run_pack
    from packer.report import pack_table, progress_bars, split_note, stderr
    from packer.write.commit import sigterm_as_interrupt

    with user_errors(debug):
        cfg = build_config(
            config,
            {
                "max_len": max_len,
                "strategy": strategy,
                "overlength": overlength,
                "pad": pad,
                "pad_id": pad_id,
                "seed": seed,
                "window": window,
                "input_column": input_column,
                "labels_column": labels_column,
                "shard_rows": shard_rows,
                "on_error": on_error,
                "hash": hash_,
                "block_size": block_size,
                "engine": engine,
                "ray_address": ray_address,
            },
        )
        with progress_bars(not json_out) as progress, sigterm_as_interrupt():
            result = run_pack(
                inputs,
                output,
                cfg,
                overwrite=overwrite,
                progress=progress,
                workers=workers,
                memory_budget=memory_budget,
                repack=repack,
            )
        report = result.report()
        if json_out:
            sys.stdout.write(json.dumps(report) + "\n")
        else:
            for skipped in result.skipped_inputs:
                stderr.print(
                    f"note: skipped {skipped}: a packer output, not samples", highlight=False
                )
            stderr.print(pack_table(report, cfg.max_len))
            note = split_note(report)
            if note is not None:
                stderr.print(note, highlight=False, markup=False, soft_wrap=True)


from packer import (  # noqa: E402  (commands register themselves on `app`)
    cli_inspect,  # noqa: E402,F401  (registers `packer inspect`)
    cli_plan,  # noqa: E402,F401  (registers `packer plan`)
    cli_verify,  # noqa: E402,F401  (registers `packer verify`)
    cli_warmup,  # noqa: E402,F401  (registers `packer warmup`)
)

# the value each option takes, as the help and docs/cli.md name it (typer would print the type:
# `<int>`, `<list[int]>`, `<path>`); options not named here fall back on their type
METAVARS = {
    "--output": "DIR",
    "--max-len": "L",
    "--window": "W",
    "--config": "FILE",
    "--memory-budget": "SIZE",
    "--block-size": "SIZE",
    "--ray-address": "ADDRESS",
    "--input-column": "NAME",
    "--labels-column": "NAME",
    "--tokenizer": "PATH",
    "--html": "FILE",
    "--row": "N",
    "--world-size": "N",
    "--batch-size": "B",
    "--hidden-size": "D",
}
TYPE_METAVARS = {int: "N", float: "X", Path: "PATH", list[int]: "N"}

# shown under each command's --help; `\b` keeps click from rewrapping the lines
EXAMPLES = {
    "pack": [
        "packer pack data/train.jsonl -o packed -L 4096",
        "packer pack 'data/*.parquet' -o packed -L 8192 --overlength split --on-error skip",
        "packer pack packed -o packed-16k -L 16384 --repack",
    ],
    "inspect": [
        "packer inspect packed",
        "packer inspect packed -r 0 -r 7 --tokenizer tokenizer.json",
        "packer inspect packed --html report.html",
    ],
    "plan": [
        "packer plan data/train.jsonl -L 4096",
        "packer plan data/train.jsonl -L 4096 --strategy bfd --world-size 8",
    ],
    "verify": [
        "packer verify packed",
        "packer verify packed -i data/train.jsonl --rows all",
        "packer verify packed --no-attention",
    ],
    "warmup": ["packer warmup"],
}


def examples(name: str) -> str:
    """The Examples section of `packer NAME --help`."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name])


class PackerCommand(typer.core.TyperCommand):
    """A command whose help names values as people write them: `INPUT...`, `--row N`.

    Typer shows a required argument as `{INPUT...}...` in the usage line and every value by
    its Python type (`<list[int]>`, `<path>`); click's plain metavars read better.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.param_type_name == "argument":
                name = param.metavar or param.name.upper()
                if param.nargs != 1 and not name.endswith("..."):
                    name += "..."
                usage = name if param.required else f"[{name}]"
                # typer's own way of naming an argument, replaced on this instance only
                param._usage_display_name = lambda usage=usage: usage
                param._rich_display_name = lambda name=name: name
                param.display_type_rich = lambda ctx: None
            elif not param.is_flag and param.metavar is None:
                long = next((o for o in param.opts if o.startswith("--")), "")
                annotation = param.type_descriptor.annotation
                param.metavar = METAVARS.get(long) or TYPE_METAVARS.get(annotation, "TEXT")


for _info in app.registered_commands:
    if _info.cls in (None, typer.core.TyperCommand):  # typer's default class, not a chosen one
        _info.cls = PackerCommand
    _name = _info.name or _info.callback.__name__
    if _info.epilog is None and _name in EXAMPLES:
        _info.epilog = examples(_name)


def run() -> None:
    """The `packer` command: a usage error is one `error:` line and exit code 2, like the rest.

    (Typer would draw a box around it; scripts that read stderr get the same shape for every
    failure this way.) Plain `packer` is no error: it prints the help on stdout, exit code 0.
    """
    try:  # typer vendors click from 0.2x on, and its exceptions with it
        from typer import TyperException as ClickError
    except ImportError:
        from click import ClickException as ClickError

    try:
        code = app(standalone_mode=False)
    except ClickError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # plain `packer`: the help is the answer
            typer.echo(exc.format_message())
            sys.exit(0)
        message = exc.format_message()
        ctx = getattr(exc, "ctx", None)
        if exc.exit_code == EXIT_USAGE:
            message += f" (see '{ctx.command_path if ctx is not None else 'packer'} --help')"
        code = fail(message, exc.exit_code).exit_code
    except typer.Abort:
        code = fail("interrupted; no partial output was left", EXIT_INTERRUPTED).exit_code
    sys.exit(code or 0)


if __name__ == "__main__":
    # `python -m packer.cli` runs this file as __main__, a second copy of the module: the
    # commands registered themselves on the app of `packer.cli`, so run that one
    from packer.cli import run as registered

    registered()
