"""Checks of the values a caller passes, each failing in one line that names the option.

The same checks serve `packer.pack`, `packer.plan`, `pack_dataset`, `verify` and the CLI:
`option` names the parameter (`max_len`) for a Python caller and the flag (`--max-len`) under
the CLI. numpy integers are integers; a bool is not an integer, and a float is not one even
when it is whole (8.0 is more likely a mistake than a length).
"""

from __future__ import annotations

import difflib
import numbers
import re
from collections.abc import Iterable

from packer.errors import OptionError, UsageError, option
from packer.errors import option as name_of


def integer(
    value,
    name: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    none: bool = False,
    flag: str | None = None,
) -> int | None:
    """`value` as a plain int within the bounds (None passes when `none`)."""
    if value is None and none:
        return None
    shown = option(name, flag)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise UsageError(f"{shown} must be an integer, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise UsageError(f"{shown} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise UsageError(f"{shown} must be at most {maximum}, got {value}")
    return value


def boolean(value, name: str, flag: str | None = None) -> bool:
    """True or False (numpy's bools too): "yes" or 1 is refused rather than read as true."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    raise UsageError(f"{option(name, flag)} must be True or False, got {value!r}")


def text(value, name: str, *, none: bool = False, flag: str | None = None) -> str | None:
    """A non-empty string (None passes when `none`)."""
    if value is None and none:
        return None
    if not isinstance(value, str) or not value:
        raise UsageError(f"{option(name, flag)} must be a non-empty string, got {value!r}")
    return value


def choice(value, name: str, choices: Iterable[str], flag: str | None = None) -> str:
    """One of `choices`."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise UsageError(
            f"unknown {option(name, flag)} {value!r} (choose from {', '.join(choices)})"
        )
    return value


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 10**6,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 10**9,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 10**12,
    "tib": 1 << 40,
}


def parse_size(text: str | int, option: str | None = None, minimum: int = 1 << 20) -> int:
    """Bytes in "2GiB", "512MB", "1.5g" or a plain integer (`option` names it in errors;
    by default `memory_budget`, as the caller calls it)."""
    option = option or name_of("memory_budget")
    if isinstance(text, numbers.Integral) and not isinstance(text, bool):
        value = int(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        if not isinstance(text, str) or not m or m.group(2).lower() not in _UNITS:
            raise UsageError(f"{option} must be a size such as 2GiB or 512MB, got {text!r}")
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < minimum:
        least = f"{minimum >> 20}MiB" if minimum % (1 << 20) == 0 else f"{minimum} bytes"
        raise UsageError(f"{option} {text} is too small (at least {least})")
    return value


_RAW_KEYS = {"messages", "conversations", "text", "prompt", "completion"}  # docs/tokenize.md


class ColumnName(str):
    """A column option's value that remembers who named it: `origin` is "default" (a column
    read when the input has it, absent otherwise) or the config file it came from. A plain str
    is a column the caller named, which the input must have."""

    origin: str

    def __new__(cls, name: str, origin: str = "default"):
        self = super().__new__(cls, name)
        self.origin = origin
        return self


DEFAULT_INPUT = ColumnName("input_ids")
DEFAULT_LABELS = ColumnName("labels")


def named(column) -> bool:
    """Whether a column option was named (by the caller or a config), not left at its default."""
    return not (isinstance(column, ColumnName) and column.origin == "default")


def column_option(name: str, column) -> str:
    """How a message names a column option: its flag or parameter, or its key and the config
    file it was read from."""
    if isinstance(column, ColumnName) and column.origin != "default":
        return f"{name} (in {column.origin})"
    return option(name)


def missing_column(
    name: str, column: str, have: list[str] | None, where: str, seen: str = "it has"
) -> OptionError:
    """The error for a column option naming a column that `where` does not have: the option,
    the columns that are there (`seen`: what `have` lists, when known) and the closest."""
    default = not named(column)
    if default:
        text = f"{where} has no '{column}' column"
    else:
        text = f"{column_option(name, column)} '{column}' is not in {where}"
    if have is None:
        return OptionError(text)
    text += f" ({seen}: {', '.join(have) or 'no columns'})"
    close = difflib.get_close_matches(column, have, n=1, cutoff=0.75 if default else 0.6)
    if name == "input_column" and default and _RAW_KEYS & set(have):
        text += (
            ": raw chats or text; pass --tokenizer DIR to tokenize them first (docs/tokenize.md)"
        )
    elif close:
        text += f"; did you mean '{close[0]}'?"
    elif default:
        text += f"; name the column with {option(name)}"
    return OptionError(text)
