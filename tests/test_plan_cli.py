"""`packer plan`: histogram and strategy table, the --json object, and one-line errors."""

from __future__ import annotations

import json

import numpy as np
from conftest import make_samples, write_jsonl, write_parquet

from packer.planning.choices import STRATEGIES
from packer.planning.strategies import best_bound, plan


def test_plan_json_compares_every_strategy(cli, tmp_path):
    samples = make_samples(300, max_len=512)
    path = write_jsonl(tmp_path / "a.jsonl", samples)
    result = cli("plan", path, "--max-len", 512, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    lengths = np.array([len(s["input_ids"]) for s in samples])
    assert report["samples"] == 300 and report["tokens"] == int(lengths.sum())
    assert report["bounds"]["best"] == best_bound(lengths, 512)
    assert [s["strategy"] for s in report["strategies"]] == list(STRATEGIES)
    for s in report["strategies"]:
        assert s["rows"] == plan(lengths, 512, s["strategy"]).num_rows
        assert s["optimal"] == (s["rows"] == report["bounds"]["best"])
        assert s["rows_over_lower_bound"] >= 1
    assert sum(report["histogram"]["counts"]) == 300


def test_plan_prints_histogram_and_table(cli, tmp_path):
    path = write_parquet(tmp_path / "a.parquet", make_samples(200, max_len=256))
    result = cli("plan", path, "-L", 256, "--strategy", "bfd")
    assert result.exit_code == 0, result.stderr
    assert "lengths of 200 samples" in result.stderr
    assert "Martello" in result.stderr and "bfd" in result.stderr
    assert "ffd" not in result.stderr
    assert result.stdout == ""


def test_plan_window_reports_its_cost(cli, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", make_samples(400, max_len=512))
    result = cli("plan", path, "-L", 512, "--window", 50, "--strategy", "ffd", "--json")
    assert result.exit_code == 0, result.stderr
    (entry,) = json.loads(result.stdout)["strategies"]
    assert entry["rows"] >= entry["global_rows"]
    assert entry["window_cost"] == round(entry["rows"] / entry["global_rows"] - 1, 6)


def test_plan_overlength_is_an_error_unless_resolved(cli, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", make_samples(100, median=100))
    result = cli("plan", path, "-L", 64)
    assert result.exit_code == 1
    assert "longer than --max-len 64" in result.stderr and "Traceback" not in result.stderr
    result = cli("plan", path, "-L", 64, "--overlength", "split", "--json")
    assert result.exit_code == 0, result.stderr


def test_plan_bad_options_are_one_line(cli, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", make_samples(10))
    for args, message in [
        (("--strategy", "best"), "unknown --strategy 'best'"),
        (("--window", 0), "--window must be at least 1"),
    ]:
        result = cli("plan", path, "-L", 512, *args)
        assert result.exit_code == 2
        assert message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_pack_accepts_every_strategy_and_window(cli, tmp_path):
    """`pack --window` reports the rows of one global plan and what the windows cost."""
    from packer.planning.strategies import plan

    samples = make_samples(120, max_len=256)
    lengths = [len(s["input_ids"]) for s in samples]
    path = write_jsonl(tmp_path / "a.jsonl", samples)
    for strategy in STRATEGIES:
        out = tmp_path / f"out-{strategy}"
        result = cli(
            "pack", path, "-L", 256, "--strategy", strategy, "--window", 40, "-o", out, "--json"
        )
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["samples_packed"] == 120
        assert report["rows"] == plan(lengths, 256, strategy, window=40).num_rows
        assert report["global_rows"] == plan(lengths, 256, strategy).num_rows
        assert report["window_cost"] == round(report["rows"] / report["global_rows"] - 1, 6)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["stats"]["window_cost"] == report["window_cost"]
    table = cli(
        "pack", path, "-L", 256, "--strategy", "nf", "--window", 40, "-o", tmp_path / "table"
    )
    assert "rows of one global plan" in table.stderr and "window cost" in table.stderr
    plain = cli("pack", path, "-L", 256, "-o", tmp_path / "plain", "--json")
    assert "global_rows" not in json.loads(plain.stdout)
