"""Build `.venv-core`: packer's core install, `pip install .` with no extras, as a user's CI has.

The development stack brings packages the core does not (click through ray and huggingface_hub,
torch, transformers, tokenizers): code that needs one of them by accident works in `.venv` and
fails on a user's machine. tests/test_core_install.py runs the CLI here, with this checkout's
sources first on PYTHONPATH, so the installed copy of packer only pins the dependencies.

Built once and reused while pyproject.toml's project table is unchanged (the stamp holds its
hash); a lock file keeps two test workers from building it together. `--no-compile`: pip's
byte-compiling of pyarrow, numba and llvmlite was half the build, and the tests compile only
what they import. `python scripts/core_venv.py` prints the venv's python (and builds it if needed).

Usage: python scripts/core_venv.py [DIR]   (default: .venv-core beside the repo's files)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = ".core-installed"


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def wanted() -> str:
    """What the venv was built from: pyproject.toml's [project] and [build-system] tables (its
    tool settings, pytest's markers among them, change nothing installed)."""
    text = (ROOT / "pyproject.toml").read_bytes()
    try:
        import tomllib
    except ImportError:  # Python 3.10: the whole file
        return hashlib.sha256(text).hexdigest()
    config = tomllib.loads(text.decode())
    tables = {k: config.get(k) for k in ("project", "build-system")}
    return hashlib.sha256(json.dumps(tables, sort_keys=True).encode()).hexdigest()


def build(env: Path) -> Path:
    env.parent.mkdir(parents=True, exist_ok=True)
    with open(env.parent / f"{env.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = env / STAMP
        if stamp.is_file() and stamp.read_text() == wanted() and python_of(env).exists():
            return python_of(env)
        venv.EnvBuilder(clear=True, with_pip=True).create(env)
        subprocess.run(
            [
                str(python_of(env)),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-warn-script-location",
                "--no-compile",
                ".",
            ],
            cwd=ROOT,
            check=True,
        )
        stamp.write_text(wanted())
    return python_of(env)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".venv-core"
    print(build(target))
