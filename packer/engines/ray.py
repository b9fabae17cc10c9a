"""The Ray engine: each stage call is a Ray task; this module is the only one that imports ray.

No address: a local Ray instance with `--workers` CPUs is started and shut down at the end.
`auto`, `host:port` or `ray://host:port`: the run joins that cluster (every node needs the same
packer installed, and the output's parent directory on storage that every node sees).

Ray retries a task whose worker process or node died (`MAX_RETRIES` times); a task that raises
is not retried: its error is the run's error, nothing more is submitted, the tasks already
running end, and the driver removes the temporary output. Tasks are submitted in a window of
twice the cluster's CPUs, so a stop (an error, Ctrl-C, SIGTERM) waits for that many at most.

`host:port` is probed first (`probe`): where no Ray answers, the run fails in seconds instead of
ray.init's minutes. Ray's SIGTERM handler is replaced by packer's again after ray.init, so that
SIGTERM cleans up and exits 143 like a local run.

Calls given a `memory` (the block tasks: `packer.pipelines.blocks.block_memory`) reserve it from
Ray's `memory` resource, so a node runs no more of them at once than its memory holds. A request
larger than every node's memory is lowered to the largest node's, which then runs one at a time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from packer.errors import PackerError, Terminated, UsageError
from packer.interrupts import sigterm_seen

MAX_RETRIES = 3
OBJECT_STORE_BYTES = 256 << 20  # a local instance: tasks exchange summaries, never tokens
CONNECT_TIMEOUT = 5.0  # seconds a --ray-address has to answer (see `probe`)
DRAIN_WAIT = 5.0  # seconds a stopped run lets its running tasks end before cancelling them


def _call(fn: Callable, call: tuple) -> Any:
    return fn(*call)


def task_options(memory: int | None = None) -> dict:
    """The Ray options of one task: one CPU, retried on lost workers, `memory` bytes reserved."""
    options = {"num_cpus": 1, "max_retries": MAX_RETRIES, "retry_exceptions": False}
    if memory is not None:
        options["memory"] = int(memory)
    return options


class RayEngine:
    def __init__(self, address: str | None, workers: int):
        try:
            import ray
        except ImportError:
            raise UsageError(
                "--engine ray needs Ray, which is not installed: pip install 'ray[data]' "
                "(packer's 'ray' extra)"
            ) from None
        self.ray = ray
        self.owned = False
        env = {k: v for k, v in os.environ.items() if k.startswith("PACKER_")}
        options = {
            "logging_level": logging.ERROR,
            "log_to_driver": False,
            "runtime_env": {"env_vars": env} if env else None,
        }
        if ray.is_initialized():  # a library user's own session: use it, leave it running
            pass
        elif address is None:
            # "local" starts a new instance even where another Ray runs on this machine (a bare
            # ray.init() would join that one, and refuse num_cpus)
            _init(
                ray,
                address="local",
                num_cpus=workers,
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                **options,
            )
            self.owned = True
        else:
            probe(address)
            try:
                _init(ray, address=address, **options)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise PackerError(
                    f"cannot join the Ray cluster at {address}: {_first_line(exc)}"
                ) from None
            self.owned = True
        self.remote = ray.remote(_call)
        # Ray's driver prints what the raylet reports ("A worker died or was killed ...") to
        # sys.stdout from a thread of its own, log_to_driver or not: while packer's tasks run,
        # that goes to stderr, so stdout carries only packer's own output (a --json object).
        self._stdout = contextlib.redirect_stdout(sys.stderr)
        self._stdout.__enter__()

    def task_workers(self, workers: int) -> int:
        return 1  # each task holds one CPU of the cluster

    def map(
        self,
        fn: Callable,
        calls: Sequence[tuple],
        on_done: Callable[[int], None] | None = None,
        memory: int | None = None,
    ) -> list[Any]:
        ray = self.ray
        if memory is not None:
            largest = self._largest_node_memory()
            memory = min(memory, largest) if largest else None  # 0: no node reports memory
        remote = self.remote.options(**task_options(memory))
        results: list[Any] = [None] * len(calls)
        pending: dict = {}  # ref -> call index: at most `window` tasks submitted at once
        window = self._window()
        submitted = 0
        try:
            while submitted < len(calls) or pending:
                while submitted < len(calls) and len(pending) < window:
                    pending[remote.remote(fn, calls[submitted])] = submitted
                    submitted += 1
                done, _ = ray.wait(list(pending), num_returns=1)
                i = pending.pop(done[0])
                results[i] = ray.get(done[0])
                if on_done:
                    on_done(i)
        except ray.exceptions.RayTaskError as exc:
            self._drain(pending)
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise PackerError(f"a Ray task failed: {_first_line(exc)}") from None
        except ray.exceptions.RayError as exc:
            self._drain(pending)
            raise PackerError(
                f"a packer task failed on Ray after {MAX_RETRIES} retries "
                f"({type(exc).__name__}: {_first_line(exc)}); nothing was written"
            ) from None
        except KeyboardInterrupt as exc:
            self._drain(pending)
            if not isinstance(exc, Terminated) and sigterm_seen():
                raise Terminated() from None  # ray.wait reraised SIGTERM's Terminated as Ctrl-C
            raise
        except BaseException:
            self._drain(pending)
            raise
        return results

    def _window(self) -> int:
        """How many tasks are submitted at once: twice the cluster's CPUs keeps every CPU busy
        while a finished task's successor is submitted, and bounds what a stop must wait for."""
        cpus = int(self.ray.cluster_resources().get("CPU", 1))
        return max(2, 2 * cpus)

    def _largest_node_memory(self) -> int:
        """The `memory` resource of the cluster's largest live node (what one task can get)."""
        sizes = [
            int(node["Resources"].get("memory", 0))
            for node in self.ray.nodes()
            if node.get("Alive", True)
        ]
        return max(sizes, default=0)

    def _drain(self, pending: dict) -> None:
        """Stop: submit nothing more, let the running tasks end, and cancel those still running
        after `DRAIN_WAIT` seconds (not `force=True`: killing workers races with their replies),
        so that none writes after the run's clean-up.

        Cancelling a task whose reply is on its way races inside Ray, whose check ("Tried to
        complete task that was not pending") then kills the driver with a stack dump instead of
        packer's one line: that hit a quarter of the SIGTERMs in tests/test_ray.py when every
        task was cancelled at once. Short tasks (blocks, tails) end within the wait and are
        never cancelled; the window keeps what is left to at most twice the cluster's CPUs.
        """
        if not pending:
            return
        ray = self.ray
        _, running = ray.wait(list(pending), num_returns=len(pending), timeout=DRAIN_WAIT)
        for ref in running:
            with contextlib.suppress(Exception):  # already finished, or its worker is gone
                ray.cancel(ref, force=False)
        if running:
            ray.wait(running, num_returns=len(running), timeout=30)

    def close(self) -> None:
        try:
            if self.owned:
                self.ray.shutdown()
                self.owned = False
        finally:
            if self._stdout is not None:
                self._stdout.__exit__(None, None, None)
                self._stdout = None


def _init(ray, **kwargs) -> None:
    """ray.init, keeping packer's SIGINT and SIGTERM handlers.

    ray.init makes SIGTERM `sys.exit(15)` and its core worker prints a stack dump on it; packer's
    handler (`sigterm_as_interrupt`) turns it into `Terminated`, whose clean-up removes the
    temporary output and exits 143. A SIGTERM that lands while ray.init runs is its SystemExit.
    """
    saved = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, getattr(signal, "SIGTERM", None)):
            if signum is not None and signal.getsignal(signum) is not None:
                saved[signum] = signal.getsignal(signum)
    try:
        ray.init(**kwargs)
    except SystemExit as exc:
        if exc.code == getattr(signal, "SIGTERM", None):
            raise Terminated() from None
        raise
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


# the HTTP/2 client preface and an empty SETTINGS frame (length 0, type 4, no flags, stream 0)
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 4


def probe(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Fail in `timeout` seconds unless a gRPC server (Ray's GCS or Ray Client) answers there.

    ray.init waits for minutes, deaf to SIGTERM and printing Ray's own log, on an address where
    something that is not Ray listens. A gRPC server answers the HTTP/2 preface with a SETTINGS
    frame at once; a silent server, an HTTP/1 server or a closed port is told apart here.
    `auto` is probed at RAY_ADDRESS when set (ray.init joins that), else left to Ray's lookup.
    """
    flag, shown = "--ray-address", f"--ray-address {address}"
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "")
        if address in ("", "auto"):
            return
        flag, shown = "RAY_ADDRESS", f"--ray-address auto (RAY_ADDRESS={address})"
    host_port = address.removeprefix("ray://")
    host, _, port = host_port.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit():
        raise UsageError(f"{flag} must be auto, host:port or ray://host:port, got {address!r}")
    deadline = time.monotonic() + timeout

    def fail(why: str) -> UsageError:
        return UsageError(f"no Ray cluster answers there ({why})", where=shown)

    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except socket.gaierror as exc:
        raise fail(f"cannot resolve {host}: {exc.strerror or exc}") from None
    except TimeoutError:
        raise fail(f"no answer to a connection in {timeout:g} s") from None
    except OSError as exc:
        raise fail((exc.strerror or str(exc)).lower()) from None
    with sock:
        answer = b""
        try:
            sock.sendall(_PREFACE)
            while len(answer) < 9:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = sock.recv(9 - len(answer))
                if not chunk:
                    break
                answer += chunk
            if len(answer) == 9 and answer[3] == _SETTINGS and answer[5:9] == bytes(4):
                return
            if b"\n" not in answer and len(answer) == 9:  # the rest of its first line, if quick
                sock.settimeout(min(max(deadline - time.monotonic(), 0.001), 0.5))
                answer += sock.recv(120)
        except TimeoutError:
            if not answer:
                raise fail(
                    f"it accepted the connection but sent nothing in {timeout:g} s"
                ) from None
        except OSError as exc:
            if not answer:
                raise fail((exc.strerror or str(exc)).lower()) from None
    if not answer:
        raise fail("it closed the connection without answering")
    first = (answer.decode("ascii", "replace").strip().splitlines() or ["?"])[0][:60]
    raise fail(f"it answers {''.join(c if c.isprintable() else '?' for c in first)!r}, not gRPC")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
