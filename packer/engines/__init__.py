"""Engines: where the block pipeline's tasks run (`packer.pipelines.blocks` holds what they do).

An engine only maps a stage function over its calls and returns the results in call order; the
first failure cancels the rest and is raised as the task raised it. `local` runs the calls in
this process, one after another; `ray` runs each as a Ray task on a cluster. Another engine
(Spark, Dask) is one more module with the same three methods, and one more branch in
`open_engine` (see docs/layout.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol


class Engine(Protocol):
    def map(
        self,
        fn: Callable,
        calls: Sequence[tuple],
        on_done: Callable[[int], None] | None = None,
        memory: int | None = None,
    ) -> list[Any]:
        """fn(*call) for every call, results in call order; on_done(i) as each one finishes.

        memory: bytes one call may hold; an engine that schedules calls side by side reserves
        them (Ray's `memory=`), so that no node runs more calls than its memory holds.
        """

    def task_workers(self, workers: int) -> int:
        """Threads one task may use."""

    def close(self) -> None: ...


@contextmanager
def open_engine(name: str, address: str | None, workers: int) -> Iterator[Engine]:
    """The engine `name` ("local" or "ray"; `config.ENGINES`), closed on exit. `address`: the
    Ray cluster to join (None: a local Ray instance with `workers` CPUs)."""
    if name == "ray":
        from packer.engines.ray import RayEngine

        engine = RayEngine(address, workers)
    else:
        from packer.engines.local import LocalEngine

        engine = LocalEngine()
    try:
        yield engine
    finally:
        engine.close()
