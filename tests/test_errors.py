"""Bad input, bad options and failing writes: one clear line, an exit code, and no output.

Every case runs through the real CLI on real files in tmp_path. `--on-error skip` and the
replacement of an existing output (`--overwrite`) are checked here too.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import make_samples, read_shards, write_arrow, write_jsonl, write_parquet

from packer.errors import InputError
from packer.write import commit as output_mod

GOOD = {"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}


def jsonl_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def good_then(path: Path, *bad: str, n_good: int = 2) -> Path:
    """n_good valid lines, then the given raw lines."""
    return jsonl_lines(path, [json.dumps(GOOD)] * n_good + list(bad))


def parquet_of(path: Path, columns: dict) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


# Each case: id -> (build(tmp) -> list of CLI args before the options, extra options,
#                   exit code, substrings the error line must hold)
def _cases():
    ids = pa.list_(pa.int32())
    return {
        "malformed-json": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [1, 2')],
            [],
            1,
            ["a.jsonl: line 3", "malformed JSON"],
        ),
        "malformed-json-blank-lines-counted": (
            lambda d: [jsonl_lines(d / "a.jsonl", [json.dumps(GOOD), "", "  ", "{oops"])],
            [],
            1,
            ["a.jsonl: line 4", "malformed JSON"],
        ),
        "not-an-object": (
            lambda d: [good_then(d / "a.jsonl", "[1, 2, 3]")],
            [],
            1,
            ["line 3", "expected a JSON object"],
        ),
        "not-utf8": (
            lambda d: [
                (d / "a.jsonl").write_bytes(b'{"input_ids": [1]}\n{"input_ids": [2, \xff]}\n')
                and d / "a.jsonl"
            ],
            [],
            1,
            ["line 2", "not UTF-8"],
        ),
        "ids-not-a-list": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": "1 2 3"}')],
            [],
            1,
            ["line 3", "'input_ids' must be a list of integers, got str"],
        ),
        "ids-float": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [1, 2.5]}')],
            [],
            1,
            ["line 3", "'input_ids'[1] is 2.5, not an integer"],
        ),
        "ids-bool": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [true]}')],
            [],
            1,
            ["line 3", "'input_ids'[0] is true, not an integer"],
        ),
        "ids-null-element": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [4, null]}')],
            [],
            1,
            ["line 3", "'input_ids'[1] is null"],
        ),
        "ids-nested": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [[1]]}')],
            [],
            1,
            ["line 3", "not an integer"],
        ),
        "negative-id": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [5, -1]}')],
            [],
            1,
            ["line 3", "'input_ids'[1] = -1 is a negative token id"],
        ),
        "id-over-int32": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [2147483648]}')],
            [],
            1,
            ["line 3", "2147483648 does not fit a 32-bit token id"],
        ),
        "id-over-int64": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [1' + "0" * 25 + "]}")],
            [],
            1,
            ["line 3", "does not fit a 32-bit token id"],
        ),
        "empty-sample": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": []}')],
            [],
            1,
            ["line 3", "empty sample"],
        ),
        "labels-length": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [1, 2], "labels": [1]}')],
            [],
            1,
            ["line 3", "'labels' has 1 entries but 'input_ids' has 2"],
        ),
        "negative-label": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [1, 2], "labels": [-100, -5]}')],
            [],
            1,
            ["line 3", "'labels'[1] = -5 is a negative label"],
        ),
        "labels-missing-in-one-sample": (
            lambda d: [good_then(d / "a.jsonl", '{"input_ids": [1, 2]}')],
            [],
            1,
            ["line 3", "no 'labels' in this sample"],
        ),
        "ids-missing-in-one-sample": (
            lambda d: [good_then(d / "a.jsonl", '{"tokens": [1, 2]}')],
            [],
            1,
            ["line 3", "no 'input_ids' in this sample"],
        ),
        "ids-column-missing-jsonl": (
            lambda d: [jsonl_lines(d / "a.jsonl", ['{"tokens": [1]}'] * 3)],
            [],
            2,
            [
                "a.jsonl has no 'input_ids' column (no line has it; line 1 has: tokens)",
                "--input-column",
            ],
        ),
        "ids-column-missing-parquet": (
            lambda d: [parquet_of(d / "a.parquet", {"tokens": pa.array([[1, 2]], ids)})],
            [],
            2,
            ["a.parquet has no 'input_ids' column (it has: tokens)", "--input-column"],
        ),
        "ids-wrong-type-parquet": (
            lambda d: [parquet_of(d / "a.parquet", {"input_ids": pa.array([[1.5]])})],
            [],
            1,
            ["a.parquet", "expected a list of integers"],
        ),
        "negative-id-parquet": (
            lambda d: [parquet_of(d / "a.parquet", {"input_ids": pa.array([[1], [2, -7]], ids)})],
            [],
            1,
            ["a.parquet: row 1", "negative token id"],
        ),
        "empty-sample-parquet": (
            lambda d: [parquet_of(d / "a.parquet", {"input_ids": pa.array([[1], [2], []], ids)})],
            [],
            1,
            ["a.parquet: row 2", "empty sample"],
        ),
        "null-sample-parquet": (
            lambda d: [parquet_of(d / "a.parquet", {"input_ids": pa.array([[1], None], ids)})],
            [],
            1,
            ["a.parquet: row 1", "no 'input_ids' in this sample"],
        ),
        "id-over-int32-parquet": (
            lambda d: [
                parquet_of(
                    d / "a.parquet", {"input_ids": pa.array([[1], [2**40]], pa.list_(pa.int64()))}
                )
            ],
            [],
            1,
            ["a.parquet: row 1", "does not fit a 32-bit"],
        ),
        "negative-id-arrow": (
            lambda d: [write_arrow(d / "a.arrow", [{"input_ids": [1]}, {"input_ids": [-3]}])],
            [],
            1,
            ["a.arrow: row 1", "negative token id"],
        ),
        "parquet-schemas-clash-labels": (
            lambda d: [
                write_parquet(d / "a.parquet", make_samples(5, with_labels=True)),
                write_parquet(d / "b.parquet", make_samples(5, with_labels=False)),
            ],
            [],
            1,
            ["mixed schemas", "a.parquet", "b.parquet"],
        ),
        "parquet-schemas-clash-types": (
            lambda d: [
                write_parquet(d / "a.parquet", make_samples(5, with_labels=False)),
                parquet_of(d / "b.parquet", {"input_ids": pa.array([["x"]])}),
            ],
            [],
            1,
            ["b.parquet", "expected a list of integers"],
        ),
        "empty-dataset": (
            lambda d: [jsonl_lines(d / "a.jsonl", [])],
            [],
            1,
            ["the dataset is empty"],
        ),
        "empty-dataset-blank-lines": (
            lambda d: [jsonl_lines(d / "a.jsonl", ["", " "])],
            [],
            1,
            ["the dataset is empty"],
        ),
        "missing-input": (lambda d: [d / "nope.jsonl"], [], 1, ["nope.jsonl", "no such file"]),
        "input-is-a-directory-named-jsonl": (
            lambda d: [(d / "x.jsonl").mkdir() or d / "x.jsonl"],
            [],
            1,
            ["x.jsonl", "no .jsonl"],
        ),
        "unknown-file-type": (
            lambda d: [jsonl_lines(d / "a.txt", [json.dumps(GOOD)])],
            [],
            1,
            ["a.txt", "unknown file type"],
        ),
        "truncated-gzip": (
            lambda d: [_truncated_gzip(d / "a.jsonl.gz")],
            [],
            1,
            ["a.jsonl.gz", "cannot read"],
        ),
        "corrupt-parquet": (
            lambda d: [(d / "a.parquet").write_bytes(b"PAR1 not really") and d / "a.parquet"],
            [],
            1,
            ["a.parquet", "cannot read Parquet"],
        ),
        "max-len-zero": (
            lambda d: [good_then(d / "a.jsonl")],
            ["--max-len", "0"],
            2,
            ["--max-len must be at least 1, got 0"],
        ),
        "max-len-negative": (
            lambda d: [good_then(d / "a.jsonl")],
            ["--max-len", "-4"],
            2,
            ["--max-len must be at least 1, got -4"],
        ),
        "bad-on-error": (
            lambda d: [good_then(d / "a.jsonl")],
            ["--on-error", "ignore"],
            2,
            ["unknown --on-error 'ignore'"],
        ),
        "config-bad-yaml": (
            lambda d: [good_then(d / "a.jsonl")],
            ["--config", "{cfg}"],
            2,
            ["c.yaml: line 1", "invalid YAML"],
        ),
        "config-unknown-option": (
            lambda d: [good_then(d / "a.jsonl")],
            ["--config", "{cfg_unknown}"],
            2,
            ["c2.yaml", "unknown option 'max_length'"],
        ),
        "config-wrong-type": (
            lambda d: [good_then(d / "a.jsonl")],
            ["--config", "{cfg_type}"],
            2,
            ["c3.yaml", "option 'max_len' must be int"],
        ),
        "config-missing-file": (
            lambda d: [good_then(d / "a.jsonl")],
            ["--config", "{nocfg}"],
            2,
            ["none.yaml", "cannot read config"],
        ),
        "output-is-a-file": (
            lambda d: [good_then(d / "a.jsonl")],
            ["--output", "{file_out}"],
            2,
            ["exists and is not a directory"],
        ),
    }


def _truncated_gzip(path: Path) -> Path:
    data = gzip.compress(b"".join(json.dumps(GOOD).encode() + b"\n" for _ in range(5000)))
    path.write_bytes(data[: len(data) // 2])
    return path


CASES = _cases()


def _prepare_options(tmp: Path, extra: list[str]) -> list[str]:
    (tmp / "c.yaml").write_text("max_len: 16: 2\n")
    (tmp / "c2.yaml").write_text("max_length: 16\n")
    (tmp / "c3.yaml").write_text("max_len: sixteen\n")
    (tmp / "file_out").write_text("not a directory\n")
    names = {
        "cfg": tmp / "c.yaml",
        "cfg_unknown": tmp / "c2.yaml",
        "cfg_type": tmp / "c3.yaml",
        "nocfg": tmp / "none.yaml",
        "file_out": tmp / "file_out",
    }
    return [a.format(**names) if a.startswith("{") else a for a in extra]


def leftovers(parent: Path) -> list[str]:
    """Hidden packer temporary directories left in `parent`."""
    return sorted(p.name for p in parent.iterdir() if ".packer-" in p.name)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_one_line_and_no_output(cli, tmp_path, case):
    build, extra, code, expected = CASES[case]
    data = tmp_path / "data"
    data.mkdir()
    inputs = build(data)
    options = _prepare_options(tmp_path, extra)
    out = tmp_path / "out"
    args = ["pack", *inputs, "--output", out, "--max-len", "16", *options]
    result = cli(*args)
    assert result.exit_code == code, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for text in expected:
        assert text in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""
    if "--output" not in options:
        assert not out.exists()
    assert leftovers(tmp_path) == []


def test_debug_shows_the_exception(runner, tmp_path):
    from packer.cli import app

    path = good_then(tmp_path / "a.jsonl", '{"input_ids": [-1]}')
    result = runner.invoke(
        app, ["pack", str(path), "-o", str(tmp_path / "o"), "-L", "8", "--debug"]
    )
    assert isinstance(result.exception, InputError)
    assert result.exception.where == f"{path}: line 3"


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["pack", "{path}", "-o", "{out}", "-L", "8", "--frobnicate"],
            "error: No such option: --frobnicate (see 'python -m packer pack --help')",
        ),
        (
            ["pack", "-o", "{out}"],
            "error: missing INPUT: name the datasets to pack, or --mix PATH=WEIGHT",
        ),
        (["pack", "{path}", "-o", "{out}", "-L", "eight"], "error: Invalid value for '--max-len'"),
        (["frobnicate"], "error: No such command 'frobnicate'. (see 'python -m packer --help')"),
    ],
    ids=["unknown-flag", "missing-input", "not-an-integer", "unknown-command"],
)
def test_command_line_mistakes_are_one_line(tmp_path, args, message):
    """The installed command (not typer's test runner): one `error:` line, exit code 2."""
    import subprocess
    import sys

    path = good_then(tmp_path / "a.jsonl")
    argv = [a.format(path=path, out=tmp_path / "o") for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "packer", *argv], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(message), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
    assert not (tmp_path / "o").exists()


def test_first_bad_sample_is_named_across_files(cli, tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", make_samples(30, seed=1, with_labels=False))
    b = good_then(tmp_path / "b.jsonl", '{"input_ids": []}', '{"input_ids": [-1]}', n_good=4)
    result = cli("pack", a, b, "-o", tmp_path / "o", "-L", "1000")
    assert result.exit_code == 1
    assert f"{b}: line 5: empty sample" in result.stderr


# --------------------------------------------------------------------------------------------
# --on-error skip


def _tree_hashes(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_skip_packs_the_valid_samples_and_lists_the_rest(cli, tmp_path):
    good = make_samples(40, seed=3, median=20)
    bad_lines = {  # position among the non-blank lines -> (line text, reason)
        3: ('{"input_ids": [1, 2', "malformed_json"),
        7: ('{"input_ids": []}', "empty"),
        8: ('{"input_ids": [1, -4], "labels": [1, 2]}', "negative_id"),
        12: ('{"input_ids": [1, 2], "labels": [1]}', "labels_length"),
        20: ('{"input_ids": [3000000000], "labels": [1]}', "id_out_of_range"),
        21: ('{"input_ids": "abc"}', "not_integer_list"),
        25: ('{"labels": [1]}', "missing_input_ids"),
        30: ('{"input_ids": [5]}', "missing_labels"),
    }
    lines, samples, expected_rejects = [], [], []
    it = iter(good)
    for pos in range(len(good) + len(bad_lines)):
        if pos == 10:
            lines.append("")  # a blank line: counted as a line, not as a sample
        if pos in bad_lines:
            text, reason = bad_lines[pos]
            lines.append(text)
            samples.append(None)
            expected_rejects.append((len(lines), pos, reason))
        else:
            sample = next(it)
            lines.append(json.dumps(sample))
            samples.append(sample)
    jsonl = jsonl_lines(tmp_path / "a.jsonl", lines)
    # a Parquet file after it: its bad rows are numbered after the JSONL's samples
    pq_samples = make_samples(6, seed=4, median=10)
    pq_samples[2] = {"input_ids": [], "labels": []}
    pq_path = write_parquet(tmp_path / "b.parquet", pq_samples)
    out = tmp_path / "out"

    result = cli("pack", jsonl, pq_path, "-o", out, "-L", "512", "--on-error", "skip", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    n_in = len(samples) + len(pq_samples)
    assert report["samples_in"] == n_in
    assert report["rejected"] == len(bad_lines) + 1
    assert report["samples_packed"] == n_in - report["rejected"]
    counts = {}
    for _, _, reason in expected_rejects:
        counts[reason] = counts.get(reason, 0) + 1
    counts["empty"] += 1
    assert report["rejected_by_reason"] == dict(sorted(counts.items()))

    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["sample_index"], r["reason"]) for r in rejects[:-1]] == expected_rejects
    assert all(r["file"] == str(jsonl) and r["message"] for r in rejects[:-1])
    assert rejects[-1] == {
        "file": str(pq_path),
        "row": 2,
        "sample_index": len(samples) + 2,
        "reason": "empty",
        "message": "empty sample: 'input_ids' is []",
    }

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stats"]["rejected_by_reason"] == report["rejected_by_reason"]
    assert manifest["rejects"]["count"] == len(rejects)
    import xxhash

    rejects_bytes = (out / "rejects.jsonl").read_bytes()
    assert manifest["rejects"]["xxh3_128"] == xxhash.xxh3_128(rejects_bytes).hexdigest()
    assert [i["rejected"] for i in manifest["inputs"]] == [len(bad_lines), 1]
    assert manifest["config"]["on_error"] == "skip"

    # every valid sample is packed exactly once, under its input position
    all_samples = samples + pq_samples
    table = read_shards(out).to_pydict()
    seen = {}
    for ids, cu, sidx in zip(table["input_ids"], table["cu_seqlens"], table["sample_index"]):
        for k, s in enumerate(sidx):
            seen[s] = ids[cu[k] : cu[k + 1]]
    valid = {i: s["input_ids"] for i, s in enumerate(all_samples) if s and s["input_ids"]}
    assert seen == valid


def test_skip_with_every_sample_bad_is_an_error(cli, tmp_path):
    path = jsonl_lines(tmp_path / "a.jsonl", ['{"input_ids": []}', "nope", '{"input_ids": [-1]}'])
    result = cli("pack", path, "-o", tmp_path / "o", "-L", "8", "--on-error", "skip")
    assert result.exit_code == 1
    assert "all 3 samples were rejected" in result.stderr
    assert not (tmp_path / "o").exists()


def test_skip_from_the_config_file(cli, tmp_path):
    path = good_then(tmp_path / "a.jsonl", '{"input_ids": [-1]}')
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_len: 8\non_error: skip\n")
    result = cli("pack", path, "-o", tmp_path / "o", "--config", cfg, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rejected_by_reason"] == {"negative_id": 1}


def test_default_run_has_no_rejects_file(cli, tmp_path):
    path = good_then(tmp_path / "a.jsonl")
    result = cli("pack", path, "-o", tmp_path / "o", "-L", "8", "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["rejected"] == 0 and report["rejected_by_reason"] == {}
    assert not (tmp_path / "o" / "rejects.jsonl").exists()


# --------------------------------------------------------------------------------------------
# Existing outputs, write failures, read failures


@pytest.fixture
def dataset(tmp_path) -> Path:
    return write_jsonl(tmp_path / "data.jsonl", make_samples(300, seed=5, median=40, max_len=200))


@pytest.fixture
def previous(cli, tmp_path, dataset) -> tuple[Path, dict]:
    out = tmp_path / "out"
    result = cli("pack", dataset, "-o", out, "-L", "512", "--shard-rows", "4")
    assert result.exit_code == 0, result.output
    return out, _tree_hashes(out)


def test_existing_output_is_not_touched_without_overwrite(cli, dataset, previous):
    out, before = previous
    result = cli("pack", dataset, "-o", out, "-L", "256")
    assert result.exit_code == 2 and "pass --overwrite" in result.stderr
    assert _tree_hashes(out) == before


def test_failed_overwrite_keeps_the_old_output(cli, tmp_path, previous):
    out, before = previous
    bad = good_then(tmp_path / "bad.jsonl", '{"input_ids": [1, 2')
    result = cli("pack", bad, "-o", out, "-L", "256", "--overwrite")
    assert result.exit_code == 1
    assert _tree_hashes(out) == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_overwrite_replaces_completely(cli, tmp_path, dataset, previous, monkeypatch, exchange):
    out, before = previous
    if not exchange:
        monkeypatch.setattr(output_mod, "_renameat2", lambda *a: False)
    result = cli("pack", dataset, "-o", out, "-L", "256", "--overwrite")
    assert result.exit_code == 0, result.output
    after = _tree_hashes(out)
    assert after != before
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(after) == sorted([s["file"] for s in manifest["shards"]] + ["manifest.json"])
    assert leftovers(tmp_path) == []


def test_stale_old_output_is_restored_by_the_next_run(cli, tmp_path, dataset, previous):
    """A run killed between the two renames of the fallback swap leaves the old output hidden."""
    import subprocess
    import sys

    out, before = previous
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    hidden = tmp_path / f".out{output_mod.OLD_MARK}{dead.stdout.strip()}-deadbeef"
    out.rename(hidden)
    output_mod.remove_stale(out)
    assert _tree_hashes(out) == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("with_previous", [False, True])
def test_full_disk_while_writing_shards(
    cli, tmp_path, dataset, previous, monkeypatch, with_previous
):
    import packer.write.shards

    out, before = previous
    if not with_previous:
        out = tmp_path / "fresh"
    real = packer.write.shards.open_shard
    calls = []

    def open_shard(path, algorithm, *schema):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, algorithm, *schema)

    monkeypatch.setattr(packer.write.shards, "open_shard", open_shard)
    result = cli("pack", dataset, "-o", out, "-L", "256", "--shard-rows", "3", "--overwrite")
    assert result.exit_code == 1
    assert len(calls) >= 2
    line = result.stderr.strip()
    assert line.startswith(f"error: {out}: cannot write the output: No space left on device")
    assert "\n" not in line
    if with_previous:
        assert _tree_hashes(out) == before
    else:
        assert not out.exists()
    assert leftovers(tmp_path) == []


def test_full_disk_while_writing_the_manifest(cli, tmp_path, dataset, monkeypatch):
    import packer.write.commit

    def dump(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(packer.write.commit.json, "dump", dump)
    result = cli("pack", dataset, "-o", tmp_path / "o", "-L", "256")
    assert result.exit_code == 1 and "No space left on device" in result.stderr
    assert not (tmp_path / "o").exists() and leftovers(tmp_path) == []


def test_read_error_on_the_second_file(cli, tmp_path, monkeypatch):
    import packer.read.formats

    a = write_jsonl(tmp_path / "a.jsonl", make_samples(20, seed=1))
    b = write_jsonl(tmp_path / "b.jsonl", make_samples(20, seed=2))
    real = packer.read.formats.pa_json.read_json
    calls = []

    def read_json(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.EIO, "Input/output error")
        return real(*args, **kwargs)

    monkeypatch.setattr(packer.read.formats.pa_json, "read_json", read_json)
    result = cli("pack", a, b, "-o", tmp_path / "o", "-L", "512")
    assert result.exit_code == 1
    assert result.stderr.strip() == f"error: {b}: cannot read: [Errno 5] Input/output error"
    assert not (tmp_path / "o").exists() and leftovers(tmp_path) == []


def test_validation_keeps_vectorized_on_valid_data(monkeypatch, tmp_path):
    """Valid data must not reach the per-line Python checks."""
    import packer.read.assemble
    import packer.read.formats

    def boom(*a, **k):
        raise AssertionError("per-line check on valid data")

    monkeypatch.setattr(packer.read.formats, "_line_problem", boom)
    path = write_jsonl(tmp_path / "a.jsonl", make_samples(500, seed=9))
    samples = packer.read.assemble.read_samples([path])
    assert samples.num_samples == 500 and samples.index is None and samples.rejects is None
    assert samples.tokens.dtype == np.int32
