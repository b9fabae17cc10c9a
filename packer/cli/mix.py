"""The mixture options of `packer pack` and `packer plan`: --mix, --mix-tokens and the
validation split, parsed into what `packer.pack` takes."""

from __future__ import annotations

import math
from typing import Optional

import typer

MIX_HELP = (
    "A source and its weight, PATH_OR_GLOB=WEIGHT (repeatable; no INPUT then). A weight is a "
    "share of the output's TOKENS (normalised by their sum): 70/30 means 70% of the packed "
    "tokens from the first source. A source short of its share is repeated in whole epochs, "
    "one with more is subsampled, by --seed (docs/mixtures.md). [default: none, every INPUT "
    "once]"
)
MIX_TOKENS_HELP = (
    "With --mix: the output's size in tokens (sources repeated or subsampled to fit). "
    "[default: as many as the scarcest source allows, each source used at most once]"
)
SPLIT_HELP = (
    "Hold out a validation set, per source and by --seed, before mixing: a fraction in (0, 1) "
    "of each source's samples, or a count per source. It is packed into --validation-output. "
    "[default: none]"
)
SPLIT_OUTPUT_HELP = (
    "Where --validation-split's output goes (replaced with --overwrite). "
    "[default: OUTPUT-validation beside the output]"
)


def mix_option():
    return typer.Option(None, "--mix", metavar="PATH_OR_GLOB=WEIGHT", help=MIX_HELP)


def mix_tokens_option():
    return typer.Option(None, "--mix-tokens", metavar="N", help=MIX_TOKENS_HELP)


def split_option():
    return typer.Option(None, "--validation-split", metavar="FRACTION|N", help=SPLIT_HELP)


def split_output_option():
    return typer.Option(None, "--validation-output", metavar="DIR", help=SPLIT_OUTPUT_HELP)


def cfg_mix(config) -> dict | None:
    """The config file's mixture (`datasets:`, or a mixture's manifest.json), or None."""
    from packer.config import load_datasets

    return load_datasets(config)


def parse_mix(values: Optional[list[str]]) -> list[tuple[str, float]] | None:
    """`--mix PATH=WEIGHT` values as (path, weight) pairs; one line naming --mix otherwise."""
    from packer.errors import UsageError

    if not values:
        return None
    pairs = []
    for value in values:
        path, sep, weight = value.rpartition("=")
        if not sep or not path or not weight:
            raise UsageError(f"--mix takes PATH_OR_GLOB=WEIGHT, got {value!r}")
        try:
            number = float(weight)
        except ValueError:
            raise UsageError(f"--mix {value}: the weight {weight!r} is not a number") from None
        if not math.isfinite(number) or number <= 0:
            raise UsageError(f"--mix {value}: the weight must be a number above 0")
        pairs.append((path, number))
    return pairs


def parse_split(value: Optional[str]) -> float | int | None:
    """`--validation-split`: a count (digits only) or a fraction."""
    from packer.errors import UsageError

    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return int(text)
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not 0 < number < 1:
        raise UsageError(
            f"--validation-split must be a fraction in (0, 1) or a whole count, got {value!r}"
        )
    return number


def mixture_args(
    inputs: Optional[list[str]],
    mix,
    mix_tokens,
    split,
    split_output,
    cfg_mix=None,
    refused: dict | None = None,
) -> tuple[list[str], dict]:
    """(inputs, the keyword arguments of `packer.pack`) for the mixture options; the
    config's `datasets:` (`cfg_mix`) is the mixture when --mix is not given. `refused`: flags
    given (flag -> whether it was) that a mixture or a split cannot run with."""
    from packer.errors import UsageError

    pairs = parse_mix(mix)
    if pairs is not None and inputs:
        raise UsageError(
            "--mix names every source of the mixture: give the datasets there, not as INPUT too"
        )
    if inputs and cfg_mix is not None and cfg_mix.get("datasets"):
        raise UsageError(
            f"{cfg_mix['datasets']} names the datasets (datasets:) and so does INPUT: keep one"
        )
    if pairs is None and cfg_mix is not None and not inputs:  # flags override the file
        pairs = cfg_mix["mix"]
        mix_tokens = mix_tokens if mix_tokens is not None else cfg_mix.get("mix_tokens")
        if split is None and cfg_mix.get("validation_split") is not None:
            split = str(cfg_mix["validation_split"])
    if pairs is None and not inputs:
        raise UsageError("missing INPUT: name the datasets to pack, or --mix PATH=WEIGHT")
    if mix_tokens is not None and pairs is None:
        raise UsageError("--mix-tokens sizes a mixture: pass --mix")
    if mix_tokens is not None and mix_tokens < 1:
        raise UsageError(f"--mix-tokens must be at least 1, got {mix_tokens}")
    kwargs = {}
    if pairs is not None:
        kwargs["mix"] = pairs
    if mix_tokens is not None:
        kwargs["mix_tokens"] = mix_tokens
    if split is not None:
        kwargs["validation_split"] = parse_split(split)
    if split_output is not None:
        kwargs["validation_output"] = split_output
    what = "--mix" if "mix" in kwargs else "--validation-split"
    for flag, given in (refused or {}).items():
        if given and kwargs:
            raise UsageError(f"{what} cannot be used with {flag}")
    return list(inputs or []), kwargs


def validation_export_target(export_to, mixing: dict, output: str, overwrite: bool):
    """With --export and --validation-split: [("validation_export", the validation output,
    where its export goes: VALIDATION_OUTPUT-FORMAT beside it)], refused up front if that
    cannot be written; None otherwise."""
    from pathlib import Path

    if export_to is None or "validation_split" not in mixing:
        return None
    from packer.export import check_destination, check_outside

    default = Path(output).with_name(f"{Path(output).name}-validation")
    held = Path(mixing.get("validation_output") or default)
    dest = held.with_name(f"{held.name}-{export_to}")
    check_outside(dest, held, "--validation-output")
    check_destination(dest, overwrite)
    return [("validation_export", str(held), dest)]


def mixture_table(mixture: dict):
    """The per-source report of a mixture (or a split) as a table."""
    from rich.table import Table

    table = Table(title="sources", title_justify="left")
    for name in ("#", "source", "weight", "share", "tokens", "samples", "epochs", "dropped"):
        if name == "source":  # a path wraps rather than being cut
            table.add_column(name, overflow="fold", min_width=12)
        else:
            table.add_column(name, justify="right", no_wrap=True)
    split = mixture.get("validation_split") is not None
    if split:
        table.add_column("held out", justify="right")
    for i, s in enumerate(mixture["sources"]):
        path = s["path"] if isinstance(s["path"], str) else ", ".join(s["path"])
        cells = [
            str(i),
            path,
            f"{s['weight']:.4f}",
            f"{s['share']:.4f}",
            f"{s['tokens']:,}",
            f"{s['samples']:,}",
            str(s["epochs"]),
            f"{s['dropped']:,}",
        ]
        table.add_row(*cells, *([f"{s['held_out']:,}"] if split else []))
    return table
