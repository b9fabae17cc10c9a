"""Every reader calls an output without a manifest "incomplete" in one line, locally as on a
store, when a run's files are there (a run killed, or still writing); a directory that holds
none keeps its "not a packer output" line, and no expansion of inputs reads a run's files as
samples.

The local leftovers are a real block run's, SIGKILLed after its fifth completion record: the
hidden temporary output beside the output (which is missing), and a finished output whose
manifest was deleted. The remote ones are the same run's to the local S3 server (moto).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_samples, to_table

from packer.contract.names import TMP_MARK
from packer.errors import EXIT_FAILURE, EXIT_USAGE, InputError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals")

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["-L", "256", "--overlength", "split", "--block-size", "8KiB", "--shard-rows", "20"]
WHY = (
    "incomplete packer output: no manifest.json (a run that did not finish, or is still running; "
    "resume it with {resume}, or rerun it)"
)


def pack(inputs, out, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "packer", "pack", str(inputs), "-o", str(out), *ARGS, *extra],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=300,
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("inputs")
    for i in range(2):
        table = to_table(make_samples(200, seed=i, median=50))
        pq.write_table(table, d / f"p{i}.parquet", row_group_size=40)
    return d


@pytest.fixture(scope="module")
def local(inputs, tmp_path_factory) -> dict[str, Path]:
    """A killed run's output (missing) and its temporary output, a finished output without its
    manifest, and an empty directory."""
    base = tmp_path_factory.mktemp("local")
    killed = base / "killed"
    r = pack(inputs, killed, env={"PACKER_FAULT_KILL_AT_RECORDS": "5"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    (tmp,) = base.glob(f".killed{TMP_MARK}*")
    assert not killed.exists() and (tmp / ".blocks").is_dir()
    unlisted = base / "unlisted"
    assert pack(inputs, unlisted).returncode == 0
    (unlisted / "manifest.json").unlink()
    (base / "empty").mkdir()
    return {"killed": killed, "tmp": tmp, "unlisted": unlisted, "empty": base / "empty"}


def line(where, resume: str = "--resume") -> str:
    return f"error: {where}: {WHY.format(resume=resume)}\n"


READERS = [
    ("verify", "{p}", "--no-attention"),
    ("inspect", "{p}"),
    ("export", "{p}", "--to", "mds", "-o", "{x}"),
    ("pack", "{p}", "-o", "{x}", "--repack", "-L", "512"),
    ("pack", "{p}", "-o", "{x}", "-L", "512"),  # the inputs expansion
]


@pytest.mark.parametrize("case", ["killed", "tmp", "unlisted"])
@pytest.mark.parametrize("reader", READERS, ids=lambda r: " ".join(r[:1] + r[-3:-2]))
def test_every_cli_reader_calls_local_leftovers_incomplete(cli, local, tmp_path, case, reader):
    where = local[case]
    r = cli(*(a.format(p=where, x=tmp_path / "x") for a in reader))
    assert (r.exit_code, r.stderr) == (EXIT_FAILURE, line(where))
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("case", ["killed", "tmp", "unlisted"])
def test_packed_dataset_calls_local_leftovers_incomplete(local, case):
    from packer.torch import PackedDataset

    with pytest.raises(InputError) as info:
        PackedDataset(local[case])
    assert f"{info.value}\n" == line(local[case], "resume=True")[len("error: ") :]


def test_a_directory_without_leftovers_is_not_a_packer_output(cli, local, tmp_path):
    empty = local["empty"]
    (tmp_path / "notes.txt").write_text("not packer's\n")
    for where in (empty, tmp_path):
        for reader in READERS[:3]:
            r = cli(*(a.format(p=where, x=tmp_path / "x") for a in reader))
            assert (r.exit_code, r.stderr) == (
                EXIT_USAGE,
                f"error: {where}: no manifest.json: not a packer output\n",
            )
    from packer.torch import PackedDataset

    with pytest.raises(FileNotFoundError, match="not a packer output"):
        PackedDataset(empty)


def test_inputs_never_read_a_half_written_output(cli, inputs, local, tmp_path):
    """A data tree holding an output without its manifest is refused, naming it; a file of it
    or a glob into it too. A run's hidden temporary output inside the tree is skipped as
    before (the run writing it may be this one's own output)."""
    data = tmp_path / "data"
    shutil.copytree(inputs, data)
    shutil.copytree(local["unlisted"], data / "old")
    r = cli("pack", data, "-o", tmp_path / "x", "-L", "512")
    assert (r.exit_code, r.stderr) == (EXIT_FAILURE, line(data / "old"))
    shard = next((data / "old").glob("shard-*.arrow"))
    r = cli("pack", shard, "-o", tmp_path / "x", "-L", "512")
    assert (r.exit_code, r.stderr) == (EXIT_FAILURE, line(data / "old"))
    r = cli("pack", f"{data}/**/*.arrow", "-o", tmp_path / "x", "-L", "512")
    assert (r.exit_code, r.stderr) == (EXIT_FAILURE, line(data / "old"))
    shutil.rmtree(data / "old")
    shutil.copytree(local["tmp"], data / local["tmp"].name)
    assert cli("pack", data, "-o", tmp_path / "y", "-L", "512", "--json").exit_code == 0


@pytest.fixture
def remote(s3, inputs) -> dict[str, str]:
    """A block run to the store killed after its fifth completion record (its run files, no
    manifest), and a prefix holding one object that is not packer's."""
    r = pack(inputs, s3.url("killed"), env={"PACKER_FAULT_KILL_AT_RECORDS": "5"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert s3.keys("killed/") and "killed/manifest.json" not in s3.keys("killed/")
    s3.client.put_object(Bucket=s3.bucket, Key="other/notes.txt", Body=b"not packer's\n")
    return {"killed": s3.url("killed"), "other": s3.url("other")}


def test_every_reader_calls_remote_leftovers_incomplete_in_the_same_line(
    cli, inputs, remote, tmp_path
):
    where = remote["killed"]
    for reader in READERS:
        r = cli(*(a.format(p=where, x=tmp_path / "x") for a in reader))
        assert (r.exit_code, r.stderr) == (EXIT_FAILURE, line(where)), reader
    from packer.torch import PackedDataset

    with pytest.raises(InputError) as info:
        PackedDataset(where)
    assert f"{info.value}\n" == line(where, "resume=True")[len("error: ") :]
    other = remote["other"]
    for reader in READERS[:3]:
        r = cli(*(a.format(p=other, x=tmp_path / "x") for a in reader))
        assert (r.exit_code, r.stderr) == (
            EXIT_FAILURE,
            f"error: {other}: no manifest.json: not a packer output\n",
        )
    # what the message says works: the readers left the killed run's files to resume
    r = pack(inputs, where, "--resume", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks_reused"] >= 5
