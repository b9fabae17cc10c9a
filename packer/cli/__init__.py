"""The `packer` command: a thin typer layer over the library, and all of its rendering.

Each command module registers itself on `app` when imported; `finish_commands` then gives them
their metavars and examples. Only this package imports typer and rich.
"""

import os as _os
import sys as _sys

from packer.interrupts import exit_while_starting as _exit_while_starting

# run as the `packer` command (not imported by a program): a signal while the commands import
# ends it with one line
_main = getattr(_sys.modules.get("__main__"), "__spec__", None)
if getattr(_main, "name", None) in ("packer.__main__", "packer.cli.__main__") or (
    _os.path.basename(_sys.argv[0] if _sys.argv else "") == "packer"
):
    _exit_while_starting()

from packer.cli.app import app, finish_commands, run  # noqa: E402

# the commands register on import, in the order `packer --help` lists them
from packer.cli import pack  # noqa: F401, E402  isort: skip
from packer.cli import tokenize  # noqa: F401, E402  isort: skip
from packer.cli import inspect, plan, verify, export, warmup  # noqa: F401, E402  isort: skip

finish_commands()

__all__ = ["app", "run"]
