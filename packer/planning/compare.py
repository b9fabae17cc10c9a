"""`packer plan` as a library call: every strategy on one set of lengths, against the bounds.

`compare_strategies` returns plain data (what `--json` prints); `packer.cli.render_plan` draws
it for the terminal. Nothing here reads files or renders.
"""

from __future__ import annotations

import time

import numpy as np

from packer.errors import UsageError
from packer.planning import kernels as algorithms
from packer.planning.balance import DEFAULT_HIDDEN_SIZE, compare_balance
from packer.planning.choices import ROW_ORDERS, STRATEGIES
from packer.planning.cp import cp_cost, pad_to_multiple
from packer.planning.multiple import cp_multiple
from packer.planning.row_order import order_plan_rows
from packer.planning.strategies import Plan, lower_bound, martello_toth_bound, plan


def _timed_plan(
    lengths: np.ndarray, max_len: int, strategy: str, seed: int, window: int | None
) -> tuple[Plan, float]:
    plan(lengths[:64], max_len, strategy, seed, window=None)  # load the JIT cache first
    t = time.perf_counter()
    rows = plan(lengths, max_len, strategy, seed, window=window)
    return rows, time.perf_counter() - t


def length_histogram(lengths: np.ndarray, max_len: int, bins: int = 16) -> dict:
    """Sample counts in `bins` equal-width length ranges over 1..L."""
    edges = np.unique(np.linspace(0, max_len, bins + 1).round().astype(np.int64))
    counts, _ = np.histogram(lengths, bins=edges + 0.5)
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def compare_strategies(
    lengths,
    max_len: int,
    strategies=STRATEGIES,
    seed: int = 0,
    window: int | None = None,
    world_size: int | None = None,
    batch_size: int = 1,
    hidden_size: int = DEFAULT_HIDDEN_SIZE,
    cp_size: int = 1,
    tp_size: int = 1,
    sequence_parallel: bool = False,
    row_order: str = "shuffle",
) -> dict:
    """Rows, efficiency, rows / best bound and seconds of each strategy on these lengths.

    With `window`, each strategy is also run globally so the cost of windowing is explicit.
    With `world_size`, each strategy's rows are also planned into one epoch of batches for
    `world_size` ranks x `batch_size` rows (seed `seed`), balanced by tokens and by attention,
    and the modeled data-parallel efficiency of both is reported (see `packer.planning.balance`).
    With `cp_size` above 1 the strategies plan the CP-padded lengths (`packer.planning.cp`), the
    bounds are theirs, `efficiency` counts real tokens only (`efficiency_padded` the padding
    too) and `cp` says what the padding costs; with `sequence_parallel`, the multiple is
    Megatron-Bridge's lcm(2 x cp_size, cp_size x tp_size) (`packer.planning.cp`).
    The batches are planned over the rows in `row_order`, as `packer pack` writes them.
    """
    if row_order not in ROW_ORDERS:
        raise UsageError(f"unknown row_order {row_order!r} (choose from {', '.join(ROW_ORDERS)})")
    mult = cp_multiple(cp_size, tp_size, sequence_parallel)
    real = np.ascontiguousarray(lengths)
    lengths = np.ascontiguousarray(pad_to_multiple(real, mult)) if mult > 1 else real
    real_tokens = int(real.sum())
    counts, _ = algorithms.length_histogram(lengths.astype(np.int64, copy=False), int(max_len))
    tokens = int(lengths.sum())
    by_tokens = lower_bound(tokens, max_len)
    l2 = martello_toth_bound(counts, max_len)
    best = max(by_tokens, l2)
    results = []
    for name in strategies:
        rows_plan, seconds = _timed_plan(lengths, max_len, name, seed, window)
        rows = rows_plan.num_rows
        entry = {
            "strategy": name,
            "rows": rows,
            "efficiency": round(real_tokens / (rows * max_len), 6) if rows else 1.0,
            "rows_over_lower_bound": round(rows / best, 6) if best else 1.0,  # bounds.best
            "optimal": rows == best,
            "seconds": round(seconds, 4),
        }
        if mult > 1:
            entry["efficiency_padded"] = round(tokens / (rows * max_len), 6) if rows else 1.0
        if window is not None:
            global_rows = _timed_plan(lengths, max_len, name, seed, None)[0].num_rows
            entry["global_rows"] = global_rows
            entry["window_cost"] = round(rows / global_rows - 1, 6) if global_rows else 0.0
        if world_size is not None:
            rows_plan = order_plan_rows(rows_plan, row_order, seed, window)
            effs = compare_balance(
                rows_plan.row_starts,
                lengths[rows_plan.order],
                world_size,
                batch_size,
                hidden_size,
                seed=seed,
            )
            entry["dp_efficiency"] = {k: round(v, 6) for k, v in effs.items()}
        results.append(entry)
    return {
        "samples": int(lengths.size),
        "tokens": tokens,
        "max_len": int(max_len),
        "window": window,
        "seed": seed,
        "row_order": row_order,
        "balance": None
        if world_size is None
        else {"world_size": world_size, "batch_size": batch_size, "hidden_size": hidden_size},
        "length_min": int(lengths.min()) if lengths.size else 0,
        "length_median": float(np.median(lengths)) if lengths.size else 0.0,
        "length_max": int(lengths.max()) if lengths.size else 0,
        "bounds": {"tokens": by_tokens, "martello_toth_l2": l2, "best": best},
        "histogram": length_histogram(lengths, max_len),
        "strategies": results,
        "cp": cp_cost(real, max_len, cp_size, mult) if mult > 1 else None,
    }
