"""`packer pack --mix` on block runs: one global mixture planned from every block's lengths.

The bar of issue 36 on a block run (shares recomputed from the rows, the scarce source whole
and once, two epochs at twice the tokens), the manifest's `mixture` equal to a one-plan run's,
`verify` on the output, the same bytes on Ray and after a killed run is resumed, and a resume
after a weight changed refused in one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import make_samples, read_shards, to_table
from typer.testing import CliRunner

from packer.cli import app
from packer.contract.names import TMP_MARK

MAX_LEN = "1024"
BLOCK = "64KiB"  # 17 blocks: one or two Parquet row groups (100 samples each)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, Path]:
    """Two directories: long samples (median 240, ~3.5x the tokens) and short ones (median 60),
    two Parquet files each, row groups of 100 samples."""
    d = tmp_path_factory.mktemp("sources")
    long, short = d / "long", d / "short"
    long.mkdir()
    short.mkdir()
    for i in range(2):
        samples = make_samples(700, seed=i, median=240, max_len=1024)
        pq.write_table(to_table(samples), long / f"l{i}.parquet", row_group_size=100)
        samples = make_samples(800, seed=10 + i, median=60, max_len=1024)
        pq.write_table(to_table(samples), short / f"s{i}.parquet", row_group_size=100)
    return long, short


def mix_args(sources, out: Path) -> list[str]:
    long, short = sources
    return ["pack", "--mix", f"{long}=1", "--mix", f"{short}=1", "-o", str(out), "-L", MAX_LEN]


def pack_cli(cli, sources, out: Path, *extra: str) -> dict:
    r = cli(*mix_args(sources, out), *extra, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def pack_process(sources, out: Path, *extra: str, env: dict | None = None):
    """`packer pack --mix ... --json`, in this process; in a process of its own where `env`
    is given (a fault-injected run kills itself)."""
    args = [*map(str, mix_args(sources, out)), *extra, "--json"]
    if env is None:
        r = CliRunner().invoke(app, args, catch_exceptions=False)
        return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)
    return subprocess.run(
        [sys.executable, "-m", "packer.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


def per_source(out: Path, n_sources: int = 2):
    """(tokens per source, {source: counts of each sample's first piece by sample_index}),
    recomputed from the rows."""
    rows = read_shards(out).select(["cu_seqlens", "sample_source", "sample_index", "sample_offset"])
    tokens = np.zeros(n_sources, np.int64)
    seen: list[dict[int, int]] = [{} for _ in range(n_sources)]
    for row in rows.to_pylist():
        lengths = np.diff(row["cu_seqlens"])[: len(row["sample_source"])]
        np.add.at(tokens, row["sample_source"], lengths)
        for s, i, o in zip(row["sample_source"], row["sample_index"], row["sample_offset"]):
            if o == 0:
                seen[s][i] = seen[s].get(i, 0) + 1
    return tokens, seen


def without_layout(mixture: dict) -> dict:
    """A manifest's `mixture` without what names the layout (none of its fields does today:
    the sources, files, ranges and counts are the same on every layout)."""
    return mixture


def verify_passes(out: Path) -> None:
    r = CliRunner().invoke(app, ["verify", str(out), "--no-attention"], catch_exceptions=False)
    assert r.exit_code == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def block_run(sources, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("blocks") / "out"
    r = pack_process(sources, out, "--block-size", BLOCK)
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def test_fifty_fifty_on_blocks_meets_the_bar_and_matches_one_plan(
    cli, sources, block_run, tmp_path
):
    out, report = block_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert report["blocks"] == manifest["stats"]["blocks"] == 17
    tokens, seen = per_source(out)
    shares = tokens / tokens.sum()
    assert abs(shares[0] - 0.5) <= 0.001 and abs(shares[1] - 0.5) <= 0.001, shares
    mixture = manifest["mixture"]
    assert tokens.tolist() == [s["tokens"] for s in mixture["sources"]]
    long, short = mixture["sources"]
    assert long["input_samples"] == 1400 and short["input_samples"] == 1600
    # the scarce source: every sample once, nothing repeated or dropped
    assert (short["epochs"], short["repeats"], short["dropped"]) == (1, 0, 0)
    assert sorted(seen[1]) == list(range(1400, 3000)) and set(seen[1].values()) == {1}
    # the larger one: a subset, no sample twice
    assert long["epochs"] == 0 and set(seen[0].values()) == {1} and len(seen[0]) < 1400
    assert all(i < 1400 for i in seen[0])
    # one global mixture: the one-plan run of the same sources reports the same
    one = tmp_path / "one"
    pack_cli(cli, sources, one)
    one_plan = json.loads((one / "manifest.json").read_text())["mixture"]
    assert without_layout(mixture) == without_layout(one_plan)
    assert report["mixture"] == mixture
    verify_passes(out)
    # inspect names each segment's source, as on a one-plan output
    from packer.inspection import inspect

    table = read_shards(out)
    files = [s["file"] for s in manifest["shards"]]
    first = [0, *np.cumsum([s["rows"] for s in manifest["shards"]]).tolist()]
    tail = first[next(k for k, f in enumerate(files) if f.startswith("shard-t"))]
    for view in inspect(out, rows=[0, tail])["row_views"]:  # a block's row, a tail row
        expected = table.column("sample_source")[view["row"]].as_py()
        assert [s["mixture_source"] for s in view["segments"]] == expected


def test_twice_the_tokens_on_blocks_is_exactly_two_epochs(cli, sources, block_run, tmp_path):
    _, first = block_run
    twice = 2 * sum(s["tokens"] for s in first["mixture"]["sources"])
    out = tmp_path / "twice"
    report = pack_cli(cli, sources, out, "--block-size", BLOCK, "--mix-tokens", str(twice))
    short = report["mixture"]["sources"][1]
    assert (short["epochs"], short["repeats"], short["dropped"]) == (2, 1, 0)
    tokens, seen = per_source(out)
    assert sorted(seen[1]) == list(range(1400, 3000)) and set(seen[1].values()) == {2}
    assert abs(tokens[1] / tokens.sum() - 0.5) <= 0.001
    verify_passes(out)


def test_a_validation_split_on_blocks_is_disjoint_and_matches_one_plan(cli, sources, tmp_path):
    out = tmp_path / "train"
    report = pack_cli(cli, sources, out, "--block-size", BLOCK, "--validation-split", "0.05")
    held = tmp_path / "train-validation"
    train_manifest = json.loads((out / "manifest.json").read_text())
    held_manifest = json.loads((held / "manifest.json").read_text())
    assert report["mixture"]["validation"]["output"] == str(held)
    _, train_seen = per_source(out)
    _, held_seen = per_source(held)
    for s, n in enumerate((1400, 1600)):  # ~5% of each source's samples, each once
        assert len(held_seen[s]) == round(0.05 * n) and set(held_seen[s].values()) == {1}
        assert not set(held_seen[s]) & set(train_seen[s])
    for s in held_manifest["mixture"]["sources"]:
        assert s["samples"] == s["held_out"]
    # the one-plan run of the same split reports the same, but for the outputs' names
    one = tmp_path / "one"
    pack_cli(cli, sources, one, "--validation-split", "0.05")
    one_train = json.loads((one / "manifest.json").read_text())["mixture"]
    one_held = json.loads((tmp_path / "one-validation" / "manifest.json").read_text())["mixture"]
    assert one_train["validation"].pop("output") == str(tmp_path / "one-validation")
    assert train_manifest["mixture"]["validation"].pop("output") == str(held)
    assert train_manifest["mixture"] == one_train
    assert held_manifest["mixture"].pop("validation_of") == str(out)
    assert one_held.pop("validation_of") == str(one)
    assert held_manifest["mixture"] == one_held
    verify_passes(out)
    verify_passes(held)
    # killed while building the validation output, resumed: both outputs' bytes again
    again = tmp_path / "again"
    args = ("--block-size", BLOCK, "--validation-split", "0.05")
    r = pack_process(sources, again, *args, env={"PACKER_FAULT_KILL_AT_RECORDS": "5"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    r = pack_process(sources, again, *args, "--resume")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks_reused"] == 5
    for a, b in ((out, again), (held, tmp_path / "again-validation")):
        names = sorted(p.name for p in a.iterdir() if p.name != "manifest.json")
        assert names == sorted(p.name for p in b.iterdir() if p.name != "manifest.json")
        assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


def test_sources_of_their_own_columns_and_labels_with_rejects(cli, sources, tmp_path):
    """A JSONL source of its own input column, without labels and with bad lines skipped,
    mixed with a labelled Parquet source: the block run's mixture and stats are the one-plan
    run's, its tail shards join the two kinds of samples, and verify passes."""
    rng = np.random.default_rng(5)
    lines = []
    for i in range(1500):
        ids = rng.integers(0, 1000, int(rng.integers(1, 300))).tolist()
        lines.append('{"input_ids": "bad"}' if i % 97 == 5 else json.dumps({"ids": ids}))
    chats = tmp_path / "ids.jsonl"
    chats.write_text("\n".join(lines) + "\n")
    config = tmp_path / "mix.yaml"
    config.write_text(
        f"max_len: {MAX_LEN}\non_error: skip\ndatasets:\n"
        f"  - {{path: {chats}, weight: 1, input_column: ids, labels_column: null}}\n"
        f"  - {{path: {sources[1]}, weight: 1}}\n"
    )
    manifests = []
    for out, extra in ((tmp_path / "one", []), (tmp_path / "blocks", ["--block-size", "32KiB"])):
        r = cli("pack", "-c", config, "-o", out, *extra, "--json")
        assert r.exit_code == 0, r.output
        manifests.append(json.loads((out / "manifest.json").read_text()))
    one, blocks = manifests
    assert blocks["stats"]["blocks"] > 4 and blocks["stats"]["rejected"] == 16
    assert blocks["mixture"] == one["mixture"]
    layout = ("blocks", "tail_rows", "tokens_moved", "global_rows", "lower_bound_l2", "block_cost")
    rows = ("rows", "efficiency", "rows_over_lower_bound", "pad_tokens")
    assert {k: v for k, v in blocks["stats"].items() if k not in layout + rows} == {
        k: v for k, v in one["stats"].items() if k not in rows
    }
    assert [i["has_labels"] for i in blocks["inputs"]] == [False, True, True]
    verify_passes(tmp_path / "blocks")


def outputs_equal(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def leftovers(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}{TMP_MARK}*"))


def test_a_killed_mixture_resumes_to_the_same_bytes(sources, block_run, tmp_path):
    out = tmp_path / "out"
    args = ("--block-size", BLOCK)
    r = pack_process(sources, out, *args, env={"PACKER_FAULT_KILL_AT_RECORDS": "8"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not out.exists() and len(leftovers(out)) == 1
    # another weight: refused in one line naming what changed, the killed run left as it was
    long, short = sources
    changed = subprocess.run(
        [sys.executable, "-m", "packer.cli", "pack", "--mix", f"{long}=2", "--mix", f"{short}=1"]
        + ["-o", str(out), "-L", MAX_LEN, *args, "--resume"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert changed.returncode == 2
    assert len(changed.stderr.strip().splitlines()) == 1, changed.stderr
    assert f"cannot resume: --mix changed ({long}=1, {short}=1 -> {long}=2, {short}=1)" in (
        changed.stderr
    )
    assert "Traceback" not in changed.stderr
    assert len(leftovers(out)) == 1
    r = pack_process(sources, out, *args, "--resume")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["tasks_reused"] == 8
    outputs_equal(block_run[0], out)
    assert leftovers(out) == []


def kill_after_validation_commit(sources, out: Path, *extra: str) -> None:
    """A block mixture with a split, killed once its validation output is committed and
    before its training output is (the fault hook pauses at each commit point)."""
    args = mix_args(sources, out)[1:]
    proc = subprocess.Popen(
        [sys.executable, "-m", "packer.cli", "pack", *args, *extra, "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PACKER_FAULT_COMMIT_PAUSE": "3"},
    )
    try:
        for line in proc.stderr:
            if line.strip() == "packer-fault: commit done":  # the validation output's
                proc.kill()
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_resume_after_the_validation_output_was_committed_finishes_the_run(sources, tmp_path):
    """Killed between the two commits of a split: --resume keeps the validation output this
    run made and commits the training output, the bytes of an uninterrupted run; a resume
    whose validation output would differ is refused in one line naming --overwrite."""
    args = ("--block-size", BLOCK, "--validation-split", "0.05")
    clean = tmp_path / "clean"
    assert pack_process(sources, clean, *args).returncode == 0
    out = tmp_path / "out"
    kill_after_validation_commit(sources, out, *args)
    held = tmp_path / "out-validation"
    assert (held / "manifest.json").is_file() and not out.exists()
    assert len(leftovers(out)) == 1
    before = (held / "manifest.json").read_bytes()
    # another split: the validation output in place is not this run's
    other = pack_process(
        sources, out, "--block-size", BLOCK, "--validation-split", "0.1", "--resume"
    )
    assert other.returncode == 2, other.stderr
    assert len(other.stderr.strip().splitlines()) == 1, other.stderr
    assert f"cannot resume: {held} holds a validation output" in other.stderr
    assert "--validation-split 0.05, not 0.1" in other.stderr and "--overwrite" in other.stderr
    r = pack_process(sources, out, *args, "--resume")
    assert r.returncode == 0, r.stderr
    assert (held / "manifest.json").read_bytes() == before  # kept, not packed again
    for name in ("manifest.json", *(p.name for p in out.glob("shard-*"))):
        assert name in {p.name for p in clean.iterdir()}
    train = json.loads((out / "manifest.json").read_text())
    want = json.loads((clean / "manifest.json").read_text())
    assert train["shards"] == want["shards"] and train["stats"] == want["stats"]
    assert train["mixture"]["validation"] == {**want["mixture"]["validation"], "output": str(held)}
    assert leftovers(out) == [] and leftovers(held) == []


def test_sources_on_s3_read_in_place_give_the_local_bytes(s3, sources, block_run, tmp_path):
    long, short = (s3.put_dir(d, d.name) for d in sources)
    out = tmp_path / "from-s3"
    r = subprocess.run(
        [sys.executable, "-m", "packer.cli", "pack", "--mix", f"{long}=1", "--mix", f"{short}=1"]
        + ["-o", str(out), "-L", MAX_LEN, "--block-size", BLOCK, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    here = json.loads((block_run[0] / "manifest.json").read_text())
    there = json.loads((out / "manifest.json").read_text())
    assert [s["xxh3_128"] for s in there["shards"]] == [s["xxh3_128"] for s in here["shards"]]
    for a, b in zip(there["mixture"]["sources"], here["mixture"]["sources"]):
        assert a.pop("path").startswith("s3://") and a.pop("files")[0].startswith("s3://")
        assert a == {k: v for k, v in b.items() if k not in ("path", "files")}


@pytest.mark.xdist_group("ray")
def test_ray_writes_the_local_block_runs_bytes(cli, cluster, sources, block_run, tmp_path):
    out = tmp_path / "ray"
    pack_cli(cli, sources, out, "--block-size", BLOCK, "--engine", "ray", "--ray-address", cluster)
    outputs_equal(block_run[0], out)


def over_length_message(cli, sources, out: Path, *extra: str) -> str:
    """The one line `--overlength error` stops a mixture with at -L 512 (nothing written)."""
    long, short = sources
    r = cli("pack", "--mix", f"{long}=1", "--mix", f"{short}=1", "-o", out, "-L", "512", *extra)
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.output, r.output
    assert not out.exists() and leftovers(out) == []
    return lines[0]


def test_overlength_error_on_blocks_counts_every_source_as_one_plan_does(cli, sources, tmp_path):
    """A block run counts the over-length samples of all blocks in its length pass (before
    packing) and names the first in input order: the one-plan run's line, word for word."""
    lengths = [
        pq.read_table(f, columns=["input_ids"]).column(0).combine_chunks().value_lengths()
        for d in sources
        for f in sorted(d.glob("*.parquet"))
    ]
    every = np.concatenate([np.asarray(a) for a in lengths])
    over = np.flatnonzero(every > 512)
    first_file = sorted(sources[0].glob("*.parquet"))[0]
    one = over_length_message(cli, sources, tmp_path / "one")
    assert f"{over.size} sample(s) are longer than --max-len 512" in one
    assert f"longest {every.max()} tokens, first at {first_file}: row {over[0]})" in one
    assert over_length_message(cli, sources, tmp_path / "blocks", "--block-size", BLOCK) == one


@pytest.mark.xdist_group("ray")
def test_overlength_error_on_ray_is_the_one_plan_line(cli, cluster, sources, tmp_path):
    """On Ray the blocks finish in any order; the line is still the one-plan run's."""
    one = over_length_message(cli, sources, tmp_path / "one")
    ray = ("--block-size", BLOCK, "--engine", "ray", "--ray-address", cluster)
    assert over_length_message(cli, sources, tmp_path / "ray", *ray) == one


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--block-size", BLOCK, "--repack"], "cannot be used with --repack"),
    ],
)
def test_what_block_mixtures_refuse_in_one_line(cli, sources, tmp_path, extra, expected):
    out = tmp_path / "out"
    r = cli(*mix_args(sources, out), *extra)
    assert r.exit_code == 2, r.output
    assert expected in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not out.exists()
