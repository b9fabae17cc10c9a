"""`packer inspect --html`: the inspect report as one self-contained page.

Inline CSS and SVG only (no scripts, fonts or images fetched), so the page opens offline, in a
CI artifact viewer or attached to a review.
"""

from __future__ import annotations

from html import escape

from packer.inspection import segment_bins, source_text

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { border: 1px solid #ddd; padding: .2em .6em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
.masked { color: #999; background: #f3f3f3; }
.seg { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12px; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
.cols { display: flex; flex-wrap: wrap; gap: 0 2.5em; align-items: flex-start; }
"""


def _bars_svg(labels: list[str], values: list[int], title: str) -> str:
    """A bar chart as inline SVG."""
    width, height, left, bottom = 560, 180, 40, 30
    n = max(len(values), 1)
    top = max(values) if values and max(values) > 0 else 1
    slot = (width - left) / n
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20}" '
        f'role="img" aria-label="{escape(title)}">',
        f'<text x="{left}" y="12">{escape(title)}</text>',
    ]
    for i, (label, value) in enumerate(zip(labels, values)):
        h = (height - bottom - 36) * value / top  # room for the title and the value above
        x = left + i * slot + 2
        y = height - bottom - h
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(slot - 4, 1):.1f}" height="{h:.1f}" '
            f'fill="#4c78a8"><title>{escape(label)}: {value:,}</title></rect>'
        )
        parts.append(f'<text x="{x:.1f}" y="{y - 3:.1f}">{value:,}</text>')
        parts.append(f'<text x="{x:.1f}" y="{height - bottom + 14}">{escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _kv_table(items: dict) -> str:
    rows = "".join(
        f"<tr><th>{escape(str(k))}</th><td>{escape(str(v))}</td></tr>" for k, v in items.items()
    )
    return f"<table>{rows}</table>"


def _segment_text(seg: dict) -> str:
    if "text" not in seg:
        return ""
    spans = "".join(
        f'<span class="masked">{escape(run["text"])}</span>'
        if run["masked"]
        else escape(run["text"])
        for run in seg["text"]
    )
    return f'<div class="seg">{spans}</div>'


def _row_html(view: dict) -> str:
    head = (
        f'<h2 id="row-{view["row"]}">Row {view["row"]:,} ({escape(view["shard"])}, row '
        f"{view['row_in_shard']:,}): {view['tokens']:,} tokens, "
        f"{view['loss_tokens']:,} loss tokens</h2>"
    )
    rows = []
    for seg in view["segments"]:
        masked = ", ".join(f"{a}-{b - 1}" for a, b in seg["masked"]) or "none"
        rows.append(
            "<tr>"
            f'<td class="n">{seg.get("sample_index", "")}</td>'
            f"<td>{escape(source_text(seg))}</td>"
            f'<td class="n">{seg["length"]:,}</td>'
            f'<td class="n">{seg["loss_tokens"]:,}</td>'
            f"<td>{escape(masked)}{_segment_text(seg)}</td>"
            "</tr>"
        )
    table = (
        "<table><tr><th>sample</th><th>source</th><th>length</th><th>loss tokens</th>"
        "<th>labels -100 at (positions in the segment)</th></tr>" + "".join(rows) + "</table>"
    )
    return head + table


def render_html(report: dict) -> str:
    stats = report.get("stats", {})
    fill = report["histograms"]["row_fill"]
    summary = {
        "output": report["output"],
        "packer version": report.get("packer_version"),
        "rows": f"{report['rows']:,}",
        "shards": report["shards"],
        "mean row fill": f"{100 * report['mean_fill']:.2f} %",
        **{k: stats[k] for k in sorted(stats) if not isinstance(stats[k], dict)},
    }
    inputs = "".join(
        f"<tr><td>{escape(str(i['path']))}</td><td>{escape(str(i['format']))}</td>"
        f'<td class="n">{i["samples"]:,}</td></tr>'
        for i in report["inputs"]
    )
    body = [
        f"<h1>packer inspect: {escape(report['output'])}</h1>",
        '<div class="cols"><div><h2>Summary</h2>',
        _kv_table(summary),
        "</div><div><h2>Inputs</h2>",
        f"<table><tr><th>file</th><th>format</th><th>samples</th></tr>{inputs}</table>",
        "<h2>Configuration</h2>",
        _kv_table(report["config"]),
        "</div></div>",
        "<h2>Histograms</h2>",
        _bars_svg(
            [f"{int(100 * b['from'])}-{int(100 * b['to'])}%" for b in fill],
            [b["rows"] for b in fill],
            "rows by fill (tokens / L)",
        ),
        _bars_svg(*segment_bins(report["histograms"]), "rows by segments per row"),
    ]
    if "dp_efficiency" in report:
        body += ["<h2>Data-parallel balance (modeled)</h2>", _kv_table(report["dp_efficiency"])]
    body += [_row_html(view) for view in report["row_views"]]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>packer inspect: {escape(report['output'])}</title><style>{_CSS}</style>"
        f"</head><body>{''.join(body)}</body></html>\n"
    )
