"""The local engine: every task in this process, in order (each one uses `--workers` threads)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class LocalEngine:
    def map(
        self,
        fn: Callable,
        calls: Sequence[tuple],
        on_done: Callable[[int], None] | None = None,
        memory: int | None = None,  # one call at a time: each has the whole budget
    ) -> list[Any]:
        results = []
        for i, call in enumerate(calls):
            results.append(fn(*call))
            if on_done:
                on_done(i)
        return results

    def task_workers(self, workers: int) -> int:
        return workers

    def close(self) -> None:
        pass
