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


# what the manifest's stats and config keys mean, for people; other keys lose their underscores
LABELS = {
    "samples_in": "samples in",
    "samples_packed": "samples packed",
    "rejected": "samples rejected",
    "dropped": "samples dropped (over L)",
    "truncated": "samples truncated",
    "split": "samples split",
    "segments": "segments",
    "tokens_in": "tokens in",
    "tokens": "tokens packed",
    "tokens_removed": "tokens removed",
    "pad_tokens": "padding tokens",
    "loss_tokens": "loss tokens",
    "rows": "rows",
    "lower_bound": "lower bound ⌈tokens / L⌉",
    "lower_bound_l2": "lower bound (Martello–Toth L2)",
    "rows_over_lower_bound": "rows / lower bound",
    "efficiency": "efficiency (tokens / rows·L)",
    "global_rows": "rows of one global plan",
    "window_cost": "window cost",
    "block_cost": "block cost",
    "blocks": "blocks",
    "tail_rows": "tail rows",
    "tokens_moved": "tokens moved (tail rows)",
    "max_len": "L (row length)",
    "strategy": "strategy",
    "overlength": "over-length samples",
    "pad": "pad rows to L",
    "pad_id": "padding id",
    "seed": "seed",
    "window": "window (samples)",
    "input_column": "token column",
    "labels_column": "labels column",
    "on_error": "bad samples",
    "shard_rows": "rows per shard",
    "hash": "shard hash",
    "block_size": "block size",
    "engine": "engine",
}
# fractions shown as percentages, once
PERCENT = {"efficiency": 3, "window_cost": 3, "block_cost": 4}


def _order(key: str) -> tuple[int, str]:
    """Keys in the order of LABELS (in, out, rows, bounds), unknown ones after them."""
    keys = list(LABELS)
    return (keys.index(key), "") if key in keys else (len(keys), key)


def _label(key: str) -> str:
    return LABELS.get(key, key.replace("_", " "))


def _value(key: str, value) -> str:
    """A value as people write it: yes/no, — for none, 1,234, 99.534 %."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "—"
    if key in PERCENT and isinstance(value, (int, float)):
        sign = "+" if key.endswith("_cost") else ""
        return f"{100 * value:{sign}.{PERCENT[key]}f} %"
    if key == "rows_over_lower_bound":
        return f"{value:.5f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.5g}"
    return str(value)


def _bars_svg(labels: list[str], values: list[int], title: str) -> str:
    """A bar chart as inline SVG; axis labels too wide for their bar are turned 45°."""
    width, height, left = 560, 180, 40
    n = max(len(values), 1)
    top = max(values) if values and max(values) > 0 else 1
    slot = (width - left) / n
    widest = 6.5 * max(map(len, labels), default=0)  # 11px text: about 6.5px a character
    turned = widest > slot - 4
    bottom = round(0.72 * widest) + 20 if turned else 30
    height += bottom - 30
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
        if turned:  # the label's end under its bar's middle, rising to the left
            cx, cy = x + slot / 2, height - bottom + 12
            parts.append(
                f'<text class="axis" x="{cx:.1f}" y="{cy}" text-anchor="end" '
                f'transform="rotate(-45 {cx:.1f} {cy})">{escape(label)}</text>'
            )
        else:
            parts.append(
                f'<text class="axis" x="{x:.1f}" y="{height - bottom + 14}">{escape(label)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def _kv_table(items: dict) -> str:
    """Keys as labels and values as text (strings are taken as already formatted)."""
    rows = "".join(
        f"<tr><th>{escape(_label(k))}</th><td>{escape(_value(k, v))}</td></tr>"
        for k, v in items.items()
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
        **{k: stats[k] for k in sorted(stats, key=_order) if not isinstance(stats[k], dict)},
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
        _kv_table({k: report["config"][k] for k in sorted(report["config"], key=_order)}),
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
        dp = report["dp_efficiency"]
        balance = {
            "ranks": dp["world_size"],
            "hidden size": dp["hidden_size"],
            **{
                f"efficiency, balanced by {m}": f"{100 * dp[m]:.1f} %"
                for m in ("tokens", "attention")
            },
        }
        body += ["<h2>Data-parallel balance (modeled)</h2>", _kv_table(balance)]
    body += [_row_html(view) for view in report["row_views"]]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>packer inspect: {escape(report['output'])}</title><style>{_CSS}</style>"
        f"</head><body>{''.join(body)}</body></html>\n"
    )
