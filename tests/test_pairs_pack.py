"""`packer pack --pairs`: preference pairs packed whole, read back from real shards.

Every output is read back with pyarrow (and once with 🤗 datasets) and checked pair by pair
against the input: both segments of a pair adjacent in one row, prompt + chosen then prompt +
rejected, prompt tokens and each segment's first token labelled -100.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import read_shards, write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.config import PackConfig
from packer.errors import OptionError, UsageError
from packer.pipelines.pack import pack
from packer.pipelines.pairs import segment_plan
from packer.planning.pairs import resolve_pairs
from packer.planning.strategies import plan

COLS = ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")


def make_pairs(n: int = 60, seed: int = 0, prompt: int = 20, completion: int = 15) -> list[dict]:
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        p, c, r = (rng.integers(1, 2 * m + 1) for m in (prompt, completion, completion))  # lengths
        pairs.append(
            {
                COLS[0]: rng.integers(0, 1000, p).tolist(),
                COLS[1]: rng.integers(0, 1000, c).tolist(),
                COLS[2]: rng.integers(0, 1000, r).tolist(),
            }
        )
    return pairs


def pair_table(pairs: list[dict], names=COLS) -> pa.Table:
    return pa.table(
        {n: pa.array([p[c] for p in pairs], pa.list_(pa.int32())) for n, c in zip(names, COLS)}
    )


def segments(table: pa.Table):
    """Every segment of every row: (row, position in row, tokens, labels, pair, side, sample)."""
    out = []
    for r, row in enumerate(table.to_pylist()):
        cu = row["cu_seqlens"]
        for k in range(len(row["sample_index"])):
            a, b = cu[k], cu[k + 1]
            out.append(
                (
                    r,
                    k,
                    row["input_ids"][a:b],
                    row["labels"][a:b],
                    row["pair_index"][k],
                    row["pair_side"][k],
                    row["sample_index"][k],
                )
            )
    return out


def check_pairs(table: pa.Table, pairs: list[dict], max_len: int) -> set[int]:
    """Every packed pair is whole, adjacent, in one row, and equal to its input; returns the
    pairs seen."""
    seen = {}
    for row in table.to_pylist():
        assert len(row["input_ids"]) <= max_len
        assert row["num_loss_tokens"] == sum(x != -100 for x in row["labels"])
    segs = segments(table)
    for r, k, ids, labels, pair, side, sample in segs:
        assert sample == 2 * pair + side
        seen.setdefault(pair, []).append((r, k, side, ids, labels))
    for pair, parts in seen.items():
        assert [p[2] for p in parts] == [0, 1], "chosen then rejected"
        (r0, k0, _, ids0, lab0), (r1, k1, _, ids1, lab1) = parts
        assert r0 == r1 and k1 == k0 + 1, "adjacent in one row"
        src = pairs[pair]
        p = src[COLS[0]]
        assert ids0 == p + src[COLS[1]] and ids1 == p + src[COLS[2]]
        assert lab0 == [-100] * len(p) + src[COLS[1]]
        assert lab1 == [-100] * len(p) + src[COLS[2]]
    return set(seen)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "arrow"])
def test_every_format_packs_pairs_whole(cli, tmp_path, fmt):
    pairs = make_pairs(80)
    path = tmp_path / f"pairs.{fmt}"
    if fmt == "jsonl":
        write_jsonl(path, pairs)
    elif fmt == "parquet":
        pq.write_table(pair_table(pairs), path)
    else:
        with (
            pa.OSFile(str(path), "wb") as sink,
            pa.ipc.new_file(sink, pair_table(pairs).schema) as w,
        ):
            w.write_table(pair_table(pairs))
    out = tmp_path / "out"
    result = cli("pack", path, "-o", out, "-L", "256", "--pairs", "--json")
    assert result.exit_code == 0, result.output
    table = read_shards(out)
    assert check_pairs(table, pairs, 256) == set(range(80))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["pairs"] is True
    assert manifest["config"]["prompt_column"] == COLS[0]
    assert manifest["pairs"]["sides"] == ["chosen", "rejected"]
    assert set(manifest["columns"]) >= {"pair_index", "pair_side"}
    stats = manifest["stats"]
    assert stats["samples_in"] == stats["samples_packed"] == 80
    assert stats["segments"] == 160
    total = sum(2 * len(p[COLS[0]]) + len(p[COLS[1]]) + len(p[COLS[2]]) for p in pairs)
    assert (
        stats["tokens"]
        == stats["tokens_in"]
        == total
        == sum(table["input_ids"].combine_chunks().value_lengths().to_pylist())
    )
    assert stats["loss_tokens"] == sum(len(p[COLS[1]]) + len(p[COLS[2]]) for p in pairs)
    report = json.loads(result.stdout)
    assert report["rows"] == table.num_rows == stats["rows"]


def test_shards_load_with_datasets_and_are_deterministic(cli, tmp_path):
    datasets = pytest.importorskip("datasets")
    path = write_jsonl(tmp_path / "pairs.jsonl", make_pairs(50, seed=3))
    for name in ("a", "b"):
        assert cli("pack", path, "-o", tmp_path / name, "-L", "128", "--pairs").exit_code == 0
    a = (tmp_path / "a" / "shard-00000.arrow").read_bytes()
    assert a == (tmp_path / "b" / "shard-00000.arrow").read_bytes()
    ds = datasets.Dataset.from_file(str(tmp_path / "a" / "shard-00000.arrow"))
    assert ds.features["pair_side"].feature.dtype == "int8"
    assert sorted(set(x for row in ds["pair_index"] for x in row)) == list(range(50))


def test_column_names_and_python_api(tmp_path):
    pairs = make_pairs(30, seed=1)
    names = ("prompt_ids", "chosen_ids", "rejected_ids")  # TRL 1.x's names
    pq.write_table(pair_table(pairs, names), tmp_path / "p.parquet")
    cfg = PackConfig(
        max_len=200,
        pairs=True,
        prompt_column=names[0],
        chosen_column=names[1],
        rejected_column=names[2],
        strategy="ffd",
    )
    result = pack(tmp_path / "p.parquet", tmp_path / "out", cfg)
    assert check_pairs(read_shards(tmp_path / "out"), pairs, 200) == set(range(30))
    assert result.stats["segments"] == 60
    with pytest.raises(OptionError, match="has no 'prompt_input_ids' column"):
        pack(tmp_path / "p.parquet", tmp_path / "out2", PackConfig(max_len=200, pairs=True))


@pytest.mark.parametrize("strategy", ["bfd", "ffd", "nf", "ff-shuffle", "histogram"])
def test_strategies_and_windows_keep_pairs_whole(cli, tmp_path, strategy):
    pairs = make_pairs(120, seed=7)
    path = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    result = cli(
        "pack",
        path,
        "-o",
        tmp_path / "o",
        "-L",
        "300",
        "--pairs",
        "--strategy",
        strategy,
        "--window",
        "50",
    )
    assert result.exit_code == 0, result.output
    assert check_pairs(read_shards(tmp_path / "o"), pairs, 300) == set(range(120))


def test_overlength_pairs_error_drop_truncate(cli, tmp_path):
    pairs = make_pairs(40, seed=2, prompt=30, completion=30)
    path = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    need = [2 * len(p[COLS[0]]) + len(p[COLS[1]]) + len(p[COLS[2]]) for p in pairs]
    L = 120
    over = [i for i, n in enumerate(need) if n > L]
    assert over
    result = cli("pack", path, "-o", tmp_path / "e", "-L", L, "--pairs")
    assert result.exit_code == 1
    assert f"{len(over)} pair(s) need more than --max-len {L}" in result.output
    assert f"pairs.jsonl: line {over[0] + 1}" in result.output
    assert not (tmp_path / "e").exists()

    assert (
        cli(
            "pack", path, "-o", tmp_path / "d", "-L", L, "--pairs", "--overlength", "drop"
        ).exit_code
        == 0
    )
    stats = json.loads((tmp_path / "d" / "manifest.json").read_text())["stats"]
    assert stats["dropped"] == len(over) and stats["samples_packed"] == 40 - len(over)
    assert check_pairs(read_shards(tmp_path / "d"), pairs, L) == set(range(40)) - set(over)

    assert (
        cli(
            "pack", path, "-o", tmp_path / "t", "-L", L, "--pairs", "--overlength", "truncate"
        ).exit_code
        == 0
    )
    stats = json.loads((tmp_path / "t" / "manifest.json").read_text())["stats"]
    assert stats["truncated"] == len(over) and stats["samples_packed"] == 40
    table = read_shards(tmp_path / "t")
    by_pair = {}
    for r, _, ids, labels, pair, side, _ in segments(table):
        by_pair.setdefault(pair, {})[side] = (r, ids, labels)
    removed = 0
    for i, src in enumerate(pairs):
        (r0, c_ids, c_lab), (r1, r_ids, r_lab) = by_pair[i][0], by_pair[i][1]
        assert r0 == r1
        n_prompt = sum(x == -100 for x in c_lab)  # the prompt, its first token included
        assert c_lab[:n_prompt] == r_lab[:n_prompt] == [-100] * n_prompt
        prompt = c_ids[:n_prompt]
        assert prompt == r_ids[:n_prompt] and prompt == src[COLS[0]][len(src[COLS[0]]) - n_prompt :]
        assert (
            c_ids[n_prompt:] == src[COLS[1]][: len(c_ids) - n_prompt]
        )  # completions keep their start
        assert r_ids[n_prompt:] == src[COLS[2]][: len(r_ids) - n_prompt]
        assert len(c_ids) + len(r_ids) <= L
        if i in over and len(src[COLS[0]]) > L // 4:  # long prompts keep a quarter of the row
            assert n_prompt >= L // 4
        if i in over:  # each side keeps as much completion as it had, or L/4 - 1 at least
            assert len(c_ids) - n_prompt >= min(len(src[COLS[1]]), L // 4 - 1)
        removed += need[i] - len(c_ids) - len(r_ids)
        if i not in over:
            assert len(c_ids) + len(r_ids) == need[i]
    assert stats["tokens_removed"] == removed > 0

    result = cli("pack", path, "-o", tmp_path / "s", "-L", L, "--pairs", "--overlength", "split")
    assert result.exit_code == 2
    assert "--overlength split cannot be used with --pairs" in result.output


def _lines(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = '{"prompt_input_ids": [1, 2], "chosen_input_ids": [3], "rejected_input_ids": [4, 5]}'


@pytest.mark.parametrize(
    ("line", "message", "reason"),
    [
        (
            '{"prompt_input_ids": [1, 2], "chosen_input_ids": [3]}',
            "no 'rejected_input_ids' in this pair",
            "missing_side",
        ),
        (
            '{"prompt_input_ids": [1, 2], "chosen_input_ids": [], "rejected_input_ids": [4]}',
            "empty chosen completion: 'chosen_input_ids' is []",
            "empty",
        ),
        (
            '{"prompt_input_ids": [], "chosen_input_ids": [3], "rejected_input_ids": [4]}',
            "empty prompt: 'prompt_input_ids' is []",
            "empty",
        ),
        (
            '{"prompt_input_ids": [1, -2], "chosen_input_ids": [3], "rejected_input_ids": [4]}',
            "'prompt_input_ids'[1] = -2 is a negative token id",
            "negative_id",
        ),
        (
            '{"prompt_input_ids": [1], "chosen_input_ids": [3, "x"], "rejected_input_ids": [4]}',
            "'chosen_input_ids'[1] is \"x\", not an integer",
            "not_integer_list",
        ),
        ('{"prompt_input_ids": [1', "malformed JSON", "malformed_json"),
    ],
)
def test_bad_pairs_are_named_by_line(cli, tmp_path, line, message, reason):
    path = _lines(tmp_path, [GOOD, GOOD, line, GOOD])
    result = cli("pack", path, "-o", tmp_path / "o", "-L", "64", "--pairs")
    assert result.exit_code == 1
    assert f"bad.jsonl: line 3: {message}" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "o").exists()
    result = cli("pack", path, "-o", tmp_path / "s", "-L", "64", "--pairs", "--on-error", "skip")
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert manifest["stats"]["rejected_by_reason"] == {reason: 1}
    assert manifest["stats"]["samples_in"] == 4 and manifest["stats"]["samples_packed"] == 3
    (record,) = [json.loads(x) for x in (tmp_path / "s" / "rejects.jsonl").read_text().splitlines()]
    assert record["line"] == 3 and record["sample_index"] == 2 and record["reason"] == reason
    pairs = {x for row in read_shards(tmp_path / "s")["pair_index"].to_pylist() for x in row}
    assert pairs == {0, 1, 3}  # the bad pair's index stays reserved


def test_files_that_disagree_on_columns(cli, tmp_path):
    pq.write_table(pair_table(make_pairs(5)), tmp_path / "a.parquet")
    pq.write_table(pair_table(make_pairs(5)).drop_columns([COLS[2]]), tmp_path / "b.parquet")
    result = cli(
        "pack",
        tmp_path / "a.parquet",
        tmp_path / "b.parquet",
        "-o",
        tmp_path / "o",
        "-L",
        "99",
        "--pairs",
    )
    assert result.exit_code == 2
    assert "b.parquet has no 'rejected_input_ids' column (it has: " in result.output
    assert "name the column with --rejected-column" in result.output
    path = _lines(tmp_path, ['{"prompt_input_ids": [1], "chosen_input_ids": [3]}'] * 3)
    result = cli("pack", path, "-o", tmp_path / "o", "-L", "99", "--pairs")
    assert result.exit_code == 2
    assert "bad.jsonl has no 'rejected_input_ids' column (no line has it" in result.output


def test_pair_options_are_checked(tmp_path):
    with pytest.raises(UsageError, match="three different columns"):
        PackConfig(max_len=9, pairs=True, chosen_column="prompt_input_ids").validate()
    with pytest.raises(UsageError, match="local engine with one global plan"):
        PackConfig(max_len=9, pairs=True, block_size=1 << 20).validate()
    with pytest.raises(UsageError, match="pairs must be True or False"):
        PackConfig(max_len=9, pairs="yes").validate()
    assert "pairs" not in PackConfig(max_len=9).validate().to_dict()  # sample manifests as before


# --------------------------------------------------------------------------------------------
# Properties: the planner never splits a pair, and truncation keeps the most it can


def _truncate_reference(p: int, c: int, r: int, L: int) -> tuple[int, int, int]:
    """Plain Python: a prompt over L // 4 tokens keeps its end, as much as the whole completions
    leave room for but at least L // 4; then the largest common cap on the completions."""
    if 2 * p + c + r <= L:
        return p, c, r
    if p > L // 4:
        p = min(p, max(L // 4, (L - c - r) // 2))
    best = 1
    for m in range(1, max(c, r) + 1):
        if 2 * p + min(c, m) + min(r, m) <= L:
            best = m
    return p, min(c, best), min(r, best)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 40), st.integers(1, 40)),
        min_size=1,
        max_size=40,
    ),
    st.integers(2, 120),
)
def test_truncate_matches_reference(lengths, L):
    p, c, r = (np.array(x) for x in zip(*lengths))
    got = resolve_pairs(p, c, r, L, "truncate")
    for i, (pi, ci, ri) in enumerate(lengths):
        assert (
            int(got.prompt[i]),
            int(got.chosen[i]),
            int(got.rejected[i]),
        ) == _truncate_reference(pi, ci, ri, L)
        assert got.prompt_cut[i] == pi - got.prompt[i]
    assert (got.item_lengths <= L).all()
    assert got.tokens_removed == int((2 * p + c + r).sum() - got.item_lengths.sum())
    dropped = resolve_pairs(p, c, r, L, "drop")
    assert dropped.dropped == int(((2 * p + c + r) > L).sum())


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(2, 100), min_size=1, max_size=80),
    st.sampled_from(["bfd", "ffd", "nf", "ff-shuffle", "histogram"]),
    st.one_of(st.none(), st.integers(1, 30)),
)
def test_segment_plan_keeps_pairs_adjacent(items, strategy, window):
    items = np.array(items)
    pl = segment_plan(plan(items, 100, strategy, seed=1, window=window))
    seg_len = np.repeat(items, 2) // 2  # any split of each item into its two segments
    seen = np.zeros(2 * items.size, int)
    for r in range(pl.num_rows):
        row = pl.row(r)
        assert len(row) % 2 == 0
        assert (row[0::2] % 2 == 0).all() and (row[1::2] == row[0::2] + 1).all()
        assert seg_len[row].sum() <= 100
        seen[row] += 1
    assert (seen == 1).all()


def test_bench_pairs_prints_its_table(tmp_path):
    """scripts/bench_pairs.py runs, and TRL's padded batches process more tokens than packed."""
    import subprocess
    import sys

    pytest.importorskip("trl")
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, str(root / "scripts" / "bench_pairs.py"), "--pairs", "60", "-L", "1024"]
        + ["--batch", "4", "--repeat", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| packer --pairs, flatten |") and rows[1].endswith("| 1.00 |")
    ratio = float(rows[3].rsplit("|", 2)[1])
    assert rows[3].startswith("| TRL DataCollatorForPreference, 4 pairs/batch |") and ratio > 1


def test_inspect_names_each_side_and_its_input_line(cli, tmp_path):
    pairs = make_pairs(6, seed=4)
    path = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    assert cli("pack", path, "-o", tmp_path / "o", "-L", "512", "--pairs").exit_code == 0
    result = cli("inspect", tmp_path / "o", "--row", "0", "--json")
    assert result.exit_code == 0, result.output
    (view,) = json.loads(result.stdout)["row_views"]
    segs = view["segments"]
    assert [s["pair_side"] for s in segs] == ["chosen", "rejected"] * (len(segs) // 2)
    for s in segs:
        assert s["sample_index"] == 2 * s["pair_index"] + (s["pair_side"] == "rejected")
        assert s["source"] == {"file": str(path), "line": s["pair_index"] + 1}


@pytest.mark.parametrize("fmt", ["trl", "megatron", "megatron-bridge", "mds"])
def test_export_refuses_a_pairs_output(cli, tmp_path, fmt):
    path = write_jsonl(tmp_path / "pairs.jsonl", make_pairs(4))
    assert cli("pack", path, "-o", tmp_path / "o", "-L", "512", "--pairs").exit_code == 0
    result = cli("export", tmp_path / "o", "--to", fmt, "-o", tmp_path / "x")
    assert result.exit_code == 2
    assert "a pairs output (pack --pairs) holds preference pairs" in result.output
    assert not (tmp_path / "x").exists()


def test_pack_export_is_refused_with_pairs_before_packing(cli, tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", make_pairs(4))
    result = cli("pack", path, "-o", tmp_path / "o", "-L", "512", "--pairs", "--export", "trl")
    assert result.exit_code == 2
    assert "--export cannot be used with --pairs" in result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("overlength", ["drop", "truncate"])
def test_plan_pairs_predicts_the_rows_pack_writes(cli, tmp_path, overlength):
    pairs = make_pairs(150, seed=11, prompt=25, completion=25)
    path = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    need = [2 * len(p[COLS[0]]) + len(p[COLS[1]]) + len(p[COLS[2]]) for p in pairs]
    common = ["-L", "120", "--pairs", "--overlength", overlength]
    r = cli("plan", path, *common, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    over = sum(n > 120 for n in need)
    assert over > 0
    assert report["pairs"]["pairs_in"] == 150
    assert report["pairs"]["dropped" if overlength == "drop" else "truncated"] == over
    kept = 150 - (over if overlength == "drop" else 0)
    assert report["pairs"]["pairs"] == report["samples"] == kept
    for strategy in report["strategies"]:
        out = tmp_path / strategy["strategy"]
        r = cli("pack", path, "-o", out, *common, "--strategy", strategy["strategy"], "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["rows"] == strategy["rows"], strategy["strategy"]
    r = cli("plan", path, *common)
    assert r.exit_code == 0 and f"planned {kept} pairs" in r.stderr
    r = cli("pack", path, "-o", tmp_path / "table", *common)
    assert r.exit_code == 0, r.output
    table = " ".join(r.stderr.split())
    assert f"pairs packed │ {kept}" in table and f"segments │ {2 * kept}" in table
    assert "samples" not in table


def test_plan_pairs_refusals(cli, tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", make_pairs(10))
    r = cli("plan", path, "-L", "128", "--pairs", "--cp-size", "2")
    assert r.exit_code == 2 and "--cp-size cannot be used with --pairs" in r.stderr
    r = cli("plan", path, "-L", "128", "--pairs", "--overlength", "split")
    assert r.exit_code == 2 and "a pair is never split" in r.stderr
    samples = write_jsonl(tmp_path / "s.jsonl", [{"input_ids": [1, 2, 3]}])
    r = cli("plan", samples, "-L", "128", "--pairs")
    assert r.exit_code != 0 and "prompt_input_ids" in r.stderr and "Traceback" not in r.output


def test_a_pairs_output_is_not_repacked(cli, tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", make_pairs(20))
    assert cli("pack", path, "-o", tmp_path / "out", "-L", "200", "--pairs").exit_code == 0
    r = cli("pack", tmp_path / "out", "-o", tmp_path / "re", "--repack", "-L", "400")
    assert r.exit_code == 2, r.output
    assert "a pairs output" in r.stderr and "with --pairs" in r.stderr
    assert not (tmp_path / "re").exists()


def test_pairs_from_and_to_object_storage_give_the_local_bytes(cli, s3, tmp_path):
    """Pair files on the local S3 server, packed into it: the shards are the local run's bytes
    and `verify` (with its pair checks) passes on the URL."""
    pairs = make_pairs(80, seed=5)
    src = tmp_path / "src"
    src.mkdir()
    write_jsonl(src / "a.jsonl", pairs[:50])
    pq.write_table(pair_table(pairs[50:]), src / "b.parquet")
    url = s3.put_dir(src, "prefs")
    common = ["-L", "160", "--pairs"]
    assert cli("pack", src, "-o", tmp_path / "local", *common).exit_code == 0
    r = cli("pack", url, "-o", s3.url("packed"), *common)
    assert r.exit_code == 0, r.output
    local = sorted((tmp_path / "local").glob("shard-*.arrow"))
    remote = [k for k in s3.keys("packed/") if "/shard-" in k]
    assert len(local) == len(remote) > 0
    for path, key in zip(local, remote):
        assert s3.get(key) == path.read_bytes(), key
    assert s3.manifest("packed")["config"]["pairs"] is True
    r = cli("verify", s3.url("packed"), "--json")
    assert r.exit_code == 0, r.output
    check = json.loads(r.stdout)["checks"]["pairs"]
    assert check["ok"] and check["ran"] and check["pairs"] == 80
