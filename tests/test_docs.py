"""The CLI reference (docs/cli.md) cannot drift from the CLI: every option of every command is
documented, and every documented option exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from packer.cli import app

CLI_DOC = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()
COMMANDS = typer.main.get_command(app).commands


def cli_options(name: str) -> set[str]:
    opts = set()
    for param in COMMANDS[name].params:
        if param.param_type_name == "option":
            opts.update(o for o in param.opts + param.secondary_opts if o.startswith("--"))
    return opts - {"--help"}


def readme_section(name: str) -> str:
    match = re.search(rf"^### packer {name}\n(.*?)(?=^#{{1,3}} |\Z)", CLI_DOC, re.M | re.S)
    assert match, f"docs/cli.md has no '### packer {name}' section"
    return match.group(1)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_readme_documents_every_option(name):
    lines = readme_section(name).splitlines()
    table = "\n".join(line for line in lines if line.startswith("| `--"))
    documented = set()
    for cell in re.findall(r"^\| ([^|]+) \|", table, re.M):
        for opt in re.findall(r"`(--[a-z0-9-]+(?:/--[a-z0-9-]+)?)`", cell):
            documented.update(opt.split("/"))
    assert documented == cli_options(name), (
        f"docs/cli.md table for `packer {name}` is out of date: missing "
        f"{sorted(cli_options(name) - documented)}, stale {sorted(documented - cli_options(name))}"
    )


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_readme_synopsis_matches_help(name):
    synopsis = re.search(r"```\n(packer .*?)```", readme_section(name), re.S).group(1)
    for opt in set(re.findall(r"(--[a-z0-9-]+)", synopsis)):
        assert opt in cli_options(name), f"docs/cli.md synopsis names {opt}, which `{name}` lacks"
