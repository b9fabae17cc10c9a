"""`verify` reads one version of the output, even while `pack --overwrite` replaces it.

The output is swapped by packer's own commit (`packer.write.commit.commit`: renameat2's exchange,
or the two renames of its fallback) at the moment `verify` has read the manifest and is about
to read the shards; before, it read the old manifest with the new shards and reported a
corruption that was not there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl

import packer.verify.structure as structure
import packer.write.commit as commit_mod
from packer.errors import UsageError
from packer.verify import verify


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(source, output A, output B): one source packed two ways (L 128 / 8 rows per shard, L 256
    / 3 rows per shard), so A's manifest lists shards that B does not hold and the reverse."""
    from typer.testing import CliRunner

    from packer.cli import app

    root = tmp_path_factory.mktemp("versions")
    src = write_jsonl(root / "data.jsonl", make_samples(120, seed=5, median=40, vocab=500))
    outs = []
    for name, max_len, shard_rows in (("a", 128, 8), ("b", 256, 3)):
        out = root / name
        args = ["pack", str(src), "-o", str(out), "-L", str(max_len), "--overlength", "split"]
        res = CliRunner().invoke(app, [*args, "--shard-rows", str(shard_rows)])
        assert res.exit_code == 0, res.output
        outs.append(out)
    return src, outs[0], outs[1]


def rows_of(out: Path) -> int:
    return json.loads((out / "manifest.json").read_text())["stats"]["rows"]


@pytest.fixture(params=["exchange", "two renames"])
def swap_mode(request, monkeypatch) -> str:
    if request.param == "two renames":  # the fallback where renameat2 is missing
        monkeypatch.setattr(commit_mod, "_renameat2", lambda src, dst, flags: False)
    return request.param


def swap_in_during_checks(monkeypatch, out: Path, replacements: list[Path]) -> list[int]:
    """Each run of the checks first swaps the next replacement into `out` as `pack --overwrite`
    does (the old version is deleted); returns the list of swaps done so far."""
    real = structure.check_structure
    done: list[int] = []

    def swapping(*args, **kwargs):
        if replacements:
            tmp = out.parent / f".{out.name}{commit_mod.TMP_MARK}{os.getpid()}-{len(done)}"
            shutil.copytree(replacements.pop(0), tmp)
            commit_mod.commit(tmp, out, overwrite=True)
            done.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(structure, "check_structure", swapping)
    return done


def test_an_output_replaced_during_verify_is_verified_again_whole(
    versions, swap_mode, tmp_path, monkeypatch
):
    src, a, b = versions
    out = tmp_path / "out"
    shutil.copytree(a, out)
    swaps = swap_in_during_checks(monkeypatch, out, [b])
    result = verify(out, [src], attention=False)
    assert len(swaps) == 1
    assert result.ok, [f.message for f in result.failures]
    assert result.checks["structure"].details["rows"] == rows_of(b) != rows_of(a)
    assert result.checks["manifest"].details["shards"] == len(list(b.glob("*.arrow")))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_output_replaced_twice_is_one_line_and_exit_2(
    versions, swap_mode, cli, tmp_path, monkeypatch
):
    src, a, b = versions
    out = tmp_path / "out"
    shutil.copytree(a, out)
    swaps = swap_in_during_checks(monkeypatch, out, [b, a])
    with pytest.raises(UsageError, match="the output changed while it was being verified"):
        verify(out, attention=False)
    assert len(swaps) == 2

    swap_in_during_checks(monkeypatch, out, [b, a])
    r = cli("verify", out, "--no-attention")
    assert r.exit_code == 2
    assert r.stderr == (
        f"error: {out}: the output changed while it was being verified, twice (a pack "
        "--overwrite of it?); verify it once nothing writes it\n"
    )
    r = cli("verify", out, "--no-attention", "--json")  # nothing swaps it now
    assert r.exit_code == 0 and json.loads(r.stdout)["ok"]


def test_a_manifest_rewritten_in_place_is_noticed(versions, tmp_path, monkeypatch):
    """Not packer's way of replacing an output, but the same directory with another manifest
    is another version too."""
    src, a, b = versions
    out = tmp_path / "out"
    shutil.copytree(a, out)
    real = structure.check_structure
    calls = []

    def rewriting(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            manifest = json.loads((out / "manifest.json").read_text())
            manifest["created_by"] = "someone else"
            (out / "manifest.json").write_text(json.dumps(manifest))
        return real(*args, **kwargs)

    monkeypatch.setattr(structure, "check_structure", rewriting)
    assert verify(out, attention=False).ok
    assert len(calls) == 2


def test_verify_while_pack_overwrites_in_a_loop(versions, tmp_path):
    """A real race: a process packs the output again and again, alternating two configurations,
    while verify runs; every verify passes (or, replaced twice, says so), none reports damage."""
    src, a, _ = versions
    out = tmp_path / "out"
    shutil.copytree(a, out)
    code = (
        "import sys, packer\n"
        "from packer.config import PackConfig\n"
        "for i in range(int(sys.argv[3])):\n"
        "    L = 256 if i % 2 == 0 else 128\n"
        "    cfg = PackConfig(max_len=L, overlength='split', shard_rows=3 if L == 256 else 8)\n"
        "    packer.pack([sys.argv[1]], sys.argv[2], cfg, overwrite=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(out), "30"])
    outcomes = []
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                result = verify(out, [src], attention=False)
            except UsageError as exc:
                assert "changed while it was being verified" in str(exc)
                outcomes.append("changed")
                continue
            assert result.ok, [f.message for f in result.failures]
            outcomes.append("ok")
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0
    assert "ok" in outcomes


def test_messages_name_the_output_not_the_directory_held_open(versions, tmp_path, monkeypatch):
    """Shards are read through the open directory (/proc/self/fd/N on Linux); an I/O error's
    message still names the file under the output's path."""
    _, a, _ = versions
    out = tmp_path / "out"
    shutil.copytree(a, out)

    def failing(path):
        raise OSError(5, "Input/output error", str(path))

    monkeypatch.setattr(structure, "read_shard", failing)
    result = verify(out, attention=False)
    messages = [f.message for f in result.checks["structure"].failures]
    io_errors = [m for m in messages if "Input/output error" in m]
    assert io_errors and all(f"'{out}/shard-" in m for m in io_errors), messages
    assert not any("/proc/" in m for m in messages)
