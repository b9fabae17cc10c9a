"""The raw sources of `pack --mix ... --tokenizer`: their (path, weight) pairs, and the checks
that each raw file belongs to one source, named by the user's paths (never a cache entry's)."""

from __future__ import annotations

from pathlib import Path

from packer.errors import UsageError


def named_once(paths: list[str]) -> None:
    """A raw file named by two --mix sources is refused before any tokenizing, naming it."""
    from packer.storage import is_url

    seen: dict[str, int] = {}
    for i, path in enumerate(paths):
        key = str(path) if is_url(str(path)) else str(Path(path).resolve())
        if key in seen:
            raise UsageError(
                f"--mix: {path} is in sources {seen[key]} and {i}; a file belongs to one source"
            )
        seen[key] = i


def one_source_per_entry(earlier: list, result, i: int) -> None:
    """Two --mix sources whose raw files hold the same bytes tokenize to one cache entry, and
    would be one source packed twice: refused naming the user's files (never the entry's)."""
    files = {entry["path"] for entry in result.inputs}
    for j, other in enumerate(earlier):
        shared = sorted(files & {entry["path"] for entry in other.inputs})
        if shared:
            raise UsageError(
                f"--mix: {shared[0]} is in sources {j} and {i}; a file belongs to one source"
            )
        if other.output == result.output:
            raise UsageError(
                f"--mix: sources {j} and {i} ({_names(other)} and {_names(result)}) hold the "
                "same bytes; a file belongs to one source"
            )


def _names(result) -> str:
    return ", ".join(entry["path"] for entry in result.inputs)


def raw_mix(mix) -> list[tuple[str, float]]:
    """The (path, weight) pairs of a raw mixture: a source's own input_column or
    labels_column (datasets:) names token columns, which raw data does not have."""
    pairs = []
    for entry in mix:
        if isinstance(entry, dict):
            own = sorted(set(entry) - {"path", "weight"})
            if own:
                raise UsageError(
                    f"datasets: {entry['path']} names {', '.join(own)}, columns of token ids; "
                    "with --tokenizer the raw columns are found by name (--column KEY=NAME)"
                )
            entry = (entry["path"], entry.get("weight", 1))
        pairs.append(tuple(entry))
    return pairs
