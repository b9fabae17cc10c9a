"""`DirectFile`: the bytes of a file written around the page cache, its fallbacks and errors."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_samples

from packer.errors import OutputError
from packer.write import direct
from packer.write.direct import BLOCK, DirectFile

STAGE = 2 * BLOCK


def chunks(seed: int) -> list[bytes]:
    """Writes of every awkward size: empty, one byte, odd, a block, over a stage."""
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 7, BLOCK, BLOCK - 1, STAGE, STAGE + 1, 3 * STAGE + 5, 1, 0]
    sizes += rng.integers(1, 3 * STAGE, 20).tolist()
    return [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]


def write_all(path: Path, parts, **options) -> DirectFile:
    out = DirectFile(path, **options)
    for part in parts:
        assert out.write(part) == len(part)
    out.close()
    return out


def direct_works(directory: Path) -> bool:
    probe = write_all(directory / "probe", [b"x"])
    (directory / "probe").unlink()
    return probe.direct


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_bytes_and_length_are_those_written(tmp_path, seed, stages):
    parts = chunks(seed)
    out = write_all(tmp_path / "f", parts, stage_bytes=STAGE, stages=stages)
    data = b"".join(parts)
    assert out.bytes == len(data) > 10 * STAGE
    assert (tmp_path / "f").read_bytes() == data  # the padded last block is cut back


@pytest.mark.parametrize("size", [0, 1, BLOCK, STAGE, 2 * STAGE, 2 * STAGE + 1])
def test_sizes_at_block_and_stage_edges(tmp_path, size):
    data = os.urandom(size)
    out = write_all(tmp_path / "f", [data], stage_bytes=STAGE)
    assert (tmp_path / "f").read_bytes() == data
    assert out.closed
    out.close()  # a second close does nothing


def test_disk_file_is_written_around_the_page_cache(tmp_path):
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    if not direct_works(tmp_path):
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT")
    out = write_all(tmp_path / "f", chunks(2), stage_bytes=STAGE)
    assert out.direct


def test_file_system_refusing_o_direct_at_open_gets_a_buffered_file(tmp_path, monkeypatch):
    """Older tmpfs and some network file systems fail the open itself with EINVAL."""
    real = os.open

    def open_(path, flags, *mode):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *mode)

    monkeypatch.setattr(os, "open", open_)
    parts = chunks(3)
    out = write_all(tmp_path / "f", parts, stage_bytes=STAGE)
    assert not out.direct
    assert (tmp_path / "f").read_bytes() == b"".join(parts)


def test_memory_file_system():
    shm = Path("/dev/shm")
    if not (sys.platform.startswith("linux") and shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable tmpfs at /dev/shm")
    path = shm / f"packer-direct-test-{os.getpid()}"
    try:
        parts = chunks(6)
        write_all(path, parts, stage_bytes=STAGE)  # tmpfs takes O_DIRECT from Linux 6.6 on
        assert path.read_bytes() == b"".join(parts)
    finally:
        path.unlink(missing_ok=True)


def test_refused_first_write_turns_the_file_buffered(tmp_path, monkeypatch):
    """Some file systems accept O_DIRECT at open and refuse the writes: the first one is
    retried through the page cache, and the rest follow it."""
    real, calls = os.pwrite, []

    def pwrite(fd, data, offset):
        import fcntl

        calls.append(offset)
        if fcntl.fcntl(fd, fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    parts = chunks(4)
    out = write_all(tmp_path / "f", parts, stage_bytes=STAGE)
    assert not out.direct
    assert (tmp_path / "f").read_bytes() == b"".join(parts)
    assert len(calls) > 5


def test_device_error_surfaces_and_the_file_closes(tmp_path, monkeypatch):
    def pwrite(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", pwrite)
    out = DirectFile(tmp_path / "f", stage_bytes=STAGE)
    with pytest.raises(OSError) as info:
        for part in chunks(5):
            out.write(part)
        out.close()
    assert info.value.errno == errno.ENOSPC
    out.abort()
    assert out.closed


def test_pack_dataset_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    """The device's error while the cache file is written: an OutputError naming the file,
    and no file, temporary or final, left behind."""
    datasets = pytest.importorskip("datasets")
    import packer

    monkeypatch.setattr("packer.write.shards.BATCH_TOKENS", 4 * 128)
    monkeypatch.setattr(direct, "STAGE_BYTES", STAGE)
    ds = datasets.Dataset.from_list(make_samples(300, seed=4, median=30))
    real, writes = os.pwrite, []

    def pwrite(fd, data, offset):
        writes.append(offset)
        if len(writes) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    target = tmp_path / "out" / "packed.arrow"
    target.parent.mkdir()
    with pytest.raises(OutputError) as info:
        packer.pack_dataset(ds, 128, overlength="split", cache_file_name=target)
    assert "No space left on device" in str(info.value) and str(target) in str(info.value)
    assert 3 <= len(writes) <= 3 + direct.STAGES  # the stages already queued still go
    assert os.listdir(target.parent) == []
