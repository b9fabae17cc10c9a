"""Signals during a run: Ctrl-C and SIGTERM clean up as one interrupt, and only the first counts.

A run that is interrupted removes its temporary output and exits 130 (Ctrl-C) or 143 (SIGTERM).
A second signal inside that clean-up (a thread pool's join, an `rmtree`) must not interrupt it
again, and a short critical section (the rename that commits an output) defers them both.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from packer.errors import Terminated

_SIGNALS = tuple(
    s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s is not None
)


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
            handler = previous[received[0]]
            if callable(handler):
                handler(received[0], None)
            elif handler != signal.SIG_IGN:
                signal.raise_signal(received[0])


_sigterm_seen = threading.Event()


def _raise_terminated(signum, frame):
    _sigterm_seen.set()
    raise Terminated()


def sigterm_seen() -> bool:
    """Whether SIGTERM arrived under `sigterm_as_interrupt`, even if a library (Ray's `ray.wait`
    checks signals and raises a plain KeyboardInterrupt) turned its `Terminated` into Ctrl-C's."""
    return _sigterm_seen.is_set()


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While active, SIGTERM raises `Terminated` (a KeyboardInterrupt), so it cleans up as Ctrl-C."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        yield
        return
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


_interrupted = threading.Event()


def _interrupt_once(signum, frame):
    """The first SIGINT or SIGTERM raises; later ones are ignored: the run is already stopping,
    and a second KeyboardInterrupt inside its clean-up (a thread pool's join, `rmtree`) would
    leave writer threads running while the interpreter exits (`Fatal Python error`)."""
    if _interrupted.is_set():
        return
    # not SIG_IGN here: a second signal caught meanwhile, still pending, would be reported as
    # "ignored due to race condition"; the CLI ignores them once it exits (`ignore_interrupts`)
    _interrupted.set()
    if signum == getattr(signal, "SIGTERM", None):
        _sigterm_seen.set()
        raise Terminated()
    raise KeyboardInterrupt()


def _once_handlers() -> dict:
    """Install `_interrupt_once` where Ctrl-C (or SIGTERM as `Terminated`) would raise; the
    handlers it replaced. A caller's own handler (or SIG_IGN) is left alone."""
    previous = {}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupt_once)
    if hasattr(signal, "SIGTERM") and signal.getsignal(signal.SIGTERM) is _raise_terminated:
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _interrupt_once)
    return previous


@contextmanager
def interrupt_once() -> Iterator[None]:
    """While active, only the first SIGINT or SIGTERM interrupts; those that follow it are
    ignored until the clean-up it started is done and the exception has left this block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _interrupt_once not in map(signal.getsignal, _SIGNALS):
        _interrupted.clear()  # an earlier call's interrupt is over
    previous = _once_handlers()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def interrupt_once_until_exit() -> None:
    """For a command line: from now on only the first SIGINT or SIGTERM interrupts, so that a
    second Ctrl-C cannot break the clean-up, the error line or the interpreter's exit."""
    if threading.current_thread() is threading.main_thread():
        _interrupted.clear()
        _once_handlers()


def ignore_interrupts() -> None:
    """For a command line about to exit after an interrupt: SIGINT and SIGTERM are ignored by
    the kernel from now on, also while the interpreter finalizes (where Python's own handlers
    are gone and the default action would kill the process)."""
    if threading.current_thread() is threading.main_thread():
        for signum in _SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
