"""Human reports on stderr (rich) and progress bars; stdout is kept for `--json`."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

from rich.console import Console
from rich.filesize import decimal
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

stderr = Console(stderr=True)


def pack_table(report: dict, max_len: int, pairs: bool = False) -> Table:
    """The pack report as a table; with `pairs` the counts are of pairs (two segments each), and a
    pair is never split."""
    unit = "pairs" if pairs else "samples"
    table = Table(
        title=f"packer pack → {report['output']}", show_header=False, title_justify="left"
    )
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    rows = [
        (f"{unit} in", f"{report['samples_in']:,}"),
        (f"{unit} packed", f"{report['samples_packed']:,}"),
        ("dropped", f"{report['dropped']:,}"),
        ("truncated", f"{report['truncated']:,}"),
        ("segments", f"{report['segments']:,}") if pairs else ("split", _split(report)),
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
            if "window_cost" in report
            else ()
        ),
        *(
            (
                ("blocks", f"{report['blocks']:,}"),
                ("tokens moved (tail rows)", f"{report['tokens_moved']:,}"),
            )
            if "blocks" in report
            else ()
        ),
        *(
            (
                ("rows of one global plan", f"{report['global_rows']:,}"),
                ("block cost", f"{100 * report['block_cost']:+.4f} %"),
            )
            if "block_cost" in report
            else ()
        ),
        ("efficiency", f"{100 * report['efficiency']:.3f} %"),
        *(
            (
                (f"CP padding ({_cp_label(report)})", f"{report['cp_pad_tokens']:,}"),
                ("efficiency with CP padding", f"{100 * report['efficiency_padded']:.3f} %"),
                ("rows / padded lower bound", f"{report['rows_over_lower_bound_padded']:.5f}"),
            )
            if "cp_size" in report
            else ()
        ),
        ("shards", f"{report['shards']:,}"),
        ("seconds", f"{report['seconds']:.2f}"),
    ]
    for what, value in rows:
        table.add_row(what, value)
    return table


def _split(report: dict) -> str:
    """Split samples, and the pieces they became: every packed sample is one segment, a split
    one is one segment per piece, so the pieces are segments - samples packed + split."""
    split = report["split"]
    if not split or "segments" not in report:
        return f"{split:,}"
    pieces = report["segments"] - report["samples_packed"] + split
    return f"{split:,} into {pieces:,} pieces"


def print_warnings(warnings) -> None:
    """One `warning:` line on stderr each: what a finished run suggests changing."""
    for warning in warnings:
        stderr.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)


def split_note(report: dict) -> str | None:
    """What a split costs, said once under the table when samples were split."""
    if not report.get("split"):
        return None
    return (
        "note: the continuation pieces of split samples start without their prompt context "
        "and their first label is masked (-100); --overlength truncate or drop avoids it"
    )


def progress_interval() -> float:
    """Seconds between progress lines without a terminal: PACKER_PROGRESS_INTERVAL, default 10."""
    try:
        return max(0.0, float(os.environ.get("PACKER_PROGRESS_INTERVAL", "10")))
    except ValueError:
        return 10.0


class ProgressLines:
    """Progress where no bar can be drawn (a CI log, a batch job): one plain line on stderr at
    most every `interval` seconds, naming the stage under way, so a long run shows it is alive."""

    def __init__(self, describe: Callable[..., str | None], interval: float | None = None):
        self._describe = describe
        self._interval = progress_interval() if interval is None else interval
        self._start = self._last = time.monotonic()

    def __call__(self, stage: str, done: int, total: int, label: str = "") -> None:
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        text = self._describe(stage, done, total, label)
        if text is None:
            return
        self._last = now
        # one write, newline included: print() writes the end separately, and a signal between
        # the two glued the run's error line onto the progress line
        sys.stderr.write(f"progress: {text} ({now - self._start:.0f} s)\n")
        sys.stderr.flush()


def _pack_line(stage: str, done: int, total: int, label: str = "") -> str | None:
    if stage == "file":  # "read" covers every file
        return None
    title = {
        "read": "reading",
        "lengths": "reading lengths (blocks)",
        "plan": "planning",
        "write": "writing rows",
    }.get(stage, stage)
    if stage in ("download", "upload") and label:
        title = f"{title} {label}"
    amount = _amount(stage, done, total)
    if total and stage != "plan":
        amount += f" ({100 * done / total:.0f} %)"
    return f"{title} {amount}".rstrip()


@contextmanager
def progress_bars(enabled: bool):
    """Yield a `progress(stage, done, total, label)` callback that draws bars on a terminal.

    Reading shows the bytes of the current file and of all files, with an ETA; planning a
    spinner; writing the rows. When stderr is not a terminal (logs, CI), a line every
    PACKER_PROGRESS_INTERVAL seconds (10) instead.
    """
    if not enabled:
        yield None
        return
    if not stderr.is_terminal:
        yield ProgressLines(_pack_line)
        return
    bars = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[amount]}"),
        TimeRemainingColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
    )
    tasks: dict[str, int] = {}
    titles = {
        "read": "reading all files",
        "lengths": "reading lengths (blocks)",
        "file": "",
        "plan": "planning",
        "write": "writing rows",
        "download": "downloading",
        "upload": "uploading",
    }

    def update(stage: str, done: int, total: int, label: str = "") -> None:
        title = titles.get(stage, stage) if stage != "file" else f"  {label}"
        if stage in ("download", "upload") and label:
            title = f"{title} {label}"
        amount = _amount(stage, done, total)
        if stage not in tasks:
            tasks[stage] = bars.add_task(title, total=total or None, amount=amount)
        bars.update(
            tasks[stage], completed=done, total=total or None, description=title, amount=amount
        )
        if stage == "read" and total and done >= total and "file" in tasks:
            # every file is read: the last one's bar ends full (a memory-mapped Parquet or
            # Arrow file counts no bytes while it is read, so it would stay at "0 bytes")
            size = int(next(t.total or 0 for t in bars.tasks if t.id == tasks["file"]))
            bars.update(tasks["file"], completed=size, amount=_amount("file", size, size))

    with bars:
        yield update


def _amount(stage: str, done: int, total: int) -> str:
    if stage in ("read", "file", "download", "upload"):
        return f"{decimal(done)} / {decimal(total)}"
    if stage == "plan":
        return "done" if total else ""
    return f"{done:,} / {total:,}"


def _cp_label(report: dict) -> str:
    """`cp_size 2`, or with sequence parallelism the multiple every sample is padded to."""
    label = f"cp_size {report['cp_size']}"
    if "segment_multiple" in report:
        label += f", sequence parallel: multiple {report['segment_multiple']}"
    return label
