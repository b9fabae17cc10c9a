"""What a newcomer hits following docs/tokenize.md: each defect found there, checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers_util import PLAIN, build_tokenizer

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
CHAT = {
    "messages": [
        {"role": "user", "content": "the way"},
        {"role": "assistant", "content": "the day"},
    ]
}


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok") / "tok", PLAIN)


def packer(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_CACHE_DIR": str(cwd / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "packer", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_an_input_with_no_samples_fails_in_one_line_and_writes_nothing(tmp_path, tok):
    (tmp_path / "empty.jsonl").write_text("")
    bad = {"messages": [{"role": "user", "content": "the"}]}
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    cases = [
        (["tokenize", "empty.jsonl"], "error: the dataset is empty: empty.jsonl holds no records"),
        (
            ["tokenize", "bad.jsonl", "--on-error", "skip"],
            "error: the dataset is empty: all 1 records were rejected (the first: bad.jsonl:1: "
            "the chat has no assistant turn",
        ),
        (["pack", "empty.jsonl", "-L", "64"], "error: the dataset is empty: empty.jsonl holds"),
        (
            ["pack", "bad.jsonl", "-L", "64", "--on-error", "skip"],
            "error: the dataset is empty: all 1",
        ),
    ]
    for args, message in cases:
        done = packer(*args, "--tokenizer", str(tok), "-o", "out", cwd=tmp_path)
        assert done.returncode == 1, (args, done.stderr)
        errors = [line for line in done.stderr.splitlines() if line.startswith("error")]
        assert len(errors) == 1 and errors[0].startswith(message), (args, done.stderr)
        assert "Traceback" not in done.stderr
        assert not (tmp_path / "out").exists()
        cached = tmp_path / "cache" / "tokenized"
        assert not cached.exists() or not [p for p in cached.iterdir() if p.is_dir()]
    # a good line next to the bad one is tokenized, and the reject listed
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n" + json.dumps(CHAT) + "\n")
    done = packer(
        "tokenize", "bad.jsonl", "--tokenizer", str(tok), "-o", "out", "--on-error", "skip",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "rejects.txt").read_text().startswith("bad.jsonl:1: the chat has")


def test_every_python_block_of_the_page_imports_what_it_uses(tmp_path):
    """A reader pastes one block into a file of its own: it must not lean on an earlier block."""
    text = (ROOT / "docs" / "tokenize.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        path = tmp_path / f"block{i}.py"
        path.write_text(block)
        ruff = Path(sys.executable).with_name("ruff")
        done = subprocess.run(
            [str(ruff), "check", "--isolated", "--select", "F821", str(path)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, (i, done.stdout)


def test_the_page_tokenizer_knows_every_word_of_the_page_data(tmp_path):
    """The page's WordLevel tokenizer mapped every '?' and '.' to <unk> (punctuation was trained
    only glued to JSON quotes), so `packer inspect` showed <unk> in every reply."""
    text = (ROOT / "docs" / "tokenize.md").read_text()
    build = next(
        b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "save_pretrained" in b
    )
    check = """
from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained("tokenizer")
unknown = 0
for line in open("chats.jsonl"):
    r = json.loads(line)
    shown = t.apply_chat_template(r["messages"], tokenize=False) if "messages" in r else r["text"]
    unknown += t(shown)["input_ids"].count(t.unk_token_id)
print("unknown", unknown)
"""
    (tmp_path / "page.py").write_text(build + check)
    done = subprocess.run(
        [sys.executable, "page.py"], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "unknown 0"


def test_a_directory_without_a_tokenizer_is_named_in_one_line(tmp_path):
    (tmp_path / "chats.jsonl").write_text(json.dumps(CHAT) + "\n")
    (tmp_path / "model").mkdir()
    res = packer("tokenize", "chats.jsonl", "--tokenizer", "model", "-o", "t", cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr == (
        "error: --tokenizer: model holds no tokenizer (no tokenizer.json or "
        "tokenizer_config.json: a directory that save_pretrained wrote)\n"
    )
    assert not (tmp_path / "t").exists()
