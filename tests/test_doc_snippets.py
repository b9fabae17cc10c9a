"""The README and docs/ can be followed as written.

- Every ```python block of README.md and docs/*.md runs, each in a fresh directory holding the
  bundled sample (`data/`), the presets (`configs/`) and a packer output at `out/demo`. The only
  names a block may use without defining them are `model` and `tokenizer`, which the pages say
  are the reader's own: here a tiny Llama with random weights built from a config (no download)
  and a word-level tokenizer.
- README.md's command lines (`packer ...` and `python -m packer ...`, in ```bash and ```console
  blocks) run in order on a fresh copy of `data/` and `configs/`, each exiting 0: a command that
  reused an earlier output without `--overwrite` would fail.
- Every relative link and `#anchor` in those pages lands (anchors made as GitHub makes them).

A block right after `<!-- snippet: skip (reason) -->` is not run; SKIPPED lists every such block,
so a new skip is a visible change to this file.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl

import packer

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GIVEN = {"model", "tokenizer"}  # the reader's own model and tokenizer, provided by run_block
OPTIONAL = {"torch", "transformers", "trl", "datasets", "tokenizers", "accelerate", "ray"}
SKIPPED: set[tuple[str, str]] = {
    ("README.md", "starts a Ray instance; tests/test_ray.py runs the Ray engine"),
    ("docs/export.md", "needs a model and flash-attn; tests/test_export.py runs TRL's collator"),
    ("README.md", "needs an S3 endpoint; tests/test_storage.py runs these against a local server"),
}

FENCE = re.compile(r"^(\s*)(`{3,})([\w-]*)\s*$")
SKIP = re.compile(r"^\s*<!-- snippet: skip \((.+)\) -->\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None  # the reason given in the skip marker

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def read_blocks(path: Path) -> list[Block]:
    """Fenced code blocks of a Markdown page, list-indented ones included."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, ticks, lang = opening.groups()
        end = i + 1
        while end < len(lines) and not re.match(rf"^\s*{ticks}`*\s*$", lines[end]):
            end += 1
        code = "\n".join(line[len(indent) :] for line in lines[i + 1 : end]) + "\n"
        skip, k = None, i - 1
        while k >= 0 and (not lines[k].strip() or lines[k].strip() == "<!-- runnable -->"):
            k -= 1
        if k >= 0 and (marker := SKIP.match(lines[k])):
            skip = marker.group(1)
        blocks.append(Block(str(path.relative_to(ROOT)), i + 1, lang, code, skip))
        i = end + 1
    return blocks


BLOCKS = [block for page in PAGES for block in read_blocks(page)]
PYTHON = [b for b in BLOCKS if b.lang == "python"]
README_SHELL = [b for b in BLOCKS if b.page == "README.md" and b.lang in ("bash", "console")]


def free_names(tree: ast.AST) -> set[str]:
    """Names a block reads but never binds (imports, assignments, loops, defs, arguments)."""
    bound, read = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound


def imported_modules(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_blocks_are_found():
    """The parser sees the blocks the pages are known to hold (a parser that found nothing
    would pass every test below)."""
    assert {"README.md", "docs/python.md", "docs/training.md", "docs/format.md"} <= {
        b.page for b in PYTHON
    }
    assert any("packer verify" in b.code for b in README_SHELL)


def test_skipped_blocks_are_listed():
    """Skipping is explicit and rare: every skipped block, with its reason, is in SKIPPED."""
    skipped = [b for b in BLOCKS if b.skip]
    for block in skipped:
        print(f"skipped: {block} ({block.skip})")
    assert {(b.page, b.skip) for b in skipped} == SKIPPED
    assert len(skipped) <= 3


# --------------------------------------------------------------------------------------------
# Python blocks


@pytest.fixture(scope="module")
def demo_output(tmp_path_factory) -> Path:
    """A small packer output standing in for `make demo`'s out/demo (the same columns, fewer and
    shorter rows), so that the training snippets take seconds on a CPU."""
    root = tmp_path_factory.mktemp("demo")
    src = write_jsonl(root / "in.jsonl", make_samples(40, seed=4, median=30, vocab=1000))
    packer.pack([src], root / "demo", packer.PackConfig(max_len=96, overlength="split"))
    return root / "demo"


def _given(names: set[str]) -> dict:
    """The reader's `model` and `tokenizer`, for the blocks that use them."""
    given = {}
    if "model" in names:
        from packer.torch.tiny_model import build_tiny_model

        given["model"] = build_tiny_model(seed=0, vocab_size=32000, hidden_size=32)
    if "tokenizer" in names:
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast

        word_level = models.WordLevel({"<pad>": 0, "<unk>": 1}, unk_token="<unk>")
        given["tokenizer"] = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(word_level), pad_token="<pad>", eos_token="<unk>"
        )
    return given


@pytest.mark.filterwarnings("ignore:'pin_memory' argument:UserWarning")  # CPU-only machine
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("block", [b for b in PYTHON if not b.skip], ids=str)
def test_python_block_runs(block, demo_output, tmp_path, monkeypatch):
    tree = ast.parse(block.code, filename=str(block))
    undefined = free_names(tree) - GIVEN
    assert not undefined, f"{block} uses {sorted(undefined)} without defining them"
    for module in sorted(imported_modules(tree) & OPTIONAL):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{block} needs {module}")
    (tmp_path / "data").symlink_to(ROOT / "data", target_is_directory=True)
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    shutil.copytree(demo_output, tmp_path / "out" / "demo")
    monkeypatch.chdir(tmp_path)
    if importlib.util.find_spec("datasets") is not None:
        import datasets

        # load_dataset caches under the user's home by default: keep it in tmp_path
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    scope = {"__name__": "__snippet__", **_given(free_names(tree))}
    exec(compile(tree, str(block), "exec"), scope)  # noqa: S102


# --------------------------------------------------------------------------------------------
# README commands


def readme_commands() -> list[str]:
    """The `packer` command lines of README.md's shell blocks, in order (continuations joined)."""
    commands = []
    for block in README_SHELL:
        if block.skip:
            continue
        text = re.sub(r"\\\n\s*", " ", block.code)
        for line in text.splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith(("packer ", "python -m packer ")):
                commands.append(line)
    return commands


def test_readme_commands_run_in_order(tmp_path):
    pytest.importorskip("torch")  # `packer verify` without --no-attention
    commands = readme_commands()
    assert len(commands) >= 8 and any(c.startswith("packer verify") for c in commands)
    shutil.copytree(ROOT / "data", tmp_path / "data")
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for command in commands:
        res = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 0, f"README: `{command}` exited {res.returncode}: {res.stderr}"


# --------------------------------------------------------------------------------------------
# Install commands


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def install_targets(text: str) -> list[str]:
    """What every `pip install` of a page installs: its arguments, options and pins left out."""
    targets = []
    for command in re.findall(r"pip install ([^`\n#;&|]+)", text):
        for arg in command.split():
            arg = arg.strip("'\"")
            if arg and not arg.startswith("-") and not re.match(r"^[\w.-]+[=<>]", arg):
                targets.append(arg)
    return targets


def test_distribution_is_packer_llm():
    """`packer` on PyPI is an unrelated project; pip must never be pointed at it."""
    project = pyproject()
    assert project["name"] == "packer-llm"
    assert project["scripts"] == {"packer": "packer.cli:run"}  # the command keeps its name
    # an extra is what `pip install 'packer-llm[x]'` resolves: flash-attn has no wheel on PyPI
    # and builds only with --no-build-isolation on a CUDA machine, so no extra may pull it in
    extras = project["optional-dependencies"]
    assert not [e for e, reqs in extras.items() if any(r.startswith("flash") for r in reqs)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_install_commands_name_packer_llm(page):
    """Every `pip install` of packer names `packer-llm` (from PyPI) or `.` (from a clone), with
    extras that exist."""
    extras = set(pyproject()["optional-dependencies"])
    for target in install_targets(page.read_text(encoding="utf-8")):
        name, _, extra = target.partition("[")
        if name not in ("packer", "packer-llm", ".") or name == "." and not extra:
            continue  # another package (torch, flash-attn), or the bare checkout
        assert name != "packer", f"{page.name}: `pip install {target}` installs the wrong project"
        for wanted in filter(None, extra.rstrip("]").split(",")):
            assert wanted in extras, f"{page.name}: `pip install {target}`: no extra {wanted!r}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_install_from_pypi(page):
    """packer-llm is not on PyPI yet: a page installs it from a clone (`.`), a git URL or a
    wheel (`packer-llm[x] @ ...`), never by its bare name."""
    text = page.read_text(encoding="utf-8")
    bare = re.findall(r"pip install (?:-\S+ )*'?packer-llm(?:\[[\w,]*\])?'?(?![\[\w'-]|\s*@)", text)
    assert not bare, f"{page.name}: {bare} installs from PyPI, where packer-llm is not published"


def test_hints_in_packer_name_installable_packages():
    """packer's own messages and help texts name packages pip can install today (torch,
    tokenizers, boto3, ...), never `packer[...]` (an unrelated project) nor `packer-llm[...]`
    (not published)."""
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "packer").rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"(?<![\w-])packer(-llm)?\[", line) and not line.lstrip().startswith("#")
    ]
    assert not found, f"install hints naming 'packer[...]' or 'packer-llm[...]': {', '.join(found)}"


# --------------------------------------------------------------------------------------------
# Links


def github_anchor(heading: str, seen: dict[str, int]) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens, and
    -1, -2, ... on repeats."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    return slug if count == 0 else f"{slug}-{count}"


def prose(path: Path) -> str:
    """The page without its fenced blocks and inline code spans."""
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"(?ms)^(\s*)(`{3,}).*?^\s*\2`*\s*$", "", text)
    return re.sub(r"`[^`\n]*`", "``", text)


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    text = re.sub(r"(?ms)^(\s*)(`{3,}).*?^\s*\2`*\s*$", "", path.read_text(encoding="utf-8"))
    return {github_anchor(h, seen) for h in re.findall(r"(?m)^#{1,6} +(.+?)\s*#*\s*$", text)}


def test_github_anchor():
    seen: dict[str, int] = {}
    assert github_anchor("Python: `pack_dataset`", seen) == "python-pack_dataset"
    assert github_anchor("Bad input, exit codes and atomic output", seen) == (
        "bad-input-exit-codes-and-atomic-output"
    )
    assert github_anchor("`packer verify`: prove it", seen) == "packer-verify-prove-it"
    assert github_anchor("Python: `pack_dataset`", seen) == "python-pack_dataset-1"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_land(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose(page)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
