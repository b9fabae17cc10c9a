"""Human reports on stderr (rich) and progress bars; stdout is kept for `--json`."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

stderr = Console(stderr=True)


def pack_table(report: dict, max_len: int) -> Table:
    table = Table(
        title=f"packer pack → {report['output']}", show_header=False, title_justify="left"
    )
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("samples in", f"{report['samples_in']:,}"),
        ("samples packed", f"{report['samples_packed']:,}"),
        ("dropped", f"{report['dropped']:,}"),
        ("truncated", f"{report['truncated']:,}"),
        ("split", f"{report['split']:,}"),
        *(
            (f"rejected: {reason}", f"{count:,}")
            for reason, count in report.get("rejected_by_reason", {}).items()
        ),
        ("tokens", f"{report['tokens']:,}"),
        ("loss tokens", f"{report['loss_tokens']:,}"),
        (f"rows (L = {max_len:,})", f"{report['rows']:,}"),
        ("lower bound ⌈tokens / L⌉", f"{report['lower_bound']:,}"),
        ("rows / lower bound", f"{report['rows_over_lower_bound']:.5f}"),
        *(
            (
                ("rows of one global plan", f"{report['global_rows']:,}"),
                ("window cost", f"{100 * report['window_cost']:+.3f} %"),
            )
            if "global_rows" in report
            else ()
        ),
        ("efficiency", f"{100 * report['efficiency']:.3f} %"),
        ("shards", f"{report['shards']:,}"),
        ("seconds", f"{report['seconds']:.2f}"),
    ]
    for what, value in rows:
        table.add_row(what, value)
    return table


@contextmanager
def progress_bars(enabled: bool):
    """Yield a `progress(stage, done, total)` callback that draws bars when stderr is a TTY."""
    if not (enabled and stderr.is_terminal):
        yield None
        return
    bars = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
    )
    tasks: dict[str, int] = {}
    labels = {"read": "reading files", "write": "writing rows"}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bars.add_task(labels.get(stage, stage), total=total or None)
        bars.update(tasks[stage], completed=done, total=total or None)

    with bars:
        yield update
