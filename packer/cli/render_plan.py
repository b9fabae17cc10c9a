"""`packer plan` on a terminal: the length histogram and the strategy table (rich), from the
plain report of `packer.planning.compare.compare_strategies`."""

from __future__ import annotations

from rich.table import Table


def histogram_lines(report: dict, width: int = 40) -> list[str]:
    """One text bar per length range, scaled to the fullest range."""
    edges, counts = report["histogram"]["edges"], report["histogram"]["counts"]
    top = max(counts, default=0) or 1
    n = max(report["samples"], 1)
    digits = len(str(edges[-1]))
    lines = [
        f"lengths of {report['samples']:,} {_items(report)} (min {report['length_min']}, "
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
        f"{report['samples']:,} {_items(report)}, {report['tokens']:,} tokens, L = "
        f"{report['max_len']:,}; bounds: ⌈tokens/L⌉ = {b['tokens']:,}, Martello–Toth L2 = "
        f"{b['martello_toth_l2']:,}"
    )
    if report["window"] is not None:
        title += f"; window = {report['window']:,} {_items(report)}"
    if report["balance"] is not None:
        bal = report["balance"]
        title += (
            f"; data-parallel efficiency for {bal['world_size']} ranks x {bal['batch_size']} "
            f"row(s), hidden size {bal['hidden_size']:,}"
        )
    headers = ["strategy", "rows", "efficiency", "rows / best bound"]
    cp = report.get("cp") is not None
    if cp:
        headers.insert(3, "eff. with CP pad")
    if report["window"] is not None:
        headers += ["global rows", "window cost"]
    if report["balance"] is not None:
        headers += ["DP eff. tokens", "DP eff. attention"]
    headers.append("seconds")
    rows = []
    for s in report["strategies"]:
        ratio = f"{s['rows_over_lower_bound']:.5f}" + (" optimal" if s["optimal"] else "")
        cells = [s["strategy"], f"{s['rows']:,}", f"{100 * s['efficiency']:.3f} %", ratio]
        if cp:
            cells.insert(3, f"{100 * s['efficiency_padded']:.3f} %")
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


def cp_line(cp: dict) -> str:
    """What CP padding costs, before packing: its tokens and the lower bound it moves."""
    return (
        f"CP size {cp['cp_size']}: every sample padded to a multiple of {cp['multiple']} adds "
        f"{cp['cp_pad_tokens']:,} tokens ({100 * cp['cp_pad_share']:.3f} % of the padded "
        f"{cp['padded_tokens']:,}); lower bound {cp['lower_bound']:,} rows without it, "
        f"{cp['lower_bound_padded']:,} with it (the table's rows plan the padded lengths)"
    )


def pairs_line(counts: dict) -> str:
    """How many pairs the table plans, each as one item (a pair is never split across rows)."""
    line = (
        f"planned {counts['pairs']:,} pairs as items of prompt x 2 + chosen + rejected tokens "
        "(a pair is never split)"
    )
    if counts["dropped"] or counts["truncated"]:
        line += f"; {counts['dropped']:,} dropped, {counts['truncated']:,} truncated"
    return line


def _items(report: dict) -> str:
    return "pairs" if report.get("pairs") else "samples"
