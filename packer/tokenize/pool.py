"""The worker processes of a tokenize run, and a driver that notices when one dies.

`multiprocessing.Pool` loses the task of a worker that dies (SIGKILL, the OOM killer, a crash
in a tokenizer's native code): it starts another worker and the driver waits for the lost
result forever. Here each worker has its own pipe and takes one task at a time, and the driver
waits on the pipes and on the processes' sentinels together: it knows which task every worker
holds, so a worker that dies fails the run at once, in one line naming that task.

A task's exception comes back to the driver and is raised when its result is asked for, so
results and errors arrive in the order the tasks were submitted, whichever worker ran them.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.pool import ExceptionWithTraceback

from packer.errors import PackerError, flag_names, naming_flags

STOP_WAIT = 5.0  # seconds a terminated worker has to end before it is killed


class WorkerDied(PackerError):
    """A worker process ended while the run needed it (killed, out of memory, crashed)."""


def _serve(
    conn, fn: Callable, initializer: Callable, initargs: tuple, inherited=(), flags=False
) -> None:
    """A worker: build its state once, then run each task it is sent until told to stop.

    inherited: the driver's ends of the pipes, which a forked worker holds copies of; closed,
    so that when the driver dies (even by SIGKILL) this worker's pipe reads EOF and it ends.
    flags: the driver's `naming_flags()`: a spawned worker starts without the CLI's context,
    and its messages (built here, sent back whole) would name parameters instead of flags."""
    for end in inherited:
        end.close()
    with flag_names(flags):
        _serve_tasks(conn, fn, initializer, initargs)


def _serve_tasks(conn, fn: Callable, initializer: Callable, initargs: tuple) -> None:
    try:
        initializer(*initargs)
    except BaseException as exc:
        _send(conn, None, False, exc)
        return
    kill_at = os.environ.get("PACKER_FAULT_KILL_WORKER_AT")
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            return
        if task is None:
            return
        ticket, args = task
        if kill_at and ticket == int(kill_at):  # fault injection for tests
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            result, ok = fn(*args), True
        except BaseException as exc:
            result, ok = exc, False
        if not _send(conn, ticket, ok, result):
            return


def _send(conn, ticket, ok: bool, value) -> bool:
    if not ok:
        value = ExceptionWithTraceback(value, value.__traceback__)
    try:
        conn.send((ticket, ok, value))
    except (BrokenPipeError, EOFError, OSError):
        return False
    except Exception as exc:  # a value that does not pickle
        conn.send((ticket, False, PackerError(f"a worker's result cannot be sent back: {exc}")))
    return True


class WorkerPool:
    """`n` processes of `context` ("fork" or "spawn"), each running `initializer(*initargs)`
    once and then `fn(*args)` for each task it takes. Started at once, so that a forking
    context forks before this pool starts any thread (it starts none)."""

    def __init__(self, context, n: int, fn: Callable, initializer: Callable, initargs: tuple):
        self.processes, self.conns = [], []
        self.holding: dict[int, tuple[int, str]] = {}  # worker -> (ticket, what it is)
        self.waiting: deque = deque()  # (ticket, args, what it is), not yet sent
        self.results: dict[int, tuple[bool, object]] = {}
        self.next_ticket = 0
        try:
            for _ in range(n):
                mine, theirs = context.Pipe()
                forked = context.get_start_method() == "fork"
                inherited = [*self.conns, mine] if forked else []
                process = context.Process(
                    target=_serve,
                    args=(theirs, fn, initializer, initargs, inherited, naming_flags()),
                    daemon=True,
                )
                process.start()
                theirs.close()  # the worker holds the only other end: its death reads as EOF
                self.processes.append(process)
                self.conns.append(mine)
        except BaseException:
            self.terminate()
            raise

    def submit(self, args: tuple, what: str) -> int:
        """Queue `fn(*args)`; `what` names the task if its worker dies. Returns its ticket."""
        ticket = self.next_ticket
        self.next_ticket += 1
        self.waiting.append((ticket, args, what))
        self._dispatch()
        return ticket

    def result(self, ticket: int):
        """The task's result (its exception raised), waiting for it as long as it takes."""
        while ticket not in self.results:
            self._step()
        ok, value = self.results.pop(ticket)
        if not ok:
            raise value
        return value

    def _dispatch(self) -> None:
        for worker, conn in enumerate(self.conns):
            if not self.waiting:
                return
            if worker not in self.holding:
                ticket, args, what = self.waiting.popleft()
                conn.send((ticket, args))
                self.holding[worker] = (ticket, what)

    def _step(self) -> None:
        """Wait for a result or a worker's end (in short steps: Ctrl-C and SIGTERM reach the
        driver between them), then hand the free workers their next tasks."""
        sentinels = {p.sentinel: w for w, p in enumerate(self.processes)}
        ready = wait(list(self.conns) + list(sentinels), timeout=0.5)
        for conn in ready:
            if conn in sentinels:
                continue
            worker = self.conns.index(conn)
            try:
                ticket, ok, value = conn.recv()
            except (EOFError, OSError):
                self._died(worker)
            if ticket is None:  # its initializer failed
                raise value
            self.results[ticket] = (ok, value)
            del self.holding[worker]
        for sentinel in ready:
            if sentinel in sentinels:
                self._died(sentinels[sentinel])
        self._dispatch()

    def _died(self, worker: int) -> None:
        process = self.processes[worker]
        process.join(STOP_WAIT)
        held = self.holding.get(worker)
        where = f" while it tokenized {held[1]}" if held else ""
        raise WorkerDied(
            f"a tokenize worker (pid {process.pid}) {_ending(process.exitcode)}{where}"
        )

    def close(self) -> None:
        """Tell the workers to stop once they are idle, and wait for them."""
        for conn in self.conns:
            with contextlib.suppress(OSError):  # a worker gone already
                conn.send(None)
        for process in self.processes:
            process.join()

    def terminate(self) -> None:
        """Stop every worker now (SIGTERM, then SIGKILL after `STOP_WAIT` s); idempotent."""
        for process in self.processes:
            if process.exitcode is None:
                process.terminate()
        for process in self.processes:
            process.join(STOP_WAIT)
            if process.exitcode is None:
                process.kill()
                process.join()
        for conn in self.conns:
            conn.close()
        self.conns = []


def _ending(exitcode: int | None) -> str:
    """How a worker ended, in words: `was killed by SIGKILL (out of memory?)`."""
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (out of memory?)" if -exitcode == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {exitcode}"
