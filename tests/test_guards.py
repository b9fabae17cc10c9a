"""Input guards: refused up front in one line, and names that are no glob patterns."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from packer.cli import app

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample.jsonl.gz"
runner = CliRunner()


def test_negative_pad_id_refused_by_cli(tmp_path):
    out = tmp_path / "out"
    res = runner.invoke(
        app, ["pack", str(SAMPLE), "-o", str(out), "-L", "512", "--pad", "--pad-id", "-1"]
    )
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --pad-id -1"), res.output
    assert not out.exists()


def test_negative_pad_id_refused_by_library(tmp_path):
    from packer import pack_dataset
    from packer.errors import PackerError

    with pytest.raises(PackerError, match="pad"):
        pack_dataset([[1, 2, 3]], 8, pad=True, pad_id=-1)


def test_stale_temp_dir_of_glob_named_output_is_removed(tmp_path):
    out = tmp_path / "run[1]"
    stale = tmp_path / ".run[1].packer-tmp-999999999-deadbeef"
    stale.mkdir()
    (stale / "shard-00000.arrow").write_bytes(b"half")
    res = runner.invoke(
        app, ["pack", str(SAMPLE), "-o", str(out), "-L", "512", "--overlength", "truncate"]
    )
    assert res.exit_code == 0, res.output
    assert (out / "manifest.json").exists()
    assert not stale.exists()
    assert not [p for p in tmp_path.iterdir() if ".packer-tmp-" in p.name]


def test_numpy_integers_are_integers():
    import numpy as np

    from packer import pack_dataset

    data = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    got = pack_dataset(data, np.int64(8), seed=np.int32(1), pad=True, pad_id=np.int16(3))
    want = pack_dataset(data, 8, seed=1, pad=True, pad_id=3)
    assert got.to_pydict() == want.to_pydict()


def test_same_column_for_ids_and_labels_refused(tmp_path):
    from packer import pack_dataset
    from packer.errors import PackerError

    with pytest.raises(PackerError, match="labels"):
        pack_dataset([[1, 2, 3]], 8, input_column="input_ids", labels_column="input_ids")
    res = runner.invoke(
        app,
        ["pack", str(SAMPLE), "-o", str(tmp_path / "o"), "-L", "512"]
        + ["--input-column", "input_ids", "--labels-column", "input_ids"],
    )
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: --labels-column 'input_ids'"), res.output


def test_manifest_as_config_packs_the_same_bytes(tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    flags = ["-L", "700", "--overlength", "split", "--pad", "--pad-id", "5", "--seed", "3"]
    res = runner.invoke(app, ["pack", str(SAMPLE), "-o", str(first), *flags])
    assert res.exit_code == 0, res.output
    config = ["--config", str(first / "manifest.json")]
    res = runner.invoke(app, ["pack", str(SAMPLE), "-o", str(again), *config])
    assert res.exit_code == 0, res.output
    shards = sorted(p.name for p in first.glob("shard-*.arrow"))
    assert shards and shards == sorted(p.name for p in again.glob("shard-*.arrow"))
    for name in shards:
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    # a flag on the command line still wins over the manifest
    other = tmp_path / "other"
    res = runner.invoke(app, ["pack", str(SAMPLE), "-o", str(other), *config, "--pad-id", "6"])
    assert res.exit_code == 0, res.output
    assert json.loads((other / "manifest.json").read_text())["config"]["pad_id"] == 6


def test_library_errors_name_the_parameter_and_the_cli_the_flag(tmp_path):
    """One check, two spellings: `max_len` for a Python caller, `--max-len` on the command line."""
    import packer
    from packer.errors import PackerError
    from packer.verify import verify

    out = tmp_path / "out"
    assert runner.invoke(app, ["pack", str(SAMPLE), "-o", str(out), "-L", "4096"]).exit_code == 0
    src = tmp_path / "x.jsonl"
    src.write_text('{"input_ids": [1, 2, 3]}\n')
    library = [
        (lambda: packer.plan([1, 2], 0), "max_len must be at least 1, got 0"),
        (
            lambda: packer.pack([src], tmp_path / "o", packer.PackConfig(max_len=2)),
            "longer than max_len 2",
        ),
        (
            lambda: packer.pack([src], tmp_path / "o", packer.PackConfig(max_len=8, seed=-1)),
            "seed must be at least 0, got -1",
        ),
        (
            lambda: packer.pack(
                [out, out], tmp_path / "o", packer.PackConfig(max_len=8), repack=True
            ),
            "repack=True takes one packer output, got 2",
        ),
        (lambda: packer.pack([out], tmp_path / "o", packer.PackConfig(max_len=8)), "inputs is"),
        (lambda: verify(out, rows=0), "rows must be a positive integer or 'all', got 0"),
        (lambda: verify(out, seed=-1), "seed must be at least 0, got -1"),
        (
            lambda: verify(out, attention=False, model_check=True),
            "attention=False runs the structural checks alone; drop it to use model_check",
        ),
        (lambda: verify(out, backend="fast"), "unknown backend 'fast'"),
    ]
    for call, words in library:
        with pytest.raises(PackerError) as info:
            call()
        assert words in str(info.value), str(info.value)
        assert "--" not in str(info.value), str(info.value)
    cli = [
        (["plan", str(SAMPLE), "-L", "0"], "--max-len must be at least 1, got 0"),
        (["pack", str(src), "-o", str(tmp_path / "o"), "-L", "2"], "longer than --max-len 2"),
        (["pack", str(out), "-o", str(tmp_path / "o"), "-L", "8"], "INPUT is a packer output"),
        (["verify", str(out), "--rows", "0"], "--rows must be a positive integer or 'all'"),
        (["verify", str(out), "--seed", "-1"], "--seed must be at least 0, got -1"),
        (
            ["verify", str(out), "--no-attention", "--model-check"],
            "--no-attention runs the structural checks alone; drop it to use --model-check",
        ),
    ]
    for args, words in cli:
        res = runner.invoke(app, args)
        assert res.exit_code == (1 if "longer" in words else 2), (args, res.output)
        assert words in res.output, (args, res.output)


def test_pack_checks_its_own_arguments(tmp_path):
    """`packer.pack` refuses a wrong argument in one line that names the parameter, and takes
    one path as well as a list (a str is not read as a sequence of one-letter paths)."""
    import packer
    from packer.errors import PackerError

    src = tmp_path / "x.jsonl"
    src.write_text('{"input_ids": [1, 2, 3]}\n')
    cfg = packer.PackConfig(max_len=8)
    existing = tmp_path / "existing"
    assert packer.pack(str(src), existing, cfg).stats["samples_packed"] == 1
    assert packer.pack(src, tmp_path / "path", cfg).stats["samples_packed"] == 1
    bad = [
        (lambda: packer.pack([src], tmp_path / "o", {"max_len": 8}), "config must be a PackConfig"),
        (lambda: packer.pack([src], None, cfg), "output_dir must be a path, got None"),
        (lambda: packer.pack([src], tmp_path / "o", cfg, workers=0), "workers must be at least 1"),
        (
            lambda: packer.pack([src], tmp_path / "o", cfg, workers=1.5),
            "workers must be an integer",
        ),
        (
            lambda: packer.pack([src], tmp_path / "o", cfg, overwrite="yes"),
            "overwrite must be True",
        ),
        (lambda: packer.pack([src], existing, cfg), "pass overwrite=True to replace it"),
        (
            lambda: packer.pack([existing], tmp_path / "o", replace_cfg(cfg), repack=True),
            "repack=True runs on the local engine with one global plan (no block_size)",
        ),
    ]
    for call, words in bad:
        with pytest.raises(PackerError) as info:
            call()
        assert words in str(info.value), str(info.value)
        assert "--" not in str(info.value), str(info.value)
    assert not (tmp_path / "o").exists()
    res = runner.invoke(app, ["pack", str(src), "-o", str(existing), "-L", "8"])
    assert res.exit_code == 2 and "pass --overwrite to replace it" in res.output, res.output
    res = runner.invoke(
        app,
        [
            "pack",
            str(existing),
            "-o",
            str(tmp_path / "o"),
            "-L",
            "8",
            "--repack",
            "--block-size",
            "1MiB",
        ],
    )
    assert "--repack runs on the local engine with one global plan (no --block-size)" in res.output


def replace_cfg(cfg):
    from dataclasses import replace

    return replace(cfg, block_size=1 << 20)
