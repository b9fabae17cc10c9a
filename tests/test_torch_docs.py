"""docs/training.md's loops run as written and train the model (tiny model, tiny dataset, CPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl

pytest.importorskip("torch")
pytest.importorskip("transformers")

import packer  # noqa: E402
from packer.torch.tiny_model import build_tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 1000


def _snippets() -> dict[str, str]:
    """Runnable blocks (marked `<!-- runnable -->`) by the heading above them."""
    text = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    section = text[text.index("## `packer.torch`") :]
    blocks = {}
    heading = ""
    for part in re.split(r"(?m)^(### .*)$", section):
        if part.startswith("### "):
            heading = part[4:].strip()
            continue
        for code in re.findall(r"<!-- runnable -->\n```python\n(.*?)```", part, re.S):
            blocks[heading] = code
    return blocks


SNIPPETS = _snippets()


def test_every_trainer_has_a_snippet():
    assert {"Plain PyTorch", "Hugging Face Trainer", "TRL"} <= set(SNIPPETS)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    src = write_jsonl(root / "in.jsonl", make_samples(40, seed=4, median=30, vocab=VOCAB))
    (root / "out").mkdir()
    packer.pack(
        [src], root / "out" / "train-512", packer.PackConfig(max_len=96, overlength="split")
    )
    return root


def _tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    word_level = models.WordLevel({"<pad>": 0, "<unk>": 1}, unk_token="<unk>")
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(word_level), pad_token="<pad>", eos_token="<unk>"
    )


@pytest.mark.filterwarnings("ignore:'pin_memory' argument:UserWarning")  # CPU-only machine
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("name", ["Plain PyTorch", "Hugging Face Trainer", "TRL"])
def test_snippet_runs(name, workdir, monkeypatch):
    if name == "TRL":
        pytest.importorskip("trl")
    monkeypatch.chdir(workdir)
    model = build_tiny_model(seed=0, vocab_size=VOCAB, hidden_size=32)
    before = [p.detach().clone() for p in model.parameters()]
    exec(
        compile(SNIPPETS[name], f"<{name} snippet>", "exec"),  # noqa: S102
        {"model": model, "tokenizer": _tokenizer(), "__name__": "__snippet__"},
    )
    changed = any(not (a == b.detach()).all() for a, b in zip(before, model.parameters()))
    assert changed, "the snippet did not train the model"
