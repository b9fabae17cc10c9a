"""What packer's signal handlers (`packer.interrupts`) need to be safe wherever they run: a
flag without a lock, and a wait for the end of code an interrupt must not stop (importlib's lock
code, llvmlite's wrappers), where a KeyboardInterrupt leaves a lock held or a native object half
made: the handler raises at the first line past it instead.
"""

from __future__ import annotations

import os
import sys


class Flag:
    """A flag that signal handlers set and clear. Not `threading.Event`: its `set` takes a lock,
    and a second signal whose handler runs inside the first one's `set` (same thread, lock held)
    waits on it forever: a `pack` hung so after two quick Ctrl-C's. An assignment takes none."""

    __slots__ = ("_on",)

    def __init__(self) -> None:
        self._on = False

    def set(self) -> None:
        self._on = True

    def clear(self) -> None:
        self._on = False

    def is_set(self) -> bool:
        return self._on


_LLVMLITE = os.path.join("llvmlite", "binding", "")
_held: dict = {}  # while `past_unsafe` waits: the tracer it replaced, the frames it traces


def _unsafe(code) -> bool:
    """Code an exception must not stop: importlib's lock code (raised between `_imp.acquire_lock()`
    and its `try`, it leaves the lock held and every later import waits: a `pack` hung so), and
    llvmlite's wrappers (a native object left half made: its `__del__` fails, or frees twice)."""
    return code.co_filename == "<frozen importlib._bootstrap>" or _LLVMLITE in code.co_filename


def past_unsafe(handler, signum: int, frame) -> bool:
    """Whether the main thread runs `_unsafe` code (`frame`); `handler` then runs at the first line
    past it, from a trace function (a signal sent again runs it at once, inside itself)."""
    if frame is None or not _unsafe(frame.f_code):
        return False
    if _held:  # one is waiting already
        return True

    def trace(f, event, arg):
        if not _held or _unsafe(f.f_code):
            return trace if _held else None
        release_held()
        handler(signum, f)  # raises here; Python then turns tracing off (a debugger's too)
        return None

    _held["previous"], _held["frames"] = sys.gettrace(), []
    while frame is not None:
        frame.f_trace = trace
        _held["frames"].append(frame)
        frame = frame.f_back
    sys.settrace(trace)
    return True


def release_held() -> None:
    """Stop waiting for the end of `_unsafe` code: the interrupt is raised now."""
    if _held:
        for frame in _held.pop("frames"):
            frame.f_trace = None
        sys.settrace(_held.pop("previous"))
