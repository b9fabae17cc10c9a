"""`packer pack` end to end: every input format through the real CLI, every row checked."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import (
    make_samples,
    read_shards,
    write_arrow,
    write_jsonl,
    write_parquet,
)

import packer
from packer.contract.names import IGNORE_INDEX


def check_output(
    out: Path,
    samples: list[dict],
    max_len: int,
    overlength: str = "error",
    pad: bool = False,
    pad_id: int = 0,
) -> dict:
    """Check every row of an output against the source samples in plain Python."""
    manifest = json.loads((out / "manifest.json").read_text())
    table = read_shards(out).to_pydict()
    rows = len(table["input_ids"])
    seen: dict[int, list[tuple[int, list[int], list[int]]]] = {}
    loss_total = 0
    for r in range(rows):
        ids, labels, pos = table["input_ids"][r], table["labels"][r], table["position_ids"][r]
        cu, sidx, soff = table["cu_seqlens"][r], table["sample_index"][r], table["sample_offset"][r]
        assert len(ids) == len(labels) == len(pos) <= max_len
        if pad:
            assert len(ids) == max_len
        assert cu[0] == 0 and cu[-1] == len(ids)
        assert all(b > a for a, b in zip(cu, cu[1:])), "cu_seqlens must be strictly increasing"
        n_samples = len(sidx)
        assert len(soff) == n_samples
        # one segment per sample, plus one final padding segment when the row is padded
        has_pad_segment = len(cu) - 1 == n_samples + 1
        assert len(cu) - 1 == n_samples or (pad and has_pad_segment)
        for k in range(len(cu) - 1):
            a, b = cu[k], cu[k + 1]
            assert pos[a:b] == list(range(b - a)), "positions restart at 0 in every segment"
            assert labels[a] == IGNORE_INDEX, "the first label of every segment is -100"
            if k == n_samples:  # padding
                assert ids[a:b] == [pad_id] * (b - a)
                assert labels[a:b] == [IGNORE_INDEX] * (b - a)
                continue
            src = samples[sidx[k]]
            src_ids = src["input_ids"][soff[k] : soff[k] + (b - a)]
            assert ids[a:b] == src_ids, "tokens equal the source tokens"
            src_labels = src.get("labels", src["input_ids"])[soff[k] : soff[k] + (b - a)]
            assert labels[a + 1 : b] == src_labels[1:], "labels are the source's, first masked"
            seen.setdefault(sidx[k], []).append((soff[k], ids[a:b], labels[a:b]))
        loss = sum(1 for x in labels if x != IGNORE_INDEX)
        assert table["num_loss_tokens"][r] == loss
        loss_total += loss

    stats = manifest["stats"]
    dropped = 0
    for i, s in enumerate(samples):
        n = len(s["input_ids"])
        if n > max_len and overlength == "drop":
            assert i not in seen, "a dropped sample must not appear"
            dropped += 1
            continue
        assert i in seen, f"sample {i} is missing from the output"
        pieces = sorted(seen[i])
        if n > max_len and overlength == "truncate":
            assert len(pieces) == 1 and len(pieces[0][1]) == max_len
        elif n > max_len and overlength == "split":
            assert [p[0] for p in pieces] == list(range(0, n, max_len))
            assert sum((p[1] for p in pieces), []) == s["input_ids"]
        else:
            assert len(pieces) == 1 and pieces[0][1] == s["input_ids"], f"sample {i} exactly once"
    tokens = sum(len(x) for x in table["input_ids"]) - stats["pad_tokens"]
    assert stats["samples_in"] == len(samples)
    assert stats["dropped"] == dropped
    assert stats["samples_packed"] == len(samples) - dropped
    assert stats["tokens"] == tokens
    assert stats["rows"] == rows == sum(s["rows"] for s in manifest["shards"])
    assert stats["loss_tokens"] == loss_total
    assert stats["lower_bound"] == math.ceil(tokens / max_len)
    assert stats["rows"] >= stats["lower_bound"]
    return manifest


@pytest.fixture
def samples():
    return make_samples(300, seed=1, median=50)


FORMATS = {
    "jsonl": lambda d, s: write_jsonl(d / "data.jsonl", s),
    "jsonl.gz": lambda d, s: write_jsonl(d / "data.jsonl.gz", s, compress="gzip"),
    "jsonl.zst": lambda d, s: write_jsonl(d / "data.jsonl.zst", s, compress="zstd"),
    "parquet": lambda d, s: write_parquet(d / "data.parquet", s),
    "parquet-int64": lambda d, s: write_parquet(d / "data.parquet", s, int_type=pa.int64()),
    "arrow-file": lambda d, s: write_arrow(d / "data.arrow", s),
    "arrow-stream": lambda d, s: write_arrow(d / "data.arrow", s, stream=True),
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_each_format(tmp_path, cli, samples, fmt):
    src = FORMATS[fmt](tmp_path, samples)
    out = tmp_path / "out"
    result = cli("pack", src, "--output", out, "--max-len", 256, "--overlength", "split")
    assert result.exit_code == 0, result.output
    manifest = check_output(out, samples, 256, "split")
    assert manifest["inputs"][0]["path"] == str(src)
    assert manifest["stats"]["rows"] <= manifest["stats"]["lower_bound"] + 1


def test_directory_and_glob_of_shards_keep_global_order(tmp_path, cli, samples):
    shards = tmp_path / "shards"
    shards.mkdir()
    # written out of name order; packer must read them sorted by name
    write_parquet(shards / "part-2.parquet", samples[200:])
    write_jsonl(shards / "part-0.jsonl", samples[:100])
    write_parquet(shards / "part-1.parquet", samples[100:200])
    (shards / "README.txt").write_text("not data")
    for i, spec in enumerate([shards, f"{shards}/part-*"]):
        out = tmp_path / f"out{i}"
        result = cli("pack", spec, "--output", out, "--max-len", 512, "--overlength", "split")
        assert result.exit_code == 0, result.output
        manifest = check_output(out, samples, 512, "split")
        assert [Path(x["path"]).name for x in manifest["inputs"]] == [
            "part-0.jsonl",
            "part-1.parquet",
            "part-2.parquet",
        ]
        assert [x["first_index"] for x in manifest["inputs"]] == [0, 100, 200]


@pytest.mark.parametrize("overlength", ["drop", "truncate", "split"])
def test_overlength_policies_count_every_sample(tmp_path, cli, overlength):
    samples = make_samples(120, seed=3, median=40)
    samples[5]["input_ids"] = list(range(300))
    samples[5]["labels"] = list(range(300))
    samples[77]["input_ids"] = list(range(1, 129))  # exactly 2 rows worth at L=64
    samples[77]["labels"] = list(range(1, 129))
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    long = sum(len(s["input_ids"]) > 64 for s in samples)
    out = tmp_path / "out"
    result = cli("pack", src, "-o", out, "--max-len", 64, "--overlength", overlength, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    check_output(out, samples, 64, overlength)
    assert (
        report[{"drop": "dropped", "truncate": "truncated", "split": "split"}[overlength]] == long
    )
    assert report["samples_in"] == 120


def test_overlength_error_is_the_default_and_names_the_sample(tmp_path, cli):
    samples = make_samples(50, seed=4, median=20, max_len=60)
    samples[17]["input_ids"] = list(range(100))
    samples[17]["labels"] = list(range(100))
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    result = cli("pack", src, "-o", tmp_path / "out", "--max-len", 64)
    assert result.exit_code == 1
    assert "line 18" in result.stderr and "--overlength" in result.stderr
    assert not (tmp_path / "out").exists()


def test_samples_without_labels_use_input_ids(tmp_path, cli):
    samples = make_samples(80, seed=5, median=30, with_labels=False)
    src = write_parquet(tmp_path / "d.parquet", samples)
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", 128, "--overlength", "split").exit_code == 0
    manifest = check_output(out, samples, 128, "split")
    assert manifest["inputs"][0]["has_labels"] is False
    # every token but the first of each sample is a target
    assert (
        manifest["stats"]["loss_tokens"]
        == manifest["stats"]["tokens"] - manifest["stats"]["segments"]
    )


def test_padding_is_a_final_segment(tmp_path, cli, samples):
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    out = tmp_path / "out"
    result = cli(
        "pack", src, "-o", out, "-L", 200, "--overlength", "split", "--pad", "--pad-id", 7, "--json"
    )
    assert result.exit_code == 0, result.output
    manifest = check_output(out, samples, 200, "split", pad=True, pad_id=7)
    stats = manifest["stats"]
    assert stats["pad_tokens"] == stats["rows"] * 200 - stats["tokens"]


def test_json_report_fields(tmp_path, cli, samples):
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    result = cli("pack", src, "-o", tmp_path / "out", "-L", 256, "--overlength", "split", "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    for key in [
        "samples_in",
        "samples_packed",
        "dropped",
        "truncated",
        "split",
        "tokens",
        "rows",
        "lower_bound",
        "efficiency",
        "seconds",
        "shards",
    ]:
        assert key in report
    assert 0.9 < report["efficiency"] <= 1.0
    assert report["efficiency"] == pytest.approx(
        report["tokens"] / (report["rows"] * 256), abs=1e-6
    )


def test_human_report_goes_to_stderr(tmp_path, cli, samples):
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    result = cli("pack", src, "-o", tmp_path / "out", "-L", 256, "--overlength", "split")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "lower bound" in result.stderr and "efficiency" in result.stderr


def test_shards_are_deterministic_and_sharded(tmp_path, cli, samples):
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    outs = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        result = cli("pack", src, "-o", out, "-L", 128, "--overlength", "split", "--shard-rows", 10)
        assert result.exit_code == 0
        outs.append(out)
    files = sorted(p.name for p in outs[0].iterdir())
    assert len(files) > 3 and files == sorted(p.name for p in outs[1].iterdir())
    for name in files:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    manifest = json.loads((outs[0] / "manifest.json").read_text())
    assert all(s["rows"] <= 10 for s in manifest["shards"])
    import xxhash

    for s in manifest["shards"]:
        assert xxhash.xxh3_128((outs[0] / s["file"]).read_bytes()).hexdigest() == s["xxh3_128"]
        assert "sha256" not in s
        assert (outs[0] / s["file"]).stat().st_size == s["bytes"]


def test_hash_sha256(tmp_path, cli, samples):
    """`--hash sha256` records sha256 digests that `sha256sum` would print, and verify checks them."""
    import hashlib

    src = write_jsonl(tmp_path / "in.jsonl", samples)
    out = tmp_path / "out"
    result = cli(
        "pack",
        str(src),
        "-o",
        str(out),
        "-L",
        "64",
        "--overlength",
        "split",
        "--shard-rows",
        "10",
        "--hash",
        "sha256",
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["hash"] == "sha256"
    for s in manifest["shards"]:
        assert hashlib.sha256((out / s["file"]).read_bytes()).hexdigest() == s["sha256"]
        assert "xxh3_128" not in s
    assert cli("verify", str(out), "--rows", "1").exit_code == 0
    shard = out / manifest["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[-100] ^= 1  # a flipped bit in the last buffer
    shard.write_bytes(bytes(data))
    result = cli("verify", str(out), "--rows", "1")
    assert result.exit_code == 1
    assert f"{shard.name}: sha256 differs from the manifest" in result.output


def test_unknown_hash_is_a_usage_error(tmp_path, cli, samples):
    src = write_jsonl(tmp_path / "in.jsonl", samples)
    result = cli("pack", str(src), "-o", str(tmp_path / "out"), "-L", "64", "--hash", "md5")
    assert result.exit_code == 2
    assert "unknown --hash 'md5' (choose from xxh3_128, sha256)" in result.output
    assert not (tmp_path / "out").exists()


def test_shards_load_with_datasets(tmp_path, cli, samples):
    datasets = pytest.importorskip("datasets")
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    out = tmp_path / "out"
    assert (
        cli(
            "pack", src, "-o", out, "-L", 128, "--overlength", "split", "--shard-rows", 20
        ).exit_code
        == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    files = [str(out / s["file"]) for s in manifest["shards"]]
    first = datasets.Dataset.from_file(files[0])
    assert first.num_rows == manifest["shards"][0]["rows"]
    assert first[0]["cu_seqlens"][0] == 0
    loaded = datasets.load_dataset("arrow", data_files=files, split="train")
    assert loaded.num_rows == manifest["stats"]["rows"]
    expected = read_shards(out)
    assert loaded.column_names == expected.column_names
    assert loaded["input_ids"][:5] == expected.column("input_ids").to_pylist()[:5]


def test_config_preset_and_flag_override(tmp_path, cli, samples):
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    cfg = tmp_path / "preset.yaml"
    cfg.write_text("max_len: 512\noverlength: split\npad: true\npad_id: 3\n")
    out = tmp_path / "out"
    result = cli("pack", src, "-o", out, "--config", cfg, "--max-len", 256, "--no-pad")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["max_len"] == 256  # flag wins
    assert manifest["config"]["pad"] is False  # flag wins
    assert manifest["config"]["pad_id"] == 3  # from the preset
    assert manifest["config"]["overlength"] == "split"


@pytest.mark.parametrize("preset", sorted(Path(__file__).parent.parent.glob("configs/*.yaml")))
def test_bundled_presets_load(tmp_path, cli, samples, preset):
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    result = cli("pack", src, "-o", tmp_path / "out", "--config", preset, "--json")
    assert result.exit_code == 0, result.output


def test_existing_output_needs_overwrite(tmp_path, cli, samples):
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", 256, "--overlength", "split").exit_code == 0
    before = (out / "manifest.json").read_bytes()
    result = cli("pack", src, "-o", out, "-L", 128, "--overlength", "split")
    assert result.exit_code != 0 and "--overwrite" in result.stderr
    assert (out / "manifest.json").read_bytes() == before
    assert (
        cli("pack", src, "-o", out, "-L", 128, "--overlength", "split", "--overwrite").exit_code
        == 0
    )
    assert json.loads((out / "manifest.json").read_text())["config"]["max_len"] == 128
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_library_api_matches_cli(tmp_path, cli):
    samples = make_samples(300, seed=1, median=50, max_len=256)
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    result = packer.pack([src], tmp_path / "lib", packer.PackConfig(max_len=256))
    assert cli("pack", src, "-o", tmp_path / "cli", "-L", 256).exit_code == 0
    for shard in result.shards:
        assert (tmp_path / "lib" / shard["file"]).read_bytes() == (
            tmp_path / "cli" / shard["file"]
        ).read_bytes()
    lengths = np.array([len(s["input_ids"]) for s in samples])
    assert packer.plan(lengths, 256).num_rows == result.stats["rows"]
    assert packer.lower_bound(lengths.sum(), 256) == result.stats["lower_bound"]


def test_missing_parent_directories_are_created(tmp_path, cli, samples):
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    out = tmp_path / "a" / "b" / "out"
    result = cli("pack", src, "-o", out, "-L", 256, "--overlength", "split")
    assert result.exit_code == 0, result.output
    check_output(out, samples, 256, "split")


def test_skipped_samples_show_in_the_human_report(tmp_path, cli, samples):
    bad = samples[:10] + [{"input_ids": []}] + samples[10:]
    src = write_jsonl(tmp_path / "d.jsonl", bad)
    result = cli(
        "pack",
        src,
        "-o",
        tmp_path / "out",
        "-L",
        256,
        "--overlength",
        "split",
        "--on-error",
        "skip",
    )
    assert result.exit_code == 0, result.output
    assert "rejected: empty" in result.stderr


@pytest.mark.parametrize("extra", [[], ["--block-size", "1KiB"]])
def test_split_pieces_and_their_cost_in_the_table(tmp_path, cli, extra):
    lengths = [10, 3, 7, 1, 9]
    samples = [{"input_ids": list(range(1, n + 1))} for n in lengths]
    path = write_jsonl(tmp_path / "a.jsonl", samples)
    args = ["pack", path, "-o", tmp_path / "out", "-L", 4, "--overlength", "split", *extra]
    result = cli(*args)
    assert result.exit_code == 0, result.stderr
    split = [n for n in lengths if n > 4]
    pieces = sum(math.ceil(n / 4) for n in split)  # 3 + 2 + 3
    assert f"│ split │ {len(split)} into {pieces} pieces │" in " ".join(result.stderr.split())
    table = read_shards(tmp_path / "out")
    assert table.column("sample_index").combine_chunks().flatten().to_pylist().count(0) == 3
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: the continuation pieces of split samples start without their prompt context and "
        "their first label is masked (-100); --overlength truncate or drop avoids it"
    ]
    kept = cli(*args[:6], "--overlength", "truncate", "--overwrite", *extra)
    assert kept.exit_code == 0, kept.stderr
    assert "│ split │ 0 │" in " ".join(kept.stderr.split()) and "note:" not in kept.stderr
