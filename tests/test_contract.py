"""packer.contract read directly: `read_manifest` (also `packer.read_manifest`) and the lenient
`packer_manifest` test, on real outputs and broken ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import packer
from packer.contract.manifest import packer_manifest, read_manifest
from packer.errors import UsageError


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("contract")
    src = root / "x.jsonl"
    src.write_text("".join(json.dumps({"input_ids": [1, 2, 3 + i]}) + "\n" for i in range(5)))
    packer.pack(src, root / "out", packer.PackConfig(max_len=8))
    return root / "out"


def test_read_manifest_of_an_output(output):
    manifest = read_manifest(output)
    assert manifest == json.loads((output / "manifest.json").read_text())
    assert packer.read_manifest(str(output)) == manifest  # the public name is this reader
    assert packer_manifest(output) == manifest


def broken(tmp_path: Path, text: str) -> Path:
    d = tmp_path / "broken"
    d.mkdir()
    (d / "manifest.json").write_text(text)
    return d


def test_read_manifest_names_the_directory_when_it_is_no_output(tmp_path):
    with pytest.raises(UsageError) as info:
        read_manifest(tmp_path / "absent")
    assert str(info.value) == f"{tmp_path / 'absent'}: no such directory"
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="not a directory"):
        read_manifest(tmp_path / "file")
    with pytest.raises(UsageError) as info:
        read_manifest(tmp_path)
    assert str(info.value) == f"{tmp_path}: no manifest.json: not a packer output"
    assert packer_manifest(tmp_path) is None


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda m: "{not json", "manifest.json is not valid JSON"),
        (lambda m: json.dumps([1]), "manifest.json has no 'shards' list"),
        (lambda m: json.dumps({**m, "shards": {}}), "manifest.json has no 'shards' list"),
        (lambda m: json.dumps({k: v for k, v in m.items() if k != "stats"}), "no 'stats' object"),
        (
            lambda m: json.dumps({**m, "config": {**m["config"], "max_len": 0}}),
            "manifest.json config.max_len must be a positive integer, got 0",
        ),
        (
            lambda m: json.dumps({**m, "config": {**m["config"], "overlength": "wrap"}}),
            "config.overlength must be error or drop or truncate or split, got 'wrap'",
        ),
        (
            lambda m: json.dumps({**m, "stats": {**m["stats"], "dropped": -1}}),
            "stats.dropped must be a non-negative integer, got -1",
        ),
        (
            lambda m: json.dumps(
                {**m, "stats": {k: v for k, v in m["stats"].items() if k != "samples_in"}}
            ),
            "manifest.json has no stats.samples_in",
        ),
        (lambda m: json.dumps({**m, "shards": [{"rows": 1}]}), "shards[0] has no 'file' name"),
    ],
)
def test_read_manifest_refuses_a_broken_manifest_in_one_line(tmp_path, output, edit, words):
    manifest = json.loads((output / "manifest.json").read_text())
    d = broken(tmp_path, edit(manifest))
    with pytest.raises(UsageError) as info:
        read_manifest(d)
    message = str(info.value)
    assert message.startswith(f"{d / 'manifest.json'}: ") and words in message, message
    assert "\n" not in message


def test_packer_manifest_is_lenient_but_needs_packer_keys(tmp_path, output):
    manifest = json.loads((output / "manifest.json").read_text())
    lenient = broken(tmp_path, json.dumps({"packer_version": "0", "shards": []}))
    assert packer_manifest(lenient) == {"packer_version": "0", "shards": []}
    (lenient / "manifest.json").write_text(json.dumps({"shards": manifest["shards"]}))
    assert packer_manifest(lenient) is None
    (lenient / "manifest.json").write_bytes(b"\xff\xfe")
    assert packer_manifest(lenient) is None
