"""`packer verify` end to end: real packed outputs pass; hand-corrupted copies fail precisely."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import make_samples, write_jsonl

from packer.contract.schema import SCHEMA
from packer.hashing import file_digest
from packer.verify import VerificationFailed, verify
from packer.verify.attention import value_bound
from packer.verify.tolerance import tolerance

MAX_LEN = 128


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def no_cuda(monkeypatch):
    """For a test that asserts the CPU's choices (the cpu backend, fp32, "needs a CUDA GPU"):
    any CUDA GPU is hidden, so the suite passes on a GPU machine too."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, Path]:
    """(output dir, source file): 80 samples, some split, 8 rows per shard."""
    from typer.testing import CliRunner

    from packer.cli import app

    root = tmp_path_factory.mktemp("verify")
    src = write_jsonl(root / "data.jsonl", make_samples(80, seed=3, median=30, vocab=500))
    out = root / "packed"
    res = CliRunner().invoke(
        app,
        [
            "pack",
            str(src),
            "-o",
            str(out),
            "--max-len",
            str(MAX_LEN),
            "--overlength",
            "split",
            "--shard-rows",
            "8",
        ],
    )
    assert res.exit_code == 0, res.output
    return out, src


def run_verify(cli, out: Path, *args: str) -> tuple[int, dict]:
    res = cli("verify", out, "--json", "--rows", "all", *args)
    return res.exit_code, json.loads(res.stdout) if res.stdout.strip() else {}


def messages(report: dict, check: str | None = None) -> list[str]:
    """The failure messages of one check, or of all; every failure names the check holding it."""
    for name, c in report["checks"].items():
        assert all(f["check"] == name for f in c["failures"]), (name, c["failures"])
    return [
        f["message"]
        for name, c in report["checks"].items()
        for f in c["failures"]
        if check is None or name == check
    ]


# --------------------------------------------------------------------------------------------
# Corrupting a copy of real shards


def copy_output(out: Path, dest: Path) -> Path:
    shutil.copytree(out, dest)
    return dest


def load_shard(path: Path) -> list[dict]:
    with pa.memory_map(str(path)) as src:
        return pa.ipc.open_stream(src).read_all().to_pylist()


def save_shard(out: Path, name: str, rows: list[dict], recount: bool = False) -> None:
    """Rewrite a shard and give the manifest its new hash (and, with recount, its counts), so
    the check under test is reached rather than stopping at the hash."""
    path = out / name
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_table(table)
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        if entry["file"] == name:
            entry["xxh3_128"] = file_digest(path)
            entry["bytes"] = path.stat().st_size
            if recount:
                old = dict(entry)
                entry["tokens"] = sum(len(r["input_ids"]) for r in rows)
                entry["segments"] = sum(len(r["sample_index"]) for r in rows)
                entry["loss_tokens"] = sum(r["num_loss_tokens"] for r in rows)
                for key in ("tokens", "segments", "loss_tokens"):
                    manifest["stats"][key] += entry[key] - old[key]
    (out / "manifest.json").write_text(json.dumps(manifest))


def multi_sample_row(out: Path) -> tuple[str, int, list[dict]]:
    """The first row holding three or more samples: (shard file, row, all rows of the shard)."""
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["shards"]:
        rows = load_shard(out / entry["file"])
        for r, row in enumerate(rows):
            if len(row["sample_index"]) >= 3:
                return entry["file"], r, rows
    raise AssertionError("no row with three samples")


# --------------------------------------------------------------------------------------------


def test_packed_output_verifies(cli, packed, no_cuda):
    out, src = packed
    code, report = run_verify(cli, out, "--input", str(src), "--model-check")
    assert code == 0, messages(report)
    checks = report["checks"]
    assert all(c["ok"] for c in checks.values() if c["ran"])
    assert report["not_run"] == ["user_model"] and checks["user_model"]["ok"] is None
    assert (
        checks["structure"]["rows"]
        == json.loads((out / "manifest.json").read_text())["stats"]["rows"]
    )
    assert checks["input"]["ran"] and checks["model"]["ran"]
    att, ctl = checks["attention"], checks["negative_control"]
    assert att["backend"] == "cpu" and att["dtype"] == "fp32"
    shards = json.loads((out / "manifest.json").read_text())["shards"]
    rows = [row for shard in shards for row in load_shard(out / shard["file"])]
    longest = max(int(np.diff(r["cu_seqlens"]).max()) for r in rows)
    import torch

    assert att["tolerance_from"] == {
        "unit_roundoff": 2.0**-24,
        "value_bound": value_bound(0, torch.float32),
        "length": longest,
    }
    assert att["tolerance"] == tolerance("fp32", longest, value_bound(0, torch.float32))
    assert 1e-6 < att["tolerance"] < 1e-4
    assert att["max_isolated_diff"] <= att["tolerance"]
    assert att["max_reference_diff"] <= att["tolerance"]
    assert ctl["min_leak"] > 100 * ctl["threshold"]  # the leak is far above the tolerance
    assert ctl["margin"] == round(ctl["min_leak"] / att["tolerance"], 1) > 1000
    assert ctl["first_sample_diff"] <= att["tolerance"]  # the first sample cannot leak
    assert ctl["samples_measured"] > 0 and not ctl["synthetic"]
    assert checks["model"]["max_loss_diff"] < 1e-4
    assert checks["model"]["samples"] == att["samples"] and checks["model"]["rows"] == att["rows"]
    assert checks["model"]["control_min_logits_leak"] > 1e-3


def test_human_report_and_exit_code(cli, packed):
    out, _ = packed
    res = cli("verify", out, "--rows", "2")
    assert res.exit_code == 0
    assert "passed" in res.stderr and "negative_control" in res.stderr


def test_label_crossing_a_boundary(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    t = row["cu_seqlens"][1]  # first token of the second sample
    row["labels"][t] = row["input_ids"][t]  # the classic shift-across-the-pack bug
    row["num_loss_tokens"] += 1
    save_shard(out, name, rows, recount=True)
    code, report = run_verify(cli, out, "--model-check")
    assert code == 1
    sample = row["sample_index"][1]
    [msg] = messages(report, "structure")
    assert msg.startswith(f"{name} row {r}, sample {sample}")
    assert f"the first label is {row['input_ids'][t]}, expected -100" in msg
    assert f"the last token of sample {row['sample_index'][0]}" in msg
    # the model check sees the same leak as a loss term the sample alone does not have
    model = messages(report, "model")
    assert any(f"sample {sample}" in m and "first token is the target" in m for m in model)


def test_shifted_cu_seqlens_entry(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, rows = multi_sample_row(out)
    old = rows[r]["cu_seqlens"][2]
    rows[r]["cu_seqlens"][2] = old + 1
    save_shard(out, name, rows)
    code, report = run_verify(cli, out)
    assert code == 1
    [msg] = messages(report, "structure")
    assert msg.startswith(f"{name} row {r}, sample {rows[r]['sample_index'][1]}")
    assert f"cu_seqlens[2] = {old + 1} but position_ids restart at token {old}" in msg
    assert "shifted by +1" in msg
    # the attention check catches it on its own: the packed forward now leaks
    att = messages(report, "attention")
    assert att and all(f"{name} row {r}," in m for m in att)
    assert any("attention crosses a sample boundary" in m for m in att)


def test_positions_that_do_not_restart(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    s, e = row["cu_seqlens"][1], row["cu_seqlens"][2]
    row["position_ids"][s:e] = list(range(s, e))  # continues from the previous sample
    save_shard(out, name, rows)
    code, report = run_verify(cli, out)
    assert code == 1
    [msg] = messages(report, "structure")
    sample = row["sample_index"][1]
    assert msg == (
        f"{name} row {r}, sample {sample} (segment 1, tokens {s}..{e - 1}): "
        f"position_ids do not restart at the start of sample {sample}: token {s} "
        f"has position {s}, expected 0"
    )


def test_merged_boundary(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    boundary = row["cu_seqlens"].pop(1)
    save_shard(out, name, rows)
    code, report = run_verify(cli, out, "--model-check")
    assert code == 1
    [msg] = messages(report, "structure")
    a, b = row["sample_index"][:2]
    assert msg.startswith(f"{name} row {r}, sample {a} (segment 0")
    assert f"position_ids restart at token {boundary}" in msg
    assert f"cu_seqlens has no boundary there: two samples (samples {a} and {b}) are merged" in msg
    att = messages(report, "attention")
    assert att and all(m.startswith(f"{name} row {r}, sample ") for m in att)
    assert any(
        m.startswith(f"{name} row {r}, sample {b} (tokens {boundary}..")
        and "crosses a sample boundary" in m
        for m in att
    )
    # the tiny model, masked by the merged cu_seqlens, sees it too
    model = messages(report, "model")
    assert any(f"tokens {boundary}.." in m and "loss differs" in m for m in model)


def test_dropped_sample(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    s = row["cu_seqlens"][-2]
    lost = row["sample_index"].pop()
    row["sample_offset"].pop()
    row["cu_seqlens"].pop()
    for col in ("input_ids", "labels", "position_ids"):
        del row[col][s:]
    row["num_loss_tokens"] = sum(1 for x in row["labels"] if x != -100)
    save_shard(out, name, rows, recount=True)
    code, report = run_verify(cli, out)
    assert code == 1
    assert messages(report) == [
        f"sample {lost} appears in no row, but the manifest records 0 "
        f"dropped sample(s) (1 of 80 are missing)"
    ]
    assert report["checks"]["structure"]["failures"][0]["sample"] == lost


def test_tokens_changed_against_input(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    src = packed[1]
    name, r, rows = multi_sample_row(out)
    row = rows[r]
    t = row["cu_seqlens"][1] + 1
    before = row["input_ids"][t]
    row["input_ids"][t] = before + 1
    save_shard(out, name, rows)
    code, report = run_verify(cli, out, "--rows", "1")
    assert code == 0  # without the source the change is invisible ...
    code, report = run_verify(cli, out, "--input", str(src), "--rows", "1")
    assert code == 1  # ... with it, it is named
    sample = row["sample_index"][1]
    [msg] = messages(report)
    assert msg.startswith(f"{name} row {r}, sample {sample}")
    assert (
        f"token 1 of the sample is {before + 1} but the source has {before} ({src}: line "
        f"{sample + 1})" in msg
    )


def test_hash_mismatch_is_reported(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0]["xxh3_128"] = "0" * 32
    (out / "manifest.json").write_text(json.dumps(manifest))
    code, report = run_verify(cli, out, "--rows", "1")
    assert code == 1
    assert messages(report) == [
        f"{manifest['shards'][0]['file']}: xxh3_128 differs from the "
        "manifest (the shard changed after packing)"
    ]


def test_padded_and_dropped_outputs(cli, tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", make_samples(40, seed=5, median=30, vocab=300))
    out = tmp_path / "pad"
    assert (
        cli("pack", src, "-o", out, "--max-len", 96, "--overlength", "drop", "--pad").exit_code == 0
    )
    stats = json.loads((out / "manifest.json").read_text())["stats"]
    assert stats["dropped"] > 0 and stats["pad_tokens"] > 0
    code, report = run_verify(cli, out, "--input", str(src))
    assert code == 0, messages(report)
    # a padding label that would be trained on
    manifest = json.loads((out / "manifest.json").read_text())
    rows = load_shard(out / manifest["shards"][0]["file"])
    r = next(
        i
        for i, row in enumerate(rows)
        if len(row["cu_seqlens"]) - 1 > len(row["sample_index"])
        and row["cu_seqlens"][-1] - row["cu_seqlens"][-2] > 1
    )
    rows[r]["labels"][-1] = 7
    save_shard(out, manifest["shards"][0]["file"], rows)
    code, report = run_verify(cli, out, "--rows", "1")
    assert code == 1
    [msg] = messages(report, "structure")
    assert f"row {r}, the padding segment" in msg and "has label 7, expected -100" in msg


def test_usage_errors_exit_2(cli, packed, tmp_path, no_cuda):
    out, _ = packed
    for args in (
        ["--backend", "nope"],
        ["--rows", "0"],
        ["--rows", "some"],
        ["--dtype", "fp8"],
        ["--backend", "torch-varlen"],
        ["--backend", "cpu", "--dtype", "int8"],
    ):
        res = cli("verify", out, *args)
        assert res.exit_code == 2, (args, res.stderr)
        assert res.stderr.startswith("error:") and "Traceback" not in res.stderr
    res = cli("verify", tmp_path)
    assert res.exit_code == 2 and "no manifest.json" in res.stderr
    res = cli("verify", out, "--backend", "torch-varlen")
    assert "needs a CUDA GPU" in res.stderr


def test_library_call_and_exception(packed, tmp_path):
    out, _ = packed
    result = verify(out, rows=1)
    assert result.ok and result.checks["attention"].details["rows"] == 1
    result.raise_for_failure()
    bad = copy_output(out, tmp_path / "bad")
    name, r, rows = multi_sample_row(bad)
    rows[r]["position_ids"][rows[r]["cu_seqlens"][1]] = 5
    save_shard(bad, name, rows)
    result = verify(bad, rows=1)
    assert not result.ok
    with pytest.raises(VerificationFailed, match=f"{name} row {r}"):
        result.raise_for_failure()


def test_structure_checks_do_not_import_torch(packed):
    out, _ = packed
    code = (
        "import sys; from packer.verify import verify; "
        f"r = verify({str(out)!r}, attention=False); "
        "assert r.ok, r.to_dict(); assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rows_are_picked_with_the_seed(packed):
    out, _ = packed
    a = verify(out, rows=3, seed=1).checks["attention"].details
    b = verify(out, rows=3, seed=1).checks["attention"].details
    assert a["rows"] == 3 and a["tokens"] == b["tokens"] and a["samples"] == b["samples"]
    assert np.isclose(a["max_isolated_diff"], b["max_isolated_diff"])


def test_flex_backend_runs_on_the_cpu(cli, packed, no_cuda):
    out, _ = packed
    code, report = run_verify(cli, out, "--backend", "flex", "--rows", "2", "--seed", "3")
    assert code == 0, messages(report)
    att = report["checks"]["attention"]
    assert att["backend"] == "flex" and att["device"] == "cpu" and att["dtype"] == "fp32"
    assert att["max_reference_diff"] <= att["tolerance"] < 1e-4
    kernel = att["kernel"]  # what ran: eager flex, nothing compiled
    assert kernel["compiled"] is False and kernel["compiles"] == 0 and kernel["calls"] > 0
    assert report["checks"]["negative_control"]["min_leak"] > 0.1


def test_shard_with_a_foreign_schema(cli, packed, tmp_path):
    out = copy_output(packed[0], tmp_path / "bad")
    name = json.loads((out / "manifest.json").read_text())["shards"][0]["file"]
    table = pa.table({"input_ids": pa.array([[1, 2]], pa.list_(pa.int64()))})
    with pa.OSFile(str(out / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    code, report = run_verify(cli, out, "--rows", "1")
    assert code == 1
    assert (
        f"{name}: column 'input_ids' has type list<item: int64>, expected list<item: int32>"
        in messages(report, "structure")
    )
    assert any("xxh3_128 differs" in m for m in messages(report, "manifest"))


def test_model_check_details_and_its_control(cli, packed, monkeypatch):
    import packer.torch.tiny_model

    out, _ = packed
    code, report = run_verify(cli, out, "--rows", "2", "--model-check", "--seed", "4")
    assert code == 0, messages(report)
    model = report["checks"]["model"]
    assert model["model"].startswith("LlamaForCausalLM, 2 layers, hidden 64, vocab ")
    assert model["model"].endswith(", random (seed 4)")
    assert (
        model["attention"] == "sdpa, explicit 4-D block-diagonal causal mask from cu_seqlens, fp32"
    )
    assert model["tolerance"] == 1e-4 and model["max_logits_diff"] < 1e-5
    assert 1e-3 < model["control_min_logits_leak"] <= model["control_max_logits_leak"]
    assert model["seconds"] > 0
    # a model that cannot see context: its control must fail, naming each later sample
    real = packer.torch.tiny_model.build_tiny_model
    monkeypatch.setattr(
        packer.torch.tiny_model, "build_tiny_model", lambda *a, **k: real(*a, **k, num_layers=0)
    )
    code, report = run_verify(cli, out, "--rows", "2", "--model-check")
    assert code == 1
    got = report["checks"]["model"]["failures"]
    assert got and all(
        f["check"] == "model" and f["shard"] and f["sample"] is not None for f in got
    )
    assert all(
        f["message"].endswith(
            ": under a plain causal mask the logits change by only 0: the model check could not "
            "see a leak here"
        )
        for f in got
    )
    assert report["checks"]["model"]["control_max_logits_leak"] == 0.0
