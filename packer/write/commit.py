"""Atomic output directories: build beside the target, swap into place when complete.

A run that dies at any moment leaves either no output or the previous complete output; the
only trace is a hidden `.NAME.packer-tmp-*` directory, removed by the next run.

Replacing an existing output is one atomic step on Linux (renameat2 with RENAME_EXCHANGE swaps
the two directories); elsewhere, or on file systems without it, it is two renames, and a run
killed between them is repaired by the next run (see `remove_stale`). SIGINT and SIGTERM are held
back while the output is swapped, so Ctrl-C cannot land between the two steps either.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import sys
import uuid
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from packer.contract.names import MANIFEST, OLD_MARK, TMP_MARK
from packer.errors import OutputError, UsageError, option
from packer.interrupts import begin_output, commit_point, deferred_signals, interrupt_once
from packer.storage.local import pid_alive


def check_target(output: Path, overwrite: bool) -> None:
    """Refuse an output that cannot be (re)placed before any work is done."""
    if output.exists() or output.is_symlink():
        if not output.is_dir():
            raise UsageError("output path exists and is not a directory", where=str(output))
        if not overwrite:
            raise UsageError(
                f"output directory exists; pass {option('overwrite=True', '--overwrite')} to replace it",
                where=str(output),
            )
        if not (output / MANIFEST).is_file() and any(output.iterdir()):
            raise UsageError(
                "refusing to overwrite a non-empty directory that is not a packer "
                "output (no manifest.json)",
                where=str(output),
            )
    # missing parents are created (like `mkdir -p`) once the inputs have been read; the
    # nearest existing ancestor must be a writable directory
    parent = output.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError("not a directory, cannot hold the output", where=str(parent))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError("directory is not writable", where=str(parent))


def remove_stale(output: Path) -> None:
    """Clean up after runs that were killed: remove their temporary directories.

    A `.packer-old-*` directory whose run died while `output` is missing is the previous
    complete output, caught between the two renames of the fallback swap: it is put back.
    """
    prefix_tmp = f".{output.name}{TMP_MARK}"
    prefix_old = f".{output.name}{OLD_MARK}"
    # names compared as strings: a glob of `run[1]` would never match its own directories
    try:
        entries = sorted(output.parent.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        name = entry.name
        for prefix in (prefix_tmp, prefix_old):
            if not name.startswith(prefix):
                continue
            pid_text = name[len(prefix) :].split("-", 1)[0]
            if not pid_text.isdigit() or pid_alive(int(pid_text)):
                continue
            if prefix == prefix_old and not (output.exists() or output.is_symlink()):
                os.rename(entry, output)
            else:
                shutil.rmtree(entry, ignore_errors=True)


def make_temp_dir(output: Path) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(output)
    tmp = output.parent / f".{output.name}{TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


# --------------------------------------------------------------------------------------------
# renameat2 (Linux >= 3.15, glibc >= 2.28), through ctypes

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2_fn = None


def _load_renameat2():
    global _renameat2_fn
    if _renameat2_fn is None:
        fn = False
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).renameat2
                fn.argtypes = [
                    ctypes.c_int,
                    ctypes.c_char_p,
                    ctypes.c_int,
                    ctypes.c_char_p,
                    ctypes.c_uint,
                ]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = False
        _renameat2_fn = fn
    return _renameat2_fn


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Rename with flags; False when the system or file system does not support it."""
    fn = _load_renameat2()
    if not fn:
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


# --------------------------------------------------------------------------------------------
# Commit and discard


def commit(tmp: Path, output: Path, overwrite: bool = True, synced: Collection[str] = ()) -> None:
    """Move a complete temporary output into place, replacing an old one when `overwrite`.

    Every file is flushed to disk before the swap, so that after a power loss the output is
    not a directory of empty shards. `synced`: names of files flushed already (a block run's
    shards, each flushed by its writer before its task's completion record was written): an
    fsync of a clean file still flushes the device's cache, ~5 ms each on a virtual disk, a
    third of a second for a 64-block output. The directory itself is flushed in every case,
    so the names they were renamed to are durable too.
    """
    _fsync_tree(tmp, frozenset(synced))
    # the swap is the commit point, unless `output` is a remote output's local build (its
    # manifest's upload is: `packer.write.remote`)
    point = deferred_signals() if output in _STAGED else commit_point(str(output))
    with point:
        if output.exists() or output.is_symlink():
            if not overwrite:
                raise UsageError(
                    f"output appeared while packing; not replacing it without "
                    f"{option('overwrite=True', '--overwrite')}",
                    where=str(output),
                )
            if _renameat2(tmp, output, _RENAME_EXCHANGE):
                shutil.rmtree(tmp, ignore_errors=True)  # holds the old output now
            else:
                _replace_by_two_renames(tmp, output)
        elif not _renameat2(tmp, output, _RENAME_NOREPLACE):
            os.rename(tmp, output)
        fsync_dir(output.parent)


_STAGED: set[Path] = set()


def stage_only(output: Path) -> None:
    """`output` is a build directory that is committed elsewhere (uploaded to a store): putting
    it in place is not the run's commit point."""
    _STAGED.add(output)


def _replace_by_two_renames(tmp: Path, output: Path) -> None:
    old = output.parent / f".{output.name}{OLD_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.rename(output, old)
    try:
        os.rename(tmp, output)
    except BaseException:
        os.rename(old, output)
        raise
    shutil.rmtree(old, ignore_errors=True)


def discard(tmp: Path) -> None:
    with deferred_signals():
        shutil.rmtree(tmp, ignore_errors=True)


KEEP_BYTES = 8192  # an IPC message's header (its flatbuffer metadata) fits well within this


def fsync_file(path: Path, drop_cache: bool = False, keep: Sequence[int] = ()) -> None:
    """Flush a file to disk; with `drop_cache`, then release its now clean cached pages.

    Shards are written once and not read back by packer: keeping gigabytes of them in the page
    cache only makes every later write wait for free memory (the kernel reclaiming pages, a
    virtual machine's host handing them back). Released pages are reused at once instead.

    keep: offsets whose first `KEEP_BYTES` stay cached: the record batches' headers of a file
    that is memory-mapped next (`pack_dataset`). Opening the stream reads every header; dropped,
    each one is a page fault whose read-ahead pulls megabytes of the body from disk (2.9 s to
    open a 5 GiB file through a plain mmap here, against 0.2 s with the headers cached).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if drop_cache and hasattr(os, "posix_fadvise"):
            start = 0  # DONTNEED rounds inward: a page partly kept is kept whole
            for offset in sorted(keep):
                if offset > start:
                    os.posix_fadvise(fd, start, offset - start, os.POSIX_FADV_DONTNEED)
                start = max(start, offset + KEEP_BYTES)
            os.posix_fadvise(fd, start, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _fsync_tree(path: Path, synced: frozenset[str] = frozenset()) -> None:
    for entry in path.iterdir():
        if entry.name not in synced and entry.is_file():
            fsync_file(entry)
    fsync_dir(path)


def fsync_dir(path: Path) -> None:
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


def os_reason(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return f"{text} [{exc.filename}]" if exc.filename else text


def start(output: Path) -> Path:
    """The hidden temporary directory a run builds its output in (one line if it cannot).

    A signal that arrived after an earlier output of this command was committed stops the run
    here, before anything of this one is made (`begin_output`)."""
    begin_output()
    try:
        return make_temp_dir(output)
    except OSError as exc:
        raise OutputError(
            f"cannot create a temporary directory: {os_reason(exc)}", where=str(output.parent)
        ) from None


@contextmanager
def building(tmp: Path, output: Path) -> Iterator[None]:
    """Whatever fails while the output is built removes it; an OSError becomes one line.

    Only the first Ctrl-C interrupts (`interrupt_once`): a second one lands in the clean-up."""
    with interrupt_once(), _removed_on_failure(tmp, output):
        yield


@contextmanager
def _removed_on_failure(tmp: Path, output: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        discard(tmp)
        raise OutputError(
            f"cannot write the output: {os_reason(exc)}; nothing was written", where=str(output)
        ) from None
    except BaseException:
        discard(tmp)
        raise


def finish(
    tmp: Path, output: Path, manifest: dict, overwrite: bool, synced: Collection[str] = ()
) -> None:
    """Write the manifest, then put the output in place (`synced`: see `commit`).

    The manifest is written last: a directory with shards but no manifest is never complete.
    """
    write_manifest(tmp, manifest)
    commit(tmp, output, overwrite=overwrite, synced=synced)


def write_manifest(tmp: Path, manifest: dict) -> None:
    """manifest.json into a built output, before `commit` (a run that commits two outputs
    writes both manifests first)."""
    with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2, sort_keys=True)
        fh.write("\n")
