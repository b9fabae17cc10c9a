"""The date a chat template reads: a fixed one, never the clock.

Some stock templates write today's date into the render through `strftime_now` (gpt-oss,
Llama-3.2, Mistral-Small-3.2, Granite-3.3: "Current date: ..."), which transformers answers
from the clock, so two runs on different days would write different shards. packer's renders
answer it from `template_date` (`--template-date`, DEFAULT_DATE unless given, at midnight):
the same input and options give the same bytes on any day, and the date is part of the
encoder's fingerprint (the cache key) where the template reads it.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import date, datetime

from packer.errors import UsageError, option

DEFAULT_DATE = "2025-01-01"


def reads_clock(template_text: str) -> bool:
    """Whether the template can write the date (it calls `strftime_now`)."""
    return "strftime_now" in template_text


def template_date(value) -> str:
    """`value` (YYYY-MM-DD, a `date`, or None for the default) as YYYY-MM-DD."""
    if value is None:
        return DEFAULT_DATE
    if isinstance(value, date):
        return value.strftime("%Y-%m-%d")
    try:
        return date.fromisoformat(str(value)).strftime("%Y-%m-%d")
    except ValueError:
        raise UsageError(
            f"{option('template_date')}: {value!r} is not a date (YYYY-MM-DD, e.g. {DEFAULT_DATE})"
        ) from None


def strftime_now(day: str):
    """The template global `strftime_now(format)`, answered from `day` at midnight."""
    moment = datetime.fromisoformat(day)

    def strftime_now(format: str) -> str:
        return moment.strftime(format)

    return strftime_now


@contextmanager
def fixed_clock(environment, day: str):
    """While active, the template `environment`'s `strftime_now` answers from `day`
    (transformers' renderer passes no function to a template: its globals are the only way in;
    restored after, since transformers shares the compiled template in the process)."""
    before = environment.globals.get("strftime_now")
    environment.globals["strftime_now"] = strftime_now(day)
    try:
        yield
    finally:
        if before is None:
            environment.globals.pop("strftime_now", None)
        else:
            environment.globals["strftime_now"] = before
