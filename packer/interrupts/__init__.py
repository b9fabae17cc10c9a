"""Signals during a run: Ctrl-C and SIGTERM clean up as one interrupt, and only the first counts.

A run that is interrupted removes its temporary output and exits 130 (Ctrl-C) or 143 (SIGTERM).
A second signal inside that clean-up (a thread pool's join, an `rmtree`) must not interrupt it
again, and a short critical section (the rename that commits an output) defers them both.

The commit point (`commit_point`: the swap of an output directory, the write of a remote
manifest) splits a run in two: a signal before it stops the run and leaves the previous output
as it was; a signal after it is recorded (`late_signal`) and the run finishes, since its
output is in place already and an exit status of 130/143 would say that nothing changed.

What signals did is the state of one run (`run_scope`): the command line's lasts until its
process exits; in a program (a notebook, a trainer, typer's CliRunner) the outermost scope
starts and ends with none, so that a run never inherits an earlier run's interrupt.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from packer.errors import Terminated
from packer.interrupts.safety import Flag, past_unsafe, release_held
from packer.starting import exit_at_start as _exit_at_start
from packer.starting import json_exit as _json_exit

_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # both exist on every platform Python runs on


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back for a short critical section, then deliver them.

    Python runs signal handlers in the main thread only, so swapping the Python-level handlers
    is enough (blocking with a signal mask would not be: arrow's threads could take the signal).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {}
    for signum in _SIGNALS:
        previous[signum] = signal.signal(signum, lambda s, _f: received.append(s))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if received:
            _deliver(received[0], previous[received[0]])


_sigterm_seen = Flag()
_signalled = Flag()  # a SIGINT or SIGTERM reached one of packer's handlers


def _raise_terminated(signum, frame):
    _signalled.set()
    if _committed.is_set():
        _late.append(signum)
        return
    if past_unsafe(_raise_terminated, signum, frame):
        return
    release_held()
    _sigterm_seen.set()
    raise Terminated()


def sigterm_seen() -> bool:
    """Whether SIGTERM arrived under `sigterm_as_interrupt`, even if a library (Ray's `ray.wait`
    checks signals and raises a plain KeyboardInterrupt) turned its `Terminated` into Ctrl-C's."""
    return _sigterm_seen.is_set()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While active, SIGTERM raises `Terminated` (a KeyboardInterrupt), so it cleans up as Ctrl-C."""
    if (
        threading.current_thread() is not threading.main_thread()
        or not hasattr(signal, "SIGTERM")
        or signal.getsignal(signal.SIGTERM) is _interrupt_once  # the command line's already
    ):
        yield
        return
    with run_scope(), _sigterm_raising():  # a run's: a SIGTERM under it is not the next run's
        yield


@contextmanager
def _sigterm_raising() -> Iterator[None]:
    _sigterm_seen.clear()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if _interrupted.is_set() and signal.getsignal(signal.SIGINT) in (
            signal.SIG_IGN,
            _interrupt_once,
        ):
            previous = signal.SIG_IGN  # stopping until exit (`interrupt_once_until_exit`)
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


_interrupted = Flag()
_exiting = Flag()  # the command line is reporting an interrupt and exiting
_committed = Flag()  # an output is in place: signals no longer stop the run
_late: list[int] = []  # signals received after the commit point
_outputs: list[str] = []  # what this run put in place, for the interrupt's message
_depth = [0]  # how many `run_scope`s the main thread is in


def _forget_run() -> None:
    """Clear what signals did to a run that is over (or about to start)."""
    for state in (_interrupted, _committed, _sigterm_seen, _signalled):
        state.clear()
    _late.clear()
    _outputs.clear()


@contextmanager
def run_scope() -> Iterator[None]:
    """One run (a command, a library call, a build): in a program, the outermost scope starts
    with no interrupt state and leaves none, however it ends: otherwise the interrupt of a run
    that a signal stopped would stop the next run of the process (a notebook's, CliRunner's)
    at its first check, its error line naming the earlier run's outputs. The command line's
    state is its process's (`interrupt_once_until_exit`), reported after the command returns."""
    if threading.current_thread() is not threading.main_thread() or _command_line.is_set():
        yield
        return
    outermost = _depth[0] == 0
    if outermost:
        _forget_run()
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if outermost:
            _forget_run()


def _interrupt_once(signum, frame):
    """The first SIGINT or SIGTERM raises; later ones are ignored while the run is stopping,
    since a second KeyboardInterrupt inside its clean-up (a thread pool's join, `rmtree`) would
    leave writer threads running while the interpreter exits (`Fatal Python error`).

    A first interrupt that something swallowed (Arrow clears the error of an import it runs, and
    the run goes on) does not make the run unstoppable: the next signal raises again."""
    _signalled.set()
    if _committed.is_set():
        _late.append(signum)
        return
    if _interrupted.is_set() and _stopping():
        return
    if past_unsafe(_interrupt_once, signum, frame):
        return
    # not SIG_IGN here: a second signal caught meanwhile, still pending, would be reported as
    # "ignored due to race condition"; the CLI ignores them once it exits (`ignore_interrupts`)
    release_held()
    _interrupted.set()
    raise _interrupt_for(signum)


def _unraisable_hook(unraisable) -> None:
    """An interrupt raised where Python prints an exception and drops it (a weakref callback of
    the import system, a ctypes callback of numba's compiler, a `__del__`) is sent again a moment
    later, to land where it stops the run; anything else goes to Python's own hook."""
    exc = unraisable.exc_value
    if isinstance(exc, KeyboardInterrupt) and _interrupted.is_set() and not _exiting.is_set():
        _interrupted.clear()
        signum = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
        timer = threading.Timer(0.02, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    sys.__unraisablehook__(unraisable)


def _interrupt_for(signum: int) -> KeyboardInterrupt:
    if signum == getattr(signal, "SIGTERM", None):
        _sigterm_seen.set()
        return Terminated()
    return KeyboardInterrupt()


def _stopping() -> bool:
    """Whether an interrupt is being acted on: it is the exception being handled (an `except`,
    a `finally`, an `__exit__` on its way up), or the cause of one, or the CLI is exiting."""
    if _exiting.is_set():
        return True
    exc = sys.exc_info()[1]
    seen = 0
    while exc is not None and seen < 32:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc, seen = exc.__context__, seen + 1
    return False


def raise_if_interrupted() -> None:
    """Raise the interrupt that reached this run and was swallowed (the run is still going)."""
    if (
        _interrupted.is_set()
        and not _stopping()
        and threading.current_thread() is threading.main_thread()
    ):
        raise _interrupt_for(signal.SIGTERM if _sigterm_seen.is_set() else signal.SIGINT)


def begin_output() -> None:
    """A new output starts being built: signals stop the run again. A signal that arrived after
    an earlier output of this command was committed (`pack --export`) stops it here."""
    if threading.current_thread() is not threading.main_thread():
        return
    _committed.clear()
    if _late:
        _interrupted.set()
        raise _interrupt_for(_late[0])
    raise_if_interrupted()


@contextmanager
def commit_point(where: str) -> Iterator[None]:
    """The instant an output is put in place (`where`, as the user names it).

    SIGINT and SIGTERM are held back while the block runs. If it raises, the output was not
    replaced: a held signal is delivered as before (the run stops, previous output intact). If it
    completes, the output is in place: from here on packer's handlers record signals instead of
    raising them (`late_signal`), and the run finishes. A handler of the caller's own (a library
    caller's default Ctrl-C) gets a held signal once the block is done.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with run_scope(), _committing(where):  # a program's own commit: its state ends with it
        yield


@contextmanager
def _committing(where: str) -> Iterator[None]:
    _fault_pause("commit before")
    raise_if_interrupted()  # a swallowed interrupt stops the run before, not after, its commit
    received: list[int] = []
    previous = {}
    for signum in _SIGNALS:
        previous[signum] = signal.signal(signum, lambda s, _f: received.append(s))
    done = False
    try:
        _fault_pause("commit held")
        yield
        done = True
    finally:
        if done:  # before the handlers are back: a signal they run from here on is late
            _committed.set()
            _outputs.append(where)
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if done:
            _fault_pause("commit done")
        if received:
            _deliver(received[0], previous[received[0]])


def _fault_pause(point: str, variable: str = "PACKER_FAULT_COMMIT_PAUSE") -> None:
    """Fault injection for tests: with `variable`=S set, the run says on stderr that it reached
    `point` (of its commit point: before, held, done; or `preparing`) and waits S seconds."""
    pause = os.environ.get(variable)
    if pause:
        sys.stderr.write(f"packer-fault: {point}\n")
        sys.stderr.flush()
        time.sleep(float(pause))


def _deliver(signum: int, handler) -> None:
    if callable(handler):
        handler(signum, None)
    elif handler != signal.SIG_IGN:
        signal.raise_signal(signum)


def late_signal() -> int | None:
    """The first SIGINT or SIGTERM that arrived after this run's output was in place, if any."""
    return _late[0] if _late else None


def committed_outputs() -> list[str]:
    """The outputs this run put in place (a `pack --export` interrupted in its export)."""
    return list(_outputs)


def exiting() -> None:
    """For a command line reporting an interrupt: later signals are ignored, by the kernel too (one
    re-sent by `_unraisable_hook`, or landing while the interpreter finalizes, would kill the
    process after its error line: -2, not 130). Not for a command run in-process (CliRunner)."""
    if _command_line.is_set():
        _exiting.set()
        ignore_interrupts()


def signalled() -> bool:
    """Whether a SIGINT or SIGTERM reached this command line's handlers, stopping it or not."""
    return _signalled.is_set()


def exit_process(code: int) -> None:
    """End the `packer` command line with `code`, past the interpreter's own exit: every
    command line ends so (`packer.cli.app.command_line`), for two reasons.

    The interpreter's finalization tears down every module the command loaded (numba,
    pyarrow, transformers: about 0.1 s of every command) to free memory the exit frees anyway.
    And an interrupt raised while C code evaluates Python (`PyRun_String`: Cython modules run it as
    they import, and pyarrow imports lazily) sets CPython's "unhandled KeyboardInterrupt" flag,
    even when packer then handles the exception; at exit, the interpreter sees the flag and
    kills itself by SIGINT: exit -2 after the error line, where 130 (or 0, for a signal after
    the commit point) is the truth. The atexit handlers run and the streams are flushed as at
    a normal exit (a reader that closed the pipe early costs nothing more); what is skipped
    is the interpreter's finalization and that check."""
    import atexit

    ignore_interrupts()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def reported() -> bool:
    """Whether the command line reported an interrupt (`exiting`)."""
    return _exiting.is_set()


_command_line = Flag()  # this process is packer's command line (its handlers)


@contextmanager
def preparing(json_out: bool = False) -> Iterator[None]:
    """For imports and the first call of each numba kernel, before a run makes anything: they
    load extension modules and machine code (llvmlite, numba's JIT cache), and an interrupt
    raised inside leaves them half made (then SIGSEGV, `free(): double free`, a `TypeError` out
    of an import). A command line that a signal reaches here exits at once with its one line
    (and the JSON error, with `json_out`): nothing has been made yet. A library caller's signals
    are held until the block ends; after a commit (`pack --export`) they stay late."""
    if (
        threading.current_thread() is not threading.main_thread()
        or _committed.is_set()
        or signal.getsignal(signal.SIGINT) is _exit_at_start  # inside an outer `preparing`
    ):
        yield
        return
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    if not _command_line.is_set() or _interrupt_once not in previous.values():
        with deferred_signals():
            yield
        return
    raise_if_interrupted()  # one that something swallowed stops the run here, before the imports
    _json_exit[:] = [True] if json_out else []
    for signum, handler in previous.items():
        if handler is _interrupt_once:  # not a signal the caller ignores
            signal.signal(signum, _exit_at_start)
    try:
        _fault_pause("preparing", "PACKER_FAULT_PREPARE_PAUSE")
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _once_handlers(sigterm_default: bool = False) -> dict:
    """Install `_interrupt_once` where Ctrl-C (or SIGTERM as `Terminated`) would raise; the
    handlers it replaced. A caller's own handler (or SIG_IGN) is left alone; SIGTERM's default
    action (death, no clean-up) is replaced too with `sigterm_default`."""
    previous = {}
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _exit_at_start):
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupt_once)
    if hasattr(signal, "SIGTERM"):
        current = signal.getsignal(signal.SIGTERM)
        starting = current is _exit_at_start or current == signal.SIG_DFL
        if current is _raise_terminated or (sigterm_default and starting):
            previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _interrupt_once)
    return previous


@contextmanager
def interrupt_once() -> Iterator[None]:
    """While active, only the first SIGINT or SIGTERM interrupts; those that follow it are
    ignored until the clean-up it started is done and the exception has left this block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with run_scope(), _first_interrupts():  # the outermost: an earlier call's interrupt is over
        yield


@contextmanager
def _first_interrupts() -> Iterator[None]:
    previous = _once_handlers()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        late = late_signal()
        if late is not None and late in previous and sys.exc_info()[1] is None:
            _late.clear()  # a library call whose output is in place: the caller's Ctrl-C now
            _committed.clear()
            _deliver(late, previous[late])


def interrupt_once_until_exit() -> None:
    """For a command line: from now on SIGINT and SIGTERM interrupt every command (SIGTERM as
    `Terminated`, so that it cleans up as Ctrl-C does), and only the first one does, so that a
    second Ctrl-C cannot break the clean-up, the error line or the interpreter's exit."""
    if threading.current_thread() is threading.main_thread():
        _forget_run()
        _exiting.clear()
        _once_handlers(sigterm_default=True)
        sys.unraisablehook = _unraisable_hook
        _command_line.set()


def ignore_interrupts() -> None:
    """For a command line about to exit after an interrupt: SIGINT and SIGTERM are ignored by
    the kernel from now on, also while the interpreter finalizes (where Python's own handlers
    are gone and the default action would kill the process)."""
    if threading.current_thread() is threading.main_thread():
        for signum in _SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
