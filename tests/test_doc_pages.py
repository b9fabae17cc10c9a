"""Every page of README.md and docs/ runs as written, top to bottom, from a fresh clone.

Each page gets its own copy of what a clone holds (`data/`, `configs/`, `scripts/`) and no
`out/`: its ```bash and ```console blocks (the `$ ` lines) run under `bash -e` and its ```python
blocks run in one namespace, in page order, so every file a command reads must be made by an
earlier command of the same page. `packer` and `python` are this interpreter's.

- A block whose first line is a comment `# needs ...` (a GPU, a cloud bucket, a model, minutes
  of benchmark) is not run; the comment is the reason, and the test lists it.
- A command whose line ends in `# exits N` (a check that is meant to fail) must exit N.

Install lines (`pip install ...`, `make demo`, `make test`) are not run: they build virtualenvs
from the network; `make demo` is measured by hand, and tests/test_no_torch.py installs the core
the way `pip install .` does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_doc_snippets import PAGES, ROOT, Block, read_blocks

SHELL = ("bash", "console")
NEEDS = re.compile(r"^\s*(?:\$ )?# (needs .+)$")
EXITS = re.compile(r"^(.*?)\s+# exits (\d+)\b.*$")
COPIED = ("data", "configs", "scripts")
# pages whose run takes minutes on 2 cores (attention checks on CPU, training loops): `slow`
SLOW_PAGES = {"README.md", "docs/cli.md", "docs/pairs.md", "docs/training.md"}


def runnable(block: Block) -> bool:
    return block.lang in (*SHELL, "python")


def skip_reason(block: Block) -> str | None:
    first = next((line for line in block.code.splitlines() if line.strip()), "")
    match = NEEDS.match(first)
    return match.group(1) if match else None


def page_blocks(page: Path) -> list[Block]:
    return [b for b in read_blocks(page) if runnable(b)]


def shell_script(block: Block) -> str:
    """The block as a bash script: a console block's `$ ` lines, install lines dropped, and
    `# exits N` turned into a check of the exit status."""
    lines = block.code.splitlines()
    if block.lang == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    script = []
    for line in lines:
        if line.lstrip().startswith(("pip install", "make ")):
            continue
        if match := EXITS.match(line):
            command, code = match.groups()
            line = f'rc=0; {command} || rc=$?; [ "$rc" -eq {code} ] || {{ echo "exited $rc, not {code}" >&2; exit 1; }}'
        script.append(line)
    return "\n".join(script) + "\n"


def test_every_runnable_block_runs_or_says_why():
    """The pages hold what this test runs: no runnable block is skipped silently."""
    blocks = [b for page in PAGES for b in page_blocks(page)]
    assert len(blocks) >= 40
    old_markers = [str(b) for b in blocks if b.skip]
    assert not old_markers, (
        f"skip markers outside the block (say `# needs ...` inside): {old_markers}"
    )
    for block in blocks:
        if reason := skip_reason(block):
            print(f"not run: {block} ({reason})")


def test_shell_script_checks_exit_codes():
    block = Block("x.md", 1, "console", "$ false   # exits 1: on purpose\nout\n$ true\n", None)
    script = shell_script(block)
    assert subprocess.run(["bash", "-e", "-c", script]).returncode == 0
    block = Block("x.md", 1, "console", "$ true   # exits 1\n", None)
    assert (
        subprocess.run(["bash", "-e", "-c", shell_script(block)], capture_output=True).returncode
        == 1
    )


def _env(home: Path) -> dict:
    bindir = str(Path(sys.executable).parent)
    return dict(
        os.environ,
        PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}",
        HF_DATASETS_CACHE=str(home / ".hf-cache"),
        HF_HUB_OFFLINE="1",
        COLUMNS="100",
        OMP_NUM_THREADS="1",
    )


def _run_page(page: Path, workdir: Path) -> list[str]:
    for name in COPIED:
        shutil.copytree(ROOT / name, workdir / name)
    env = _env(workdir)
    namespace: dict = {"__name__": "__doc__"}
    ran = []
    for block in page_blocks(page):
        if skip_reason(block):
            continue
        if block.lang in SHELL:
            res = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", shell_script(block)],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert res.returncode == 0, (
                f"{block}: exited {res.returncode}\n{block.code}\nstdout: {res.stdout[-2000:]}\n"
                f"stderr: {res.stderr[-3000:]}"
            )
        else:
            cwd = os.getcwd()
            os.chdir(workdir)
            try:
                exec(compile(block.code, str(block), "exec"), namespace)  # noqa: S102
            finally:
                os.chdir(cwd)
        ran.append(str(block))
    return ran


def _param(page: Path):
    name = str(page.relative_to(ROOT))
    marks = [pytest.mark.slow] if name in SLOW_PAGES else []
    return pytest.param(page, id=name, marks=marks)


@pytest.mark.filterwarnings("ignore:'pin_memory' argument:UserWarning")  # CPU-only machine
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("page", [_param(p) for p in PAGES if page_blocks(p)])
def test_page_runs_in_order(page: Path, tmp_path: Path, monkeypatch):
    pytest.importorskip("torch")  # packer verify's attention check, packer.torch
    for name, value in _env(tmp_path).items():
        if name != "PATH":
            monkeypatch.setenv(name, value)
    if any(b.lang == "python" and "datasets" in b.code for b in page_blocks(page)):
        import datasets

        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / ".hf-cache"))
    _run_page(page, tmp_path)
