"""The `packer` command: a thin typer layer over the library.

Each command parses options, calls one library function and renders its result. Failures the
user can act on (`PackerError`) become one line on stderr and a non-zero exit code.
"""

from __future__ import annotations

import importlib
import sys
from contextlib import contextmanager, suppress
from pathlib import Path

import typer

from packer.errors import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    EXIT_USAGE,
    PackerError,
    Terminated,
    flag_names,
)
from packer.storage.names import displayed
from packer.version import __version__

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


def _json_asked() -> bool:
    """Whether the failing command was given --json (parsed, or still on the command line when
    the options themselves were the error)."""
    ctx = _current_context()
    if ctx is not None and "json_out" in ctx.params:
        return bool(ctx.params["json_out"])
    return "--json" in sys.argv[1:]


def _current_context():
    """The running command's context, or None. Typer (0.26 on) vendors click as `typer._click`
    and depends on no `click` package: the core install has none, and a `click` that another
    package brings holds other contexts than typer's."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # a typer that moved its vendored click: the command line says it
        return None
    return get_current_context(silent=True)


def fail(message: str, code: int = EXIT_FAILURE) -> typer.Exit:
    from rich.markup import escape

    from packer.cli.render import stderr

    # escaped: a message may hold brackets (a file name, an extra) that are not markup
    stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    if _json_asked():  # a script reading stdout gets an object it can parse, not nothing
        import json

        sys.stdout.write(json.dumps({"error": message, "exit_code": code}) + "\n")
        sys.stdout.flush()
    return typer.Exit(code)


@contextmanager
def user_errors(debug: bool):
    """Turn expected failures into one line and an exit code; --debug shows the traceback.
    Messages name options by their flags here (`flag_names`), by their parameters in Python.
    The command is one run (`run_scope`): run in-process (CliRunner, a program), it starts with
    no interrupt of an earlier command's, and its own ends with its error line."""
    from packer.interrupts import run_scope

    with run_scope(), _reported(debug):
        yield


@contextmanager
def _reported(debug: bool):
    try:
        with flag_names():
            yield
    except typer.Exit:
        raise
    except PackerError as exc:
        if debug:
            raise
        raise fail(displayed(str(exc)), exc.exit_code) from None
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as `Terminated`: clean-up has run
        from packer.interrupts import exiting

        exiting()  # the clean-up has run: a second signal cannot break the error line
        if debug:
            raise
        raise interrupted(isinstance(exc, Terminated)) from None
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


def interrupted(terminated: bool) -> typer.Exit:
    """The one line of a run stopped by Ctrl-C or SIGTERM: what it left in place, if anything
    (`pack --export` stopped in its export has put the packed output in place already)."""
    from packer.interrupts import committed_outputs

    what, code = (
        ("terminated", EXIT_TERMINATED) if terminated else ("interrupted", EXIT_INTERRUPTED)
    )
    done = committed_outputs()
    if done:
        return fail(
            f"{what} after {', '.join(done)} was complete and in place; nothing else was written",
            code,
        )
    return fail(f"{what}; no partial output was left", code)


def late_note() -> None:
    """A signal that arrived after the output was in place did not stop the run: say so."""
    import signal

    from packer.cli.render import stderr
    from packer.interrupts import late_signal

    signum = late_signal()
    if signum is not None:
        name = "SIGTERM" if signum == getattr(signal, "SIGTERM", None) else "Ctrl-C (SIGINT)"
        stderr.print(
            f"note: received {name} after the output was in place; the run finished and its "
            "output is complete",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


OFF = "[default: off]"
STORAGE_OPTION = typer.Option(
    [],
    "--storage-option",
    metavar="KEY=VALUE",
    help="An option for the object store, given by hand (e.g. endpoint_url=http://host:9000, "
    "region_name=...); repeatable. Credentials come from the store's environment first. "
    "Never printed nor recorded. [default: none]",
)


def set_storage_options(pairs: list[str]) -> None:
    """Use `--storage-option KEY=VALUE` pairs for every store this command opens."""
    from packer.storage import parse_pairs, set_options

    if pairs:
        set_options(parse_pairs(pairs))


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
        "packer pack data/sample.jsonl.gz -o out/packed -L 4096 --overlength split",
        "packer pack 'data/*.jsonl.gz' -o out/packed-2k -L 2048 --overlength split --on-error skip",
        "packer pack out/packed -o out/packed-16k -L 16384 --repack",
        "packer pack data/chats.json --tokenizer data/chat-tokenizer -o out/chats -L 4096",
    ],
    "tokenize": [
        "packer tokenize data/chats.json --tokenizer data/chat-tokenizer -o out/tokenized",
        "packer tokenize data/chats.json --tokenizer data/chat-tokenizer -o out/tokenized-2 "
        "--train-on last --on-error skip",
    ],
    "inspect": [
        "packer inspect out/packed",
        "packer inspect out/packed -r 0 -r 7",
        "packer inspect out/packed --html out/report.html",
    ],
    "plan": [
        "packer plan data/sample.jsonl.gz -L 4096 --overlength split",
        "packer plan data/sample.jsonl.gz -L 4096 --overlength split --strategy bfd --world-size 8",
    ],
    "verify": [
        "packer verify out/packed -i data/sample.jsonl.gz --rows 2",
        "packer verify out/packed --no-attention",
    ],
    "export": [
        "packer export out/packed --to megatron-bridge -o out/packed-bridge --eos-id 2",
        "packer export out/packed --to mds -o out/packed-mds",
        "packer export out/packed --to trl -o out/packed-trl",
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


def finish_commands() -> None:
    """Give every registered command its metavars and Examples: run once, after the command
    modules have imported (each registers itself on `app`)."""
    for info in app.registered_commands:
        if info.cls in (None, typer.core.TyperCommand):  # typer's default class, not a chosen one
            info.cls = PackerCommand
        name = info.name or info.callback.__name__
        if info.epilog is None and name in EXAMPLES:
            info.epilog = examples(name)


def run() -> None:
    """The `packer` command: a usage error is one `error:` line and exit code 2, like the rest.

    (Typer would draw a box around it; scripts that read stderr get the same shape for every
    failure this way.) Plain `packer` is no error: it prints the help on stdout, exit code 0.
    """
    # every error of typer's vendored click (usage errors, plain `packer`) derives from it
    from typer import TyperException

    from packer.interrupts import (
        exit_process,
        exiting,
        ignore_interrupts,
        interrupt_once_until_exit,
        reported,
        signalled,
        sigterm_seen,
    )

    # typer imports what converts option values (0.2x: pydantic, `_decimal` with it) on the first
    # parse of a command's options: here instead, where a signal ends the command at once
    if sys.argv[1:2] and not sys.argv[1].startswith("-"):
        with suppress(ImportError):  # (not `import typer._adapters`: it would bind `typer` here)
            importlib.import_module("typer._adapters")
    interrupt_once_until_exit()  # a second Ctrl-C cannot break the clean-up or the error line
    try:
        code = app(standalone_mode=False)
    except KeyboardInterrupt as exc:  # in typer, before the command's own handling begins
        exiting()
        code = interrupted(isinstance(exc, Terminated)).exit_code
    except TyperException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # plain `packer`: the help is the answer
            typer.echo(exc.format_message())
            sys.exit(0)
        message = exc.format_message()
        ctx = getattr(exc, "ctx", None)
        if exc.exit_code == EXIT_USAGE:
            message += f" (see '{ctx.command_path if ctx is not None else 'packer'} --help')"
        code = fail(message, exc.exit_code).exit_code
    except typer.Abort:  # an interrupt outside a command's own handling (its options' parsing)
        exiting()
        code = interrupted(sigterm_seen()).exit_code
    # The command is done (its output in place, its report or error line printed): signals are
    # ignored from here, also in the interpreter's exit, which has no Python handlers left (one
    # there killed the process after its last line: -2 after a whole `verify` report).
    ignore_interrupts()
    if code == EXIT_INTERRUPTED and not reported():
        # typer turns an interrupt outside a command's own handling (the imports a command makes
        # before its run) into a silent exit 130, SIGTERM's too: one line, and 143 for SIGTERM
        exiting()
        code = interrupted(sigterm_seen()).exit_code
    if not code:
        late_note()
    if signalled():
        exit_process(code or 0)  # not the interpreter's exit: it could end by SIGINT (-2)
    sys.exit(code or 0)


def command_line() -> None:
    """The `packer` console script and `python -m packer`: `run`, then the process ends past
    the interpreter's finalization (`exit_process`: the atexit handlers run, the streams are
    flushed), whose last garbage collection and module teardown would walk every object
    numba, pyarrow and transformers made to free memory the exit frees anyway. A program that
    calls `run` itself keeps its interpreter: it gets `SystemExit`."""
    from packer.interrupts import exit_process

    try:
        run()
        code = 0
    except SystemExit as e:
        code = e.code
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"), as Python prints it
        sys.stderr.write(f"{code}\n")
        code = 1
    exit_process(code)
