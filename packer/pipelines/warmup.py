"""Warm-up: each numba kernel run once on a few samples, with the argument types a real run
passes, so that it is compiled (or loaded from the JIT cache) before the run needs it.

`start_warming` compiles the kernels of one `pack` in a background thread while its input is
being read; `warm_steps` are what `packer warmup` runs, every kernel ahead of time (for an image
build or a CI cache; see `packer.cli.warmup`). Why a first run compiles, and how the kernels are
kept quick to compile: `packer.jit`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np


def warm_plan(strategy: str, dtype=np.int64) -> None:
    """The planning kernels of one strategy (`pack` and `plan` pass int64 lengths)."""
    from packer.planning.strategies import plan

    plan(np.array([3, 2, 2, 1], dtype), 4, strategy)


def warm_gather() -> None:
    """The gather kernel, through the same call `write_shards` makes."""
    from packer.config import PackConfig
    from packer.planning.overlength import resolve
    from packer.planning.strategies import Plan
    from packer.read.samples import Samples, as_chunks
    from packer.write.shards import allocate, gather_batch

    chunk = np.arange(1, 8, dtype=np.int32)
    samples = Samples(
        tokens=None,
        offsets=np.array([0, 3, 5, 7], np.int64),
        labels=None,
        sources=[],
        token_chunks=as_chunks([chunk]),
        label_chunks=as_chunks([chunk]),
        chunk_starts=np.array([0, chunk.size], np.int64),
    )
    cfg = PackConfig(max_len=4)
    segs = resolve(
        samples.lengths,
        cfg.max_len,
        cfg.overlength,
        starts=samples.offsets[:-1],
        locate=samples.locate,
    )
    pl = Plan(order=np.arange(3, dtype=np.int64), row_starts=np.arange(4, dtype=np.int64))
    bounds = [(0, 0, pl.num_rows)]
    gather_batch(samples, segs, pl, cfg, 0, pl.num_rows, allocate(pl, segs, cfg, bounds))


def warm_verify(pack: Callable, verify: Callable) -> None:
    """`pack` and `verify` (structure and source checks) of a few samples in a temporary
    directory: the real read, plan, gather and check calls, with their real argument types.

    Both are passed in: `verify` lives above the pipelines, and `pack`'s one-plan driver
    imports this module (`start_warming`)."""
    import json
    import tempfile
    from pathlib import Path

    from packer.config import PackConfig

    with tempfile.TemporaryDirectory(prefix="packer-warmup-") as tmp:
        data = Path(tmp) / "warmup.jsonl"
        rows = [
            {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
            {"input_ids": [8, 9], "labels": [8, 9]},
        ]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = Path(tmp) / "out"
        pack([data], out, PackConfig(max_len=4, overlength="split"), workers=1)
        verify(out, [data], attention=False)


def warm_export(pack: Callable, export: Callable) -> None:
    """`export` of two tiny outputs, without and with a `--pad` tail (a padded row's tokens are
    copied, the others read from the mapped shard: two argument types), to MDS, whose encoder
    runs every export kernel. `export` is `packer.export`, which lives above the pipelines."""
    import json
    import tempfile
    from pathlib import Path

    from packer.config import PackConfig

    with tempfile.TemporaryDirectory(prefix="packer-warmup-") as tmp:
        data = Path(tmp) / "warmup.jsonl"
        rows = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}]
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        for pad in (False, True):
            out = Path(tmp) / f"out-{pad}"
            pack([data], out, PackConfig(max_len=8, pad=pad), workers=1)
            export(out, "mds", Path(tmp) / f"mds-{pad}")


def warm_steps(
    pack: Callable, verify: Callable, export: Callable | None = None
) -> list[tuple[str, Callable[[], None]]]:
    """What `packer warmup` runs: every kernel, with the argument types packer passes it;
    `pack`, `verify` and `export` are `packer.pack`, `packer.verify.verify` and
    `packer.export` (see `warm_verify`, `warm_export`)."""
    from packer.planning.choices import STRATEGIES

    steps = [(f"plan {name}", lambda name=name: warm_plan(name)) for name in STRATEGIES]
    steps += [
        (f"plan {name} (int32 lengths)", lambda name=name: warm_plan(name, np.int32))
        for name in STRATEGIES
    ]
    steps += [("gather", warm_gather), ("pack + verify", lambda: warm_verify(pack, verify))]
    if export is not None:
        steps.append(("export", lambda: warm_export(pack, export)))
    return steps


def compiled_during(fn: Callable[[], None]) -> list[tuple[str, float]]:
    """Run fn; the kernels numba compiled meanwhile (not those it loaded from the cache), with
    their seconds. Helpers compiled inside a kernel's compilation count as part of it."""
    from numba.core import event

    done: list[tuple[str, float]] = []
    local = threading.local()  # per thread: start times of the compilations under way

    class Listener(event.Listener):
        def on_start(self, ev):
            local.starts = getattr(local, "starts", []) + [time.perf_counter()]

        def on_end(self, ev):
            seconds = time.perf_counter() - local.starts.pop()
            if not local.starts:
                func = ev.data["dispatcher"].py_func
                done.append((f"{func.__module__}.{func.__qualname__}", seconds))

    with event.install_listener("numba:compile", Listener()):
        fn()
    return done


class Warming:
    """Steps run one after the other in a background thread; `stop` skips those not started."""

    def __init__(self, steps: list[Callable[[], None]]):
        self._steps = steps
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="packer-jit-warmup", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for step in self._steps:
            if self._stop.is_set():
                return
            try:
                step()
            except Exception:  # the run's own call meets the same error and reports it
                return

    def stop(self) -> None:
        """Wait for the step under way (no compiler thread outlives the run), skip the rest."""
        self._stop.set()
        self._thread.join()


def start_warming(strategy: str) -> Warming:
    """Compile (or load from the cache) the kernels a `pack` with this strategy runs, while the
    caller reads the input. A kernel the caller reaches first waits for numba's compile lock,
    then finds itself compiled; compiling releases the GIL only in LLVM, so this pays off
    where the reading does not hold the GIL (Arrow's readers) and a second core is free."""
    return Warming([lambda: warm_plan(strategy), warm_gather])
