"""The block pipeline on the local engine: blocks follow the files, every sample keeps its global
index and line, tails are packed together, and nothing here imports Ray."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import make_samples, python_script, read_shards, to_table, write_jsonl

from packer.config import PackConfig
from packer.pipelines.block_task import block_seed, tail_rows
from packer.planning.strategies import plan
from packer.read.blocks import scan_file


def check_provenance(out: Path, samples: list[dict]) -> int:
    """Every packed segment holds exactly the tokens of the input sample it names."""
    table = read_shards(out).to_pydict()
    seen = 0
    for ids, cu, index, offset in zip(
        table["input_ids"], table["cu_seqlens"], table["sample_index"], table["sample_offset"]
    ):
        for k, (i, o) in enumerate(zip(index, offset)):
            piece = ids[cu[k] : cu[k + 1]]
            assert piece == samples[i]["input_ids"][o : o + len(piece)]
            seen += 1
    return seen


def test_jsonl_scan_counts_samples_across_blank_lines_crlf_and_long_lines(tmp_path):
    samples = make_samples(300, seed=1, median=40)
    lines = [json.dumps(s) for s in samples]
    text = ""
    for k, line in enumerate(lines):
        text += line + ("\r\n" if k % 7 == 0 else "\n")
        if k % 11 == 0:
            text += "  \t\n\n"  # blank lines are not samples
    path = tmp_path / "a.jsonl"
    path.write_text(text.rstrip("\n"))  # no newline after the last line
    blocks = scan_file(0, str(path), 2000, ["input_ids", "labels"]).blocks
    assert len(blocks) > 20
    assert sum(b.rows for b in blocks) == 300
    assert [b.row0 for b in blocks] == list(np.cumsum([0] + [b.rows for b in blocks])[:-1])
    data = path.read_bytes()
    for b in blocks:  # each block starts at a line start at or after its multiple of 2000
        assert b.start == 0 or data[b.start - 1 : b.start] == b"\n"
        assert b.line0 == data[: b.start].count(b"\n")


def test_blocks_keep_global_indices_rejects_and_lines(cli, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    samples = make_samples(600, seed=2, median=50)
    pq.write_table(to_table(samples[:300]), d / "a.parquet", row_group_size=30)
    text = "".join(json.dumps(s) + "\n" for s in samples[300:])
    lines = text.splitlines(keepends=True)
    lines[40] = "not json\n"
    lines[250] = '{"input_ids": []}\n'
    (d / "b.jsonl").write_text("".join(lines))
    common = ["-L", "256", "--overlength", "split", "--on-error", "skip", "--json"]
    r = cli("pack", d, "-o", tmp_path / "blocks", "--block-size", "8KiB", *common)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["blocks"] > 20 and report["rejected"] == 2
    assert check_provenance(tmp_path / "blocks", samples) == report["segments"]
    r = cli("pack", d, "-o", tmp_path / "plain", *common)
    assert r.exit_code == 0, r.output
    plain = json.loads(r.stdout)
    # the same samples, rejects (with their lines) and counts as one global plan
    assert (tmp_path / "blocks" / "rejects.jsonl").read_bytes() == (
        tmp_path / "plain" / "rejects.jsonl"
    ).read_bytes()
    for key in ("samples_in", "samples_packed", "segments", "tokens", "loss_tokens", "split"):
        assert report[key] == plain[key], key
    assert report["rows"] <= plain["rows"] + 1
    manifest = json.loads((tmp_path / "blocks" / "manifest.json").read_text())
    plain_manifest = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    assert manifest["inputs"] == plain_manifest["inputs"]
    assert manifest["config"]["block_size"] == 8192 and "block_size" not in plain_manifest["config"]
    assert "engine" not in manifest["config"]


def test_block_output_does_not_depend_on_workers_and_reruns_from_its_manifest(cli, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    for i in range(2):
        write_jsonl(d / f"{i}.jsonl", make_samples(200, seed=i, median=60))
    base = ["-L", "128", "--overlength", "split", "--strategy", "ff-shuffle", "--seed", "7"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli("pack", d, "-o", a, *base, "--block-size", "10KiB", "--workers", "1").exit_code == 0
    config = json.loads((a / "manifest.json").read_text())["config"]
    (tmp_path / "preset.yaml").write_text(json.dumps(config))  # JSON is YAML
    r = cli("pack", d, "-o", b, "--config", tmp_path / "preset.yaml", "--workers", "2")
    assert r.exit_code == 0, r.output
    for f in sorted(p.name for p in a.iterdir()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_block_size_and_engine_options(cli, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    write_jsonl(d / "a.jsonl", make_samples(50, seed=0))
    (tmp_path / "c.yaml").write_text("max_len: 512\nblock_size: 4KiB\nengine: local\n")
    r = cli("pack", d, "-o", tmp_path / "o", "--config", tmp_path / "c.yaml", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["blocks"] > 1
    r = cli("pack", d, "-o", tmp_path / "x", "-L", "512", "--block-size", "lots")
    assert r.exit_code == 2 and "--block-size must be a size such as" in r.stderr
    r = cli("pack", d, "-o", tmp_path / "x", "-L", "512", "--ray-address", "auto")
    assert r.exit_code == 2 and "--ray-address needs --engine ray" in r.stderr
    r = cli("pack", d, "-o", tmp_path / "x", "-L", "512", "--engine", "spark")
    assert r.exit_code == 2 and "unknown --engine 'spark'" in r.stderr
    r = cli(
        "pack", tmp_path / "o", "-o", tmp_path / "x", "--repack", "-L", "64", "--block-size", "1MiB"
    )
    assert r.exit_code == 2 and "--repack" in r.stderr
    assert not (tmp_path / "x").exists()


def test_a_block_over_the_memory_budget_is_refused(cli, tmp_path):
    path = tmp_path / "big.parquet"
    pq.write_table(to_table(make_samples(3000, seed=0, median=200)), path)  # one row group
    r = cli("pack", path, "-o", tmp_path / "o", "-L", "4096", "--block-size", "4KiB",
            "--memory-budget", "1MiB")  # fmt: skip
    assert r.exit_code == 2
    assert "a block of" in r.stderr and "--block-size" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.parquet"]


def test_overlength_error_in_a_block_says_which_samples_it_counted(cli, tmp_path):
    """A block run stops at the first block holding an over-length sample: its count is that
    block's, and the line says so rather than passing it off as the input's."""
    write_jsonl(tmp_path / "a.jsonl", make_samples(400, seed=0, median=100))
    r = cli("pack", tmp_path / "a.jsonl", "-o", tmp_path / "o", "-L", "100", "--block-size", "8KiB")
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert " in block 0 (" in r.stderr and "a.jsonl) are longer than --max-len 100" in r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("blocks", [64, 256])
def test_tails_packed_together_stay_within_a_hundredth_of_a_percent_of_one_plan(blocks):
    """1M lognormal lengths (the benchmark's) cut into blocks: rows at most 0.01 % above one
    global plan, moving under 6 % of the tokens."""
    rng = np.random.default_rng(0)
    L = 2048
    lengths = np.clip(np.round(rng.lognormal(np.log(300), 0.9, 1_000_000)), 1, L).astype(np.int64)
    cfg = PackConfig(max_len=L)
    full, tails = 0, []
    for b, part in enumerate(np.array_split(lengths, blocks)):
        pl = plan(part, L, seed=block_seed(0, b))
        tail = tail_rows(pl, part, cfg)
        full += int((~tail).sum())
        tails.append(part[pl.order[np.repeat(tail, np.diff(pl.row_starts))]])
    moved = np.concatenate(tails)
    rows = full + plan(moved, L).num_rows
    one = plan(lengths, L).num_rows
    assert rows <= one * 1.0001
    assert moved.sum() < 0.06 * lengths.sum()


def test_import_and_local_engine_never_import_ray(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", make_samples(40, seed=0))
    code = (
        "import sys, packer\n"
        "assert 'ray' not in sys.modules\n"
        f"packer.pack([{str(tmp_path / 'a.jsonl')!r}], {str(tmp_path / 'o1')!r}, "
        "packer.PackConfig(max_len=512))\n"
        f"packer.pack([{str(tmp_path / 'a.jsonl')!r}], {str(tmp_path / 'o2')!r}, "
        "packer.PackConfig(max_len=512, block_size=2048), engine='local')\n"
        "from packer.cli import run\n"
        f"sys.argv = ['packer', 'pack', {str(tmp_path / 'a.jsonl')!r}, '-o', "
        f"{str(tmp_path / 'o3')!r}, '-L', '512', '--block-size', '2KiB', '--json']\n"
        "try:\n    run()\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')], 'ray imported'\n"
        "print('ok')\n"
    )
    r = python_script(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "ok"


def test_tails_of_block_groups_are_planned_apart(cli, tmp_path, monkeypatch):
    """With groups of 4 blocks, each tail shard only reads its group's spills; all is packed."""
    import packer.pipelines.block_tail

    samples = make_samples(500, seed=4, median=50)
    write_jsonl(tmp_path / "a.jsonl", samples)
    args = ["-L", "256", "--overlength", "split", "--block-size", "6KiB", "--shard-rows", "8"]
    r = cli("pack", tmp_path / "a.jsonl", "-o", tmp_path / "all", *args, "--json")
    assert r.exit_code == 0, r.output
    together = json.loads(r.stdout)
    monkeypatch.setattr(packer.pipelines.block_tail, "TAIL_GROUP", 4)
    r = cli("pack", tmp_path / "a.jsonl", "-o", tmp_path / "grouped", *args, "--json")
    assert r.exit_code == 0, r.output
    grouped = json.loads(r.stdout)
    assert grouped["blocks"] > 12 and grouped["tokens_moved"] == together["tokens_moved"]
    assert grouped["tail_rows"] >= together["tail_rows"]
    assert check_provenance(tmp_path / "grouped", samples) == grouped["segments"]
    assert read_shards(tmp_path / "grouped").num_rows == grouped["rows"]


def test_a_block_run_pays_no_fixed_cost_it_can_skip(tmp_path):
    """What every block run (and a resumed one, for a fifth of the work) used to pay on top of
    its blocks: pandas, imported by `pa.array`/`to_numpy` on the spill files, and the commit
    flushing again every shard that its writer had flushed before the task's record."""
    data = tmp_path / "d.parquet"
    pq.write_table(to_table(make_samples(400, seed=3, median=60)), data, row_group_size=50)
    script = f"""
import json, sys
import packer
from packer.config import PackConfig
from packer.write import commit, shards

flushed = []
original = commit.fsync_file
def counted(path, *args, **kwargs):
    flushed.append(path.name)
    return original(path, *args, **kwargs)
commit.fsync_file = shards.fsync_file = counted
cfg = PackConfig(max_len=256, overlength="split", block_size=8192, shard_rows=20)
result = packer.pack([{str(data)!r}], {str(tmp_path / "out")!r}, cfg)
print(json.dumps({{"flushed": flushed, "shards": [s["file"] for s in result.shards],
                  "blocks": result.stats["blocks"], "pandas": "pandas" in sys.modules}}))
"""
    r = python_script(script, timeout=300)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["blocks"] > 5 and len(seen["shards"]) > 5
    assert not seen["pandas"], "a block run imported pandas"
    # each shard flushed once, by its writer; the commit flushes what it wrote itself
    assert {name: seen["flushed"].count(name) for name in seen["shards"]} == {
        name: 1 for name in seen["shards"]
    }
    assert "manifest.json" in seen["flushed"]
