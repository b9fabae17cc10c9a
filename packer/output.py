"""Atomic output directories: build beside the target, rename into place when complete.

A run that dies at any moment leaves either no output or the previous complete output; the
only trace is a hidden `.NAME.packer-tmp-*` directory, removed by the next run.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from packer.errors import UsageError

TMP_MARK = ".packer-tmp-"
OLD_MARK = ".packer-old-"


def check_target(output: Path, overwrite: bool) -> None:
    """Refuse an output that cannot be (re)placed before any work is done."""
    if output.exists() or output.is_symlink():
        if not output.is_dir():
            raise UsageError("output path exists and is not a directory", where=str(output))
        if not overwrite:
            raise UsageError("output directory exists; pass --overwrite to replace it",
                             where=str(output))
        if not (output / "manifest.json").is_file() and any(output.iterdir()):
            raise UsageError("refusing to overwrite a non-empty directory that is not a packer "
                             "output (no manifest.json)", where=str(output))
    parent = output.parent
    if not parent.is_dir():
        raise UsageError("parent directory does not exist", where=str(parent))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError("parent directory is not writable", where=str(parent))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(output: Path) -> None:
    """Remove temporary directories left beside `output` by runs that were killed."""
    prefix_tmp = f".{output.name}{TMP_MARK}"
    prefix_old = f".{output.name}{OLD_MARK}"
    for entry in output.parent.glob(f".{output.name}.packer-*"):
        name = entry.name
        for prefix in (prefix_tmp, prefix_old):
            if name.startswith(prefix):
                pid_text = name[len(prefix):].split("-", 1)[0]
                if pid_text.isdigit() and not _pid_alive(int(pid_text)):
                    shutil.rmtree(entry, ignore_errors=True)


def make_temp_dir(output: Path) -> Path:
    remove_stale(output)
    tmp = output.parent / f".{output.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def commit(tmp: Path, output: Path) -> None:
    """Move a complete temporary output into place, replacing an old one."""
    _fsync_dir(tmp)
    if output.exists():
        old = output.parent / f".{output.name}{OLD_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(output, old)
        try:
            os.rename(tmp, output)
        except BaseException:
            os.rename(old, output)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, output)
    _fsync_dir(output.parent)


def discard(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
