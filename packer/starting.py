"""The `packer` command's start-up: a signal while it imports its modules ends it at once.

Nothing has been made yet, so a Ctrl-C or SIGTERM there ends the command with its one line and
130 (143), and the JSON error with --json, where Python would print a traceback of the import it
landed in (or SIGTERM kill it without a word). `packer/__init__.py` runs this as its first
statement, so it imports built-in modules only; what comes before it (the interpreter's own
start, `site`, finding packer) is Python's.
"""

from __future__ import annotations

import os
import sys

try:  # CPython's built-in half of `signal`, which builds its enums first: 1.6 ms more unguarded
    import _signal as signal
except ImportError:  # another interpreter
    import signal

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_COMMAND_MODULES = ("packer", "packer.cli")  # `python -m` of either runs the command
json_exit: list[bool] = []  # the exit prints the JSON error too (--json, or `preparing`'s)


def exit_at_start(signum, frame) -> None:
    """The handler of a signal at start-up: the command's one line, its exit status, no more."""
    for other in _SIGNALS:  # a second signal must not print a second line
        signal.signal(other, signal.SIG_IGN)
    what, code = ("terminated", 143) if signum == signal.SIGTERM else ("interrupted", 130)
    message = f"{what}; no partial output was left"
    os.write(2, f"error: {message}\n".encode())
    if json_exit:  # as json.dumps writes it; json itself may be what was importing
        os.write(1, f'{{"error": "{message}", "exit_code": {code}}}\n'.encode())
    os._exit(code)


def is_command_line() -> bool:
    """Whether this process is the `packer` command (the console script, `python -m packer` or
    `python -m packer.cli`), not a program that imports packer."""
    if os.path.basename(sys.argv[0] if sys.argv else "") == "packer":
        return True
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(main, "name", None) in ("packer.__main__", "packer.cli.__main__"):
        return True
    # `python -m packer`: while runpy imports the package, argv[0] is "-m" and the module's name
    # is only in the interpreter's own arguments
    if sys.argv[:1] != ["-m"]:
        return False
    given = getattr(sys, "orig_argv", [])[1:]
    for at, arg in enumerate(given):
        if arg.startswith("-m"):
            name = arg[2:] or (given[at + 1] if at + 1 < len(given) else "")
            return name in _COMMAND_MODULES
    return False


def exit_while_starting() -> None:
    """For the command line: a signal ends it at once until its handlers for the run replace
    this one (`interrupts.interrupt_once_until_exit`). A signal it ignores stays ignored."""
    if "--json" in sys.argv[1:]:
        json_exit[:] = [True]
    try:
        for signum in _SIGNALS:
            if signal.getsignal(signum) in (signal.default_int_handler, signal.SIG_DFL):
                signal.signal(signum, exit_at_start)
    except ValueError:  # not the main thread: its signals are not this thread's to handle
        return
    import _imp

    if _imp.lock_held():
        # Held now, when nothing imports under it: a Ctrl-C before this handler (Python's own
        # raised it) landed inside importlib's lock code and was swallowed there ("Exception
        # ignored in ... _get_module_lock"), leaving the lock held: the run would go on as if
        # no signal came, and hang at the first import another thread makes.
        exit_at_start(signal.SIGINT, None)
    pause = os.environ.get("PACKER_FAULT_START_PAUSE")  # fault injection for tests
    if pause:
        import time

        os.write(2, b"packer-fault: starting\n")
        time.sleep(float(pause))
