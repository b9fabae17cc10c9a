"""Every failure path of verify (and the packing guarantees it leans on), planted and caught.

Each test plants one fault in a copy of a real output (or in the code path, with a spy or a
planted kernel) and sees it reported end to end through `packer verify` where the check is
user-facing: the fp32 reference against a non-causal kernel, each manifest check, the labels
against the source, the coverage codes (DUPLICATE, PIECE_GAP, FIRST_PIECE), and, on the packing
side, the atomic exchange, truncation keeping the first L tokens, fsync of every shard, and
--seed changing the rows of ff-shuffle."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
import test_verify_cli
from conftest import make_samples, read_shards, write_jsonl
from test_verify_cli import (
    MAX_LEN,
    copy_output,
    load_shard,
    messages,
    multi_sample_row,
    no_cuda,  # noqa: F401 (a fixture: the tests that assert the CPU's choices hide a GPU)
    run_verify,
    save_shard,
)

import packer
import packer.write.commit as output_mod
from packer.contract.schema import SCHEMA
from packer.hashing import file_digest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

packed = test_verify_cli.packed  # 80 samples, some split, L = 128, 8 rows per shard


CHECKS = ["structure", "manifest", "input", "attention", "negative_control", "model", "user_model"]


def manifest_of(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def write_manifest(out: Path, manifest: dict) -> None:
    (out / "manifest.json").write_text(json.dumps(manifest))


def structural(cli, out: Path, *args: str) -> tuple[int, dict]:
    return run_verify(cli, out, "--no-attention", *args)


# --------------------------------------------------------------------------------------------
# attention: the fp32 reference is the only witness against a kernel equally wrong both ways


@pytest.mark.usefixtures("no_cuda")
def test_non_causal_kernel_is_caught_by_the_fp32_reference(cli, packed, monkeypatch):
    import torch.nn.functional as F

    from packer.verify import backends, forwards

    def make_non_causal_forward(budget=None):  # as make_cpu_forward(budget)
        def forward(q, k, v, cu, max_seqlen):
            doc = forwards.segment_ids(cu, q.shape[0])
            mask = doc[:, None] == doc[None, :]  # within the segment, but both directions
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
            )
            return out.transpose(0, 1)

        return forward, "planted: block-diagonal, not causal"

    monkeypatch.setattr(backends, "make_cpu_forward", make_non_causal_forward)
    code, report = run_verify(cli, packed[0], "--rows", "2")
    assert code == 1
    att = report["checks"]["attention"]
    assert att["call"] == "planted: block-diagonal, not causal"
    # packed equals alone (the kernel is wrong the same way both times) ...
    assert att["max_isolated_diff"] <= att["tolerance"] < 1e-4
    # ... so only the reference comparison can see it, and it names every sample
    assert att["max_reference_diff"] > 0.1 and att["failure_count"] == att["samples"]
    for m in messages(report, "attention"):
        assert (
            "differs from the fp32 reference by" in m and f"(tolerance {att['tolerance']:g})" in m
        )
    assert report["checks"]["negative_control"]["ok"]  # the control alone would not catch it


# --------------------------------------------------------------------------------------------
# manifest


def test_missing_shard(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name = manifest_of(out)["shards"][1]["file"]
    (out / name).unlink()
    code, report = structural(cli, out)
    assert code == 1
    assert f"{name}: listed in the manifest but missing" in messages(report, "manifest")


def test_shard_bytes(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = manifest_of(out)
    entry = manifest["shards"][0]
    real = entry["bytes"]
    entry["bytes"] = real + 1
    write_manifest(out, manifest)
    code, report = structural(cli, out)
    assert code == 1
    assert messages(report) == [f"{entry['file']}: {real} bytes, the manifest says {real + 1}"]
    # --no-attention: the torch checks are listed as not run, with the reason
    assert report["not_run"] == ["input", "attention", "negative_control", "model", "user_model"]
    assert report["checks"]["input"]["skipped_reason"] == "no --input given"
    for name in report["not_run"][1:]:
        body = report["checks"][name]
        assert (body["ran"], body["ok"]) == (False, None)
        assert body["skipped_reason"] == "--no-attention was given"


@pytest.mark.parametrize("key", ["rows", "tokens", "segments", "loss_tokens"])
def test_shard_counts(cli, packed, tmp_path, key):
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = manifest_of(out)
    entry = manifest["shards"][1]
    real = entry[key]
    entry[key] = real + 1
    write_manifest(out, manifest)
    code, report = structural(cli, out)
    assert code == 1
    assert messages(report) == [
        f"{entry['file']}: manifest says {real + 1} {key} but the shard holds {real}"
    ]


@pytest.mark.parametrize(
    "key", ["rows", "segments", "tokens", "pad_tokens", "loss_tokens", "samples_packed"]
)
def test_stats_totals(cli, packed, tmp_path, key):
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = manifest_of(out)
    real = manifest["stats"][key]
    manifest["stats"][key] = real + 3
    write_manifest(out, manifest)
    code, report = structural(cli, out)
    assert code == 1
    assert messages(report) == [f"manifest stats say {real + 3} {key} but the shards hold {real}"]


def test_unlisted_arrow_file(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    first = manifest_of(out)["shards"][0]["file"]
    (out / "zz-extra.arrow").write_bytes((out / first).read_bytes())
    code, report = structural(cli, out)
    assert code == 1
    assert messages(report) == [
        "zz-extra.arrow: an .arrow file in the output that the manifest does not list"
    ]


# --------------------------------------------------------------------------------------------
# labels against the source


def test_label_differs_from_the_source(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    src = packed[1]
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    a, b = row["cu_seqlens"][1], row["cu_seqlens"][2]
    t = next(i for i in range(a + 1, b) if row["labels"][i] != -100)
    before = row["labels"][t]
    row["labels"][t] = before + 1  # still a target, so num_loss_tokens stays right
    save_shard(out, name, rows)
    code, report = structural(cli, out)
    assert code == 0  # without the source a changed label is a valid label
    code, report = structural(cli, out, "--input", str(src))
    assert code == 1
    sample = row["sample_index"][1]
    [msg] = messages(report)
    assert msg.startswith(f"{name} row {r}, sample {sample} (segment 1")
    assert f"label {t - a} of the sample is {before + 1} but the source has {before}" in msg
    assert report["checks"]["input"]["failures"][0]["sample"] == sample


# --------------------------------------------------------------------------------------------
# coverage codes


def find_split_sample(out: Path) -> tuple[str, int, int]:
    """(shard, row, segment) of the second piece of a split sample."""
    for entry in manifest_of(out)["shards"]:
        for r, row in enumerate(load_shard(out / entry["file"])):
            for k, off in enumerate(row["sample_offset"]):
                if off > 0:
                    return entry["file"], r, k
    raise AssertionError("no split sample")


def test_duplicate(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    first, lost = row["sample_index"][0], row["sample_index"][1]
    row["sample_index"][1] = first
    save_shard(out, name, rows)
    code, report = structural(cli, out)
    assert code == 1
    got = messages(report)
    assert any(
        m.startswith(f"{name} row {r}, sample {first} (segment 1")
        and f"sample {first} at offset 0 appears twice (also in {name} row {r})" in m
        for m in got
    ), got
    assert any(f"sample {lost} appears in no row" in m for m in got)


def test_first_piece_not_at_offset_zero(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    row["sample_offset"][1] = 5
    save_shard(out, name, rows)
    code, report = structural(cli, out)
    assert code == 1
    sample = row["sample_index"][1]
    [msg] = messages(report)
    assert msg.startswith(f"{name} row {r}, sample {sample} (piece at token 5) (segment 1")
    assert f"the first piece of sample {sample} starts at token 5, not 0" in msg


def test_piece_gap(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, k = find_split_sample(out)
    rows = load_shard(out / name)
    off = rows[r]["sample_offset"][k]
    rows[r]["sample_offset"][k] = off + 1
    save_shard(out, name, rows)
    code, report = structural(cli, out)
    assert code == 1
    sample = rows[r]["sample_index"][k]
    msg = messages(report)[0]  # (the piece after it, if any, now overlaps: reported too)
    assert msg.startswith(f"{name} row {r}, sample {sample} (piece at token {off + 1})")
    assert (
        f"this piece of sample {sample} starts at token {off + 1} but the previous piece "
        f"ends at token {off}" in msg
    )
    assert all(f"sample {sample}" in m for m in messages(report))


# --------------------------------------------------------------------------------------------
# truncation keeps the first L tokens; a piece from elsewhere in the sample is caught


def test_truncation_keeps_the_first_tokens(cli, tmp_path):
    samples = make_samples(60, seed=12, median=40, vocab=300)
    samples[7]["input_ids"] = list(range(1, 301))
    samples[7]["labels"] = list(range(1, 301))
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", MAX_LEN, "--overlength", "truncate").exit_code == 0
    table = read_shards(out).to_pylist()
    long = {i for i, s in enumerate(samples) if len(s["input_ids"]) > MAX_LEN}
    assert 7 in long
    found = {}
    for row in table:
        for k, (idx, off) in enumerate(zip(row["sample_index"], row["sample_offset"])):
            a, b = row["cu_seqlens"][k], row["cu_seqlens"][k + 1]
            found[idx] = (off, row["input_ids"][a:b])
    for i in long:
        assert found[i] == (0, samples[i]["input_ids"][:MAX_LEN])
    assert found[7][1] == list(range(1, MAX_LEN + 1))
    assert run_verify(cli, out, "--no-attention", "--input", str(src))[0] == 0
    # the last L tokens instead of the first: caught as a first piece not at offset 0
    name = manifest_of(out)["shards"][0]["file"]
    rows = load_shard(out / name)
    r = next(i for i, row in enumerate(rows) if 7 in row["sample_index"])
    k = rows[r]["sample_index"].index(7)
    a = rows[r]["cu_seqlens"][k]
    tail = samples[7]["input_ids"][-MAX_LEN:]
    rows[r]["input_ids"][a : a + MAX_LEN] = tail
    rows[r]["labels"][a + 1 : a + MAX_LEN] = tail[1:]
    rows[r]["sample_offset"][k] = 300 - MAX_LEN
    save_shard(out, name, rows)
    code, report = structural(cli, out, "--input", str(src))
    assert code == 1
    assert any(
        f"the first piece of sample 7 starts at token {300 - MAX_LEN}, not 0" in m
        for m in messages(report)
    )


# --------------------------------------------------------------------------------------------
# the atomic exchange and fsync


def test_overwrite_swaps_through_renameat2_exchange(cli, tmp_path, monkeypatch):
    src = write_jsonl(tmp_path / "d.jsonl", make_samples(60, seed=2, median=30, max_len=120))
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", 128).exit_code == 0
    old_inode = out.stat().st_ino
    real = output_mod._load_renameat2()
    assert real, "renameat2 is not available here"
    calls, temp_inodes = [], []

    def spy(olddirfd, old, newdirfd, new, flags):
        temp_inodes.append(os.stat(old).st_ino)
        rc = real(olddirfd, old, newdirfd, new, flags)
        calls.append((os.fsdecode(old), os.fsdecode(new), flags, rc))
        return rc

    def no_fallback(*args):
        raise AssertionError("fell back to two renames")

    monkeypatch.setattr(output_mod, "_renameat2_fn", spy)
    monkeypatch.setattr(output_mod, "_replace_by_two_renames", no_fallback)
    assert (
        cli("pack", src, "-o", out, "-L", 64, "--overlength", "split", "--overwrite").exit_code == 0
    )
    [(old, new, flags, rc)] = calls
    assert flags == output_mod._RENAME_EXCHANGE == 2 and rc == 0
    assert new == str(out) and ".packer-tmp-" in Path(old).name
    # the directory now at `out` is the one built under the temporary name, not the old one
    assert out.stat().st_ino == temp_inodes[0] != old_inode
    assert not Path(old).exists()  # it held the old output, removed after the swap
    assert manifest_of(out)["config"]["max_len"] == 64


def test_every_shard_and_the_manifest_are_fsynced_before_the_commit(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_commit = os.fsync, output_mod.commit

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def commit(tmp, out, overwrite=True, **kwargs):
        events.append(("commit", str(tmp)))
        return real_commit(tmp, out, overwrite, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(output_mod, "commit", commit)
    src = write_jsonl(tmp_path / "d.jsonl", make_samples(200, seed=6, median=40))
    result = packer.pack(
        [src], tmp_path / "out", packer.PackConfig(max_len=128, overlength="split", shard_rows=10)
    )
    assert len(result.shards) >= 5
    [(_, tmp)] = [e for e in events if e[0] == "commit"]
    before = {p for kind, p in events[: events.index(("commit", tmp))] if kind == "fsync"}
    after = {p for kind, p in events[events.index(("commit", tmp)) :] if kind == "fsync"}
    for shard in result.shards:
        assert str(Path(tmp) / shard["file"]) in before, shard["file"]
    assert str(Path(tmp) / "manifest.json") in after | before
    # the directory holding the files, and after the rename the parent directory
    assert tmp in after and str(tmp_path) in after


# --------------------------------------------------------------------------------------------
# --seed picks the rows of ff-shuffle


def _digests(out: Path) -> list[str]:
    return [
        hashlib.sha256((out / s["file"]).read_bytes()).hexdigest()
        for s in manifest_of(out)["shards"]
    ]


def _rows_of(out: Path) -> list[tuple[int, ...]]:
    return [tuple(r) for r in read_shards(out).column("sample_index").to_pylist()]


def test_seed_changes_the_rows_of_ff_shuffle(cli, tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", make_samples(150, seed=9, median=30, max_len=128))
    outs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        out = tmp_path / name
        res = cli("pack", src, "-o", out, "-L", 128, "--strategy", "ff-shuffle", "--seed", seed)
        assert res.exit_code == 0, res.output
        outs[name] = out
    assert _digests(outs["a"]) == _digests(outs["b"])  # same seed, same bytes
    assert _rows_of(outs["a"]) != _rows_of(outs["c"])  # another seed, other rows
    assert sorted(sum(_rows_of(outs["a"]), ())) == sorted(sum(_rows_of(outs["c"]), ()))
    assert manifest_of(outs["c"])["config"]["seed"] == 1
    for out in outs.values():
        assert structural(cli, out)[0] == 0


# --------------------------------------------------------------------------------------------
# the source comparison's other codes


def source_lengths(src: Path) -> list[int]:
    return [len(json.loads(line)["input_ids"]) for line in src.read_text().splitlines()]


def test_piece_longer_than_its_source_sample(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    src = packed[1]
    lengths = source_lengths(src)
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    n = row["cu_seqlens"][2] - row["cu_seqlens"][1]
    short = next(i for i, m in enumerate(lengths) if m < n and i not in row["sample_index"])
    row["sample_index"][1] = short
    save_shard(out, name, rows)
    code, report = structural(cli, out, "--input", str(src))
    assert code == 1
    failure = next(
        f for f in report["checks"]["input"]["failures"] if "the piece ends" in f["message"]
    )
    assert failure["message"] == (
        f"{name} row {r}, sample {short} (segment 1, tokens {row['cu_seqlens'][1]}.."
        f"{row['cu_seqlens'][2] - 1}): the piece ends at token {n} but the source sample has "
        f"only {lengths[short]} tokens ({src}: line {short + 1})"
    )
    assert (failure["shard"], failure["row"], failure["sample"], failure["segment"]) == (
        name,
        r,
        short,
        1,
    )
    assert failure["sample_offset"] == 0


def test_sample_index_outside_the_source(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, rows = multi_sample_row(out)
    rows[r]["sample_index"][2] = 10_000
    save_shard(out, name, rows)
    code, report = structural(cli, out, "--input", str(packed[1]))
    assert code == 1
    text = "sample_index 10000 is outside the 80 input samples"
    got = [m for m in messages(report, "input") if m.endswith(text)]
    assert len(got) == 2  # from the coverage check and from the source comparison
    assert all(m.startswith(f"{name} row {r}, sample 10000 (segment 2") for m in got)


def test_token_of_a_later_piece_differs(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, k = find_split_sample(out)
    rows = load_shard(out / name)
    row = rows[r]
    off, t = row["sample_offset"][k], row["cu_seqlens"][k] + 2
    before = row["input_ids"][t]
    row["input_ids"][t] = before + 1
    save_shard(out, name, rows)
    code, report = structural(cli, out, "--input", str(packed[1]))
    assert code == 1
    sample = row["sample_index"][k]
    [failure] = report["checks"]["input"]["failures"]
    assert failure["message"].endswith(
        f": token {off + 2} of the sample is {before + 1} but the source has {before} "
        f"({packed[1]}: line {sample + 1})"
    )
    assert failure["sample_offset"] == off and failure["segment"] == k


def test_source_without_labels_is_compared_with_its_tokens(cli, tmp_path):
    samples = make_samples(30, seed=4, median=20, max_len=60, with_labels=False)
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", 64).exit_code == 0
    assert structural(cli, out, "--input", str(src))[0] == 0
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    t = row["cu_seqlens"][1] + 1
    row["labels"][t] = row["input_ids"][t] + 1
    save_shard(out, name, rows)
    code, report = structural(cli, out, "--input", str(src))
    assert code == 1
    [msg] = messages(report, "input")
    assert msg.endswith(
        f": label 1 of the sample is {row['input_ids'][t] + 1} but the source has "
        f"{row['input_ids'][t]} ({src}: line {row['sample_index'][1] + 1})"
    )


# --------------------------------------------------------------------------------------------
# the JSON report: its shape, the fields of each failure, the attention numbers


def test_report_shape_and_failure_fields(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, rows = multi_sample_row(out)
    rows[r]["sample_offset"][1] = 5  # FIRST_PIECE
    save_shard(out, name, rows)
    manifest = manifest_of(out)
    manifest["shards"][0]["rows"] += 1
    write_manifest(out, manifest)
    code, report = run_verify(cli, out, "--rows", "1")
    assert code == 1
    assert list(report) == [
        "ok",
        "output",
        "seconds",
        "failure_count",
        "failures_listed",
        "not_run",
        "checks",
    ]
    assert report["failures_listed"] == 2
    assert report["ok"] is False and report["output"] == str(out)
    assert report["failure_count"] == 2 and 0 < report["seconds"] < 600
    assert list(report["checks"]) == CHECKS
    for check, body in report["checks"].items():
        assert all(f["check"] == check for f in body["failures"])
    [structure] = report["checks"]["structure"]["failures"]
    assert {k: structure[k] for k in ("shard", "row", "sample", "sample_offset", "segment")} == {
        "shard": name,
        "row": r,
        "sample": rows[r]["sample_index"][1],
        "sample_offset": 5,
        "segment": 1,
    }
    [entry] = report["checks"]["manifest"]["failures"]
    assert entry["shard"] == manifest["shards"][0]["file"] and "row" not in entry


@pytest.mark.usefixtures("no_cuda")
def test_attention_numbers_add_up(cli, packed):
    code, report = run_verify(cli, packed[0])  # --rows all
    assert code == 0
    att, ctl = report["checks"]["attention"], report["checks"]["negative_control"]
    assert att["tokens"] == report["checks"]["structure"]["tokens"]
    assert att["rows"] == report["checks"]["structure"]["rows"]
    per_million = att["seconds"] / att["tokens"] * 1e6
    assert abs(att["seconds_per_million_tokens"] - per_million) <= 0.01 * per_million + 1e-3
    assert 0 < att["packed_seconds_per_million_tokens"] <= att["seconds_per_million_tokens"]
    assert ctl["backend"] == "cpu" and ctl["dtype"] == "fp32"
    assert ctl["threshold"] == 10 * att["tolerance"]
    assert ctl["min_leak"] <= ctl["max_leak"] and ctl["samples_measured"] == (
        att["samples"] - att["rows"]
    )


@pytest.mark.usefixtures("no_cuda")
def test_fp16_on_the_cpu_uses_its_tolerance(cli, packed):
    import torch

    from packer.verify.attention import value_bound
    from packer.verify.tolerance import tolerance

    code, report = run_verify(cli, packed[0], "--rows", "2", "--dtype", "fp16")
    assert code == 0, messages(report)
    att = report["checks"]["attention"]
    bound = value_bound(0, torch.float16)
    assert att["tolerance_from"]["unit_roundoff"] == 2.0**-11
    assert att["tolerance"] == tolerance("fp16", att["tolerance_from"]["length"], bound)
    assert 2 * 2.0**-11 * bound < att["tolerance"] < 1e-2  # fp16's, not fp32's
    assert 0 < att["max_reference_diff"] <= att["tolerance"]  # fp16 rounding shows
    ctl = report["checks"]["negative_control"]
    assert ctl["threshold"] == 10 * att["tolerance"] and ctl["margin"] > 10


def test_padding_totals_over_several_shards(cli, tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", make_samples(60, seed=7, median=30, max_len=90))
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", 96, "--pad", "--shard-rows", "4").exit_code == 0
    stats = manifest_of(out)["stats"]
    assert len(manifest_of(out)["shards"]) > 2 and stats["pad_tokens"] > 0
    code, report = structural(cli, out)
    assert code == 0
    assert report["checks"]["structure"]["pad_tokens"] == stats["pad_tokens"]
    assert report["checks"]["structure"]["tokens"] == stats["tokens"]


def test_rows_are_numbered_across_record_batches(cli, packed, tmp_path):
    """A shard of several record batches: a fault in a later batch is named by its row in the
    shard file, and a missing shard does not stop the others from being checked."""
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = manifest_of(out)
    name = manifest["shards"][0]["file"]
    rows = load_shard(out / name)
    rows[7]["position_ids"][0] = 3  # in the third batch
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    with pa.OSFile(str(out / name), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
        for batch in table.to_batches(max_chunksize=3):  # batches of rows 0-2, 3-5, 6-7
            writer.write_batch(batch)
    manifest["shards"][0]["xxh3_128"] = file_digest(out / name)
    manifest["shards"][0]["bytes"] = (out / name).stat().st_size
    missing = manifest["shards"][1]
    (out / missing["file"]).unlink()
    write_manifest(out, manifest)
    code, report = run_verify(cli, out, "--no-attention")
    assert code == 1
    [structure] = [m for m in messages(report, "structure") if "position" in m]
    assert structure.startswith(f"{name} row 7, sample ")
    assert report["checks"]["structure"]["failures"][0]["row"] == 7
    shards = manifest["shards"]
    assert report["checks"]["structure"]["shards"] == len(shards) - 1
    assert report["checks"]["structure"]["rows"] == sum(s["rows"] for s in shards) - missing["rows"]


def test_manifest_errors_are_usage_errors(cli, packed, tmp_path):
    res = cli("verify", tmp_path / "nothing")
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {tmp_path / 'nothing'}: no such directory"
    out = copy_output(packed[0], tmp_path / "bad")
    (out / "manifest.json").write_text("{")
    res = cli("verify", out)
    assert res.exit_code == 2
    assert res.stderr.startswith(
        f"error: {out / 'manifest.json'}: manifest.json is not valid JSON ("
    )
    (out / "manifest.json").write_text('{"shards": {}}')
    res = cli("verify", out)
    assert res.stderr.strip() == (
        f"error: {out / 'manifest.json'}: manifest.json has no 'shards' list"
    )
    (out / "manifest.json").unlink()  # shards without their manifest: a run that did not end
    res = cli("verify", out)
    assert res.exit_code == 1
    assert res.stderr.strip() == (
        f"error: {out}: incomplete packer output: no manifest.json (a run that did not finish, "
        "or is still running; resume it with --resume, or rerun it)"
    )
    for shard in out.glob("*.arrow"):
        shard.unlink()
    res = cli("verify", out)
    assert res.stderr.strip() == f"error: {out}: no manifest.json: not a packer output"


@pytest.mark.parametrize(
    ("section", "key", "value", "why"),
    [
        ("config", "max_len", None, "has no config.max_len"),
        ("config", "max_len", 0, "config.max_len must be a positive integer, got 0"),
        ("config", "max_len", True, "config.max_len must be a positive integer, got True"),
        ("config", "pad", 1, "config.pad must be true or false, got 1"),
        ("config", "pad_id", -1, "config.pad_id must be a non-negative integer, got -1"),
        ("config", "pad_id", None, "has no config.pad_id"),
        (
            "config",
            "overlength",
            "wrap",
            "config.overlength must be error or drop or truncate or split, got 'wrap'",
        ),
        ("config", "input_column", "", "config.input_column must be a column name, got ''"),
        ("config", "labels_column", 3, "config.labels_column must be a column name or null, got 3"),
        ("stats", "samples_in", "80", "stats.samples_in must be a non-negative integer, got '80'"),
        ("stats", "dropped", None, "has no stats.dropped"),
        ("stats", "dropped", -2, "stats.dropped must be a non-negative integer, got -2"),
    ],
)
def test_manifest_fields_the_checks_read(cli, packed, tmp_path, section, key, value, why):
    """A manifest without a field the checks read is refused by name, not checked against a
    made-up default (max_len 0 would call every row over-long)."""
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = manifest_of(out)
    if value is None:
        del manifest[section][key]
    else:
        manifest[section][key] = value
    write_manifest(out, manifest)
    res = cli("verify", out, "--no-attention")
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {out / 'manifest.json'}: manifest.json {why}"


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda m: m.pop("config"), "has no 'config' object"),
        (lambda m: m.update(stats=[]), "has no 'stats' object"),
        (lambda m: m["shards"].append("shard-9.arrow"), "shards[{n}] has no 'file' name"),
        (lambda m: m["shards"][0].pop("file"), "shards[0] has no 'file' name"),
    ],
)
def test_manifest_sections_the_checks_read(cli, packed, tmp_path, edit, why):
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = manifest_of(out)
    n = len(manifest["shards"])
    edit(manifest)
    write_manifest(out, manifest)
    res = cli("verify", out, "--no-attention")
    assert res.exit_code == 2
    expected = why.format(n=n)
    assert res.stderr.strip() == f"error: {out / 'manifest.json'}: manifest.json {expected}"


# --------------------------------------------------------------------------------------------
# verify() from Python: defaults, reasons, and which rows the attention check picks


def test_python_defaults_and_reasons(packed):
    from packer.errors import UsageError
    from packer.verify import verify

    result = verify(packed[0], rows=1)  # default seed 0, no model checks
    assert list(result.checks) == CHECKS
    assert all(name == check.name for name, check in result.checks.items())
    assert result.ok and result.checks["attention"].details["rows"] == 1
    assert result.to_dict()["not_run"] == ["input", "model", "user_model"]
    assert result.checks["input"].skipped_reason == "no --input given"
    assert result.checks["model"].skipped_reason == "not asked (--model-check)"
    assert result.checks["user_model"].skipped_reason == "not asked (--model DIR)"

    def timeless(r):
        return {k: v for k, v in r.checks["attention"].details.items() if "seconds" not in k}

    assert timeless(result) == timeless(verify(packed[0], rows=1, seed=0))
    with pytest.raises(UsageError, match=r"^seed must be at least 0, got -1$"):
        verify(packed[0], seed=-1)


def test_attention_picks_a_row_of_two_samples_first(cli, tmp_path):
    """Ten rows hold one sample, one holds two: with --rows 1 every seed picks that one, since
    only a row of several samples can show a leak."""
    samples = [{"input_ids": [(7 * i + j) % 400 + 1 for j in range(120)]} for i in range(10)]
    samples += [{"input_ids": [(3 * j + i) % 400 + 1 for j in range(50)]} for i in range(2)]
    src = write_jsonl(tmp_path / "d.jsonl", samples)
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", "128").exit_code == 0
    cu = read_shards(out).column("cu_seqlens").to_pylist()
    assert sorted(len(c) - 1 for c in cu) == [1] * 10 + [2]
    for seed in range(4):
        res = cli("verify", out, "--json", "--rows", "1", "--seed", str(seed))
        assert res.exit_code == 0, res.output
        att = json.loads(res.stdout)["checks"]["attention"]
        assert (att["rows"], att["samples"]) == (1, 2), seed


# --------------------------------------------------------------------------------------------
# samples that appear in no row, and samples covered short


@pytest.mark.parametrize(
    ("extra", "listed"),
    [
        (1, "sample 80 appears"),
        (2, "samples 80, 81 appear"),
        (12, "samples 80, 81, 82, 83, 84, 85, 86, 87, 88, 89 and 2 more appear"),
    ],
)
def test_samples_in_no_row_without_the_source(cli, packed, tmp_path, extra, listed):
    """Without --input the manifest's counts say how many samples there were: more than the
    rows hold and not recorded as dropped is a structure failure; recorded as dropped, none."""
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = manifest_of(out)
    manifest["stats"]["samples_in"] += extra
    write_manifest(out, manifest)
    code, report = structural(cli, out)
    assert code == 1
    [failure] = report["checks"]["structure"]["failures"]
    assert failure == {
        "check": "structure",
        "message": f"{listed} in no row, but the manifest records 0 dropped sample(s) "
        f"({extra} of {80 + extra} are missing)",
        "sample": 80,
    }
    manifest["stats"]["dropped"] = extra
    write_manifest(out, manifest)
    code, report = structural(cli, out)
    assert (code, report["checks"]["structure"]["failure_count"]) == (0, 0)


@pytest.fixture(scope="module")
def truncated(tmp_path_factory) -> tuple[Path, Path]:
    """(output, source): 90 samples, 6 of them longer than L and truncated, 2 rows a shard."""
    from typer.testing import CliRunner

    from packer.cli import app

    root = tmp_path_factory.mktemp("truncated")
    samples = make_samples(90, seed=8, median=30, vocab=300)
    for k in range(6):
        samples[7 * k + 3] = make_samples(1, seed=20 + k, median=200, vocab=300)[0]
        samples[7 * k + 3]["input_ids"] += [1] * MAX_LEN  # longer than L whatever the draw
        samples[7 * k + 3]["labels"] += [1] * MAX_LEN
    src = write_jsonl(root / "long.jsonl", samples)
    out = root / "packed"
    args = ["pack", str(src), "-o", str(out), "-L", str(MAX_LEN), "--overlength", "truncate"]
    # in the plan's order (the tests below keep shards by where the long samples are)
    res = CliRunner().invoke(app, [*args, "--shard-rows", "2", "--row-order", "plan"])
    assert res.exit_code == 0, res.output
    return out, src


def test_truncated_output_passes_against_its_source(cli, truncated):
    code, report = structural(cli, truncated[0], "--input", str(truncated[1]))
    assert code == 0, messages(report)
    assert report["checks"]["input"]["samples"] == 90


def test_samples_in_no_row_against_the_source(cli, truncated, tmp_path):
    """Every missing sample is counted and listed (up to MAX_LISTED per check), and
    a truncated sample whose row is gone is missing too: only --overlength drop excuses one."""
    out = copy_output(truncated[0], tmp_path / "bad")
    manifest = manifest_of(out)
    kept = manifest["shards"][-1:]  # rows of long (truncated) samples come first
    for entry in manifest["shards"][:-1]:
        (out / entry["file"]).unlink()
    manifest["shards"] = kept
    write_manifest(out, manifest)
    present = {i for row in load_shard(out / kept[0]["file"]) for i in row["sample_index"]}
    missing = sorted(set(range(90)) - present)
    lengths = source_lengths(truncated[1])
    assert len(missing) > 50 and {i for i in range(90) if lengths[i] > MAX_LEN} <= set(missing)
    code, report = structural(cli, out, "--input", str(truncated[1]))
    assert code == 1
    check = report["checks"]["input"]
    assert check["failure_count"] == len(missing)
    assert check["failures"] == [
        {
            "check": "input",
            "message": f"sample {i} ({truncated[1]}: line {i + 1}, {lengths[i]} tokens) "
            "appears in no row",
            "sample": i,
        }
        for i in missing
    ]
    assert check["failures_omitted"] == 0


def test_sample_covered_short_of_its_source(cli, truncated, tmp_path):
    """A row's last sample loses its last token: covered for n - 1 of n, though the output was
    packed with --overlength truncate (only a sample longer than L may be cut, and to L)."""
    out = copy_output(truncated[0], tmp_path / "bad")
    lengths = source_lengths(truncated[1])
    name = manifest_of(out)["shards"][-1]["file"]  # rows of short samples come last
    rows = load_shard(out / name)
    row = rows[-1]
    assert 1 < lengths[row["sample_index"][-1]] < MAX_LEN
    sample = row["sample_index"][-1]
    for key in ("input_ids", "position_ids"):
        row[key].pop()
    if row["labels"].pop() != -100:
        row["num_loss_tokens"] -= 1
    row["cu_seqlens"][-1] -= 1
    save_shard(out, name, rows, recount=True)
    code, report = structural(cli, out, "--input", str(truncated[1]))
    assert code == 1
    assert report["checks"]["input"]["failures"] == [
        {
            "check": "input",
            "message": f"sample {sample} ({truncated[1]}: line {sample + 1}) is covered for "
            f"{lengths[sample] - 1} of its {lengths[sample]} tokens",
            "sample": sample,
        }
    ]


def test_an_output_listing_no_shard_misses_every_sample(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = manifest_of(out)
    for entry in manifest["shards"]:
        (out / entry["file"]).unlink()
    manifest["shards"] = []
    write_manifest(out, manifest)
    code, report = structural(cli, out)
    assert code == 1
    assert messages(report, "structure") == [
        "samples 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 70 more appear in no row, but the manifest "
        "records 0 dropped sample(s) (80 of 80 are missing)"
    ]
    assert (report["checks"]["structure"]["rows"], report["checks"]["manifest"]["shards"]) == (0, 0)


def test_manifest_failures_name_their_shard(cli, packed, tmp_path):
    """Several faults at once, each failure placed on its shard; an unreadable shard is
    reported and the shards after it are still checked."""
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = manifest_of(out)
    a, b, c, d = (e["file"] for e in manifest["shards"][:4])
    (out / a).write_bytes(b"not arrow")  # unreadable, and its hash differs
    manifest["shards"][0]["bytes"] = 9
    (out / b).unlink()
    manifest["shards"][2]["bytes"] += 1
    size_c = (out / c).stat().st_size
    rows = load_shard(out / d)
    rows[0]["input_ids"][0] += 1
    save_shard(out, d, rows)
    manifest_d = manifest_of(out)["shards"][3]
    manifest["shards"][3] = manifest_d | {"xxh3_128": "0" * 32}
    (out / "zz.arrow").write_bytes(b"")
    write_manifest(out, manifest)
    code, report = structural(cli, out)
    assert code == 1
    assert report["checks"]["manifest"]["failures"] == [
        {
            "check": "manifest",
            "message": f"{a}: xxh3_128 differs from the manifest (the shard changed after packing)",
            "shard": a,
        },
        {"check": "manifest", "message": f"{b}: listed in the manifest but missing", "shard": b},
        {
            "check": "manifest",
            "message": f"{c}: {size_c} bytes, the manifest says {size_c + 1}",
            "shard": c,
        },
        {
            "check": "manifest",
            "message": f"{d}: xxh3_128 differs from the manifest (the shard changed after packing)",
            "shard": d,
        },
        {
            "check": "manifest",
            "message": "zz.arrow: an .arrow file in the output that the manifest does not list",
            "shard": "zz.arrow",
        },
    ]
    unreadable = report["checks"]["structure"]["failures"][0]  # then the samples it held
    assert unreadable["shard"] == a and unreadable["message"].startswith(f"{a}: ")
    assert report["checks"]["structure"]["shards"] == len(manifest["shards"]) - 2


def test_sha256_outputs_are_checked_with_sha256(cli, tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", make_samples(40, seed=5, median=20, max_len=60))
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out, "-L", "64", "--hash", "sha256").exit_code == 0
    assert structural(cli, out)[0] == 0
    manifest = manifest_of(out)
    entry = manifest["shards"][0]
    assert entry["sha256"] == hashlib.sha256((out / entry["file"]).read_bytes()).hexdigest()
    entry["sha256"] = entry["sha256"][::-1]
    write_manifest(out, manifest)
    code, report = structural(cli, out)
    assert code == 1
    assert messages(report) == [
        f"{entry['file']}: sha256 differs from the manifest (the shard changed after packing)"
    ]


def test_prompt_label_made_a_target_is_compared_with_the_source_labels(cli, packed, tmp_path):
    """A -100 of the source's prompt turned into a target: the message quotes the source's
    label (-100), not its token."""
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = manifest_of(out)
    for entry in manifest["shards"]:
        rows = load_shard(out / entry["file"])
        found = [
            (r, k, t)
            for r, row in enumerate(rows)
            for k in range(len(row["sample_index"]))
            if row["sample_offset"][k] == 0
            for t in range(row["cu_seqlens"][k] + 1, row["cu_seqlens"][k + 1])
            if row["labels"][t] == -100
        ]
        if found:
            name = entry["file"]
            break
    r, k, t = found[0]
    row = rows[r]
    row["labels"][t] = row["input_ids"][t]
    row["num_loss_tokens"] += 1
    save_shard(out, name, rows, recount=True)
    code, report = structural(cli, out, "--input", str(packed[1]))
    assert code == 1
    [failure] = report["checks"]["input"]["failures"]
    t0 = row["cu_seqlens"][k]
    assert failure["message"].endswith(
        f": label {t - t0} of the sample is {row['input_ids'][t]} but the source has -100 "
        f"({packed[1]}: line {row['sample_index'][k] + 1})"
    )
