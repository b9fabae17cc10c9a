"""The CLI's edges: plain `packer`, how --help names values and shows examples, `plan`'s warning
and table on a narrow terminal, and the line `inspect --html` prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from conftest import make_samples, write_jsonl

from packer.cli import app

COMMANDS = sorted(typer.main.get_command(app).commands)


def packer(*args: str, columns: int = 100) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "packer", *map(str, args)], capture_output=True, text=True, env=env
    )


def test_plain_packer_prints_the_help_without_error():
    result = packer()
    assert result.returncode == 0, result.stderr
    assert "error" not in result.stderr and result.stderr == ""
    assert result.stdout.startswith("Usage: python -m packer [OPTIONS] COMMAND [ARGS]...")
    for name in COMMANDS:
        assert f"\n  {name} " in result.stdout


def test_a_usage_error_is_still_one_error_line():
    result = packer("pack")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("name", COMMANDS)
def test_help_names_values_as_people_write_them(cli, name):
    text = cli(name, "--help").stdout
    assert "<" not in text.split("Examples:")[0], text  # no <int>, <path>, <list[int]>
    assert "{" not in text.splitlines()[0], text  # no {INPUT...}...


def test_usage_lines_and_metavars(cli):
    assert cli("pack", "--help").stdout.startswith("Usage: packer pack [OPTIONS] [INPUT...]\n")
    assert cli("plan", "--help").stdout.startswith("Usage: packer plan [OPTIONS] [INPUT...]\n")
    inspect = " ".join(cli("inspect", "--help").stdout.split())
    assert inspect.startswith("Usage: packer inspect [OPTIONS] DIR ")
    for option in ("-r, --row N", "--tokenizer PATH", "--html FILE", "--world-size N"):
        assert option in inspect
    pack = " ".join(cli("pack", "--help").stdout.split())
    for option in ("-o, --output DIR", "-L, --max-len L", "--memory-budget SIZE", "--seed N"):
        assert option in pack


@pytest.mark.parametrize("name", COMMANDS)
def test_help_ends_with_examples_that_parse(cli, name):
    text = cli(name, "--help").stdout
    assert "\n  Examples:\n" in text
    lines = [line.strip() for line in text.split("\n  Examples:\n")[1].splitlines() if line]
    assert lines and all(line.startswith(f"packer {name}") for line in lines)
    options = set()
    for param in typer.main.get_command(app).commands[name].params:
        options.update(param.opts + getattr(param, "secondary_opts", []))
    for line in lines:  # every option an example uses exists
        for word in line.split()[2:]:
            if word.startswith("-"):
                assert word in options, f"example {line!r} uses {word}, which {name} lacks"


@pytest.fixture(scope="module")
def fourteen(tmp_path_factory) -> Path:
    return write_jsonl(
        tmp_path_factory.mktemp("edges") / "a.jsonl", make_samples(14, seed=3, max_len=512)
    )


def test_plan_warns_when_ranks_outnumber_rows(fourteen: Path):
    result = packer("plan", fourteen, "-L", "512", "--world-size", "64", columns=80)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, result.stderr
    assert "--world-size 64 x --batch-size 1 takes 64 rows a step" in warnings[0]
    # on an 80-column terminal no name, header or number is cut ("ff-shuff…"), no column lost
    assert "…" not in result.stderr
    row = next(line for line in result.stderr.splitlines() if "ff-shuffle" in line)
    assert row.startswith("│ ff-shuffle │") and row.endswith("│") and row.count("│") == 8


def test_plan_says_nothing_when_rows_suffice(fourteen: Path):
    result = packer("plan", fourteen, "-L", "64", "--world-size", "2", "--overlength", "split")
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr


def test_inspect_html_says_what_it_wrote(cli, fourteen: Path, tmp_path: Path):
    out, page = tmp_path / "out", tmp_path / "report.html"
    assert cli("pack", fourteen, "-o", out, "-L", "512").exit_code == 0
    result = cli("inspect", out, "--html", page)
    assert result.exit_code == 0, result.stderr
    assert f"wrote {page}" in result.stderr.splitlines()
    assert page.read_text().startswith("<!")
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_inspect_warns_when_ranks_outnumber_rows(cli, fourteen: Path, tmp_path: Path):
    out = tmp_path / "out"
    assert cli("pack", fourteen, "-o", out, "-L", "512").exit_code == 0
    rows = json.loads((out / "manifest.json").read_text())["stats"]["rows"]
    result = cli("inspect", out, "--world-size", "64")
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: --world-size 64 is more ranks than the {rows} rows: each step is filled with "
        "repeated rows, so the DP efficiency models a padded epoch"
    ]
    assert "warning" not in cli("inspect", out, "--world-size", str(rows)).stderr
