"""`packer plan` as a library call: every strategy on one set of lengths, against the bounds.

`compare_strategies` returns plain data (what `--json` prints); `histogram_lines` and
`strategy_table` render it for the terminal. Nothing here reads files.
"""

from __future__ import annotations

import time

import numpy as np
from rich.table import Table

from packer.planning import kernels as algorithms
from packer.planning.balance import DEFAULT_HIDDEN_SIZE, compare_balance
from packer.planning.strategies import STRATEGIES, Plan, lower_bound, martello_toth_bound, plan


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
) -> dict:
    """Rows, efficiency, rows / best bound and seconds of each strategy on these lengths.

    With `window`, each strategy is also run globally so the cost of windowing is explicit.
    With `world_size`, each strategy's rows are also planned into one epoch of batches for
    `world_size` ranks x `batch_size` rows (seed `seed`), balanced by tokens and by attention,
    and the modeled data-parallel efficiency of both is reported (see `packer.planning.balance`).
    """
    lengths = np.ascontiguousarray(lengths)
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
            "efficiency": round(tokens / (rows * max_len), 6) if rows else 1.0,
            "rows_over_bound": round(rows / best, 6) if best else 1.0,
            "optimal": rows == best,
            "seconds": round(seconds, 4),
        }
        if window is not None:
            global_rows = _timed_plan(lengths, max_len, name, seed, None)[0].num_rows
            entry["global_rows"] = global_rows
            entry["window_cost"] = round(rows / global_rows - 1, 6) if global_rows else 0.0
        if world_size is not None:
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
        "balance": None
        if world_size is None
        else {"world_size": world_size, "batch_size": batch_size, "hidden_size": hidden_size},
        "length_min": int(lengths.min()) if lengths.size else 0,
        "length_median": float(np.median(lengths)) if lengths.size else 0.0,
        "length_max": int(lengths.max()) if lengths.size else 0,
        "bounds": {"tokens": by_tokens, "martello_toth_l2": l2, "best": best},
        "histogram": length_histogram(lengths, max_len),
        "strategies": results,
    }


def histogram_lines(report: dict, width: int = 40) -> list[str]:
    """One text bar per length range, scaled to the fullest range."""
    edges, counts = report["histogram"]["edges"], report["histogram"]["counts"]
    top = max(counts, default=0) or 1
    n = max(report["samples"], 1)
    digits = len(str(edges[-1]))
    lines = [
        f"lengths of {report['samples']:,} samples (min {report['length_min']}, "
        f"median {report['length_median']:g}, max {report['length_max']}, L = "
        f"{report['max_len']:,})"
    ]
    for lo, hi, c in zip(edges[:-1], edges[1:], counts):
        bar = "█" * round(width * c / top)
        lines.append(
            f"{lo + 1:>{digits}}-{hi:<{digits}} {bar:<{width}} {c:>12,} {100 * c / n:5.1f}%"
        )
    return lines


def balance_warning(report: dict) -> str | None:
    """One line when a step needs more rows than a strategy planned: the modeled data-parallel
    efficiency then describes an epoch whose ranks share repeated rows, not a real one."""
    if report["balance"] is None or not report["strategies"]:
        return None
    bal = report["balance"]
    per_step = bal["world_size"] * bal["batch_size"]
    fewest = min(report["strategies"], key=lambda s: s["rows"])
    if per_step <= fewest["rows"]:
        return None
    return (
        f"--world-size {bal['world_size']} x --batch-size {bal['batch_size']} takes {per_step:,} "
        f"rows a step, more than the {fewest['rows']:,} rows {fewest['strategy']} plans: the "
        "step is filled with repeated rows, so the DP efficiency models a padded epoch"
    )


def strategy_table(report: dict) -> Table:
    b = report["bounds"]
    title = (
        f"{report['samples']:,} samples, {report['tokens']:,} tokens, L = "
        f"{report['max_len']:,}; bounds: ⌈tokens/L⌉ = {b['tokens']:,}, Martello–Toth L2 = "
        f"{b['martello_toth_l2']:,}"
    )
    if report["window"] is not None:
        title += f"; window = {report['window']:,} samples"
    if report["balance"] is not None:
        bal = report["balance"]
        title += (
            f"; data-parallel efficiency for {bal['world_size']} ranks x {bal['batch_size']} "
            f"row(s), hidden size {bal['hidden_size']:,}"
        )
    headers = ["strategy", "rows", "efficiency", "rows / best bound"]
    if report["window"] is not None:
        headers += ["global rows", "window cost"]
    if report["balance"] is not None:
        headers += ["DP eff. tokens", "DP eff. attention"]
    headers.append("seconds")
    rows = []
    for s in report["strategies"]:
        ratio = f"{s['rows_over_bound']:.5f}" + (" optimal" if s["optimal"] else "")
        cells = [s["strategy"], f"{s['rows']:,}", f"{100 * s['efficiency']:.3f} %", ratio]
        if report["window"] is not None:
            cells += [f"{s['global_rows']:,}", f"{100 * s['window_cost']:+.3f} %"]
        if report["balance"] is not None:
            cells += [f"{100 * s['dp_efficiency'][k]:.1f} %" for k in ("tokens", "attention")]
        cells.append(f"{s['seconds']:.3f}")
        rows.append(cells)
    table = Table(title=title, title_justify="left")
    # a narrow terminal wraps a cell between words, never inside one ("ff-shuff…", "efficien…",
    # "1.50…"): each column is at least as wide as its longest word
    for i, header in enumerate(headers):
        words = [w for text in (header, *(r[i] for r in rows)) for w in text.split()]
        table.add_column(
            header,
            style="bold" if i == 0 else None,
            justify="left" if i == 0 else "right",
            min_width=max(map(len, words)),
        )
    for cells in rows:
        table.add_row(*cells)
    return table
