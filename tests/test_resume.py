"""`packer pack --resume`: a block run killed (SIGKILL) at chosen moments, then picked up.

The resumed output must be byte for byte an uninterrupted run's, the report must count the
tasks kept from the killed run, a resume after an input or an option changed is refused in one
line, and leftovers that cannot be trusted (a truncated shard, a torn record) are redone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import make_samples, to_table, write_jsonl
from typer.testing import CliRunner

import packer
from packer.cli import app
from packer.config import PackConfig
from packer.contract.names import TMP_MARK

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals")

BLOCKS, TAILS = 57, 10  # of the inputs below, with ARGS
ARGS = ["-L", "256", "--overlength", "split", "--block-size", "8KiB", "--shard-rows", "20"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Parquet (row groups of 40 rows) and JSONL files with labels: 57 blocks, 10 tail tasks."""
    d = tmp_path_factory.mktemp("inputs")
    for i in range(2):
        pq.write_table(
            to_table(make_samples(300, seed=i, median=50)), d / f"p{i}.parquet", row_group_size=40
        )
        write_jsonl(d / f"j{i}.jsonl", make_samples(250, seed=10 + i, median=50))
    return d


def pack(inputs: Path, out: Path, *extra: str, env: dict | None = None, cwd=None):
    """`packer pack ... --json`, in this process; in a process of its own where `env` or `cwd`
    is given (the fault knobs SIGKILL the process)."""
    args = ["pack", str(inputs), "-o", str(out), *ARGS, "--json", *extra]
    if env is None and cwd is None:
        r = CliRunner().invoke(app, args, catch_exceptions=False)
        return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
    return subprocess.run(
        [sys.executable, "-m", "packer.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def full(inputs, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("full") / "out"
    r = pack(inputs, out)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def outputs_equal(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def leftovers(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}{TMP_MARK}*"))


def records(tmp: Path) -> list[str]:
    return sorted(p.name for p in (tmp / ".blocks" / "done").glob("*.json"))


def killed(inputs: Path, out: Path, at: int, cwd=None) -> Path:
    """A run SIGKILLed right after its `at`-th completion record: its temporary output."""
    r = pack(inputs, out, env={"PACKER_FAULT_KILL_AT_RECORDS": str(at)}, cwd=cwd)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not out.exists()
    (tmp,) = leftovers(out)
    assert len(records(tmp)) == at
    return tmp


def test_uninterrupted_runs_report_every_task_run(full):
    _, report = full
    assert report["blocks"] == BLOCKS
    assert report["tasks_reused"] == 0
    assert report["tasks_run"] == BLOCKS + TAILS


@pytest.mark.parametrize(
    "at",
    [1, 40, BLOCKS, BLOCKS + 5, BLOCKS + TAILS],
    ids=["first-block", "mid-blocks", "blocks-done", "mid-tails", "before-commit"],
)
def test_resume_after_sigkill_keeps_finished_tasks_and_the_bytes(inputs, full, tmp_path, at):
    out = tmp_path / "out"
    killed(inputs, out, at)
    r = pack(inputs, out, "--resume")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["tasks_reused"] == at
    assert report["tasks_run"] == BLOCKS + TAILS - at
    outputs_equal(full[0], out)
    assert leftovers(out) == []
    assert {k: v for k, v in report.items() if k not in ("seconds", "timings", "output")} == {
        k: v
        for k, v in full[1].items()
        if k not in ("seconds", "timings", "output", "tasks_reused", "tasks_run")
    } | {"tasks_reused": at, "tasks_run": BLOCKS + TAILS - at}


def test_a_block_killed_before_publishing_runs_again(inputs, full, tmp_path):
    out = tmp_path / "out"
    marker = tmp_path / "marker"
    r = pack(inputs, out, env={"PACKER_FAULT_KILL_ONCE": str(marker)})
    assert r.returncode == -signal.SIGKILL
    (tmp,) = leftovers(out)
    assert records(tmp) == [] and list((tmp / ".blocks").glob("work-*"))
    r = pack(inputs, out, "--resume")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks_reused"] == 0
    outputs_equal(full[0], out)


def test_records_that_cannot_be_trusted_are_redone(inputs, full, tmp_path):
    out = tmp_path / "out"
    tmp = killed(inputs, out, BLOCKS + 5)
    done = tmp / ".blocks" / "done"
    listed = {p.stem: json.loads(p.read_text())["files"] for p in sorted(done.glob("*.json"))}
    with_shard = next(t for t, files in listed.items() if t.startswith("t") and files)
    with_spill = next(
        b for b, files in listed.items() if files and files[-1]["name"][:5] == "tail-"
    )
    torn = next(b for b in listed if b.startswith("b") and b != with_spill)
    # a shard that lost bytes after its record was written, a spill file gone, a torn record
    shard = tmp / listed[with_shard][0]["name"]
    shard.write_bytes(shard.read_bytes()[:-10])
    (tmp / ".blocks" / listed[with_spill][-1]["name"]).unlink()
    text = (done / f"{torn}.json").read_text()
    (done / f"{torn}.json").write_text(text[: len(text) // 2])
    (done / ".t00009.json.0000.part").write_text(text[: len(text) // 3])  # a kill mid-write
    r = pack(inputs, out, "--resume")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks_reused"] == BLOCKS + 5 - 3
    outputs_equal(full[0], out)


def test_a_kept_file_with_other_bytes_of_the_same_size_is_redone(inputs, full, tmp_path):
    out = tmp_path / "out"
    tmp = killed(inputs, out, BLOCKS + 5)
    done = tmp / ".blocks" / "done"
    listed = {p.stem: json.loads(p.read_text())["files"] for p in sorted(done.glob("*.json"))}
    shard_task = next(
        t for t, files in listed.items() if files and files[0]["name"][:6] == "shard-"
    )
    spill_task = next(
        b for b, files in listed.items() if files and files[-1]["name"][:5] == "tail-"
    )
    for path in (
        tmp / listed[shard_task][0]["name"],
        tmp / ".blocks" / listed[spill_task][-1]["name"],
    ):
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01  # one bit: the size its record holds, other bytes
        path.write_bytes(bytes(data))
    r = pack(inputs, out, "--resume")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks_reused"] == BLOCKS + 5 - 2
    outputs_equal(full[0], out)


def test_an_input_spelled_another_way_is_the_same_input(inputs, full, tmp_path):
    out = tmp_path / "out"
    killed(Path(inputs.name), out, 10, cwd=inputs.parent)  # relative, from the inputs' parent
    r = pack(inputs, out, "--resume")  # absolute
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks_reused"] == 10
    outputs_equal(full[0], out)


def test_a_resume_after_an_input_changed_is_refused_in_one_line(inputs, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    for p in inputs.iterdir():
        (d / p.name).write_bytes(p.read_bytes())
    out = tmp_path / "out"
    tmp = killed(d, out, 10)
    with open(d / "j1.jsonl", "a") as fh:
        fh.write('{"input_ids": [1, 2, 3]}\n')
    r = pack(d, out, "--resume")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: {out}: cannot resume: the input {d / 'j1.jsonl'} changed (size "
        f"{(d / 'j1.jsonl').stat().st_size - 25} -> {(d / 'j1.jsonl').stat().st_size}) since "
        "the killed run; rerun without --resume to pack from the start"
    ]
    assert leftovers(out) == [tmp] and not out.exists()
    os.utime(d / "p0.parquet", ns=(1, 1))
    (d / "j1.jsonl").write_bytes((inputs / "j1.jsonl").read_bytes())
    r = pack(d, out, "--resume")
    assert r.returncode == 2
    assert "j1.jsonl changed (modified)" in r.stderr or "p0.parquet changed (modified)" in r.stderr
    # without --resume the leftovers are removed and everything runs
    r = pack(d, out)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks_reused"] == 0
    assert leftovers(out) == []


def test_a_resume_with_other_options_is_refused_naming_the_option(inputs, tmp_path):
    out = tmp_path / "out"
    killed(inputs, out, 10)
    r = pack(inputs, out, "--resume", "--seed", "3")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: {out}: cannot resume: --seed changed (0 -> 3) since the killed run; rerun "
        "without --resume to pack from the start"
    ]
    r = pack(inputs, out, "--resume", "--block-size", "16KiB")
    assert r.returncode == 2
    assert "--block-size changed (8192 -> 16384)" in r.stderr


def test_resume_with_nothing_to_resume_runs_everything(inputs, full, tmp_path):
    out = tmp_path / "out"
    r = pack(inputs, out, "--resume")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert (report["tasks_reused"], report["tasks_run"]) == (0, BLOCKS + TAILS)
    outputs_equal(full[0], out)
    # a complete output has nothing to resume
    r = pack(inputs, out, "--resume")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: {out}: the output is complete (it has manifest.json): nothing to resume; "
        "pass --overwrite to pack it again"
    ]


def test_without_resume_a_dead_runs_leftovers_are_removed(inputs, full, tmp_path):
    out = tmp_path / "out"
    killed(inputs, out, 50)
    r = pack(inputs, out)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks_reused"] == 0
    assert leftovers(out) == []
    outputs_equal(full[0], out)


def test_resume_is_for_block_runs(cli, inputs, tmp_path):
    r = cli("pack", inputs, "-o", tmp_path / "o", "-L", "256", "--overlength", "split", "--resume")
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [
        "error: --resume picks up block runs: pass --block-size or --engine ray (not with "
        "--repack or --pairs)"
    ]


def test_the_library_resumes_and_counts(inputs, full, tmp_path):
    out = tmp_path / "out"
    killed(inputs, out, 60)
    cfg = PackConfig(max_len=256, overlength="split", block_size=8192, shard_rows=20)
    result = packer.pack(inputs, out, cfg, resume=True)
    assert (result.tasks_reused, result.tasks_run) == (60, BLOCKS + TAILS - 60)
    outputs_equal(full[0], out)
    with pytest.raises(packer.errors.UsageError, match="^resume=True picks up block runs"):
        packer.pack(inputs, tmp_path / "o2", PackConfig(max_len=256), resume=True)
