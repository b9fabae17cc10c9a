"""The README and docs/ hold what a reader can install and follow.

- Blocks are read here (`read_blocks`); tests/test_doc_pages.py runs every page's blocks in
  order, from a fresh copy of the repository's data.
- Every `pip install` names packer as the clone (`.`), a git URL or a wheel (packer-llm is not
  on PyPI yet), with extras that exist, and packer's own hints name installable packages.
- Every relative link and `#anchor` in those pages lands (anchors made as GitHub makes them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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


def test_blocks_are_found():
    """The parser sees the blocks the pages are known to hold (a parser that found nothing
    would pass every test that reads them)."""
    python = {b.page for b in BLOCKS if b.lang == "python"}
    assert {"README.md", "docs/python.md", "docs/training.md", "docs/format.md"} <= python
    assert any("packer verify" in b.code for b in BLOCKS if b.page == "README.md")


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
    assert project["scripts"] == {"packer": "packer.cli:command_line"}  # the command keeps its name
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
