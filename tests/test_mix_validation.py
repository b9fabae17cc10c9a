"""`packer pack --validation-split`: a held-out output per source, by seed, before mixing;
disjoint from the training output by provenance (sample_source, sample_index)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_samples, read_shards, write_jsonl

from packer.verify import verify

MAX_LEN = 256


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("split")
    long = write_jsonl(root / "long.jsonl", make_samples(200, seed=4, median=100, max_len=250))
    short = write_jsonl(root / "short.jsonl", make_samples(200, seed=5, median=25))
    return long, short


def samples_of(out: Path) -> set[tuple[int, int]]:
    """(source, sample_index) of every first piece in an output."""
    table = read_shards(out)
    source = np.concatenate(table.column("sample_source").to_numpy())
    index = np.concatenate(table.column("sample_index").to_numpy())
    offset = np.concatenate(table.column("sample_offset").to_numpy())
    first = offset == 0
    return set(zip(source[first].tolist(), index[first].tolist()))


def pack(cli, out: Path, *args):
    return cli("pack", *args, "-o", out, "-L", MAX_LEN, "--json")


def test_split_five_percent_disjoint(cli, sources, tmp_path):
    long, short = sources
    out = tmp_path / "train"
    res = pack(cli, out, "--mix", f"{long}=1", "--mix", f"{short}=1", "--validation-split", "0.05")
    assert res.exit_code == 0, res.output
    held = tmp_path / "train-validation"  # the default: a sibling
    train, validation = samples_of(out), samples_of(held)
    assert not train & validation
    for s in (0, 1):  # 5% of each source's 200 samples
        assert sum(1 for src, _ in validation if src == s) == 10
    report = json.loads(res.stdout)["mixture"]
    assert [s["held_out"] for s in report["sources"]] == [10, 10]
    # the short source's training part is used whole: 190 samples, once each
    assert sum(1 for src, _ in train if src == 1) == 190
    manifest = json.loads((out / "manifest.json").read_text())
    vmanifest = json.loads((held / "manifest.json").read_text())
    assert manifest["mixture"]["validation"] == {"output": str(held), "split": 0.05, "seed": 0}
    assert vmanifest["mixture"]["validation_split"] == 0.05
    assert vmanifest["mixture"]["validation_of"] == str(out)
    assert [s["samples"] for s in vmanifest["mixture"]["sources"]] == [10, 10]
    assert verify(out, attention=False).ok and verify(held, attention=False).ok


def test_split_by_count_on_a_plain_input(cli, sources, tmp_path):
    long, _ = sources
    out = tmp_path / "plain"
    dest = tmp_path / "held" / "out"
    res = pack(cli, out, long, "--validation-split", "7", "--validation-output", dest)
    assert res.exit_code == 0, res.output
    train, validation = samples_of(out), samples_of(dest)
    assert len(validation) == 7 and len(train) == 193 and not train & validation
    assert {i for _, i in train | validation} == set(range(200))  # every sample, once
    assert json.loads(res.stdout)["samples_packed"] == 193
    assert verify(dest, attention=False).ok


def test_same_seed_same_split(cli, sources, tmp_path):
    long, short = sources
    args = ("--mix", f"{long}=1", "--mix", f"{short}=2", "--validation-split", "0.1")
    for name in ("a", "b"):
        assert pack(cli, tmp_path / name, *args, "--seed", "5").exit_code == 0
    assert samples_of(tmp_path / "a-validation") == samples_of(tmp_path / "b-validation")
    assert pack(cli, tmp_path / "c", *args, "--seed", "6").exit_code == 0
    assert samples_of(tmp_path / "a-validation") != samples_of(tmp_path / "c-validation")


def test_existing_validation_output_refused_up_front(cli, sources, tmp_path):
    long, short = sources
    out = tmp_path / "run"
    (tmp_path / "run-validation").mkdir()
    (tmp_path / "run-validation" / "keep.txt").write_text("mine")
    res = pack(cli, out, long, "--validation-split", "0.05")
    assert res.exit_code == 2 and "run-validation" in res.output
    assert not out.exists() and (tmp_path / "run-validation" / "keep.txt").exists()
    # a packer output there is replaced with --overwrite, the training output too
    (tmp_path / "run-validation" / "keep.txt").unlink()
    (tmp_path / "run-validation").rmdir()
    assert pack(cli, out, long, "--validation-split", "0.05").exit_code == 0
    first = samples_of(tmp_path / "run-validation")
    res = pack(cli, out, long, "--validation-split", "0.05", "--seed", "1")
    assert res.exit_code == 2 and "exists" in res.output
    res = pack(cli, out, long, "--validation-split", "0.05", "--seed", "1", "--overwrite")
    assert res.exit_code == 0, res.output
    assert samples_of(tmp_path / "run-validation") != first


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--validation-split", "0"], "--validation-split must be a count of at least 1"),
        (["--validation-split", "1.5"], "--validation-split must be a fraction in (0, 1)"),
        (["--validation-split", "abc"], "--validation-split must be a fraction in (0, 1)"),
        (["--validation-split", "200"], "leaving none to train on"),
        (["--validation-output", "x"], "--validation-output is where --validation-split"),
        (["--validation-split", "2", "--validation-output", "{out}/v"], "must be apart"),
        (["--validation-split", "2", "--validation-output", "{out}"], "must be apart"),
    ],
)
def test_bad_split_refused(cli, sources, tmp_path, extra, expected):
    long, _ = sources
    out = tmp_path / "o"
    extra = [a.format(out=out) for a in extra]
    res = cli("pack", long, *extra, "-o", out, "-L", MAX_LEN)
    assert res.exit_code == 2, res.output
    assert expected in res.output and len(res.output.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "o-validation").exists()


def test_repack_refuses_a_mixture_output(cli, sources, tmp_path):
    long, short = sources
    out = tmp_path / "mixed"
    res = pack(cli, out, "--mix", f"{long}=1", "--mix", f"{short}=1", "--validation-split", "3")
    assert res.exit_code == 0, res.output
    for packed in (out, tmp_path / "mixed-validation"):
        res = cli("pack", packed, "--repack", "-o", tmp_path / "again", "-L", MAX_LEN)
        assert res.exit_code == 2 and "repeated or left out by design" in res.output
        assert len(res.output.strip().splitlines()) == 1


def test_a_mixtures_manifest_packs_again_as_it_was(cli, sources, tmp_path):
    long, short = sources
    first = tmp_path / "first"
    args = ("--mix", f"{long}=1", "--mix", f"{short}=3", "--mix-tokens", "20000")
    assert pack(cli, first, *args, "--validation-split", "0.1", "--seed", "4").exit_code == 0
    again = tmp_path / "again"
    res = cli("pack", "-c", first / "manifest.json", "-o", again, "--json")
    assert res.exit_code == 0, res.output
    for a, b in ((first, again), (tmp_path / "first-validation", tmp_path / "again-validation")):
        shards = [json.loads((d / "manifest.json").read_text())["shards"] for d in (a, b)]
        assert [s["xxh3_128"] for s in shards[0]] == [s["xxh3_128"] for s in shards[1]]
    # a validation output's manifest names no mixture to make: INPUT or --mix is needed
    res = cli("pack", "-c", tmp_path / "first-validation" / "manifest.json", "-o", tmp_path / "x")
    assert res.exit_code == 2 and "missing INPUT" in res.output


def test_per_dataset_columns_and_labels(cli, tmp_path):
    """A config's datasets read each with its own columns; a source without labels trains
    every token but each sample's first, next to one whose labels mask a prompt."""
    sft = [
        {"tokens": s["input_ids"], "mask": s["labels"]}
        for s in make_samples(60, seed=9, max_len=200)
    ]
    write_jsonl(tmp_path / "sft.jsonl", sft)
    text = make_samples(60, seed=10, max_len=200, with_labels=False)
    write_jsonl(tmp_path / "text.jsonl", text)
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(
        f"max_len: {MAX_LEN}\ndatasets:\n"
        f"  - {{path: {tmp_path}/sft.jsonl, weight: 1, input_column: tokens, labels_column: mask}}\n"
        f"  - {{path: {tmp_path}/text.jsonl, weight: 1}}\n"
    )
    out = tmp_path / "out"
    res = cli("pack", "-c", cfg, "-o", out, "--row-order", "plan", "--json")
    assert res.exit_code == 0, res.output
    table = read_shards(out).to_pylist()
    seen = set()
    for row in table:
        cu, sources, index = row["cu_seqlens"], row["sample_source"], row["sample_index"]
        for k, (source, i) in enumerate(zip(sources, index)):
            labels = row["labels"][cu[k] : cu[k + 1]]
            ids = row["input_ids"][cu[k] : cu[k + 1]]
            want = sft[i]["mask"] if source == 0 else text[i - 60]["input_ids"]
            assert ids == (sft[i]["tokens"] if source == 0 else want)
            assert labels == [-100] + want[1:]
            seen.add(source)
    assert seen == {0, 1}
    assert verify(out, attention=False).ok
    cfg.write_text(cfg.read_text().replace("labels_column: mask", "labels_column: nope"))
    res = cli("pack", "-c", cfg, "-o", tmp_path / "never")
    assert res.exit_code == 2 and "labels_column" in res.output and "nope" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_export_writes_the_validation_output_too(cli, sources, tmp_path):
    long, short = sources
    out = tmp_path / "train"
    args = ("--mix", f"{long}=1", "--mix", f"{short}=1", "--validation-split", "0.05")
    res = pack(cli, out, *args, "--export", "megatron-bridge")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["export"]["output"] == str(tmp_path / "train-megatron-bridge")
    held = tmp_path / "train-validation-megatron-bridge"
    assert report["validation_export"]["output"] == str(held)
    assert any(held.iterdir()) and any((tmp_path / "train-megatron-bridge").iterdir())
    # refused up front when the validation export's destination exists
    res = pack(cli, tmp_path / "again", *args, "--export", "trl")
    assert res.exit_code == 0, res.output
    (tmp_path / "third-validation-trl").mkdir()
    res = pack(cli, tmp_path / "third", *args, "--export", "trl")
    assert res.exit_code == 2 and "third-validation-trl" in res.output
    assert not (tmp_path / "third").exists()
