"""The rejects and `--input` checks of `verify`, called directly on crafted manifests and files.

`read_rejects` and `check_rejected_inputs` (packer.verify.rejects), and `check_fingerprints`,
`full_view` and `source_to_compare` (packer.verify.source): every branch, with the whole
failure message and the exact value returned.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import xxhash

from packer.errors import flag_names
from packer.read.samples import Samples, SourceFile
from packer.verify.rejects import check_rejected_inputs, read_rejects
from packer.verify.result import CheckResult
from packer.verify.source import check_fingerprints, full_view, source_to_compare


def messages(result: CheckResult) -> list[str]:
    return [f.message for f in result.failures]


def manifest_with(
    stats: int | None = 0,
    inputs: tuple[int, ...] = (0,),
    rejects: dict | None = None,
    repacked_from: dict | None = None,
) -> dict:
    manifest: dict = {
        "stats": {} if stats is None else {"rejected": stats},
        "inputs": [{"path": f"in{i}.jsonl", "rejected": r} for i, r in enumerate(inputs)],
    }
    if rejects is not None:
        manifest["rejects"] = rejects
    if repacked_from is not None:
        manifest["repacked_from"] = repacked_from
    return manifest


def lines_of(*indices: int) -> bytes:
    return b"".join(
        json.dumps({"sample_index": i, "reason": "empty"}).encode() + b"\n" for i in indices
    )


def check() -> CheckResult:
    return CheckResult("manifest")


# --- read_rejects: the manifest's three counts ------------------------------------------


def test_no_rejects_anywhere_is_none_and_no_failure(tmp_path: Path):
    result = check()
    assert read_rejects(tmp_path, manifest_with(), result) is None
    assert result.ok and result.failures == []


def test_no_stats_rejected_and_no_inputs_counts_zero(tmp_path: Path):
    result = check()
    manifest = {"stats": {}}
    assert read_rejects(tmp_path, manifest, result) is None
    assert result.failure_count == 0


def test_per_input_differs_from_stats(tmp_path: Path):
    result = check()
    manifest = manifest_with(stats=2, inputs=(1, 2), rejects=None)
    assert read_rejects(tmp_path, manifest, result) is None
    assert messages(result) == [
        "manifest inputs record 3 rejected sample(s) but its stats 2",
        "manifest stats record 2 rejected but no rejects file",
    ]
    assert result.failure_count == 2
    assert [f.check for f in result.failures] == ["manifest", "manifest"]


def test_per_input_differs_with_a_prior_repack(tmp_path: Path):
    result = check()
    manifest = manifest_with(
        stats=0, inputs=(4,), repacked_from={"absent": {"rejected": 3, "dropped": 7}}
    )
    assert read_rejects(tmp_path, manifest, result) is None
    assert messages(result) == [
        "manifest inputs record 4 rejected sample(s) but its stats 0 (and 3 before a repack)"
    ]


def test_per_input_matches_stats_plus_prior_repack(tmp_path: Path):
    result = check()
    manifest = manifest_with(stats=0, inputs=(1, 2), repacked_from={"absent": {"rejected": 3}})
    assert read_rejects(tmp_path, manifest, result) is None
    assert result.ok


@pytest.mark.parametrize(
    "repacked_from", [{}, {"absent": None}, {"absent": {}}, {"absent": {"dropped": 5}}]
)
def test_repack_without_prior_rejects_counts_zero(tmp_path: Path, repacked_from: dict):
    ok, bad = check(), check()
    assert (
        read_rejects(tmp_path, manifest_with(inputs=(0,), repacked_from=repacked_from), ok) is None
    )
    assert ok.ok
    read_rejects(tmp_path, manifest_with(inputs=(1,), repacked_from=repacked_from), bad)
    assert messages(bad) == ["manifest inputs record 1 rejected sample(s) but its stats 0"]


def test_repacked_from_null_counts_zero(tmp_path: Path):
    result = check()
    manifest = manifest_with(inputs=(2,), stats=2, rejects=None)
    manifest["repacked_from"] = None
    read_rejects(tmp_path, manifest, result)
    assert messages(result) == ["manifest stats record 2 rejected but no rejects file"]


def test_input_without_rejected_key_counts_zero(tmp_path: Path):
    result = check()
    manifest = {"stats": {"rejected": 1}, "inputs": [{"path": "a"}, {"path": "b", "rejected": 1}]}
    read_rejects(tmp_path, manifest, result)
    assert messages(result) == ["manifest stats record 1 rejected but no rejects file"]


def test_no_rejects_file_and_only_per_input_rejected(tmp_path: Path):
    """Stats record none: only the per-input disagreement is a failure."""
    result = check()
    assert read_rejects(tmp_path, manifest_with(stats=0, inputs=(2,)), result) is None
    assert messages(result) == ["manifest inputs record 2 rejected sample(s) but its stats 0"]


def test_empty_rejects_entry_is_no_rejects_file(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(lines_of(0))
    result = check()
    assert read_rejects(tmp_path, manifest_with(stats=1, inputs=(1,), rejects={}), result) is None
    assert messages(result) == ["manifest stats record 1 rejected but no rejects file"]


# --- read_rejects: the file ---------------------------------------------------------------


def test_missing_file_is_unreadable(tmp_path: Path):
    result = check()
    manifest = manifest_with(stats=1, inputs=(1,), rejects={"file": "rejects.jsonl", "count": 1})
    assert read_rejects(tmp_path, manifest, result) is None
    assert messages(result) == [
        "rejects.jsonl: listed in the manifest but unreadable (No such file or directory)"
    ]


def test_directory_is_unreadable_and_named_as_the_manifest_names_it(tmp_path: Path):
    (tmp_path / "other.jsonl").mkdir()
    result = check()
    manifest = manifest_with(stats=1, inputs=(1,), rejects={"file": "other.jsonl", "count": 1})
    assert read_rejects(tmp_path, manifest, result) is None
    assert messages(result) == [
        "other.jsonl: listed in the manifest but unreadable (Is a directory)"
    ]


def test_file_defaults_to_rejects_jsonl(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(lines_of(5, 2))
    result = check()
    index = read_rejects(
        tmp_path, manifest_with(stats=2, inputs=(2,), rejects={"count": 2}), result
    )
    assert result.ok, messages(result)
    assert index.dtype == np.int64
    assert index.tolist() == [5, 2]


def test_index_in_file_order_as_int64(tmp_path: Path):
    (tmp_path / "r.jsonl").write_bytes(lines_of(9, 0, 4))
    result = check()
    manifest = manifest_with(stats=3, inputs=(1, 2), rejects={"file": "r.jsonl", "count": 3})
    index = read_rejects(tmp_path, manifest, result)
    assert result.failures == []
    assert isinstance(index, np.ndarray)
    assert index.dtype == np.int64
    assert index.tolist() == [9, 0, 4]


def test_empty_file_gives_an_empty_int64_index(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(b"")
    result = check()
    manifest = manifest_with(stats=0, inputs=(0,), rejects={"file": "rejects.jsonl", "count": 0})
    index = read_rejects(tmp_path, manifest, result)
    assert result.ok
    assert index.dtype == np.int64 and index.shape == (0,)


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_matching_hash_is_no_failure(tmp_path: Path, algorithm: str):
    data = lines_of(1, 3)
    (tmp_path / "rejects.jsonl").write_bytes(data)
    digest = (xxhash.xxh3_128 if algorithm == "xxh3_128" else hashlib.sha256)(data).hexdigest()
    result = check()
    entry = {"file": "rejects.jsonl", "count": 2, algorithm: digest}
    index = read_rejects(tmp_path, manifest_with(stats=2, inputs=(2,), rejects=entry), result)
    assert result.ok, messages(result)
    assert index.tolist() == [1, 3]


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_hash_mismatch(tmp_path: Path, algorithm: str):
    data = lines_of(1, 3)
    (tmp_path / "rejects.jsonl").write_bytes(data)
    digest = (xxhash.xxh3_128 if algorithm == "xxh3_128" else hashlib.sha256)(
        data + b"\n"
    ).hexdigest()
    result = check()
    entry = {"file": "rejects.jsonl", "count": 2, algorithm: digest}
    index = read_rejects(tmp_path, manifest_with(stats=2, inputs=(2,), rejects=entry), result)
    assert messages(result) == [
        f"rejects.jsonl: {algorithm} differs from the manifest (changed after packing)"
    ]
    assert index.tolist() == [1, 3]  # the lines are still read and returned


def test_hash_of_the_other_algorithm_is_a_mismatch(tmp_path: Path):
    data = lines_of(0)
    (tmp_path / "rejects.jsonl").write_bytes(data)
    result = check()
    entry = {"file": "rejects.jsonl", "sha256": xxhash.xxh3_128(data).hexdigest()}
    read_rejects(tmp_path, manifest_with(stats=1, inputs=(1,), rejects=entry), result)
    assert messages(result) == [
        "rejects.jsonl: sha256 differs from the manifest (changed after packing)"
    ]


def test_blank_lines_are_skipped(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(
        b"\n" + lines_of(7) + b"   \n\t\n" + lines_of(8) + b"\r\n"
    )
    result = check()
    entry = {"file": "rejects.jsonl", "count": 2}
    index = read_rejects(tmp_path, manifest_with(stats=2, inputs=(2,), rejects=entry), result)
    assert result.ok, messages(result)
    assert index.tolist() == [7, 8]


@pytest.mark.parametrize(
    "bad",
    [
        b'{"reason": "empty"}\n',  # no sample_index
        b"not json\n",
        b"[1, 2]\n",  # JSON, not an object
        b'{"sample_index": null}\n',
        b'{"sample_index": "x"}\n',
    ],
)
def test_line_without_a_sample_index(tmp_path: Path, bad: bytes):
    (tmp_path / "rejects.jsonl").write_bytes(lines_of(0) + bad + lines_of(1))
    result = check()
    entry = {"file": "rejects.jsonl", "count": 3}
    index = read_rejects(tmp_path, manifest_with(stats=3, inputs=(3,), rejects=entry), result)
    assert index is None
    assert messages(result) == ["rejects.jsonl: not a JSON line with a sample_index on every line"]


def test_count_disagrees_with_the_lines(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(lines_of(0, 1))
    result = check()
    entry = {"file": "rejects.jsonl", "count": 3}
    index = read_rejects(tmp_path, manifest_with(stats=2, inputs=(2,), rejects=entry), result)
    assert messages(result) == [
        "rejects.jsonl: lists 2 sample(s) but the manifest's rejects.count 3"
    ]
    assert index.tolist() == [0, 1]


def test_stats_disagree_with_the_lines(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(lines_of(0, 1))
    result = check()
    entry = {"file": "rejects.jsonl", "count": 2}
    index = read_rejects(tmp_path, manifest_with(stats=4, inputs=(4,), rejects=entry), result)
    assert messages(result) == ["rejects.jsonl: lists 2 sample(s) but the manifest's stats 4"]
    assert index.tolist() == [0, 1]


def test_count_and_stats_both_disagree(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(lines_of(0))
    result = check()
    entry = {"file": "rejects.jsonl", "count": 0}
    read_rejects(tmp_path, manifest_with(stats=2, inputs=(2,), rejects=entry), result)
    assert messages(result) == [
        "rejects.jsonl: lists 1 sample(s) but the manifest's rejects.count 0",
        "rejects.jsonl: lists 1 sample(s) but the manifest's stats 2",
    ]
    assert result.failure_count == 2


def test_count_absent_checks_stats_only(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(lines_of(0, 1, 2))
    ok, bad = check(), check()
    entry = {"file": "rejects.jsonl"}
    assert read_rejects(tmp_path, manifest_with(stats=3, inputs=(3,), rejects=entry), ok).size == 3
    assert ok.ok
    read_rejects(tmp_path, manifest_with(stats=1, inputs=(1,), rejects=entry), bad)
    assert messages(bad) == ["rejects.jsonl: lists 3 sample(s) but the manifest's stats 1"]


def test_stats_without_rejected_count_zero_against_the_lines(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(lines_of(6))
    result = check()
    manifest = {"stats": {}, "inputs": [], "rejects": {"file": "rejects.jsonl", "count": 1}}
    index = read_rejects(tmp_path, manifest, result)
    assert messages(result) == ["rejects.jsonl: lists 1 sample(s) but the manifest's stats 0"]
    assert index.tolist() == [6]


def test_count_as_a_string_is_compared_as_a_number(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(lines_of(0, 1))
    ok, bad = check(), check()
    read_rejects(tmp_path, manifest_with(2, (2,), {"file": "rejects.jsonl", "count": "2"}), ok)
    assert ok.ok
    read_rejects(tmp_path, manifest_with(2, (2,), {"file": "rejects.jsonl", "count": "5"}), bad)
    assert messages(bad) == ["rejects.jsonl: lists 2 sample(s) but the manifest's rejects.count 5"]


def test_duplicates(tmp_path: Path):
    (tmp_path / "rejects.jsonl").write_bytes(lines_of(3, 1, 3))
    result = check()
    entry = {"file": "rejects.jsonl", "count": 3}
    index = read_rejects(tmp_path, manifest_with(stats=3, inputs=(3,), rejects=entry), result)
    assert messages(result) == ["rejects.jsonl: lists a sample more than once"]
    assert result.failure_count == 1
    assert index.dtype == np.int64
    assert index.tolist() == [3, 1, 3]


def test_every_failure_at_once(tmp_path: Path):
    data = lines_of(2, 2)
    (tmp_path / "rejects.jsonl").write_bytes(data)
    result = check()
    entry = {"file": "rejects.jsonl", "count": 5, "sha256": hashlib.sha256(b"x").hexdigest()}
    manifest = manifest_with(stats=1, inputs=(9,), rejects=entry)
    index = read_rejects(tmp_path, manifest, result)
    assert messages(result) == [
        "manifest inputs record 9 rejected sample(s) but its stats 1",
        "rejects.jsonl: sha256 differs from the manifest (changed after packing)",
        "rejects.jsonl: lists 2 sample(s) but the manifest's rejects.count 5",
        "rejects.jsonl: lists 2 sample(s) but the manifest's stats 1",
        "rejects.jsonl: lists a sample more than once",
    ]
    assert index.tolist() == [2, 2]


# --- check_rejected_inputs --------------------------------------------------------------


def test_rejected_inputs_agree():
    result = CheckResult("input")
    source_rejected = np.array([False, True, False, True])
    manifest = manifest_with(stats=2)
    check_rejected_inputs(source_rejected, np.array([3, 1], np.int64), manifest, result)
    assert result.ok and result.failures == []


def test_rejected_inputs_agree_without_a_rejects_list():
    result = CheckResult("input")
    check_rejected_inputs(np.array([True, False]), None, manifest_with(stats=1), result)
    assert result.ok


def test_rejected_inputs_more_than_the_manifest_accounts_for():
    result = CheckResult("input")
    source_rejected = np.array([True, True, False, True])
    check_rejected_inputs(source_rejected, np.array([0, 1], np.int64), manifest_with(2), result)
    assert messages(result) == [
        "the inputs hold 3 sample(s) that packer rejects, but the manifest accounts for 2"
    ]
    assert [f.check for f in result.failures] == ["input"]


def test_rejected_inputs_count_the_prior_repack():
    source_rejected = np.array([True, True, False, True])
    ok, bad = CheckResult("input"), CheckResult("input")
    prior = {"absent": {"rejected": 2}}
    check_rejected_inputs(source_rejected, None, manifest_with(1, repacked_from=prior), ok)
    assert ok.ok
    check_rejected_inputs(source_rejected, None, manifest_with(2, repacked_from=prior), bad)
    assert messages(bad) == [
        "the inputs hold 3 sample(s) that packer rejects, but the manifest accounts for 4"
    ]


@pytest.mark.parametrize("repacked_from", [None, {}, {"absent": None}, {"absent": {}}])
def test_rejected_inputs_without_prior_rejects(repacked_from):
    result = CheckResult("input")
    manifest = manifest_with(stats=None)
    manifest["repacked_from"] = repacked_from
    check_rejected_inputs(np.array([False, True]), None, manifest, result)
    assert messages(result) == [
        "the inputs hold 1 sample(s) that packer rejects, but the manifest accounts for 0"
    ]


def test_rejected_inputs_none_and_none_recorded():
    result = CheckResult("input")
    check_rejected_inputs(np.zeros(3, bool), np.zeros(0, np.int64), {"stats": {}}, result)
    assert result.ok


def test_rejects_list_names_other_samples():
    result = CheckResult("input")
    source_rejected = np.array([False, True, False, True, False])
    check_rejected_inputs(source_rejected, np.array([4, 0], np.int64), manifest_with(2), result)
    assert messages(result) == [
        "rejects.jsonl lists samples 0, 4 that the inputs hold as valid (it should list 1, 3)"
    ]


def test_rejects_list_with_a_duplicate_and_a_missing_sample():
    result = CheckResult("input")
    source_rejected = np.array([True, True, False])
    check_rejected_inputs(source_rejected, np.array([0, 0], np.int64), manifest_with(2), result)
    assert messages(result) == [
        "rejects.jsonl lists samples  that the inputs hold as valid (it should list 1)"
    ]


def test_rejects_list_names_at_most_ten_samples_each_way():
    source_rejected = np.zeros(40, bool)
    source_rejected[:12] = True
    rejected = np.arange(20, 32, dtype=np.int64)[::-1]
    result = CheckResult("input")
    check_rejected_inputs(source_rejected, rejected, manifest_with(12), result)
    assert messages(result) == [
        "rejects.jsonl lists samples 20, 21, 22, 23, 24, 25, 26, 27, 28, 29 that the inputs "
        "hold as valid (it should list 0, 1, 2, 3, 4, 5, 6, 7, 8, 9)"
    ]


def test_rejects_list_in_another_order_agrees():
    result = CheckResult("input")
    source_rejected = np.array([True, False, True, True])
    check_rejected_inputs(source_rejected, np.array([3, 0, 2], np.int64), manifest_with(3), result)
    assert result.ok


def test_count_mismatch_hides_the_list_comparison():
    result = CheckResult("input")
    source_rejected = np.array([True, False])
    check_rejected_inputs(source_rejected, np.array([1], np.int64), manifest_with(0), result)
    assert messages(result) == [
        "the inputs hold 1 sample(s) that packer rejects, but the manifest accounts for 0"
    ]


# --- check_fingerprints, full_view, source_to_compare -----------------------------------


def source_file(i: int, samples: int, first: int, rejected: int = 0) -> SourceFile:
    return SourceFile(
        path=Path(f"/data/in{i}.jsonl"),
        format="jsonl",
        num_samples=samples,
        first_index=first,
        size=100 + i,
        fingerprint=f"fp{i}",
        has_labels=False,
        rejected=rejected,
    )


def input_entry(src: SourceFile) -> dict:
    return {
        "path": f"recorded/in{src.path.stem[-1]}.jsonl",
        "bytes": src.size,
        "fingerprint": src.fingerprint,
        "rejected": src.rejected,
    }


def samples_of(lengths: list[int], sources: list[SourceFile], index=None) -> Samples:
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.arange(int(offsets[-1]), dtype=np.int32) + 100
    return Samples(
        tokens=tokens,
        offsets=offsets,
        labels=None,
        sources=sources,
        index=None if index is None else np.asarray(index, np.int64),
    )


def two_files() -> list[SourceFile]:
    return [source_file(0, 3, 0), source_file(1, 2, 3)]


def test_fingerprints_match():
    sources = two_files()
    result = CheckResult("input")
    manifest = {"inputs": [input_entry(s) for s in sources]}
    assert check_fingerprints(samples_of([1, 2, 3, 4, 5], sources), manifest, result) is True
    assert result.ok and result.failures == []


def test_fingerprints_other_number_of_files():
    sources = two_files()
    manifest = {"inputs": [input_entry(sources[0])]}
    result = CheckResult("input")
    assert check_fingerprints(samples_of([1] * 5, sources), manifest, result) is False
    assert messages(result) == [
        "inputs names 2 file(s) but the manifest's inputs are 1: recorded/in0.jsonl"
    ]
    with flag_names():
        cli = CheckResult("input")
        assert check_fingerprints(samples_of([1] * 5, sources), manifest, cli) is False
    assert messages(cli) == [
        "--input names 2 file(s) but the manifest's inputs are 1: recorded/in0.jsonl"
    ]


def test_fingerprints_fewer_files_than_recorded():
    sources = two_files()
    manifest = {"inputs": [input_entry(s) for s in sources] + [{"bytes": 1}]}
    result = CheckResult("input")
    assert check_fingerprints(samples_of([1] * 5, sources), manifest, result) is False
    assert messages(result) == [
        "inputs names 2 file(s) but the manifest's inputs are 3: "
        "recorded/in0.jsonl, recorded/in1.jsonl, None"
    ]


def test_fingerprints_no_inputs_recorded():
    result = CheckResult("input")
    assert check_fingerprints(samples_of([], []), {}, result) is True
    assert result.ok
    assert check_fingerprints(samples_of([2], [source_file(0, 1, 0)]), {}, result) is False
    assert messages(result) == ["inputs names 1 file(s) but the manifest's inputs are 0: "]


@pytest.mark.parametrize(
    "change", [{"bytes": 100}, {"fingerprint": "other"}, {"bytes": None}, {"fingerprint": None}]
)
def test_fingerprints_first_file_that_differs(change: dict):
    sources = two_files()
    entries = [input_entry(s) for s in sources]
    entries[1] = {k: v for k, v in {**entries[1], **change}.items() if v is not None}
    entries.append({"path": "third"})
    sources.append(source_file(2, 1, 5))  # differs too, but only the first is named
    result = CheckResult("input")
    assert check_fingerprints(samples_of([1] * 6, sources), {"inputs": entries}, result) is False
    assert messages(result) == [
        "/data/in1.jsonl: its fingerprint does not match the manifest's input "
        "recorded/in1.jsonl (another file, or changed since packing); the samples were not "
        "compared"
    ]
    assert result.failure_count == 1


def test_fingerprints_bytes_as_a_string_is_a_number():
    sources = two_files()
    entries = [input_entry(s) for s in sources]
    entries[0]["bytes"] = "100"
    result = CheckResult("input")
    assert check_fingerprints(samples_of([1] * 5, sources), {"inputs": entries}, result) is True
    assert result.ok


def test_full_view_without_rejects_is_the_source():
    source = samples_of([2, 1, 3], [source_file(0, 3, 0)])
    view, rejected = full_view(source)
    assert view is source
    assert rejected.dtype == bool
    assert rejected.tolist() == [False, False, False]


def test_full_view_numbers_as_the_input():
    sources = [source_file(0, 3, 0, rejected=1), source_file(1, 3, 3, rejected=2)]
    source = samples_of([2, 1, 3], sources, index=[0, 2, 4])
    view, rejected = full_view(source)
    assert view is not source
    assert view.index is None
    assert view.offsets.dtype == np.int64
    assert view.offsets.tolist() == [0, 2, 2, 3, 3, 6, 6]
    assert rejected.dtype == bool
    assert rejected.tolist() == [False, True, False, True, False, True]
    assert view.tokens is source.tokens and view.sources is source.sources
    assert view.tokens[view.offsets[4] : view.offsets[5]].tolist() == [103, 104, 105]
    assert source.index.tolist() == [0, 2, 4]  # the source itself is left as it was


def test_full_view_all_rejected():
    source = samples_of([], [source_file(0, 2, 0, rejected=2)], index=[])
    view, rejected = full_view(source)
    assert view.offsets.tolist() == [0, 0, 0]
    assert rejected.tolist() == [True, True]


def test_source_to_compare_other_files():
    sources = two_files()
    result = CheckResult("input", details={"samples": 5, "tokens": 9, "kept": 1})
    source = samples_of([1] * 5, sources)
    got, rejected = source_to_compare(source, {"inputs": [], "stats": {}}, None, result)
    assert got is None and rejected is False
    assert result.details == {"samples": None, "tokens": None, "kept": 1}
    assert result.failure_count == 1


def test_source_to_compare_full_view_and_rejects_checked():
    sources = [source_file(0, 3, 0, rejected=1), source_file(1, 2, 3)]
    manifest = {"inputs": [input_entry(s) for s in sources], "stats": {"rejected": 1}}
    source = samples_of([2, 1, 3, 1], sources, index=[0, 2, 3, 4])
    result = CheckResult("input", details={"samples": 4})
    got, rejected = source_to_compare(source, manifest, np.array([1], np.int64), result)
    assert result.ok, messages(result)
    assert result.details == {"samples": 4}
    assert got.index is None
    assert got.offsets.tolist() == [0, 2, 2, 3, 6, 7]
    assert rejected.tolist() == [False, True, False, False, False]


def test_source_to_compare_reports_the_rejects_that_differ():
    sources = [source_file(0, 3, 0, rejected=1), source_file(1, 2, 3)]
    manifest = {"inputs": [input_entry(s) for s in sources], "stats": {"rejected": 1}}
    source = samples_of([2, 1, 3, 1], sources, index=[0, 2, 3, 4])
    result = CheckResult("input")
    got, rejected = source_to_compare(source, manifest, np.array([2], np.int64), result)
    assert messages(result) == [
        "rejects.jsonl lists samples 2 that the inputs hold as valid (it should list 1)"
    ]
    assert got is not None
    assert rejected.tolist() == [False, True, False, False, False]


def test_source_to_compare_without_rejects():
    sources = two_files()
    manifest = {"inputs": [input_entry(s) for s in sources], "stats": {}}
    source = samples_of([1, 2, 3, 4, 5], sources)
    result = CheckResult("input")
    got, rejected = source_to_compare(source, manifest, None, result)
    assert result.ok
    assert got is source
    assert rejected.tolist() == [False] * 5


def test_fingerprints_bytes_not_recorded_differs_from_an_empty_file():
    src = source_file(0, 0, 0)
    src.size = 0
    entry = {"path": "empty.jsonl", "fingerprint": src.fingerprint}
    result = CheckResult("input")
    assert check_fingerprints(samples_of([], [src]), {"inputs": [entry]}, result) is False
    assert messages(result) == [
        "/data/in0.jsonl: its fingerprint does not match the manifest's input empty.jsonl "
        "(another file, or changed since packing); the samples were not compared"
    ]
    ok = CheckResult("input")
    entry["bytes"] = 0
    assert check_fingerprints(samples_of([], [src]), {"inputs": [entry]}, ok) is True
    assert ok.ok
