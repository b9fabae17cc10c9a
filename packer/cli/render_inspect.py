"""`packer inspect` on a terminal: rich tables and text histograms on stdout."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from packer.inspection import segment_bins, source_text

_BAR = 40  # characters of the longest histogram bar


def _histogram(title: str, labels: list[str], values: list[int]) -> Table:
    table = Table(title=title, title_justify="left", show_header=False, box=None)
    table.add_column("bin", justify="right")
    table.add_column("bar")
    table.add_column("rows", justify="right")
    top = max(values) if values and max(values) > 0 else 1
    for label, value in zip(labels, values):
        table.add_row(label, "█" * round(_BAR * value / top), f"{value:,}")
    return table


# around label-masked text (-100) where no colour can dim it: piped, NO_COLOR (see --help)
MASK_OPEN, MASK_CLOSE = "«", "»"


def _row(view: dict) -> Table:
    table = Table(
        title=f"row {view['row']:,} ({view['shard']}, row {view['row_in_shard']:,}): "
        f"{view['tokens']:,} tokens, {view['loss_tokens']:,} loss tokens",
        title_justify="left",
    )
    for name, justify in (
        ("sample", "right"),
        ("source", "left"),
        ("length", "right"),
        ("loss tokens", "right"),
        ("labels -100 at", "left"),
    ):
        table.add_column(name, justify=justify)
    for seg in view["segments"]:
        masked = ", ".join(f"{a}-{b - 1}" for a, b in seg["masked"]) or "none"
        table.add_row(
            str(seg.get("sample_index", "")),
            source_text(seg),
            f"{seg['length']:,}",
            f"{seg['loss_tokens']:,}",
            masked,
        )
    return table


def _texts(view: dict, colour: bool = True) -> list[Text]:
    """Each segment's text below the table, at the terminal's full width: a column beside five
    others would leave it a dozen characters at 80 columns, and cut special tokens."""
    if not any("text" in seg for seg in view["segments"]):
        return []
    how = "dimmed" if colour else f"between {MASK_OPEN} {MASK_CLOSE}"
    texts = [Text(f"text of row {view['row']:,}'s segments (label-masked text {how}):")]
    for seg in view["segments"]:
        name = "padding" if seg.get("padding") else f"sample {seg.get('sample_index', '')}"
        text = Text(f"{name}: ", style="bold", overflow="fold")
        for run in seg.get("text", []):
            if run["masked"] and colour:
                text.append(run["text"], style="dim")
            elif run["masked"]:
                text.append(f"{MASK_OPEN}{run['text']}{MASK_CLOSE}")
            else:
                text.append(run["text"])
        texts.append(text)
    return texts


def draw(report: dict, console: Console | None = None) -> None:
    console = console or Console()
    stats = report.get("stats", {})
    summary = Table(title=f"packer inspect → {report['output']}", show_header=False)
    summary.add_column("what", style="bold")
    summary.add_column("value", justify="right")
    for what, value in (
        ("inputs", ", ".join(str(i["path"]) for i in report["inputs"])),
        ("L", f"{report['config'].get('max_len', 0):,}"),
        ("strategy", str(report["config"].get("strategy"))),
        ("overlength", str(report["config"].get("overlength"))),
        ("samples in", f"{stats.get('samples_in', 0):,}"),
        ("rows", f"{report['rows']:,}"),
        ("lower bound", f"{stats.get('lower_bound', 0):,}"),
        ("mean row fill", f"{100 * report['mean_fill']:.2f} %"),
        ("tokens", f"{stats.get('tokens', 0):,}"),
        ("loss tokens", f"{stats.get('loss_tokens', 0):,}"),
        ("shards", f"{report['shards']:,}"),
    ):
        summary.add_row(what, value)
    if "dp_efficiency" in report:
        dp = report["dp_efficiency"]
        for mode in ("tokens", "attention"):
            summary.add_row(
                f"DP efficiency, {dp['world_size']} ranks, by {mode}", f"{100 * dp[mode]:.1f} %"
            )
    console.print(summary)
    fill = report["histograms"]["row_fill"]
    console.print(
        _histogram(
            "row fill (tokens / L)",
            [f"{int(100 * b['from'])}-{int(100 * b['to'])} %" for b in fill],
            [b["rows"] for b in fill],
        )
    )
    console.print(_histogram("segments per row", *segment_bins(report["histograms"])))
    colour = console.color_system is not None and not console.no_color
    for view in report["row_views"]:
        console.print(_row(view))
        for text in _texts(view, colour):
            console.print(text)
