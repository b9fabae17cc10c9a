"""`packer plan --mix`: the mixture a pack would make (shares, repeats, rows), writing nothing."""

from __future__ import annotations

import json

from conftest import make_samples, write_jsonl


def test_plan_shows_the_mixture_pack_makes(cli, tmp_path):
    long = write_jsonl(tmp_path / "long.jsonl", make_samples(200, seed=7, median=120, max_len=400))
    short = write_jsonl(tmp_path / "short.jsonl", make_samples(200, seed=8, median=30))
    mix = ("--mix", f"{long}=3", "--mix", f"{short}=1", "--mix-tokens", "40000", "--seed", "2")
    before = sorted(p.name for p in tmp_path.iterdir())
    res = cli("plan", *mix, "-L", "512", "--strategy", "bfd", "--json")
    assert res.exit_code == 0, res.output
    planned = json.loads(res.stdout)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    res = cli("pack", *mix, "-L", "512", "-o", tmp_path / "out", "--json")
    assert res.exit_code == 0, res.output
    packed = json.loads(res.stdout)
    assert planned["mixture"] == packed["mixture"]
    assert planned["strategies"][0]["rows"] == packed["rows"]
    assert planned["tokens"] == packed["tokens"]
    first, second = planned["mixture"]["sources"]
    assert abs(first["tokens"] - 0.75 * 40000) <= 400 / 2  # half of its longest sample
    assert second["epochs"] == 1 and second["dropped"] == 0  # whole, then a subset
    text = cli("plan", *mix, "-L", "512", "--strategy", "bfd")
    assert text.exit_code == 0 and "sources" in text.output
    assert f"{second['share']:.4f}" in text.output and f"{second['tokens']:,}" in text.output


def test_plan_mix_refusals(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", make_samples(20, seed=1, median=10))
    for args, expected in (
        (["--mix", f"{data}=1", "--pairs"], "cannot be used with --pairs"),
        ([str(data), "--mix-tokens", "50"], "--mix-tokens sizes a mixture"),
        (["--mix", f"{data}=x"], "is not a number"),
    ):
        res = cli("plan", *args, "-L", "64")
        assert res.exit_code == 2 and expected in res.output, res.output
