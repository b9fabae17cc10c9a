"""The `packer` command: a thin typer layer over the library, and all of its rendering.

Each command module registers itself on `app` when imported; `finish_commands` then gives them
their metavars and examples. Only this package imports typer and rich.
"""

from packer.cli.app import app, command_line, finish_commands, run

# the commands register on import, in the order `packer --help` lists them
from packer.cli import pack  # noqa: F401  isort: skip
from packer.cli import tokenize  # noqa: F401  isort: skip
from packer.cli import inspect, plan, verify, export, warmup  # noqa: F401  isort: skip

finish_commands()

__all__ = ["app", "command_line", "run"]
