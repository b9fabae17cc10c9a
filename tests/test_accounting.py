"""Every input sample is accounted for: packed, dropped, truncated or rejected, through repacks.

`--repack` reads only an output whose shards and counts match its manifest (a changed shard
would otherwise come out with fresh hashes), and `verify` counts what the manifest says was
left out (rejects.jsonl, and what the pack a repack read had dropped or rejected) while still
catching a sample that is really missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import make_samples, write_jsonl, write_parquet

from packer import hashing
from packer.errors import EXIT_FAILURE
from packer.read.assemble import read_samples
from packer.verify.result import MAX_LISTED, CheckResult
from packer.verify.structure import check_structure


def manifest_of(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def save_manifest(out: Path, manifest: dict) -> None:
    (out / "manifest.json").write_text(json.dumps(manifest))


def verify_json(cli, out: Path, *extra) -> dict:
    r = cli("verify", out, "--no-attention", "--json", *extra)
    report = json.loads(r.stdout)
    assert (r.exit_code == 0) == report["ok"], r.output
    return report


def failures(report: dict) -> list[str]:
    return [f["message"] for c in report["checks"].values() for f in c["failures"]]


def refused(r, tmp_path: Path, target: Path, *words: str) -> str:
    """One `error:` line, exit 1 (bad data), naming the words, and nothing written."""
    assert r.exit_code == EXIT_FAILURE, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    for word in (*words, "packer verify"):
        assert word in lines[0], lines[0]
    assert "Traceback" not in r.output
    assert not target.exists()
    assert not [p.name for p in tmp_path.iterdir() if ".packer-" in p.name]
    return lines[0]


@pytest.fixture
def packed(cli, tmp_path: Path) -> tuple[Path, Path]:
    """300 labelled samples split over several shards of L = 128."""
    src = write_parquet(tmp_path / "src.parquet", make_samples(300, seed=3, median=60))
    out = tmp_path / "a"
    r = cli("pack", src, "-o", out, "-L", "128", "--overlength", "split", "--shard-rows", "40")
    assert r.exit_code == 0, r.output
    assert len(manifest_of(out)["shards"]) >= 3
    return src, out


def test_repack_refuses_a_shard_whose_token_changed(cli, tmp_path: Path, packed):
    _, out = packed
    shard = out / "shard-00001.arrow"
    with pa.memory_map(str(shard)) as fh:
        first = pa.ipc.open_stream(fh).read_all().column("input_ids")[0].values
    ids = np.asarray(first.to_numpy(), np.int32)[:4]
    data = bytearray(shard.read_bytes())
    at = bytes(data).index(ids.tobytes())
    data[at] ^= 1  # one token of row 0 changes; the stream stays valid Arrow
    shard.write_bytes(bytes(data))
    assert not verify_json(cli, out)["ok"]

    target = tmp_path / "b"
    r = cli("pack", out, "-o", target, "-L", "4096", "--repack")
    refused(r, tmp_path, target, "shard-00001.arrow", "xxh3_128", "differs from manifest.json")


@pytest.mark.parametrize("rows", ["split", "whole"])
def test_repack_refuses_a_manifest_that_lost_a_shard(cli, tmp_path: Path, packed, rows):
    src, out = packed
    words = ["a missing, repeated or overlapping piece"]
    if rows == "whole":  # no sample split: what is lost shows only in the counts
        out = tmp_path / "whole"
        assert cli("pack", src, "-o", out, "-L", "4096", "--shard-rows", "2").exit_code == 0
        words = ["manifest.json", "samples packed", "missing"]
    manifest = manifest_of(out)
    lost = manifest["shards"].pop(1)
    (out / lost["file"]).unlink()
    save_manifest(out, manifest)
    target = tmp_path / "b"
    r = cli("pack", out, "-o", target, "-L", "4096", "--repack")
    refused(r, tmp_path, target, *words)


@pytest.mark.parametrize("recorded", ["as packed", "updated"])
def test_repack_refuses_a_shard_replaced_by_fewer_rows(cli, tmp_path: Path, packed, recorded):
    _, out = packed
    shard = out / "shard-00001.arrow"
    with pa.memory_map(str(shard)) as fh:
        table = pa.ipc.open_stream(fh).read_all()
    half = table.slice(0, table.num_rows // 2)
    data = pa.BufferOutputStream()
    with pa.ipc.new_stream(data, half.schema) as writer:
        writer.write_table(half)
    shard.write_bytes(data.getvalue().to_pybytes())
    words = ["shard-00001.arrow", "bytes"]
    if recorded == "updated":  # size and digest made to match: the rows still do not
        manifest = manifest_of(out)
        entry = manifest["shards"][1]
        entry["bytes"] = shard.stat().st_size
        entry["xxh3_128"] = hashing.file_digest(shard)
        save_manifest(out, manifest)
        words = ["shard-00001.arrow", f"holds {half.num_rows} rows", f"{table.num_rows}"]
    target = tmp_path / "b"
    r = cli("pack", out, "-o", target, "-L", "4096", "--repack")
    refused(r, tmp_path, target, *words)


def test_repack_refuses_stats_that_do_not_add_up(cli, tmp_path: Path, packed):
    _, out = packed
    manifest = manifest_of(out)
    manifest["stats"]["samples_in"] += 1
    save_manifest(out, manifest)
    target = tmp_path / "b"
    r = cli("pack", out, "-o", target, "-L", "4096", "--repack")
    refused(r, tmp_path, target, "samples in", "300")


@pytest.mark.parametrize("overlength", ["truncate", "drop"])
def test_repacks_of_truncate_and_drop_outputs_pass_verify(cli, tmp_path: Path, overlength):
    src = write_jsonl(tmp_path / "src.jsonl", make_samples(300, seed=7, median=60))
    first, re, again = tmp_path / "first", tmp_path / "re", tmp_path / "again"
    r = cli("pack", src, "-o", first, "-L", "96", "--overlength", overlength, "--json")
    assert r.exit_code == 0, r.output
    removed = json.loads(r.stdout)["truncated" if overlength == "truncate" else "dropped"]
    assert removed > 0
    assert cli("pack", first, "-o", re, "-L", "1024", "--repack").exit_code == 0
    # a second repack that truncates further, then one to longer rows: the chain adds up
    r = cli("pack", re, "-o", again, "-L", "64", "--overlength", "truncate", "--repack")
    assert r.exit_code == 0, r.output
    final = tmp_path / "final"
    assert cli("pack", again, "-o", final, "-L", "2048", "--repack").exit_code == 0
    for out in (re, again, final):
        assert verify_json(cli, out)["ok"], failures(verify_json(cli, out))
        report = verify_json(cli, out, "--input", src)
        assert report["ok"], failures(report)
    absent = manifest_of(final)["repacked_from"]["absent"]
    assert absent["truncated_to"] == 64
    assert absent["dropped"] == (removed if overlength == "drop" else 0)
    assert absent["dropped_over"] == (96 if overlength == "drop" else None)


def test_verify_still_finds_a_sample_missing_from_a_repack(cli, tmp_path: Path):
    src = write_jsonl(tmp_path / "src.jsonl", make_samples(300, seed=7, median=60))
    first, re = tmp_path / "first", tmp_path / "re"
    assert cli("pack", src, "-o", first, "-L", "96", "--overlength", "drop").exit_code == 0
    assert cli("pack", first, "-o", re, "-L", "1024", "--repack").exit_code == 0
    manifest = manifest_of(re)
    manifest["repacked_from"]["absent"]["dropped"] -= 1
    save_manifest(re, manifest)
    report = verify_json(cli, re)
    assert not report["ok"]
    assert any("appear in no row" in m for m in failures(report)), failures(report)

    manifest["repacked_from"]["absent"]["dropped"] += 1
    manifest["repacked_from"]["absent"]["dropped_over"] = 10_000  # allows no drop at all
    save_manifest(re, manifest)
    assert verify_json(cli, re)["ok"]
    report = verify_json(cli, re, "--input", src)
    assert not report["ok"]
    assert report["checks"]["input"]["failure_count"] > 0
    assert all("appears in no row" in m for m in failures(report)), failures(report)


def skip_output(cli, tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "x.jsonl"
    src.write_text('{"input_ids":[1,2,3]}\n{"input_ids":[4,-5,6]}\n{"input_ids":[7,8]}\n')
    out = tmp_path / "sk"
    r = cli("pack", src, "-o", out, "-L", "8", "--on-error", "skip")
    assert r.exit_code == 0, r.output
    return src, out


def test_verify_counts_rejected_samples(cli, tmp_path: Path):
    src, out = skip_output(cli, tmp_path)
    report = verify_json(cli, out)
    assert report["ok"], failures(report)
    # the library with the source read as pack read it (skipping the rejected sample)
    checks = [CheckResult(n) for n in ("structure", "manifest", "input")]
    source = read_samples([src], on_error="skip")
    check_structure(out, manifest_of(out), source, *checks)
    assert all(c.ok for c in checks), [f.message for c in checks for f in c.failures]
    # and its repack, whose manifest carries the reject
    re = tmp_path / "re"
    assert cli("pack", out, "-o", re, "-L", "16", "--repack").exit_code == 0
    assert manifest_of(re)["repacked_from"]["absent"]["rejected"] == 1
    assert verify_json(cli, re)["ok"]


def test_verify_input_of_an_on_error_skip_output(cli, tmp_path: Path):
    src, out = skip_output(cli, tmp_path)
    report = verify_json(cli, out, "--input", src)
    assert report["ok"], failures(report)


@pytest.mark.parametrize("damage", ["another sample", "count"])
def test_verify_checks_the_rejects_file(cli, tmp_path: Path, damage: str):
    _, out = skip_output(cli, tmp_path)
    rejects = out / "rejects.jsonl"
    if damage == "another sample":  # the reject names a packed sample instead (hash updated)
        record = json.loads(rejects.read_text())
        record["sample_index"] = 0
        rejects.write_text(json.dumps(record) + "\n")
        manifest = manifest_of(out)
        manifest["rejects"]["xxh3_128"] = hashing.file_digest(rejects)
        save_manifest(out, manifest)
        expected = ["listed in rejects.jsonl but appears in a row", "1 appears in no row"]
        checks = [CheckResult(n) for n in ("structure", "manifest", "input")]
        source = read_samples([tmp_path / "x.jsonl"], on_error="skip")
        check_structure(out, manifest_of(out), source, *checks)
        assert [f.message for f in checks[2].failures if f.message.startswith("rejects")] == [
            "rejects.jsonl lists samples 0 that the inputs hold as valid (it should list 1)"
        ]
    else:
        rejects.write_text("")
        expected = ["rejects.jsonl: xxh3_128 differs", "lists 0 sample(s)"]
    report = verify_json(cli, out)
    assert not report["ok"]
    for text in expected:
        assert any(text in m for m in failures(report)), failures(report)


def test_verify_json_lists_the_failures_the_text_counts(cli, tmp_path: Path):
    src = write_jsonl(tmp_path / "src.jsonl", make_samples(400, seed=2, median=40, max_len=60))
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", "64").exit_code == 0
    manifest = manifest_of(out)
    manifest["config"]["max_len"] = 8  # every row is now longer than max_len
    save_manifest(out, manifest)
    report = verify_json(cli, out)
    structure = report["checks"]["structure"]
    assert structure["failure_count"] >= 100 > 20
    assert len(structure["failures"]) == min(structure["failure_count"], MAX_LISTED)
    assert structure["failures_omitted"] == 0
    assert report["failures_listed"] == report["failure_count"]
    text = cli("verify", out, "--no-attention")  # the text points at what the JSON holds
    assert text.exit_code == 1
    more = report["failure_count"] - 10
    assert f"… and {more} more (--json lists all)" in text.output, text.output


def test_verify_input_of_another_file_is_one_fingerprint_failure(cli, tmp_path: Path):
    src = write_jsonl(tmp_path / "src.jsonl", make_samples(200, seed=4, max_len=200))
    other = write_jsonl(tmp_path / "other.jsonl", make_samples(200, seed=5, max_len=200))
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", "256").exit_code == 0
    report = verify_json(cli, out, "--input", other)
    assert not report["ok"]
    check = report["checks"]["input"]
    assert check["failure_count"] == 1, failures(report)
    message = check["failures"][0]["message"]
    assert str(other) in message and "fingerprint" in message and str(src) in message
    assert report["checks"]["structure"]["ok"] and report["checks"]["manifest"]["ok"]
    # the same bytes at another path are the same input
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(src.read_bytes())
    assert verify_json(cli, out, "--input", copy)["ok"]


def test_verify_text_says_how_many_the_json_lists(cli, tmp_path: Path, monkeypatch):
    monkeypatch.setattr("packer.verify.result.MAX_LISTED", 30)
    src = write_jsonl(tmp_path / "src.jsonl", make_samples(400, seed=2, median=40, max_len=60))
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", "64").exit_code == 0
    manifest = manifest_of(out)
    manifest["config"]["max_len"] = 8
    save_manifest(out, manifest)
    res = cli("verify", out, "--no-attention")
    assert res.exit_code == 1
    listed = verify_json(cli, out)["failures_listed"]
    assert listed < verify_json(cli, out)["failure_count"]
    assert f"(--json lists {listed - 10} of them)" in res.output, res.output
