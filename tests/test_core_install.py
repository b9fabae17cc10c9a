"""The CLI's error paths on the core install (`pip install .`, no extras), in a real virtualenv.

Every failure is one `error:` line and its exit code, never a traceback: also where typer's
vendored click is the only click, and torch, transformers and tokenizers are not installed.
The virtualenv (.venv-core, scripts/core_venv.py) is built once and reused; this checkout's
sources come first on PYTHONPATH, so the installed copy only brings the dependencies.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
DEV_ONLY = ("click", "torch", "transformers", "tokenizers", "jinja2", "datasets", "ray")
TORCH_LINE = (
    "error: the attention check needs torch (packer's 'verify' extra): pip install torch, or pass "
    "--no-attention for the structural checks alone"
)


@pytest.fixture(scope="session")
def core_bin() -> Path:
    """The core virtualenv's bin directory; skipped where it cannot be built (no index)."""
    try:
        out = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "core_venv.py")],
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )
    except subprocess.CalledProcessError as e:
        pytest.skip(
            f"the core virtualenv (scripts/core_venv.py) cannot be built: {e.stderr[-500:]}"
        )
    except (subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"the core virtualenv (scripts/core_venv.py) cannot be built: {e}")
    return Path(out.stdout.strip().splitlines()[-1]).parent


def packer(core_bin: Path, *args, cwd: Path) -> subprocess.CompletedProcess:
    """The installed `packer` command of the core virtualenv, running this checkout's code."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "VIRTUAL_ENV")}
    # the checkout's numba cache, as the dev stack's runs use it (the same numba version)
    env.update(PYTHONPATH=str(ROOT), PACKER_PROGRESS_INTERVAL="3600", COLUMNS="200")
    return subprocess.run(
        [str(core_bin / "packer"), *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def work(core_bin, tmp_path_factory) -> Path:
    """A directory with token data, a packed output, raw chats, a tokenizer directory and a
    broken config, all made with the core install."""
    root = tmp_path_factory.mktemp("core")
    write_jsonl(root / "a.jsonl", make_samples(40, seed=3, median=20, max_len=64, vocab=300))
    res = packer(core_bin, "pack", "a.jsonl", "-o", "packed", "-L", "64", cwd=root)
    assert res.returncode == 0, res.stderr
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (root / "chats.jsonl").write_text(json.dumps({"messages": chat}) + "\n")
    (root / "tok").mkdir()
    (root / "tok" / "tokenizer.json").write_text("{}")
    (root / "bad.yaml").write_text("max_len: [\n")
    return root


def test_packer_imports_no_click():
    """typer (0.26 on) vendors click and installs none: an `import click` works in the dev stack
    (ray and huggingface_hub bring it) and fails on the core install. Read with `ast`, so this
    holds where the core virtualenv cannot be built."""
    import ast

    found = []
    for path in sorted((ROOT / "packer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}"
                for name in names
                if name.split(".")[0] == "click"
            ]
    assert found == []


def test_the_core_install_lacks_the_dev_packages(core_bin, work):
    """What the tests below rely on: none of the packages only the dev stack brings."""
    code = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    res = subprocess.run(
        [str(core_bin / "python"), "-c", code, *DEV_ONLY], capture_output=True, text=True
    )
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (
            ["pack", "missing.jsonl", "-o", "out", "-L", "10"],
            1,
            "error: missing.jsonl: no such file or directory",
        ),
        (
            ["pack", "a.jsonl", "-o", "out", "-L", "10", "--no-such-flag"],
            2,
            "error: No such option: --no-such-flag (see 'packer pack --help')",
        ),
        (["nope"], 2, "error: No such command 'nope'. (see 'packer --help')"),
        (["pack", "a.jsonl", "-L", "10"], 2, "error: Missing option '--output' / '-o'."),
        (["pack", "a.jsonl", "-o", "out", "-L", "ten"], 2, "error: Invalid value for '--max-len'"),
        (["plan", "missing.jsonl", "-L", "8"], 1, "error: missing.jsonl: no such file"),
        (["pack", "a.jsonl", "-o", "out", "--config", "bad.yaml"], 2, "error: bad.yaml: line 2"),
        (["verify", "packed"], 2, TORCH_LINE),
        (["verify", "a.jsonl", "--no-attention"], 2, "error: a.jsonl: not a directory"),
        (["pack", "packed", "-o", "packed", "-L", "64", "--repack"], 2, "error: packed: output"),
        (["export", "packed", "--to", "nope", "-o", "x"], 2, "error: --to must be one of"),
        (
            ["pack", "chats.jsonl", "-o", "out", "-L", "64"],
            2,
            "error: chats.jsonl has no 'input_ids' column",
        ),
        (
            ["pack", "chats.jsonl", "--tokenizer", "tok", "-o", "out", "-L", "64"],
            2,
            "error: --tokenizer: tokenizing needs transformers",
        ),
        (
            ["tokenize", "chats.jsonl", "--tokenizer", "tok", "-o", "out"],
            2,
            "error: --tokenizer: tokenizing needs transformers",
        ),
        (
            ["inspect", "packed", "--tokenizer", "tok"],
            2,
            "error: --tokenizer needs the tokenizers package",
        ),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_an_error_is_one_line_on_the_core_install(core_bin, work, args, code, line):
    res = packer(core_bin, *args, cwd=work)
    assert "Traceback" not in res.stderr and "click" not in res.stderr, res.stderr
    assert res.returncode == code, res.stderr
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith(line), res.stderr
    assert res.stdout == ""
    assert not (work / "out").exists()


def test_a_json_command_fails_with_a_json_object_on_the_core_install(core_bin, work):
    for args, code in (
        (["pack", "missing.jsonl", "-o", "out", "-L", "8", "--json"], 1),
        (["pack", "a.jsonl", "-o", "out", "-L", "8", "--json", "--no-such-flag"], 2),
        (["verify", "packed", "--json"], 2),
    ):
        res = packer(core_bin, *args, cwd=work)
        assert res.returncode == code, res.stderr
        reply = json.loads(res.stdout)
        assert reply["exit_code"] == code and res.stderr == f"error: {reply['error']}\n"


def test_the_commands_run_on_the_core_install(core_bin, work):
    """No error: plain `packer` prints the help, --version the version, and the packed output
    passes `verify --no-attention`."""
    res = packer(core_bin, cwd=work)
    assert res.returncode == 0 and res.stdout.startswith("Usage: packer") and not res.stderr
    res = packer(core_bin, "--version", cwd=work)
    assert res.returncode == 0 and res.stdout.startswith("packer ")
    res = packer(core_bin, "verify", "packed", "--input", "a.jsonl", "--no-attention", cwd=work)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
