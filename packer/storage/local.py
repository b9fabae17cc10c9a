"""Local files that several processes share (the cache of remote outputs, staged copies).

Eight ranks of one node reading the same remote output share one cache directory. Each
process writes a download under a temporary name of its own (host, pid and random digits),
and a finished file is placed with a hard link, which creates the final name only if it is
absent: the first copy placed wins, a later one is dropped and its process reads the winner's.
A file at its final name is therefore complete and never replaced under a reader's memory map.
A lock file lets one process download while the others wait, so the bytes cross the network
once; where the file system has no locks, every process downloads and the placing still holds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

PART = ".part"
_HOST = socket.gethostname().replace("-", "_").replace(".", "_")[:40] or "host"


def private_name(final: Path) -> Path:
    """A temporary name beside `final` that no other process uses."""
    return final.with_name(f".{final.name}.{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}{PART}")


def place_once(part: Path, final: Path) -> bool:
    """Give `part`'s file the name `final` unless a file already has it; False when one had
    (then `part` is left for the caller to remove). A file system without hard links falls
    back to a rename, which replaces an equal file (the caller checked the bytes)."""
    try:
        os.link(part, final)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
            raise
    os.replace(part, final)
    return True


def remove_dead_parts(directory: Path) -> None:
    """Remove the temporary files that processes of this host left when they died."""
    prefix = f"{_HOST}-"
    with contextlib.suppress(OSError):
        for entry in directory.iterdir():
            if not (entry.name.startswith(".") and entry.name.endswith(PART)):
                continue
            owner = entry.name[: -len(PART)].rsplit(".", 1)[-1]
            if not owner.startswith(prefix):
                continue
            pid = owner[len(prefix) :].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                entry.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs (one that another user owns counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def held_lock(path: Path, poll: float = 0.05) -> Iterator[None]:
    """An exclusive lock on the file `path` while the block runs (released by the kernel if the
    holder dies). Waits by polling, so Ctrl-C and SIGTERM stop a waiting process at once; a
    file system without locks gives no lock and the block runs anyway."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the placing alone keeps readers safe
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        yield
        return
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(poll)
            except OSError:  # ENOLCK and the like: no locks here
                break
        yield
    finally:
        os.close(fd)
