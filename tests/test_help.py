"""Every command's --help gives each option's default, and the choices of every closed set."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from packer.cli import app

COMMANDS = typer.main.get_command(app).commands
# options whose values form a closed set, wherever a command has them
CLOSED_SETS = {
    "--strategy",
    "--overlength",
    "--on-error",
    "--hash",
    "--backend",
    "--dtype",
    "--mode",
}


def options(name: str):
    for param in COMMANDS[name].params:
        if param.param_type_name == "option" and "--help" not in param.opts:
            yield param


def shows_default(param) -> bool:
    text = param.help or ""
    if "[default:" in text or "[required" in text or param.required:
        return True
    # click prints "[default: X]" itself for a non-flag option with a default
    return param.default is not None and not param.is_flag and param.show_default is not False


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_states_its_default(name):
    missing = [p.opts[-1] for p in options(name) if not shows_default(p)]
    assert not missing, f"`packer {name} --help` gives no default for {missing}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_closed_sets_list_their_choices(name):
    for param in options(name):
        if CLOSED_SETS & set(param.opts):
            metavar = param.metavar or ""
            assert metavar.startswith("[") and "|" in metavar, (
                f"`packer {name} {param.opts[-1]}` does not list its choices ({metavar!r})"
            )


def test_help_shows_defaults_as_written(cli):
    result = cli("pack", "--help")
    text = " ".join(result.stdout.split())  # undo the wrapping
    assert "--strategy [bfd|ffd|nf|ff-shuffle|histogram]" in text
    assert "[default: bfd, or the config's]" in text
    assert "--overwrite Replace an existing output" in text and "[default: off]" in text
    assert "[required, here or in --config]" in text


CLI_DOC = Path(__file__).parent.parent / "docs" / "cli.md"


def help_examples(text: str) -> list[str]:
    """The command lines under 'Examples:' at the end of a --help text."""
    return [line.strip() for line in text.split("\n  Examples:\n")[-1].splitlines() if line]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_docs_show_the_examples_of_help(cli, name):
    """docs/cli.md is written by hand: this check (and tests/test_docs.py for the options)
    says exactly what to copy when a command's --help changes."""
    examples = help_examples(cli(name, "--help").stdout)
    assert examples, f"`packer {name} --help` shows no examples"
    section = re.search(
        rf"^### packer {name}\n(.*?)(?=^#{{1,3}} |\Z)", CLI_DOC.read_text(), re.M | re.S
    )
    assert section, f"docs/cli.md has no '### packer {name}' section"
    block = re.search(r"^Examples .*?\n\n```(?:bash)?\n(.*?)```", section.group(1), re.M | re.S)
    documented = block.group(1).splitlines() if block else []
    assert documented == examples, (
        f"docs/cli.md's examples for `packer {name}` differ from `packer {name} --help`: replace "
        f"the ``` block after 'Examples (as `packer {name} --help` shows them):' in its section "
        f"with the lines under 'Examples:' of `python -m packer {name} --help`: {examples}"
    )
