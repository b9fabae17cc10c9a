"""`packer pack --mix` end to end: two sources of different length distributions, one with 4x
the tokens of the other, mixed by tokens through the real CLI; outputs read back with pyarrow,
shares recomputed from the rows (sample_source + cu_seqlens), and `packer verify` run on them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_samples, read_shards, write_jsonl, write_parquet

from packer.verify import verify

MAX_LEN = 512


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, Path]:
    """(long, short): the long source holds about 4x the short one's tokens."""
    root = tmp_path_factory.mktemp("mix")
    long = write_jsonl(root / "long.jsonl", make_samples(400, seed=1, median=140, max_len=500))
    short = write_parquet(root / "short.parquet", make_samples(400, seed=2, median=30))
    return long, short


def source_totals(path: Path) -> tuple[int, int]:
    """(samples, tokens) of a source file."""
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    table = pq.read_table(path) if path.suffix == ".parquet" else pj.read_json(path)
    ids = table.column("input_ids").combine_chunks()
    return len(ids), len(ids.values)


def per_segment(out: Path) -> dict[str, np.ndarray]:
    """Every segment of an output: its source, sample_index, sample_offset and length."""
    table = read_shards(out)
    cu = table.column("cu_seqlens").to_pylist()
    index = table.column("sample_index").to_pylist()
    length = [b - a for row, n in zip(cu, index) for a, b in zip(row[: len(n)], row[1:])]
    return {
        "source": np.concatenate(table.column("sample_source").to_numpy()).astype(np.int64),
        "index": np.array([i for row in index for i in row], np.int64),
        "offset": np.concatenate(table.column("sample_offset").to_numpy()).astype(np.int64),
        "length": np.array(length, np.int64),
    }


def pack(cli, out: Path, *args) -> dict:
    res = cli("pack", *args, "-o", out, "-L", MAX_LEN, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_half_and_half_by_tokens(cli, sources, tmp_path):
    long, short = sources
    n_short, short_tokens = source_totals(short)
    long_tokens = source_totals(long)[1]
    assert 3.5 < long_tokens / short_tokens < 4.5  # the bar: one 4x the other
    out = tmp_path / "mixed"
    report = pack(cli, out, "--mix", f"{long}=1", "--mix", f"{short}=1")
    seg = per_segment(out)
    tokens = np.bincount(seg["source"], weights=seg["length"], minlength=2)
    shares = tokens / tokens.sum()
    assert abs(shares[0] - 0.5) < 0.001 and abs(shares[1] - 0.5) < 0.001
    # the scarcer source is used whole, each sample once; the other is subsampled
    short_index = seg["index"][seg["source"] == 1]
    first = report["mixture"]["sources"][1]["first_index"]
    assert np.array_equal(np.sort(short_index), first + np.arange(n_short))
    assert int(tokens[1]) == short_tokens
    manifest = json.loads((out / "manifest.json").read_text())
    mixed = manifest["mixture"]
    assert mixed == report["mixture"]
    assert [s["tokens"] for s in mixed["sources"]] == tokens.astype(int).tolist()
    assert mixed["sources"][1]["epochs"] == 1 and mixed["sources"][1]["repeats"] == 0
    assert mixed["sources"][0]["epochs"] == 0 and mixed["sources"][0]["dropped"] > 0
    assert mixed["weights"] == [0.5, 0.5] and mixed["mix_tokens"] is None
    assert verify(out, attention=False).ok


def test_mix_tokens_twice_repeats_whole_epochs(cli, sources, tmp_path):
    long, short = sources
    n_short, short_tokens = source_totals(short)
    out = tmp_path / "twice"
    size = 4 * short_tokens  # twice the default output (2x the short source)
    report = pack(cli, out, "--mix", f"{long}=1", "--mix", f"{short}=1", "--mix-tokens", size)
    seg = per_segment(out)
    short_index = seg["index"][seg["source"] == 1]
    counts = np.bincount(short_index - short_index.min(), minlength=n_short)
    assert counts.min() == counts.max() == 2  # two whole epochs, no partial one
    entry = report["mixture"]["sources"][1]
    assert (entry["epochs"], entry["repeats"], entry["tokens"]) == (2, 1, 2 * short_tokens)
    assert abs(report["tokens"] - size) <= 500  # within a sample of the long source
    assert report["mixture"]["mix_tokens"] == size
    assert verify(out, attention=False).ok


def test_weights_are_shares_of_tokens(cli, sources, tmp_path):
    long, short = sources
    out = tmp_path / "seventy"
    report = pack(cli, out, "--mix", f"{long}=7", "--mix", f"{short}=3", "--seed", "3")
    seg = per_segment(out)
    tokens = np.bincount(seg["source"], weights=seg["length"], minlength=2)
    assert abs(tokens[0] / tokens.sum() - 0.7) < 0.001
    assert report["mixture"]["weights"] == [0.7, 0.3]


def test_same_bytes_twice(cli, sources, tmp_path):
    long, short = sources
    args = ("--mix", f"{long}=2", "--mix", f"{short}=1", "--mix-tokens", "60000")
    digests = []
    for name in ("one", "two"):
        pack(cli, tmp_path / name, *args)
        shards = json.loads((tmp_path / name / "manifest.json").read_text())["shards"]
        digests.append([(s["file"], s["xxh3_128"]) for s in shards])
        data = [(tmp_path / name / s["file"]).read_bytes() for s in shards]
        digests[-1].append(hash(tuple(data)))
    assert digests[0] == digests[1]


def test_verify_fails_on_edited_mixture_tokens(cli, sources, tmp_path):
    long, short = sources
    out = tmp_path / "edited"
    pack(cli, out, "--mix", f"{long}=1", "--mix", f"{short}=1")
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["mixture"]["sources"][0]["tokens"] += 7
    path.write_text(json.dumps(manifest))
    run = subprocess.run(
        [sys.executable, "-m", "packer", "verify", str(out), "--no-attention"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1, run.stderr
    lines = [x for x in run.stderr.splitlines() if "mixture source 0" in x]
    assert len(lines) == 1 and "the manifest says" in lines[0] and "long.jsonl" in lines[0]


def test_config_datasets(cli, sources, tmp_path):
    long, short = sources
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(
        f"max_len: {MAX_LEN}\ndatasets:\n  - {{path: {long}, weight: 1}}\n"
        f"  - {{path: {short}, weight: 1}}\n"
    )
    a = pack(cli, tmp_path / "from-config", "-c", cfg)
    b = pack(cli, tmp_path / "from-flags", "--mix", f"{long}=1", "--mix", f"{short}=1")
    assert a["mixture"]["sources"] == b["mixture"]["sources"]
    digest = [
        [s["xxh3_128"] for s in json.loads((tmp_path / d / "manifest.json").read_text())["shards"]]
        for d in ("from-config", "from-flags")
    ]
    assert digest[0] == digest[1]
    res = cli("pack", long, "-c", cfg, "-o", tmp_path / "never")
    assert res.exit_code == 2 and "names the datasets (datasets:) and so does INPUT" in res.output
    flags = pack(
        cli, tmp_path / "flags-win", "-c", cfg, "--mix", f"{long}=1", "--mix", f"{short}=3"
    )
    assert flags["mixture"]["weights"] == [0.25, 0.75]  # --mix overrides the file's datasets
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"max_len: 64\ndatasets:\n  - {{path: {long}, weight: 0}}\n")
    res = cli("pack", "-c", bad, "-o", tmp_path / "never")
    assert res.exit_code == 2 and "datasets[0]: the weight must be a number above 0" in res.output


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--mix", "{long}"], "--mix takes PATH_OR_GLOB=WEIGHT"),
        (["--mix", "{long}=abc"], "is not a number"),
        (["--mix", "{long}=0"], "the weight must be a number above 0"),
        (["--mix", "{long}=-1"], "the weight must be a number above 0"),
        (["--mix", "{long}=1", "{short}"], "not as INPUT too"),
        (["--mix", "{long}=1", "--repack"], "cannot be used with --repack"),
        (["--mix", "{long}=1", "--resume"], "--resume picks up block runs"),
        (["--mix", "{long}=1", "--mix", "{long}=2"], "a file belongs to one source"),
        (["{long}", "--mix-tokens", "100"], "--mix-tokens sizes a mixture"),
        (["--mix", "{long}=1", "--mix-tokens", "0"], "--mix-tokens must be at least 1"),
    ],
)
def test_refused_in_one_line(cli, sources, tmp_path, extra, expected):
    long, short = sources
    out = tmp_path / "out"
    args = [a.format(long=long, short=short) for a in extra]
    res = cli("pack", *args, "-o", out, "-L", MAX_LEN)
    assert res.exit_code == 2, res.output
    assert expected in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not out.exists()


def test_glob_matching_nothing_names_mix(cli, sources, tmp_path):
    long, _ = sources
    res = cli(
        "pack",
        "--mix",
        f"{long}=1",
        "--mix",
        f"{tmp_path}/none-*.jsonl=1",
        "-o",
        tmp_path / "o",
        "-L",
        MAX_LEN,
    )
    assert res.exit_code == 1
    assert res.output.strip().startswith(f"error: --mix {tmp_path}/none-*.jsonl:")
    assert "no file matches" in res.output


def test_library_mix(sources, tmp_path):
    import packer
    from packer.errors import UsageError

    long, short = sources
    cfg = packer.PackConfig(max_len=MAX_LEN)
    a = packer.pack([], tmp_path / "a", cfg, mix={str(long): 1, str(short): 1})
    b = packer.pack([], tmp_path / "b", cfg, mix=[(long, 1), (short, 1)])
    assert (
        a.report()["mixture"]["sources"][1]["tokens"]
        == b.report()["mixture"]["sources"][1]["tokens"]
    )
    with pytest.raises(UsageError, match=r"^mix .*: the weight must be a number above 0"):
        packer.pack([], tmp_path / "c", cfg, mix={str(long): 0})
    with pytest.raises(UsageError, match="not as inputs too"):
        packer.pack([short], tmp_path / "c", cfg, mix={str(long): 1})
    with pytest.raises(UsageError, match="^resume=True picks up block runs"):
        packer.pack([], tmp_path / "c", cfg, mix={str(long): 1}, resume=True)
    assert not (tmp_path / "c").exists()


def test_inspect_names_each_segments_source(cli, sources, tmp_path):
    from packer.inspection import inspect

    long, short = sources
    out = tmp_path / "seen"
    pack(cli, out, "--mix", f"{long}=1", "--mix", f"{short}=1", "--row-order", "plan")
    report = inspect(out, rows=[0, 1])
    table = read_shards(out)
    for view in report["row_views"]:
        expected = table.column("sample_source")[view["row"]].as_py()
        assert [s["mixture_source"] for s in view["segments"]] == expected
    res = cli("inspect", out, "--row", "0")
    assert res.exit_code == 0 and "source 0, " in res.output + res.stderr


def test_out_of_core_writes_the_same_bytes(cli, sources, tmp_path):
    from packer.read.cache import needs_out_of_core

    long, short = sources
    assert needs_out_of_core([long, short], ["input_ids", "labels"], 1 << 20)
    args = ("--mix", f"{long}=1", "--mix", f"{short}=3", "--mix-tokens", "50000")
    pack(cli, tmp_path / "memory", *args)
    pack(cli, tmp_path / "streamed", *args, "--memory-budget", "1MiB")
    shards = [
        [s["xxh3_128"] for s in json.loads((tmp_path / d / "manifest.json").read_text())["shards"]]
        for d in ("memory", "streamed")
    ]
    assert shards[0] == shards[1]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no cache left


def test_window_cp_and_skipped_samples(cli, sources, tmp_path):
    long, short = sources
    bad = tmp_path / "bad.jsonl"
    ok = '{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}\n'
    bad.write_text((ok + '{"input_ids": [], "labels": []}\n' + ok) * 20)
    out = tmp_path / "windowed"
    report = pack(
        cli,
        out,
        "--mix",
        f"{long}=1",
        "--mix",
        f"{bad}=1",
        "--on-error",
        "skip",
        "--window",
        "64",
        "--cp-size",
        "2",
        "--mix-tokens",
        "2000",
    )
    assert report["rejected"] == 20 and report["window_cost"] is not None
    seg = per_segment(out)
    ranges = report["mixture"]["sources"]
    for s, entry in enumerate(ranges):
        index = seg["index"][seg["source"] == s]
        assert index.min() >= entry["first_index"]
        assert index.max() < entry["first_index"] + entry["input_samples"]
    rejected = {
        json.loads(x)["sample_index"] for x in (out / "rejects.jsonl").read_text().splitlines()
    }
    assert not rejected & set(seg["index"].tolist())
    assert verify(out, attention=False).ok


def test_verify_input_compares_a_mixtures_tokens(cli, sources, tmp_path):
    long, short = sources
    out = tmp_path / "checked"
    pack(cli, out, "--mix", f"{long}=1", "--mix", f"{short}=1", "--mix-tokens", "60000")
    result = verify(out, [long, short], attention=False)
    assert result.ok and result.checks["input"].ran
    entry = json.loads((out / "manifest.json").read_text())["mixture"]["sources"][1]
    assert entry["epochs"] == 1 and entry["samples"] > entry["available"]  # a partial 2nd pass
    samples = make_samples(400, seed=2, median=30)
    samples[0]["input_ids"] = [t + 1 for t in samples[0]["input_ids"]]
    edited = write_parquet(tmp_path / "short.parquet", samples)
    assert not verify(out, [long, edited], attention=False).checks["input"].ok


def test_sources_on_s3_give_the_local_bytes(cli, sources, s3, tmp_path):
    long, short = sources
    s3.client.upload_file(str(long), s3.bucket, "corpus/long.jsonl")
    s3.client.upload_file(str(short), s3.bucket, "corpus/short/part-0.parquet")
    remote = pack(
        cli,
        tmp_path / "remote",
        "--mix",
        f"{s3.url('corpus/long.jsonl')}=1",
        "--mix",
        f"{s3.url('corpus/short/')}=1",
    )
    local = pack(cli, tmp_path / "local", "--mix", f"{long}=1", "--mix", f"{short}=1")
    digests = [
        [s["xxh3_128"] for s in json.loads((tmp_path / d / "manifest.json").read_text())["shards"]]
        for d in ("remote", "local")
    ]
    assert digests[0] == digests[1]
    assert remote["mixture"]["sources"][1]["files"] == [s3.url("corpus/short/part-0.parquet")]
    assert [s["tokens"] for s in remote["mixture"]["sources"]] == [
        s["tokens"] for s in local["mixture"]["sources"]
    ]
    res = cli("pack", "--mix", f"{long}=1", "-o", s3.url("out"), "-L", MAX_LEN)
    assert res.exit_code == 2 and "writes local outputs" in res.output
    res = cli(
        "pack",
        long,
        "--validation-split",
        "2",
        "--validation-output",
        s3.url("v"),
        "-o",
        tmp_path / "t",
        "-L",
        MAX_LEN,
    )
    assert res.exit_code == 2 and "--validation-output must be a local directory" in res.output
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "t").exists()
