"""Options for the stores that must be given by hand (`--storage-option KEY=VALUE`).

Credentials and endpoints come from each store's own environment and configuration first
(AWS_* variables, `AWS_ENDPOINT_URL`, `~/.aws`, GCS application defaults, the HF token). The
options given here are kept in this process only: never printed, never written anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from packer.errors import UsageError, option

_OPTIONS: dict[str, str] = {}
# the environment variables that configure the stores (credentials, endpoints, retries)
ENV_PREFIXES = ("AWS_", "GOOGLE_", "GCS_", "HF_", "PACKER_STORAGE_")


def set_options(options: Mapping[str, str] | None) -> None:
    """Use `options` for every store opened from now on in this process (replaces earlier ones)."""
    if options is not None and not isinstance(options, Mapping):
        raise UsageError(
            f"{option('storage_options', '--storage-option')} must be a mapping of names to values"
        )
    _OPTIONS.clear()
    _OPTIONS.update({str(k): str(v) for k, v in (options or {}).items()})


def storage_options() -> dict[str, str]:
    return dict(_OPTIONS)


def parse_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """`KEY=VALUE` strings as a dict; a malformed one is named by its position, never echoed."""
    out: dict[str, str] = {}
    for i, pair in enumerate(pairs, 1):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--storage-option number {i} is not KEY=VALUE")
        out[key.strip()] = value
    return out


def carried() -> dict:
    """This process's store settings (the options given by hand and the stores' environment
    variables), for tasks that reach the stores from other processes or nodes: kept in memory
    and handed to `carry_in` there, never printed or written to a file."""
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}
    return {"options": dict(_OPTIONS), "env": env}


def carry_in(settings: dict) -> None:
    """Use the store settings of the driver (`carried`) in this process (a task's worker)."""
    # the driver's variables win; a node's own (set where the driver has none) are kept
    for name, value in settings.get("env", {}).items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    if settings.get("options", {}) != _OPTIONS:
        set_options(settings.get("options", {}))
