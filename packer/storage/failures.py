"""One-line errors for what a store says, and retries with backoff for what may pass.

A store's exceptions (pyarrow's OSError with curl and AWS details, botocore's ClientError,
fsspec's) become one `PackerError` naming the URL: a missing bucket or object, denied access, an
unreachable endpoint. No message carries a credential: only the URL (`redact`) and the reason.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from packer.errors import (
    EXIT_TERMINATED,
    InputError,
    OutputError,
    PackerError,
    Terminated,
    UsageError,
    option,
)

T = TypeVar("T")

ATTEMPTS = 4  # whole-transfer attempts; the clients retry single requests inside each
BACKOFF = 0.2  # seconds before the second attempt, doubled each time (with jitter)

_DENIED = (
    "accessdenied",
    "access_denied",
    "access denied",
    "forbidden",
    "invalidaccesskeyid",
    "signaturedoesnotmatch",
    "http 403",
    "code: 403",
    "permission",
    "401",
)
_UNREACHABLE = (
    "couldn't connect",
    "could not connect",
    "connection refused",
    "curlcode: 7",
    "curlcode: 6",
    "failed to connect",
    "name or service not known",
    "could not resolve",
    "endpointconnectionerror",
    "connect timeout",
    "max retries exceeded",
    "connection aborted",
)
_NO_BUCKET = ("nosuchbucket", "bucket does not exist", "the specified bucket does not exist")
_TRANSIENT = (
    "connection reset",
    "broken pipe",
    "timed out",
    "timeout",
    "incompleteread",
    "connection was closed",
    "connection aborted",
    "remotedisconnected",
    "slowdown",
    "internalerror",
    "serviceunavailable",
    "http 500",
    "http 503",
    "curlcode: 18",
    "curlcode: 52",
    "curlcode: 55",
    "curlcode: 56",
    "empty reply",
    "responsestreamingerror",
    "readtimeout",
    "protocolerror",
)


def _text(exc: BaseException) -> str:
    parts = [type(exc).__name__, str(exc)]
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        parts.append(str(response.get("Error", {}).get("Code", "")))
        parts.append(f"http {response.get('ResponseMetadata', {}).get('HTTPStatusCode', '')}")
    return " ".join(parts).lower()


def kind(exc: BaseException) -> str:
    """'no_bucket', 'denied', 'unreachable', 'missing', 'transient' or 'other'."""
    text = _text(exc)
    if any(k in text for k in _NO_BUCKET):
        return "no_bucket"
    if any(k in text for k in _DENIED) or isinstance(exc, PermissionError):
        return "denied"
    if any(k in text for k in _UNREACHABLE):
        return "unreachable"
    if isinstance(exc, FileNotFoundError) or "nosuchkey" in text or "not found" in text:
        return "missing"
    if any(k in text for k in _TRANSIENT) or isinstance(exc, (ConnectionError, TimeoutError)):
        return "transient"
    return "other"


def one_line(exc: BaseException, where: str, writing: bool = False) -> PackerError:
    """The user's line for a store failure at `where` (a URL already redacted)."""
    if isinstance(exc, PackerError):
        return exc
    k = kind(exc)
    error = OutputError if writing else InputError
    if k == "no_bucket":
        return error("the bucket does not exist", where=where)
    if k == "denied":
        return error("access denied (check the credentials and the bucket's policy)", where=where)
    if k == "unreachable":
        return error(
            "cannot reach the storage endpoint (is it running, is the URL right?)", where=where
        )
    if k == "missing":
        return error("no such object or prefix", where=where)
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return error(f"storage error: {reason[:200]}", where=where)


def retrying(fn: Callable[[], T], what: str, writing: bool = False, attempts: int = ATTEMPTS) -> T:
    """`fn()`, tried again with exponential backoff while its failure looks transient; any
    failure that is left becomes one line naming `what`. On the main thread each try runs
    where Ctrl-C and SIGTERM can stop it (`interruptible`)."""
    delay = BACKOFF
    for attempt in range(1, attempts + 1):
        try:
            return interruptible(fn)
        except (PackerError, KeyboardInterrupt, UsageError):
            raise
        except Exception as exc:  # noqa: BLE001 (every store failure becomes one line)
            if kind(exc) != "transient" or attempt == attempts:
                raise one_line(exc, what, writing) from None
            time.sleep(delay * (1 + random.random() / 2))
            delay *= 2
    raise AssertionError("unreachable")


def interruptible(fn: Callable[[], T]) -> T:
    """`fn()`, run on a helper thread while the main thread waits in short slices.

    A store's client blocks inside C++ (pyarrow's S3 and GCS, curl) for as long as its retries
    last; Python runs signal handlers only between bytecodes of the main thread, so Ctrl-C and
    SIGTERM would wait for the call to end. Waiting here instead, the main thread takes the
    signal at once and raises; the helper is a daemon thread, abandoned with the process."""
    if threading.current_thread() is not threading.main_thread():
        return fn()
    box: dict = {}
    finished = threading.Event()  # not `Thread.is_alive`: a join cut by a signal marks it stopped

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 (handed to the waiting thread)
            box["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=run, name="packer-store-call", daemon=True).start()
    try:
        while not finished.wait(0.1):
            pass
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as `Terminated`
        if option("cli", "--cli") == "--cli":  # under packer's CLI, which exits 130/143 now
            _abandoned.append((finished, EXIT_TERMINATED if isinstance(exc, Terminated) else 130))
        raise
    if "error" in box:
        raise box.pop("error")
    return box["value"]


_abandoned: list[tuple[threading.Event, int]] = []  # store calls left running by a signal


def _exit_now_if_abandoned() -> None:
    """At the CLI's exit, after a signal left a store call running: leave without waiting for
    it (a library caller's process exits as Python decides).

    pyarrow's S3 finalizer (an exit handler registered before this one, so run after it) waits
    for every request in flight, which keeps an interrupted process alive until a stalled
    request times out (up to a minute). The process has said its line and cleaned up by now
    (later-registered exit handlers, such as the staging directory's removal, ran first)."""
    if any(not finished.is_set() for finished, _ in _abandoned):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(_abandoned[0][1])


atexit.register(_exit_now_if_abandoned)
