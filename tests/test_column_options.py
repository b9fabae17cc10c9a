"""Column options name columns the input has, and options a run would not use are refused.

A typo in `--labels-column` used to train every token with exit 0; these tests hold every way
of naming a column (flags, a YAML config, the library) against every input format and engine,
and check that nothing is written when a run is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import make_samples, write_arrow, write_jsonl, write_parquet

import packer
from packer.errors import EXIT_FAILURE, EXIT_USAGE, OptionError, UsageError

PACK = ("-L", "512", "--overlength", "split")


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    return lines[0]


def inputs_of(tmp_path: Path, fmt: str, **kw) -> Path:
    samples = make_samples(40, seed=3, **kw)
    path = tmp_path / f"in.{fmt}"
    if fmt == "jsonl":
        return write_jsonl(path, samples)
    if fmt == "jsonl.gz":
        return write_jsonl(path, samples, compress="gzip")
    if fmt == "parquet":
        return write_parquet(path, samples)
    return write_arrow(path, samples, stream=fmt == "ipc")


FORMATS = ["jsonl", "jsonl.gz", "parquet", "arrow", "ipc"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_labels_typo_is_refused_and_nothing_is_written(cli, tmp_path, fmt):
    data = inputs_of(tmp_path, fmt)
    out = tmp_path / "out"
    r = cli("pack", data, "-o", out, *PACK, "--labels-column", "label")
    assert r.exit_code == EXIT_USAGE
    line = one_error_line(r)
    assert "--labels-column 'label' is not in" in line and data.name in line
    seen = "no line has it; line 1 has" if fmt.startswith("jsonl") else "it has"
    assert f"({seen}: input_ids, labels); did you mean 'labels'?" in line
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [data.name]


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_input_column_typo_is_refused(cli, tmp_path, fmt):
    data = inputs_of(tmp_path, fmt)
    out = tmp_path / "out"
    r = cli("pack", data, "-o", out, *PACK, "--input-column", "input_id")
    assert r.exit_code == EXIT_USAGE
    line = one_error_line(r)
    assert "--input-column 'input_id' is not in" in line and "did you mean 'input_ids'?" in line
    assert not out.exists()


@pytest.mark.parametrize("engine", [["--block-size", "1MiB"], ["--engine", "ray"]])
def test_block_runs_check_columns_before_any_task(cli, tmp_path, engine):
    """Refused on the driver before an engine starts (Ray is not even imported)."""
    a = write_parquet(tmp_path / "a.parquet", make_samples(30, seed=1))
    b = write_parquet(tmp_path / "b.parquet", make_samples(30, seed=2, with_labels=False))
    out = tmp_path / "out"
    r = cli("pack", a, b, "-o", out, *PACK, "--labels-column", "labels", *engine)
    assert r.exit_code == EXIT_USAGE
    line = one_error_line(r)
    assert f"--labels-column 'labels' is not in {b} (it has: input_ids)" in line
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.parquet"]


def test_the_default_labels_column_stays_optional(cli, tmp_path):
    data = inputs_of(tmp_path, "jsonl", with_labels=False)
    r = cli("pack", data, "-o", tmp_path / "out", *PACK, "--json")
    assert r.exit_code == 0, r.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["inputs"][0]["has_labels"] is False
    # and a manifest used as a config packs such inputs again
    r = cli("pack", data, "-o", tmp_path / "again", "-c", tmp_path / "out" / "manifest.json")
    assert r.exit_code == 0, r.output


def test_a_jsonl_file_lacks_a_column_only_when_no_line_has_it(cli, tmp_path):
    """A first line without the key is a bad sample (skippable), not a missing column."""
    samples = make_samples(10, seed=5)
    del samples[0]["labels"]
    samples[1] = {"tokens": [1, 2]}
    data = write_jsonl(tmp_path / "a.jsonl", samples)
    flags = ("--labels-column", "labels", "--on-error", "skip", "--json")
    r = cli("pack", data, "-o", tmp_path / "out", *PACK, *flags)
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["rejected_by_reason"] == {"missing_labels": 1, "missing_input_ids": 1}
    r = cli("pack", data, "-o", tmp_path / "o2", *PACK, "--labels-column", "labels")
    assert r.exit_code == EXIT_FAILURE
    assert one_error_line(r).endswith(
        "a.jsonl: line 1: no 'labels' in this sample (a labels column that is named must be in "
        "every one)"
    )


def test_a_named_labels_column_is_needed_on_every_jsonl_line(cli, tmp_path):
    samples = make_samples(10, seed=4)
    del samples[6]["labels"]
    data = write_jsonl(tmp_path / "a.jsonl", samples)
    r = cli("pack", data, "-o", tmp_path / "out", *PACK, "--labels-column", "labels")
    assert r.exit_code == EXIT_FAILURE
    line = one_error_line(r)
    assert f"{data}: line 7: no 'labels' in this sample (a labels column that is named" in line
    assert not (tmp_path / "out").exists()
    r = cli(
        "pack", data, "-o", tmp_path / "out", *PACK, "--labels-column", "labels",
        "--on-error", "skip", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rejected"] == 1
    # left at its default, the same file is refused as before: mixed labels are ambiguous
    r = cli("pack", data, "-o", tmp_path / "o2", *PACK)
    assert r.exit_code == EXIT_FAILURE and "though other samples have them" in r.stderr


def test_a_config_file_is_named_with_its_key(cli, tmp_path):
    data = inputs_of(tmp_path, "parquet")
    config = tmp_path / "preset.yaml"
    config.write_text("max_len: 512\noverlength: split\nlabels_column: label\n")
    r = cli("pack", data, "-o", tmp_path / "out", "-c", config)
    assert r.exit_code == EXIT_USAGE
    line = one_error_line(r)
    assert f"labels_column (in {config}) 'label' is not in {data}" in line
    assert "did you mean 'labels'?" in line
    assert not (tmp_path / "out").exists()


def test_pair_columns_are_checked(cli, tmp_path):
    rows = [{"prompt_ids": [1, 2], "chosen_input_ids": [3], "rejected_input_ids": [4]}] * 3
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    r = cli("pack", data, "-o", tmp_path / "out", "-L", "64", "--pairs")
    assert r.exit_code == EXIT_USAGE
    line = one_error_line(r)
    assert "p.jsonl has no 'prompt_input_ids' column (no line has it; line 1 has: " in line
    assert "did you mean 'prompt_ids'?" in line
    r = cli(
        "pack", data, "-o", tmp_path / "out", "-L", "64", "--pairs",
        "--prompt-column", "prompt_ids", "--chosen-column", "chosen",
    )  # fmt: skip
    assert r.exit_code == EXIT_USAGE
    assert "--chosen-column 'chosen' is not in" in one_error_line(r)
    r = cli(
        "pack", data, "-o", tmp_path / "out", "-L", "64", "--pairs", "--prompt-column",
        "prompt_ids",
    )  # fmt: skip
    assert r.exit_code == 0, r.output


def test_library_calls_name_the_parameter(tmp_path):
    data = inputs_of(tmp_path, "parquet")
    out = tmp_path / "out"
    with pytest.raises(OptionError, match=r"^labels_column 'label' is not in .*did you mean"):
        packer.pack([data], out, packer.PackConfig(max_len=512, labels_column="label"))
    assert not out.exists()
    table = pa.table({"input_ids": [[1, 2], [3]], "labels": [[1, 2], [3]]})
    with pytest.raises(ValueError, match=r"^labels_column 'lab' is not in the input \(it has"):
        packer.pack_dataset(table, 8, labels_column="lab")
    with pytest.raises(ValueError, match=r"^input_column 'ids' is not in the first sample"):
        packer.pack_dataset([{"input_ids": [1, 2]}], 8, input_column="ids")
    with pytest.raises(ValueError, match=r"^labels_column 'label' is not in the first sample"):
        packer.pack_dataset([{"input_ids": [1, 2]}], 8, labels_column="label")
    assert packer.pack_dataset([{"input_ids": [1, 2]}], 8).num_rows == 1
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2]], "labels": [[1, 2]]})
    with pytest.raises(OptionError, match="labels_column 'label' is not in the input"):
        packer.pack_dataset(ds, 8, labels_column="label")
    assert packer.pack_dataset(ds, 8, labels_column="labels").num_rows == 1


def test_raw_chats_point_to_the_tokenizer_option(cli, tmp_path):
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}
    data = write_jsonl(tmp_path / "chats.jsonl", [chat] * 2)
    r = cli("pack", data, "-o", tmp_path / "out", "-L", "64")
    assert r.exit_code == EXIT_USAGE
    line = one_error_line(r)
    assert "chats.jsonl has no 'input_ids' column (no line has it; line 1 has: messages)" in line
    assert "pass --tokenizer DIR to tokenize them first (docs/tokenize.md)" in line


def test_a_missing_input_is_reported_before_an_existing_output(cli, tmp_path):
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "notes.txt").write_text("x")
    r = cli("pack", tmp_path / "missing.jsonl", "-o", tmp_path / "existing", *PACK)
    assert r.exit_code == EXIT_FAILURE
    assert one_error_line(r) == f"error: {tmp_path / 'missing.jsonl'}: no such file or directory"
    r = cli("pack", tmp_path / "nothing-*.jsonl", "-o", tmp_path / "existing", *PACK)
    assert r.exit_code == EXIT_FAILURE and "no file matches this pattern" in r.stderr


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--prompt-column", "p"], "--prompt-column is read only with --pairs"),
        (["--chosen-column", "c"], "--chosen-column is read only with --pairs"),
        (["--rejected-column", "r"], "--rejected-column is read only with --pairs"),
        (["--pairs", "--labels-column", "labels"], "--labels-column cannot be used with --pairs"),
        (["--pairs", "--input-column", "input_ids"], "--input-column cannot be used with --pairs"),
        (
            ["--pairs", "--overlength", "drop", "--memory-budget", "1GiB"],
            "--memory-budget cannot be used with --pairs",
        ),
        (["--pad-id", "3"], "--pad-id is the token of --pad's row padding"),
    ],
)
def test_options_a_run_would_ignore_are_refused(cli, tmp_path, flags, words):
    data = inputs_of(tmp_path, "jsonl")
    r = cli("pack", data, "-o", tmp_path / "out", *PACK, *flags)
    assert r.exit_code == EXIT_USAGE
    assert words in one_error_line(r)
    assert not (tmp_path / "out").exists()


def test_repack_refuses_options_it_would_ignore(cli, tmp_path):
    data = inputs_of(tmp_path, "jsonl")
    packed = tmp_path / "packed"
    assert cli("pack", data, "-o", packed, *PACK).exit_code == 0
    out = tmp_path / "out"
    for flags, words in [
        (["--labels-column", "labels"], "--labels-column cannot be used with --repack"),
        (["--input-column", "input_ids"], "--input-column cannot be used with --repack"),
        (["--on-error", "skip"], "--on-error cannot be used with --repack"),
        (["--memory-budget", "1GiB"], "--memory-budget cannot be used with --repack"),
    ]:
        r = cli("pack", packed, "-o", out, "-L", "1024", "--repack", *flags)
        assert r.exit_code == EXIT_USAGE, flags
        assert words in one_error_line(r)
        assert not out.exists()
    cfg = packer.PackConfig(max_len=1024, labels_column="labels")
    with pytest.raises(UsageError, match="labels_column cannot be used with repack=True"):
        packer.pack([packed], out, cfg, repack=True)
    with pytest.raises(UsageError, match="prompt_column is read only with pairs=True"):
        packer.PackConfig(max_len=8, prompt_column="p").validate()
    # --memory-budget with --repack --export is the export's budget
    r = cli(
        "pack", packed, "-o", out, "-L", "1024", "--repack", "--export", "trl",
        "--memory-budget", "1GiB",
    )  # fmt: skip
    assert r.exit_code == 0, r.output


def test_an_s3_output_that_is_an_object_is_refused(cli, tmp_path, s3):
    data = inputs_of(tmp_path, "jsonl")
    s3.client.put_object(Bucket="bkt", Key="taken", Body=b"x")
    r = cli("pack", data, "-o", s3.url("taken"), *PACK)
    assert r.exit_code == EXIT_USAGE
    assert one_error_line(r) == (
        "error: s3://bkt/taken: output path exists and is not a directory (an object)"
    )
    assert s3.keys() == ["taken"]
    (tmp_path / "file").write_text("x")  # as a local output that is a file
    r = cli("pack", data, "-o", tmp_path / "file", *PACK)
    assert r.exit_code == EXIT_USAGE and "output path exists and is not a directory" in r.stderr


def test_the_typo_in_a_real_process(tmp_path):
    data = inputs_of(tmp_path, "jsonl")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "packer", "pack", str(data), "-o", str(out), *PACK]
    r = subprocess.run([*cmd, "--labels-column", "label"], capture_output=True, text=True)
    assert r.returncode == EXIT_USAGE
    assert r.stderr.count("\n") == 1 and "did you mean 'labels'?" in r.stderr
    assert r.stdout == "" and not out.exists()


def test_plan_and_out_of_core_reads_check_columns_too(cli, tmp_path):
    data = inputs_of(tmp_path, "jsonl")
    r = cli("plan", data, "-L", "512", "--input-column", "input_id")
    assert r.exit_code == EXIT_USAGE
    assert "--input-column 'input_id' is not in" in one_error_line(r)
    with pytest.raises(OptionError, match="^labels_column 'label' is not in"):
        packer.read_samples([data], labels_column="label")
    out = tmp_path / "out"
    cfg = packer.PackConfig(max_len=512, overlength="split", labels_column="label")
    with pytest.raises(OptionError, match="^labels_column 'label' is not in"):
        packer.pack([data], out, cfg, memory_budget="1MiB", out_of_core=True)
    assert not out.exists()


@pytest.mark.parametrize("blocks", [[], ["--block-size", "1MiB"]])
@pytest.mark.parametrize("fmt", ["jsonl.gz", "parquet", "arrow"])
def test_remote_inputs_are_checked(cli, tmp_path, s3, fmt, blocks):
    """Block runs read s3:// inputs in place, other runs a staged copy: both are named by URL."""
    local = tmp_path / "data"
    local.mkdir()
    inputs_of(local, fmt)
    url = s3.put_dir(local, "in")
    out = tmp_path / "out"
    r = cli("pack", url, "-o", out, *PACK, *blocks, "--labels-column", "label")
    assert r.exit_code == EXIT_USAGE
    line = one_error_line(r)
    assert f"--labels-column 'label' is not in {url}/in.{fmt}" in line
    assert "did you mean 'labels'?" in line
    assert not out.exists()


def test_pack_dataset_refuses_column_options_it_would_ignore():
    with pytest.raises(OptionError, match="^labels_column names a key of dict rows"):
        packer.pack_dataset([[1, 2], [3]], 8, labels_column="labels")
    with pytest.raises(OptionError, match="^input_column names a key of dict rows"):
        packer.pack_dataset([[1, 2], [3]], 8, input_column="ids")
    rows = [{"ids": [1, 2], "lab": [1, 2]}]
    with pytest.raises(OptionError, match="^labels_column cannot be used with labels="):
        packer.pack_dataset(rows, 8, input_column="ids", labels_column="lab", labels=[[5, 6]])
    packed = packer.pack_dataset(rows, 8, input_column="ids", labels_column="lab")
    assert packed.column("labels").to_pylist() == [[-100, 2]]
    assert packer.pack_dataset([[1, 2], [3]], 8, labels=[[1, 2], [3]]).num_rows == 1


@pytest.mark.xdist_group("ray")  # the Ray tests' worker: its cluster, not one more
def test_ray_and_local_blocks_name_a_line_without_the_named_labels_alike(cli, cluster, tmp_path):
    pytest.importorskip("ray")
    d = tmp_path / "in"
    d.mkdir()
    samples = make_samples(300, seed=6, median=50)
    del samples[250]["labels"]  # line 251, in a later block
    write_jsonl(d / "a.jsonl", samples)
    args = ("pack", d, *PACK, "--labels-column", "labels", "--block-size", "24KiB")
    local = cli(*args, "-o", tmp_path / "local")
    on_ray = cli(*args, "-o", tmp_path / "ray", "--engine", "ray", "--ray-address", cluster)
    assert local.exit_code == on_ray.exit_code == EXIT_FAILURE
    assert "a.jsonl: line 251: no 'labels' in this sample" in one_error_line(on_ray)
    assert on_ray.stderr == local.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
