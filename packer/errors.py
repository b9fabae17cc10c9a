"""Errors a user can act on.

Every failure that stems from the input, the options or the file system is raised as a
`PackerError` with one line that names the place (file, line or row) and the problem. The CLI
prints that line and exits non-zero instead of showing a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

EXIT_FAILURE = 1  # bad input data, I/O failure, failed verification
EXIT_USAGE = 2  # bad options or configuration
EXIT_INTERRUPTED = 130  # SIGINT (128 + 2)
EXIT_TERMINATED = 143  # SIGTERM (128 + 15)


_FLAG_NAMES: ContextVar[bool] = ContextVar("packer_flag_names", default=False)


def option(parameter: str, flag: str | None = None) -> str:
    """How a message names an option: as its Python parameter (`max_len`) for a library caller,
    as its flag (`--max-len`, or `flag` where the two differ) under the CLI (`flag_names`)."""
    if not _FLAG_NAMES.get():
        return parameter
    return flag or "--" + parameter.replace("_", "-")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """`1 row`, `2 rows`, `1,500 samples`: a number and its noun, for messages and reports."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def naming_flags() -> bool:
    """Whether messages name flags now: a worker process started here asks for the same."""
    return _FLAG_NAMES.get()


@contextmanager
def flag_names(on: bool = True) -> Iterator[None]:
    """While active, `option` gives the CLI's flags: the CLI's commands run under it."""
    token = _FLAG_NAMES.set(on)
    try:
        yield
    finally:
        _FLAG_NAMES.reset(token)


class PackerError(Exception):
    """A failure with a one-line message meant for the user."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        self.problem = message
        super().__init__(f"{where}: {message}" if where else message)


class UsageError(PackerError):
    """Options or configuration that cannot work, whatever the data."""

    exit_code = EXIT_USAGE


class InputError(PackerError):
    """The input data is missing, unreadable or does not follow the expected schema."""


class OutputError(PackerError):
    """The output could not be written (full disk, permissions, I/O error); nothing was left."""


class OptionError(UsageError, ValueError):
    """`pack_dataset` options that cannot work; a `ValueError` for Python callers."""


class SampleError(InputError, ValueError):
    """Data given to `pack_dataset` that packer cannot pack (bad ids, empty samples, labels of
    another length, a missing column, over-length samples with `overlength="error"`); the
    message names the sample as `sample N`. A `ValueError` for Python callers."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C would be so that the same clean-up runs."""
