"""How packer compiles its numba kernels, and what keeps a first run (empty JIT cache) short.

A kernel is compiled the first time it is called with new argument types, then cached on disk
(`cache=True`), so only a run on an empty cache pays for it. What that first run costs:

- A kernel called from a kernel is compiled once per *literal* argument type it meets:
  `f(x, 0)` and `f(x, 1)` are two compilations, and so is `f(x, n)` while type inference still
  holds `n = 0` as the literal 0. `kernel` and `helper` type the arguments of such nested
  calls without their literal values, so each helper is compiled once.
- Each compiled function costs a fixed tenth of a second or so (a third less for a `helper`,
  which has no Python entry point), and each numba feature pulls its own machinery into the
  compilation: array allocation, slice assignment (it formats an error message with the
  shapes), `typed.List`. The kernels on `pack`'s path therefore write into arrays their
  Python callers allocate, copy with loops, and take no typed lists.
- `pack` compiles the kernels it needs in a background thread while its input is being read
  (`start_warming`), and `packer warmup` compiles all of them ahead of time (for an image
  build or a CI cache; see `packer.cli.warmup`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
from numba import njit
from numba.core import types


def kernel(py_func):
    """A kernel called from Python: `njit(cache=True, nogil=True)`, typing the calls it makes
    to helpers without literal argument values."""
    return _unliteral_calls(njit(cache=True, nogil=True)(py_func))


def helper(py_func):
    """A function that only kernels call: compiled without the Python and C entry points a
    kernel needs (about a third of a small function's compile time) and not cached on its own
    (its code is part of each calling kernel's cache entry)."""
    options = {"nogil": True, "no_cpython_wrapper": True, "no_cfunc_wrapper": True}
    return _unliteral_calls(njit(**options)(py_func))


def _unliteral_calls(dispatcher):
    resolve = dispatcher.get_call_template

    def get_call_template(args, kws):
        args = tuple(types.unliteral(a) for a in args)
        return resolve(args, {k: types.unliteral(v) for k, v in kws.items()})

    dispatcher.get_call_template = get_call_template
    return dispatcher


# --------------------------------------------------------------------------------------------
# Warm-up: run each kernel once on a few samples of the argument types a real run passes


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


def warm_verify() -> None:
    """`pack` and `verify` (structure and source checks) of a few samples in a temporary
    directory: the real read, plan, gather and check calls, with their real argument types."""
    import json
    import tempfile
    from pathlib import Path

    from packer.config import PackConfig
    from packer.pipeline import pack
    from packer.verify import verify

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


def warm_steps() -> list[tuple[str, Callable[[], None]]]:
    """What `packer warmup` runs: every kernel, with the argument types packer passes it."""
    from packer.planning.choices import STRATEGIES

    steps = [(f"plan {name}", lambda name=name: warm_plan(name)) for name in STRATEGIES]
    steps += [
        (f"plan {name} (int32 lengths)", lambda name=name: warm_plan(name, np.int32))
        for name in STRATEGIES
    ]
    return steps + [("gather", warm_gather), ("pack + verify", warm_verify)]


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
