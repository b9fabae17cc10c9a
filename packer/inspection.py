"""`inspect`: what a user looks at to trust a packed dataset before a long run.

The manifest summary, histograms of row fill and of segments per row over every row, and chosen
rows drawn segment by segment: which source sample (file and line or row), its length, its loss
tokens and where its labels are -100. With a tokenizer, each segment's text, split into runs of
masked and trained tokens. Reads shards through the same zero-copy batches as `verify`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packer.contract.manifest import read_manifest
from packer.contract.names import IGNORE_INDEX
from packer.contract.remote import local_copy
from packer.contract.schema import PAIR_SIDES
from packer.contract.shards import ShardArrays, read_shard
from packer.errors import UsageError, count, option
from packer.read.samples import SourceFile
from packer.storage import display, is_url

FILL_BINS = 10  # row fill histogram: 0-10 %, ..., 90-100 %


@dataclass
class _Shards:
    """Every record batch of an output, in row order, with each batch's first global row."""

    batches: list[ShardArrays]
    first_rows: np.ndarray  # int64 [batches + 1]

    @property
    def num_rows(self) -> int:
        return int(self.first_rows[-1])

    def locate(self, row: int) -> tuple[ShardArrays, int]:
        b = int(np.searchsorted(self.first_rows, row, side="right")) - 1
        return self.batches[b], row - int(self.first_rows[b])


def _read_all(directory: Path, manifest: dict) -> _Shards:
    batches = []
    for shard in manifest["shards"]:
        path = directory / shard["file"]
        try:
            batches.extend(read_shard(path))
        except (ValueError, OSError) as exc:
            raise UsageError(f"cannot read shard: {exc}", where=str(path)) from None
    first = np.zeros(len(batches) + 1, np.int64)
    first[1:] = np.cumsum([b.rows for b in batches])
    return _Shards(batches, first)


def _sources(manifest: dict) -> list[tuple[SourceFile, str]]:
    """Each input with its name as the manifest records it: a URL stays whole (`s3://b/k`),
    where a Path of it would read `s3:/b/k`."""
    return [(SourceFile.from_manifest(inp), str(inp["path"])) for inp in manifest.get("inputs", [])]


def _where(sources: list[tuple[SourceFile, str]], index: int) -> dict:
    """The source file of a global sample index and its line (JSONL) or row, when known."""
    starts = [s.first_index for s, _ in sources]
    k = int(np.searchsorted(starts, index, side="right")) - 1
    if k < 0:
        return {"file": None}
    (src, name), row = sources[k], index - sources[k][0].first_index
    if src.format == "jsonl" and "://" not in name and src.path.is_file():
        kind, n = src.position(row)
        return {"file": name, kind: n}
    if src.format == "jsonl":  # the file is gone or remote: its line numbers with it
        return {"file": name, "sample_in_file": row}
    return {"file": name, "row": row}


def _runs(mask: np.ndarray) -> list[list[int]]:
    """[start, end) runs where `mask` is true."""
    if not mask.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    return edges.reshape(-1, 2).tolist()


def _histograms(shards: _Shards, max_len: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """Row fill and segments-per-row histograms, and every row's segment lengths as CSR."""
    fills, nsegs, seg_lengths = [], [], []
    for b in shards.batches:
        row_len = np.diff(b.ids_off)
        pad = np.zeros(b.rows, np.int64)
        n_seg = np.diff(b.si_off)
        n_cu = np.diff(b.cu_off) - 1
        has_pad = n_cu > n_seg  # stored padding is one final cu segment
        last = b.cu_off[1:] - 1
        pad[has_pad] = (b.cu[last] - b.cu[last - 1])[has_pad]
        fills.append((row_len - pad) / max_len)
        nsegs.append(n_seg)
        cu = b.cu[b.cu_off[0] : b.cu_off[-1]].astype(np.int64)
        diffs = np.diff(cu)
        starts = (b.cu_off[:-1] - b.cu_off[0])[1:] - 1  # the diff across two rows
        seg_lengths.append(np.delete(diffs, starts))
    fill = np.concatenate(fills) if fills else np.zeros(0)
    seg = np.concatenate(nsegs) if nsegs else np.zeros(0, np.int64)
    fill_counts = np.histogram(np.clip(fill, 0, 1), bins=FILL_BINS, range=(0.0, 1.0))[0]
    seg_values, seg_counts = np.unique(seg, return_counts=True)
    hist = {
        "row_fill": [
            {"from": i / FILL_BINS, "to": (i + 1) / FILL_BINS, "rows": int(c)}
            for i, c in enumerate(fill_counts)
        ],
        "segments_per_row": [
            {"segments": int(v), "rows": int(c)} for v, c in zip(seg_values, seg_counts)
        ],
    }
    return hist, fill, np.concatenate(seg_lengths) if seg_lengths else np.zeros(0, np.int64)


def source_text(seg: dict) -> str:
    """Where a segment of a row view comes from, as one line."""
    if seg.get("padding"):
        return "padding"
    src = seg["source"]
    where = next((f"{k} {src[k]}" for k in ("line", "row", "sample_in_file") if k in src), "")
    side = f" ({seg['pair_side']})" if "pair_side" in seg else ""
    mixed = f"source {seg['mixture_source']}, " if "mixture_source" in seg else ""
    return f"{mixed}{src.get('file')}: {where}{side}"


def segment_bins(hist: dict, max_bins: int = 16) -> tuple[list[str], list[int]]:
    """Segments-per-row counts for display: one bar per value, or ranges when there are many."""
    rows = hist["segments_per_row"]
    if len(rows) <= max_bins:
        return [str(b["segments"]) for b in rows], [b["rows"] for b in rows]
    lo, hi = rows[0]["segments"], rows[-1]["segments"]
    width = -(-(hi - lo + 1) // max_bins)
    labels, counts = [], []
    for start in range(lo, hi + 1, width):
        end = min(start + width - 1, hi)
        labels.append(f"{start}-{end}" if end > start else str(start))
        counts.append(sum(b["rows"] for b in rows if start <= b["segments"] <= end))
    return labels, counts


def _row_view(
    shards: _Shards,
    sources: list[tuple[SourceFile, str]],
    row: int,
    tokenizer,
    pairs: bool = False,
) -> dict:
    b, r = shards.locate(row)
    data = b.row(r)
    cu, ids, labels = data["cu_seqlens"], data["input_ids"], data["labels"]
    segments = []
    for k in range(len(cu) - 1):
        a, e = int(cu[k]), int(cu[k + 1])
        lab = labels[a:e]
        masked = lab == IGNORE_INDEX
        seg = {"start": a, "length": e - a}
        if k < len(data["sample_index"]):
            index = int(data["sample_index"][k])
            seg.update(
                sample_index=index,
                sample_offset=int(data["sample_offset"][k]),
                # a pairs output: segment 2p + side of the pair in input row p
                source=_where(sources, index // 2 if pairs else index),
            )
            if pairs:
                seg.update(pair_index=index // 2, pair_side=PAIR_SIDES[index % 2])
        else:
            seg["padding"] = True
        seg["loss_tokens"] = int((~masked).sum())
        seg["masked"] = _runs(masked)
        if tokenizer is not None:
            # special tokens shown: a missing <eos> or a stray <bos> is what one looks for here
            seg["text"] = [
                {
                    "masked": bool(masked[s]),
                    "text": tokenizer.decode(
                        ids[a + s : a + t].tolist(), skip_special_tokens=False
                    ),
                }
                for s, t in _alternating(masked)
            ]
        segments.append(seg)
    view = {
        "row": row,
        "shard": b.name,
        "row_in_shard": b.shard_row(r),
        "tokens": len(ids),
        "loss_tokens": data["num_loss_tokens"],
        "segments": segments,
    }
    if tokenizer is not None:
        # ids the tokenizer does not know decode to nothing or garbage: the wrong tokenizer
        vocab = tokenizer.get_vocab_size(with_added_tokens=True)
        view["vocab_size"] = vocab
        view["ids_outside_vocab"] = int((np.asarray(ids) >= vocab).sum())
    return view


def _alternating(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) runs of equal mask values covering the whole segment."""
    change = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    bounds = np.concatenate(([0], change, [mask.size]))
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def load_tokenizer(path: str | Path):
    """A `tokenizers.Tokenizer` from a local tokenizer.json (or a directory holding one)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError(
            f"{option('tokenizer')} needs the tokenizers package "
            "(packer's 'inspect' extra): pip install tokenizers"
        ) from None
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise UsageError("no tokenizer.json here", where=str(path))
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises plain Exceptions
        raise UsageError(f"cannot load the tokenizer ({exc})", where=str(path)) from None


def inspect(
    directory: str | Path,
    rows: list[int] | None = None,
    tokenizer=None,
    world_size: int | None = None,
    hidden_size: int = 4096,
) -> dict:
    """The report `packer inspect` draws: summary, histograms, rows (first row by default)."""
    directory = local_copy(directory) if is_url(directory) else Path(directory)
    manifest = read_manifest(directory)
    cfg = manifest.get("config", {})
    max_len = int(cfg.get("max_len") or 0)
    if max_len < 1:
        raise UsageError("manifest.json has no config.max_len", where=display(directory))
    shards = _read_all(directory, manifest)
    n = shards.num_rows
    wanted = [0] if rows is None else list(rows)
    for row in wanted:
        if not 0 <= row < n:
            raise UsageError(
                f"{option('rows', '--row')} {row} is out of range (the output has {count(n, 'row')})"
            )
    if n == 0:
        wanted = []
    hist, fill, seg_lengths = _histograms(shards, max_len)
    sources = _sources(manifest)
    report = {
        "output": display(directory),
        "packer_version": manifest.get("packer_version"),
        "inputs": [
            {k: inp.get(k) for k in ("path", "format", "samples", "bytes", "has_labels")}
            for inp in manifest.get("inputs", [])
        ],
        "config": cfg,
        "stats": manifest.get("stats", {}),
        "rows": n,
        "shards": len(manifest["shards"]),
        "mean_fill": float(fill.mean()) if fill.size else 0.0,
        "histograms": hist,
        "row_views": [
            _row_view(shards, sources, r, tokenizer, bool(cfg.get("pairs"))) for r in wanted
        ],
    }
    if "repacked_from" in manifest:
        report["repacked_from"] = manifest["repacked_from"]
    if manifest.get("mixture") is not None:
        report["mixture"] = manifest["mixture"]
        _name_mixture_sources(report["row_views"], manifest["mixture"])
    if world_size is not None:
        report["dp_efficiency"] = _balance(shards, seg_lengths, world_size, hidden_size)
    return report


def _name_mixture_sources(views: list[dict], mixture: dict) -> None:
    """Each segment's mixture source (the `sample_source` the row holds, read off its
    `sample_index`: a source is a range of them) and what that source was named."""
    sources = mixture.get("sources") or []
    starts = np.array([s["first_index"] for s in sources], np.int64)
    for view in views:
        for seg in view["segments"]:
            if "sample_index" in seg and starts.size:
                i = int(np.searchsorted(starts, seg["sample_index"], side="right")) - 1
                path = sources[i]["path"]
                seg["mixture_source"] = i
                seg["mixture_path"] = path if isinstance(path, str) else ", ".join(path)


def _balance(shards: _Shards, seg_lengths: np.ndarray, world_size: int, hidden_size: int):
    from packer.planning.balance import compare_balance

    if world_size < 1:
        raise UsageError(f"{option('world_size')} must be at least 1, got {world_size}")
    per_row = np.concatenate([np.diff(b.cu_off) - 1 for b in shards.batches])
    offsets = np.zeros(per_row.size + 1, np.int64)
    offsets[1:] = np.cumsum(per_row)
    eff = compare_balance(offsets, seg_lengths, world_size, hidden_size=hidden_size)
    return {"world_size": world_size, "hidden_size": hidden_size, **eff}
