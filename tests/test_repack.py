"""Packer outputs are never packed as samples by accident, and `--repack` undoes a packing.

A packed row read back as one sample is exactly the cross-contamination packing must prevent,
so these tests cover the layouts that lead there (output inside the input directory, an output
or one of its shards named as INPUT) and the one sanctioned way to read an output back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import make_samples, read_shards, write_jsonl, write_parquet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packer
from packer.errors import EXIT_USAGE


def shard_bytes(out: Path) -> list[bytes]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [(out / s["file"]).read_bytes() for s in manifest["shards"]]


def no_leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".packer-" in p.name]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", make_samples(120, seed=1))
    write_parquet(data / "b.parquet", make_samples(80, seed=2))
    return data


def test_output_inside_input_directory_is_skipped_on_rerun(cli, data_dir: Path):
    out = data_dir / "packed"
    first = cli("pack", data_dir, "-o", out, "-L", "512", "--json")
    assert first.exit_code == 0, first.output
    first_report = json.loads(first.stdout)
    first_bytes = shard_bytes(out)
    first_manifest = (out / "manifest.json").read_bytes()

    again = cli("pack", data_dir, "-o", out, "-L", "512", "--overwrite", "--json")
    assert again.exit_code == 0, again.output
    report = json.loads(again.stdout)
    assert report["samples_in"] == first_report["samples_in"] == 200
    assert report["tokens"] == first_report["tokens"]
    assert report["skipped_inputs"] == [str(out)]
    assert shard_bytes(out) == first_bytes
    assert (out / "manifest.json").read_bytes() == first_manifest


def test_other_packer_outputs_and_work_dirs_inside_an_input_directory_are_skipped(
    cli, data_dir: Path, tmp_path: Path
):
    nested = data_dir / "sub" / "old-pack"
    assert cli("pack", data_dir, "-o", nested, "-L", "512").exit_code == 0
    # a killed run's hidden temporary directory, holding a shard and a stray sample file
    work = data_dir / ".packed.packer-tmp-4242-deadbeef"
    work.mkdir()
    shutil.copy(nested / "shard-00000.arrow", work / "shard-00000.arrow")
    write_jsonl(work / "stray.jsonl", make_samples(5, seed=9))

    out = tmp_path / "out"
    result = cli("pack", data_dir, "-o", out, "-L", "512", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["samples_in"] == 200
    assert report["skipped_inputs"] == [str(nested)]
    files = [inp["path"] for inp in json.loads((out / "manifest.json").read_text())["inputs"]]
    assert files == [str(data_dir / "a.jsonl"), str(data_dir / "b.parquet")]

    # a recursive glob leaves them out the same way
    globbed = cli("pack", f"{data_dir}/**/*.*", "-o", tmp_path / "g", "-L", "512", "--json")
    assert globbed.exit_code == 0, globbed.output
    assert json.loads(globbed.stdout)["samples_in"] == 200
    assert shard_bytes(tmp_path / "g") == shard_bytes(out)


@pytest.mark.parametrize("named", ["dir", "shard", "glob", "loose copy"])
def test_a_packer_output_named_as_input_is_refused(cli, data_dir: Path, tmp_path: Path, named):
    packed = tmp_path / "packed"
    assert cli("pack", data_dir, "-o", packed, "-L", "512").exit_code == 0
    loose = tmp_path / "loose" / "rows.arrow"
    loose.parent.mkdir()
    shutil.copy(packed / "shard-00000.arrow", loose)
    arg = {
        "dir": packed,
        "shard": packed / "shard-00000.arrow",
        "glob": f"{packed}/*.arrow",
        "loose copy": loose,
    }[named]
    out = tmp_path / "out"
    result = cli("pack", arg, "-o", out, "-L", "1024")
    assert result.exit_code == EXIT_USAGE
    err = result.stderr.strip()
    assert err.count("\n") == 0, err
    assert "packer output" in err and "--repack" in err
    assert str(arg) in err
    assert not out.exists()
    assert no_leftovers(tmp_path) == []


def test_library_refuses_a_packer_output_by_default(data_dir: Path, tmp_path: Path):
    cfg = packer.PackConfig(max_len=512)
    packer.pack([data_dir], tmp_path / "p", cfg)
    with pytest.raises(packer.PackedInputError, match="packer output"):
        packer.pack([tmp_path / "p"], tmp_path / "q", cfg)
    assert not (tmp_path / "q").exists()


def unlabelled(samples: list[dict]) -> list[dict]:
    return [{"input_ids": s["input_ids"]} for s in samples]


def test_repack_split_output_to_longer_rows_matches_packing_the_original(cli, tmp_path: Path):
    src = write_jsonl(
        tmp_path / "src.jsonl", unlabelled(make_samples(300, seed=3, median=150, max_len=1000))
    )
    small, big, direct = tmp_path / "l256", tmp_path / "l1024", tmp_path / "direct"
    r = cli("pack", src, "-o", small, "-L", "256", "--overlength", "split", "--pad", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["split"] > 10  # the test needs split samples
    r = cli("pack", small, "-o", big, "-L", "1024", "--repack", "--json")
    assert r.exit_code == 0, r.output
    assert cli("pack", src, "-o", direct, "-L", "1024").exit_code == 0
    assert shard_bytes(big) == shard_bytes(direct)

    manifest = json.loads((big / "manifest.json").read_text())
    direct_manifest = json.loads((direct / "manifest.json").read_text())
    assert manifest["inputs"] == direct_manifest["inputs"]
    assert manifest["stats"] == direct_manifest["stats"]
    origin = manifest["repacked_from"]
    assert origin["path"] == str(small)
    assert origin["config"]["max_len"] == 256 and origin["config"]["pad"] is True
    assert origin["manifest"]["hash"] == packer.hashing.file_digest(small / "manifest.json")
    assert origin["samples"] == 300 and origin["samples_absent"] == 0

    # sample_index still points at the original file: verify checks against it
    v = cli("verify", big, "--input", src, "--rows", "1", "--json")
    assert v.exit_code == 0, v.output
    assert json.loads(v.stdout)["ok"] is True

    # a repack of a repack, back down to split rows
    again = tmp_path / "again"
    r = cli("pack", big, "-o", again, "-L", "256", "--overlength", "split", "--pad", "--repack")
    assert r.exit_code == 0, r.output
    assert shard_bytes(again) == shard_bytes(small)


def test_repack_keeps_labels_and_dropped_numbering(cli, tmp_path: Path):
    samples = make_samples(250, seed=5, median=60)
    src = write_parquet(tmp_path / "src.parquet", samples)
    first, re, direct = tmp_path / "first", tmp_path / "re", tmp_path / "direct"
    opts = ["-L", "128", "--overlength", "drop"]
    r = cli("pack", src, "-o", first, *opts, "--strategy", "ffd", "--json")
    assert r.exit_code == 0, r.output
    dropped = json.loads(r.stdout)["dropped"]
    assert dropped > 0
    assert cli("pack", first, "-o", re, *opts, "--repack").exit_code == 0
    assert cli("pack", src, "-o", direct, *opts).exit_code == 0
    assert shard_bytes(re) == shard_bytes(direct)
    origin = json.loads((re / "manifest.json").read_text())["repacked_from"]
    assert origin["samples_absent"] == dropped
    for extra in ([], ["--input", src]):  # the drops of the first pack are accounted for
        r = cli("verify", re, "--no-attention", *extra)
        assert r.exit_code == 0, r.output
    assert origin["absent"]["dropped"] == dropped and origin["absent"]["dropped_over"] == 128
    table = read_shards(re).to_pydict()
    # labels come back as they were in the source (the first of each sample is -100 anyway)
    for ids, labels, cu, sidx in zip(
        table["input_ids"], table["labels"], table["cu_seqlens"], table["sample_index"]
    ):
        for k, s in enumerate(sidx):
            a, b = cu[k], cu[k + 1]
            assert ids[a:b] == samples[s]["input_ids"]
            assert labels[a + 1 : b] == samples[s]["labels"][1:]


def test_repack_in_place(cli, tmp_path: Path):
    src = write_jsonl(tmp_path / "src.jsonl", make_samples(100, seed=7))
    out, direct = tmp_path / "out", tmp_path / "direct"
    assert cli("pack", src, "-o", out, "-L", "300", "--pad").exit_code == 0
    r = cli("pack", out, "-o", out, "-L", "900", "--repack", "--overwrite")
    assert r.exit_code == 0, r.output
    assert cli("pack", src, "-o", direct, "-L", "900").exit_code == 0
    assert shard_bytes(out) == shard_bytes(direct)
    assert no_leftovers(tmp_path) == []


def test_repack_restores_the_labels_at_split_points(cli, tmp_path: Path):
    samples = make_samples(200, seed=8, median=150, max_len=1000)
    src = write_jsonl(tmp_path / "src.jsonl", samples)
    small, big, direct = tmp_path / "small", tmp_path / "big", tmp_path / "direct"
    r = cli("pack", src, "-o", small, "-L", "128", "--overlength", "split", "--json")
    assert r.exit_code == 0, r.output
    manifest = json.loads((small / "manifest.json").read_text())
    entry = manifest["split_labels"]
    lines = [json.loads(x) for x in (small / entry["file"]).read_text().splitlines()]
    assert entry["count"] == len(lines) > 50
    for line in lines:  # the source label at every split point the rows overwrote with -100
        s, o = line["sample_index"], line["sample_offset"]
        assert o > 0 and o % 128 == 0
        assert line["label"] == samples[s]["labels"][o]
    assert any(line["label"] != -100 for line in lines)  # so the test can tell

    assert cli("pack", small, "-o", big, "-L", "1024", "--repack").exit_code == 0
    assert cli("pack", src, "-o", direct, "-L", "1024").exit_code == 0
    assert shard_bytes(big) == shard_bytes(direct)
    v = cli("verify", big, "--input", src, "--rows", "1", "--json")
    assert v.exit_code == 0, v.output


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_repack_refuses_split_labels_it_cannot_restore(cli, tmp_path: Path, damage: str):
    src = write_jsonl(tmp_path / "src.jsonl", make_samples(200, seed=8, median=150))
    small = tmp_path / "small"
    assert cli("pack", src, "-o", small, "-L", "128", "--overlength", "split").exit_code == 0
    labels_file = small / "split_labels.jsonl"
    if damage == "missing":  # an output written before packer kept these labels
        manifest = json.loads((small / "manifest.json").read_text())
        del manifest["split_labels"]
        (small / "manifest.json").write_text(json.dumps(manifest))
        labels_file.unlink()
    else:
        labels_file.write_text(labels_file.read_text().replace('"label": ', '"label": 1', 1))
    out = tmp_path / "out"
    r = cli("pack", small, "-o", out, "-L", "1024", "--repack")
    if damage == "missing":
        assert r.exit_code == EXIT_USAGE
        assert "split point" in r.stderr and "pack the original inputs" in r.stderr
    else:
        assert r.exit_code == 1 and "does not match its hash" in r.stderr
    assert not out.exists()
    assert no_leftovers(tmp_path) == []


def _tamper_one_token(shard: Path) -> None:
    """Change the first token of the first row in place: same size, one id different."""
    import numpy as np
    import pyarrow as pa

    with pa.memory_map(str(shard)) as src:
        first = pa.ipc.open_stream(src).read_next_batch().column("input_ids")[0].values
    ids = first.to_numpy()[:8].astype("<i4")
    data = bytearray(shard.read_bytes())
    at = data.find(ids.tobytes())
    assert at >= 0
    changed = ids.copy()
    changed[0] += 1
    data[at : at + 32] = changed.tobytes()
    shard.write_bytes(bytes(data))
    assert np.frombuffer(bytes(data[at : at + 32]), "<i4")[0] == ids[0] + 1


@pytest.mark.parametrize("damage", ["one-token", "truncated", "missing"])
def test_repack_of_a_corrupted_output_is_bad_data(cli, data_dir: Path, tmp_path: Path, damage):
    """A packer output whose shard changed after packing is bad input data: exit 1, not 2."""
    packed = tmp_path / "packed"
    assert cli("pack", data_dir / "a.jsonl", "-o", packed, "-L", "512").exit_code == 0
    manifest = json.loads((packed / "manifest.json").read_text())
    shard = packed / manifest["shards"][0]["file"]
    size = shard.stat().st_size
    if damage == "one-token":
        _tamper_one_token(shard)
        assert shard.stat().st_size == size
        why = "differs from manifest.json (changed after packing)"
    elif damage == "truncated":
        shard.write_bytes(shard.read_bytes()[: size // 2])
        why = f"{size // 2} bytes where manifest.json records {size}"
    else:
        shard.unlink()
        why = "listed in manifest.json but missing"
    out = tmp_path / "out"
    r = cli("pack", packed, "-o", out, "-L", "1024", "--repack")
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(shard) in lines[0] and why in lines[0], r.stderr
    assert "run `packer verify` on it" in lines[0]
    assert not out.exists()
    assert no_leftovers(tmp_path) == []
    with pytest.raises(packer.errors.InputError, match="manifest.json") as info:
        packer.pack([packed], out, packer.PackConfig(max_len=1024), repack=True)
    assert not isinstance(info.value, packer.errors.UsageError)


def test_repack_refuses_mixed_or_several_inputs(cli, data_dir: Path, tmp_path: Path):
    p1, p2 = tmp_path / "p1", tmp_path / "p2"
    assert cli("pack", data_dir / "a.jsonl", "-o", p1, "-L", "512").exit_code == 0
    assert cli("pack", data_dir / "b.parquet", "-o", p2, "-L", "512").exit_code == 0
    out = tmp_path / "out"
    mixed = cli("pack", p1, data_dir / "b.parquet", "-o", out, "-L", "512", "--repack")
    assert mixed.exit_code == EXIT_USAGE
    assert "number their samples twice" in mixed.stderr
    assert str(data_dir / "b.parquet") in mixed.stderr
    several = cli("pack", p1, p2, "-o", out, "-L", "512", "--repack")
    assert several.exit_code == EXIT_USAGE
    assert "one packer output" in several.stderr
    assert not out.exists()


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    lengths=st.lists(st.integers(1, 400), min_size=1, max_size=60),
    small=st.integers(16, 200),
    grow=st.integers(1, 4),
    pad=st.booleans(),
    strategy=st.sampled_from(["bfd", "ffd", "nf", "ff-shuffle"]),
    labelled=st.booleans(),
)
def test_repack_property_same_bytes_as_packing_the_original(
    tmp_path_factory, lengths, small, grow, pad, strategy, labelled
):
    tmp = tmp_path_factory.mktemp("prop")
    samples = [{"input_ids": [(i * 7 + j) % 997 for j in range(n)]} for i, n in enumerate(lengths)]
    if labelled:  # labels differ from the ids, -100 on every third token
        for s in samples:
            s["labels"] = [-100 if j % 3 == 0 else t + 1 for j, t in enumerate(s["input_ids"])]
    src = write_jsonl(tmp / "src.jsonl", samples)
    first = packer.pack(
        [src], tmp / "a", packer.PackConfig(max_len=small, overlength="split", pad=pad)
    )
    assert first.stats["samples_packed"] == len(lengths)
    big = packer.PackConfig(max_len=small * grow, overlength="split", strategy=strategy)
    packer.pack([tmp / "a"], tmp / "b", big, repack=True)
    packer.pack([src], tmp / "c", big)
    assert shard_bytes(tmp / "b") == shard_bytes(tmp / "c")


def test_split_labels_are_the_same_out_of_core(tmp_path: Path):
    src = write_parquet(tmp_path / "src.parquet", make_samples(300, seed=4, median=150))
    cfg = packer.PackConfig(max_len=100, overlength="split")
    packer.pack([src], tmp_path / "mem", cfg, out_of_core=False)
    packer.pack([src], tmp_path / "ooc", cfg, memory_budget="1MiB", out_of_core=True)
    mem = (tmp_path / "mem" / "split_labels.jsonl").read_bytes()
    assert mem and mem == (tmp_path / "ooc" / "split_labels.jsonl").read_bytes()
    assert (tmp_path / "mem" / "manifest.json").read_bytes() == (
        tmp_path / "ooc" / "manifest.json"
    ).read_bytes()


def test_block_pipeline_keeps_split_labels_like_one_plan(tmp_path: Path):
    """The block pipeline (the Ray engine's, run locally) records the same split labels, so
    its outputs re-pack the same way."""
    files = []
    for k in range(3):
        files.append(
            write_jsonl(tmp_path / f"s{k}.jsonl", make_samples(150, seed=20 + k, median=150))
        )
    cfg = packer.PackConfig(max_len=100, overlength="split")
    packer.pack(files, tmp_path / "one", cfg)
    blocks = packer.PackConfig(max_len=100, overlength="split", block_size=8192)
    result = packer.pack(files, tmp_path / "blocks", blocks)
    assert result.stats["blocks"] > 3
    one = (tmp_path / "one" / "split_labels.jsonl").read_bytes()
    assert one and one == (tmp_path / "blocks" / "split_labels.jsonl").read_bytes()
    big = packer.PackConfig(max_len=1000, overlength="split")
    packer.pack([tmp_path / "blocks"], tmp_path / "re", big, repack=True)
    packer.pack(files, tmp_path / "direct", big)
    assert shard_bytes(tmp_path / "re") == shard_bytes(tmp_path / "direct")
