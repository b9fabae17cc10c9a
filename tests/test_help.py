"""Every command's --help gives each option's default, and the choices of every closed set."""

from __future__ import annotations

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
