"""One version: the distribution's (pyproject.toml), `packer.__version__`, `packer --version` and
what manifests record are the same string."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import packer
from packer.cli import app
from packer.version import __version__

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


def test_one_version_everywhere(tmp_path):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__ == packer.__version__
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and __version__ in res.output, res.output
    src = tmp_path / "x.jsonl"
    src.write_text('{"input_ids": [1, 2, 3]}\n')
    packer.pack(src, tmp_path / "out", packer.PackConfig(max_len=8))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["packer_version"] == __version__
