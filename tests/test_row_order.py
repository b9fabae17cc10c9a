"""Rows in a seeded shuffled order (`--row-order shuffle`, the default) or the plan's.

The same seed gives the same bytes on every engine (one plan in memory or out of core, block
runs with any number of workers, Ray) and across a resume; another seed or `--row-order plan`
gives the same rows in another order; the shuffled order has no length curriculum; verify
passes; old (format 1) outputs are still read, and a newer format is refused.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import make_samples, read_shards, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import packer
from packer.cli import app
from packer.config import PackConfig
from packer.contract.manifest import FORMAT_VERSIONS
from packer.errors import OptionError, UsageError
from packer.planning.row_order import (
    order_plan_rows,
    order_shards,
    reorder_rows,
    row_permutation,
)
from packer.planning.strategies import Plan
from packer.write.manifest import FORMAT_VERSION

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample.jsonl.gz"
BLOCK_ARGS = ["-L", "256", "--overlength", "split", "--block-size", "8KiB", "--shard-rows", "20"]


def row_keys(table: pa.Table) -> list[tuple]:
    """Each row as a hashable tuple of all its columns, in table order."""
    columns = [table.column(n).to_pylist() for n in table.column_names]
    return [repr(r) for r in zip(*columns)]


def longest_segment(table: pa.Table) -> np.ndarray:
    """The longest sample (segment) of every row."""
    return np.array([max(np.diff(cu)) for cu in table.column("cu_seqlens").to_pylist()])


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (ties take their mean rank)."""

    def ranks(v: np.ndarray) -> np.ndarray:
        order = np.argsort(v, kind="stable")
        r = np.empty(v.size)
        r[order] = np.arange(v.size)
        for value in np.unique(v):  # mean rank of ties
            tie = v == value
            r[tie] = r[tie].mean()
        return r

    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    return float(np.corrcoef(rx, ry)[0, 1])


def same_bytes(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def pack_cli(inputs, out: Path, *extra, env=None) -> subprocess.CompletedProcess:
    """`packer pack ... --json`, in this process; in a process of its own where `env` is given
    (the fault knobs SIGKILL the process)."""
    args = ["pack", *map(str, inputs), "-o", str(out), *map(str, extra), "--json"]
    if env is None:
        r = CliRunner().invoke(app, args, catch_exceptions=False)
        return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
    return subprocess.run(
        [sys.executable, "-m", "packer", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("inputs")
    for i in range(3):
        write_jsonl(d / f"j{i}.jsonl", make_samples(250, seed=20 + i, median=50))
    return d


# --------------------------------------------------------------------------------------------
# The permutation


def random_plan(sizes: list[int]) -> Plan:
    starts = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    order = np.random.default_rng(len(sizes)).permutation(int(starts[-1])).astype(np.int64)
    return Plan(order=order, row_starts=starts)


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), max_size=300),
    seed=st.integers(0, 2**32 - 1),
    key=st.lists(st.integers(0, 2**20), max_size=2),
)
def test_reordered_rows_are_the_plans_rows_permuted(sizes, seed, key):
    pl = random_plan(sizes)
    perm = row_permutation(pl.num_rows, seed, *key)
    assert perm.dtype == np.int64 and sorted(perm.tolist()) == list(range(pl.num_rows))
    assert np.array_equal(perm, row_permutation(pl.num_rows, seed, *key))  # only (seed, key)
    got = reorder_rows(pl, perm)
    assert got.num_rows == pl.num_rows and got.row_starts[-1] == pl.row_starts[-1]
    for i in range(got.num_rows):  # row i is row perm[i], its items in the same order
        assert np.array_equal(got.row(i), pl.row(int(perm[i])))
    inverse = np.argsort(perm)
    assert np.array_equal(reorder_rows(got, inverse).order, pl.order)


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=200), window=st.integers(1, 60))
def test_window_rows_stay_in_their_window(sizes, window):
    """With windows, rows are permuted within their window: a row's window keeps its place."""
    starts = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    pl = Plan(order=np.arange(starts[-1], dtype=np.int64), row_starts=starts)
    # rows that cross a window do not occur in a windowed plan: cut them at window bounds
    cut = np.union1d(starts, np.arange(0, starts[-1], window))
    pl = Plan(
        order=pl.order, row_starts=np.append(cut, starts[-1]) if cut[-1] != starts[-1] else cut
    )
    got = order_plan_rows(pl, "shuffle", 7, window)
    first = lambda p: p.order[p.row_starts[:-1]] // window  # noqa: E731
    assert np.array_equal(first(got), first(pl))
    assert sorted(map(tuple, (got.row(i) for i in range(got.num_rows)))) == sorted(
        map(tuple, (pl.row(i) for i in range(pl.num_rows)))
    )
    assert order_plan_rows(pl, "plan", 7, window) is pl


def test_permutation_is_numpys_pcg64_from_the_documented_seed():
    """docs/format.md names the generator and the key: a reader can recompute the order."""
    want = np.random.Generator(np.random.PCG64(np.random.SeedSequence([5, 0x726F77, 0])))
    assert np.array_equal(row_permutation(1000, 5, 0), want.permutation(1000))
    assert not np.array_equal(row_permutation(1000, 5, 0), row_permutation(1000, 6, 0))
    assert order_shards(["a", "b"], "plan", 3) == ["a", "b"]


# --------------------------------------------------------------------------------------------
# One plan


def test_sample_is_shuffled_without_a_length_curriculum(tmp_path):
    """On the bundled sample, a row's place says nothing about the length of its samples; in
    the plan's order the longest come first."""
    cfg = PackConfig(max_len=1024, overlength="split")
    shuffled = packer.pack([SAMPLE], tmp_path / "s", cfg).output
    in_plan = packer.pack(
        [SAMPLE], tmp_path / "p", PackConfig(**{**vars(cfg), "row_order": "plan"})
    )
    a, b = read_shards(shuffled), read_shards(in_plan.output)
    assert a.num_rows == b.num_rows > 300
    rho = spearman(np.arange(a.num_rows), longest_segment(a))
    rho_plan = spearman(np.arange(b.num_rows), longest_segment(b))
    assert abs(rho) < 0.1, rho
    assert rho_plan < -0.8, rho_plan
    assert Counter(row_keys(a)) == Counter(row_keys(b))  # the same rows
    manifest = json.loads((shuffled / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION == 2
    assert manifest["config"]["row_order"] == "shuffle" and manifest["config"]["seed"] == 0


def test_same_seed_same_bytes_in_memory_and_out_of_core_another_seed_other_order(tmp_path):
    base = [SAMPLE, "-L", "2048", "--overlength", "split", "--shard-rows", "50"]
    runs = {
        "mem": pack_cli(base[:1], tmp_path / "mem", *base[1:], "--seed", "4"),
        "ooc": pack_cli(
            base[:1], tmp_path / "ooc", *base[1:], "--seed", "4", "--memory-budget", "1MiB"
        ),
        "w1": pack_cli(base[:1], tmp_path / "w1", *base[1:], "--seed", "4", "--workers", "1"),
        "seed5": pack_cli(base[:1], tmp_path / "seed5", *base[1:], "--seed", "5"),
        "plan": pack_cli(base[:1], tmp_path / "plan", *base[1:], "--row-order", "plan"),
    }
    for name, r in runs.items():
        assert r.returncode == 0, (name, r.stderr)
    assert json.loads(runs["ooc"].stdout)["timings"]["out_of_core"] == 1.0
    same_bytes(tmp_path / "mem", tmp_path / "ooc")
    same_bytes(tmp_path / "mem", tmp_path / "w1")
    rows = {k: row_keys(read_shards(tmp_path / k)) for k in ("mem", "seed5", "plan")}
    assert rows["mem"] != rows["seed5"] != rows["plan"]
    assert Counter(rows["mem"]) == Counter(rows["seed5"]) == Counter(rows["plan"])
    # --seed also seeds ff-shuffle; with bfd only the order moves, so the stats are the same
    stats = [json.loads(runs[k].stdout) for k in ("mem", "seed5", "plan")]
    assert {s["rows"] for s in stats} == {stats[0]["rows"]}


def test_repack_pairs_and_cp_order_their_rows_by_the_seed(tmp_path):
    """Every one-plan driver permutes whole rows: the rows are those of --row-order plan."""
    pairs = tmp_path / "pairs.jsonl"
    rng = np.random.default_rng(3)
    with open(pairs, "w") as fh:
        for _ in range(120):
            p, c, r = (rng.integers(1, 500, int(n)).tolist() for n in rng.integers(1, 40, 3))
            fh.write(
                json.dumps({"prompt_input_ids": p, "chosen_input_ids": c, "rejected_input_ids": r})
                + "\n"
            )
    cases = {
        "pairs": ([pairs], ["-L", "256", "--pairs"]),
        "cp": ([SAMPLE], ["-L", "4096", "--overlength", "split", "--cp-size", "2"]),
        "repack": ([tmp_path / "src-plan"], ["-L", "4096", "--repack"]),
    }
    r = pack_cli(
        [SAMPLE],
        tmp_path / "src-plan",
        "-L",
        "1024",
        "--overlength",
        "split",
        "--row-order",
        "plan",
    )
    assert r.returncode == 0, r.stderr
    for name, (ins, args) in cases.items():
        got = {}
        for order in ("shuffle", "plan"):
            out = tmp_path / f"{name}-{order}"
            r = pack_cli(ins, out, *args, "--row-order", order)
            assert r.returncode == 0, (name, r.stderr)
            got[order] = row_keys(read_shards(out))
        again = tmp_path / f"{name}-again"
        assert pack_cli(ins, again, *args).returncode == 0
        same_bytes(tmp_path / f"{name}-shuffle", again)  # the default is shuffle, seed 0
        assert got["shuffle"] != got["plan"], name
        assert Counter(got["shuffle"]) == Counter(got["plan"]), name


def test_pack_dataset_row_order(tmp_path):
    lists = [list(range(1, 2 + n)) for n in np.random.default_rng(1).integers(1, 90, 400)]
    shuffled = packer.pack_dataset(lists, 128)
    in_plan = packer.pack_dataset(lists, 128, row_order="plan")
    assert shuffled.equals(packer.pack_dataset(lists, 128, row_order="shuffle", seed=0))
    assert row_keys(shuffled) != row_keys(in_plan)
    assert Counter(row_keys(shuffled)) == Counter(row_keys(in_plan))
    with pytest.raises(OptionError, match="row_order"):
        packer.pack_dataset(lists, 128, row_order="random")


# --------------------------------------------------------------------------------------------
# Block runs, resume and Ray


def test_block_runs_same_bytes_for_any_workers_and_rows_of_plan_order(inputs, tmp_path):
    runs = {
        "w1": ["--workers", "1"],
        "w2": ["--workers", "2"],
        "plan": ["--row-order", "plan"],
    }
    for name, extra in runs.items():
        r = pack_cli([inputs], tmp_path / name, *BLOCK_ARGS, *extra)
        assert r.returncode == 0, (name, r.stderr)
    same_bytes(tmp_path / "w1", tmp_path / "w2")
    manifest = json.loads((tmp_path / "w1" / "manifest.json").read_text())
    names = [s["file"] for s in manifest["shards"]]
    plan_names = [
        s["file"] for s in json.loads((tmp_path / "plan" / "manifest.json").read_text())["shards"]
    ]
    # the plan's order lists block shards by block, then the tail shards; shuffle permutes them
    assert plan_names == sorted(plan_names) and names == order_shards(plan_names, "shuffle", 0)
    assert names != plan_names
    a, b = read_shards(tmp_path / "w1"), read_shards(tmp_path / "plan")
    assert Counter(row_keys(a)) == Counter(row_keys(b))
    # no length curriculum in the order a reader follows (the plan's order has one per block)
    assert abs(spearman(np.arange(a.num_rows), longest_segment(a))) < 0.15


def test_resumed_block_run_is_the_uninterrupted_run(inputs, tmp_path):
    full = tmp_path / "full"
    assert pack_cli([inputs], full, *BLOCK_ARGS, "--seed", "9").returncode == 0
    out = tmp_path / "out"
    r = pack_cli(
        [inputs], out, *BLOCK_ARGS, "--seed", "9", env={"PACKER_FAULT_KILL_AT_RECORDS": "30"}
    )
    assert r.returncode == -signal.SIGKILL, r.stderr
    r = pack_cli([inputs], out, *BLOCK_ARGS, "--seed", "9", "--resume")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks_reused"] == 30
    same_bytes(full, out)
    # a resume with another row order is another run: refused, as for any other option
    killed = tmp_path / "killed"
    env = {"PACKER_FAULT_KILL_AT_RECORDS": "5"}
    assert pack_cli([inputs], killed, *BLOCK_ARGS, env=env).returncode == -signal.SIGKILL
    r = pack_cli([inputs], killed, *BLOCK_ARGS, "--row-order", "plan", "--resume")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.xdist_group("ray")
def test_ray_writes_the_local_engines_shuffled_bytes(inputs, cluster, tmp_path):
    r = pack_cli([inputs], tmp_path / "local", *BLOCK_ARGS)
    assert r.returncode == 0, r.stderr
    r = pack_cli(
        [inputs], tmp_path / "ray", *BLOCK_ARGS, "--engine", "ray", "--ray-address", cluster
    )
    assert r.returncode == 0, r.stderr
    same_bytes(tmp_path / "local", tmp_path / "ray")


# --------------------------------------------------------------------------------------------
# verify, old and new formats, options


def test_verify_passes_on_shuffled_outputs(inputs, tmp_path, cli, one_torch_thread):
    one = tmp_path / "one"
    assert pack_cli([SAMPLE], one, "-L", "2048", "--overlength", "split").returncode == 0
    blocks = tmp_path / "blocks"
    assert pack_cli([inputs], blocks, *BLOCK_ARGS).returncode == 0
    for out, source in ((one, SAMPLE), (blocks, inputs)):
        # in this process: torch is imported once, not once per verify
        r = cli("verify", out, "-i", source, "--rows", "2", "--json")
        assert r.exit_code == 0, r.stdout + r.stderr
        assert json.loads(r.stdout)["ok"]


def test_format_1_outputs_are_read_and_repack_in_their_order(tmp_path, cli, one_torch_thread):
    """An output written before the row order was an option (format 1, no row_order) is
    verified and inspected as before, and its manifest as --config packs its bytes again."""
    out = tmp_path / "old"
    r = pack_cli([SAMPLE], out, "-L", "2048", "--overlength", "split", "--row-order", "plan")
    assert r.returncode == 0, r.stderr
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["format_version"] = 1
    del manifest["config"]["row_order"]
    path.write_text(json.dumps(manifest, indent=2))
    for args in (["verify", out, "--rows", "1"], ["inspect", out, "--json"]):
        r = cli(*args)  # in this process: torch is imported once
        assert r.exit_code == 0, r.stdout + r.stderr
    again = tmp_path / "again"
    r = pack_cli([SAMPLE], again, "--config", path)
    assert r.returncode == 0, r.stderr
    assert json.loads((again / "manifest.json").read_text())["config"]["row_order"] == "plan"
    for shard in manifest["shards"]:
        assert (again / shard["file"]).read_bytes() == (out / shard["file"]).read_bytes()

    assert max(FORMAT_VERSIONS) == FORMAT_VERSION  # the writer's is one the readers read
    manifest["format_version"] = 3
    path.write_text(json.dumps(manifest))
    for args in (
        ["verify", out],
        ["inspect", out],
        ["pack", out, "--repack", "-L", "4096", "-o", tmp_path / "re"],
    ):
        r = cli(*args)
        assert r.exit_code == 2, (args, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert "format_version 3" in line and "upgrade packer" in line, line


def test_bad_row_order_is_one_line_naming_the_option(cli, tmp_path):
    for command in ("pack", "plan"):
        args = [command, SAMPLE, "-L", "4096", "--row-order", "random"]
        r = cli(*args, *(["-o", tmp_path / "x"] if command == "pack" else []))
        assert r.exit_code == 2 and not (tmp_path / "x").exists()
        (line,) = r.stderr.strip().splitlines()
        assert "--row-order" in line and "shuffle, plan" in line
    with pytest.raises(UsageError, match="row_order"):
        PackConfig(max_len=8, row_order="random").validate()
    config = tmp_path / "c.yaml"
    config.write_text("max_len: 2048\noverlength: split\nrow_order: plan\n")
    r = cli("pack", SAMPLE, "--config", config, "-o", tmp_path / "y")
    assert r.exit_code == 0, r.stderr
    assert (
        json.loads((tmp_path / "y" / "manifest.json").read_text())["config"]["row_order"] == "plan"
    )
