"""The Ray engine: each stage call is a Ray task; this module is the only one that imports ray.

No address: a local Ray instance with `--workers` CPUs is started and shut down at the end.
`auto`, `host:port` or `ray://host:port`: the run joins that cluster (every node needs the same
packer installed, and the output's parent directory on storage that every node sees).

Ray retries a task whose worker process or node died (`MAX_RETRIES` times); a task that raises
is not retried: its error is the run's error, the other tasks are cancelled, and the driver
removes the temporary output.

Calls given a `memory` (the block tasks: `packer.engines.blocks.block_memory`) reserve it from
Ray's `memory` resource, so a node runs no more of them at once than its memory holds. A request
larger than every node's memory is lowered to the largest node's, which then runs one at a time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any

from packer.errors import PackerError, UsageError

MAX_RETRIES = 3
OBJECT_STORE_BYTES = 256 << 20  # a local instance: tasks exchange summaries, never tokens
_CONNECT_TIMEOUT = 5.0


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
                "--engine ray needs Ray, which is not installed: pip install 'packer[ray]'"
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
            ray.init(
                num_cpus=workers,
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                **options,
            )
            self.owned = True
        else:
            _check_reachable(address)
            try:
                ray.init(address=address, **options)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise PackerError(
                    f"cannot join the Ray cluster at {address}: {_first_line(exc)}"
                ) from None
            self.owned = True
        self.remote = ray.remote(_call)

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
        refs = [remote.remote(fn, call) for call in calls]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                ray.get(done[0])
                if on_done:
                    on_done(index[done[0]])
        except ray.exceptions.RayTaskError as exc:
            self._cancel(pending)
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception):
                raise cause from None
            raise PackerError(f"a Ray task failed: {_first_line(exc)}") from None
        except ray.exceptions.RayError as exc:
            self._cancel(pending)
            raise PackerError(
                f"a packer task failed on Ray after {MAX_RETRIES} retries "
                f"({type(exc).__name__}: {_first_line(exc)}); nothing was written"
            ) from None
        except BaseException:
            self._cancel(pending)
            raise
        return ray.get(refs)

    def _largest_node_memory(self) -> int:
        """The `memory` resource of the cluster's largest live node (what one task can get)."""
        sizes = [
            int(node["Resources"].get("memory", 0))
            for node in self.ray.nodes()
            if node.get("Alive", True)
        ]
        return max(sizes, default=0)

    def _cancel(self, refs: list) -> None:
        """Cancel the tasks still queued or running, and wait until they have stopped."""
        ray = self.ray
        for ref in refs:
            with contextlib.suppress(Exception):  # already finished, or its worker is gone
                ray.cancel(ref, force=True)
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=30)

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()
            self.owned = False


def _check_reachable(address: str) -> None:
    """Fail fast on an address nothing listens on (ray.init would wait a long time)."""
    if address == "auto":
        return
    host_port = address.removeprefix("ray://")
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(
            f"--ray-address must be auto, host:port or ray://host:port, got {address!r}"
        )
    try:
        socket.create_connection((host, int(port)), timeout=_CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise PackerError(
            f"cannot reach a Ray cluster at {address}: {exc.strerror or exc}; nothing was written"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
