"""One version of an output being verified: its manifest and shards read from one directory.

(The manifest and shard readers themselves are the contract's: `packer.contract`.)
"""

from __future__ import annotations

import os
from pathlib import Path

from packer.contract.manifest import no_manifest, parse_manifest
from packer.contract.names import MANIFEST
from packer.errors import UsageError


class OutputVersion:
    """One version of an output directory, held open so that every read comes from it.

    `pack --overwrite` swaps a whole new directory into place and deletes the old one
    (`packer.write.commit`): a reader that opens the manifest, then the shards, by the output's
    path can get the old manifest with the new shards. `path` reads through the open directory
    instead (/proc/self/fd/N on Linux; elsewhere the output's path), and `changed()` says whether
    the output's path still names this directory and this manifest. The open directory also
    keeps its inode number from being reused by a later output.
    """

    def __init__(self, output_dir: str | Path):
        self.shown = Path(output_dir)
        self.fd = -1
        for attempt in range(3):
            self._open()
            try:
                self.manifest_bytes = (self.path / MANIFEST).read_bytes()
                break
            except OSError as exc:
                moved = self._moved()
                self.close()
                if moved and attempt < 2:  # replaced, its old version deleted: open the new one
                    continue
                if isinstance(exc, (FileNotFoundError, IsADirectoryError)):
                    raise no_manifest(self.shown) from None
                raise UsageError(
                    f"cannot read manifest.json: {exc.strerror or exc}", where=str(output_dir)
                ) from None
        try:
            self.manifest = parse_manifest(self.manifest_bytes, self.shown / MANIFEST)
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        if not self.shown.is_dir():
            raise no_manifest(self.shown)
        try:
            self.fd = os.open(self.shown, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError as exc:
            raise UsageError(f"cannot open: {exc.strerror or exc}", where=str(self.shown)) from None
        st = os.fstat(self.fd)
        self.identity = (st.st_dev, st.st_ino)
        proc = Path(f"/proc/self/fd/{self.fd}")
        try:
            self.path = proc if os.path.samestat(os.stat(proc), st) else self.shown
        except OSError:
            self.path = self.shown

    def _moved(self) -> bool:
        """Whether the output's path names another directory now (or nothing)."""
        try:
            st = os.stat(self.shown)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.identity

    def changed(self) -> bool:
        """Whether the output's path now names another directory, or another manifest."""
        if self._moved():
            return True
        try:
            return (self.shown / MANIFEST).read_bytes() != self.manifest_bytes
        except OSError:
            return True

    def shown_path(self, text: str) -> str:
        """`text` with the paths read through the open directory given as the user's."""
        if self.path == self.shown:
            return text
        return text.replace(f"{self.path}{os.sep}", f"{self.shown}{os.sep}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> OutputVersion:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
