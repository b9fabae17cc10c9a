"""docs/export.md's TRL recipe, run as written against the installed TRL (1.16.0) on CPU: the
block is read from the page, given a tiny random Llama and a word-level tokenizer trained with
`tokenizers`, and must train; with `padding_free=True` turned off, its `check_trainer` line must
stop it before the first step."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl

import packer

pytest.importorskip("trl")
pytest.importorskip("tokenizers")

from test_trainer_check import VOCAB, tiny_tokenizer  # noqa: E402

from packer.torch import TrainerCheckError  # noqa: E402
from packer.torch.tiny_model import build_tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.xdist_group("export"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:'pin_memory' argument:UserWarning"),
]


def recipe() -> str:
    """The ```python block of the page's TRL section."""
    text = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    section = text[text.index("## TRL (`--to trl`)") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"^```python\n(.*?)^```", section, re.M | re.S)
    assert len(blocks) == 1, "docs/export.md's TRL section should hold one python block"
    return blocks[0]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A directory holding a packer output at out/demo, as the page assumes."""
    src = write_jsonl(tmp_path / "in.jsonl", make_samples(60, seed=2, median=20, max_len=60))
    packer.pack([src], tmp_path / "out" / "demo", packer.PackConfig(max_len=128))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run(code: str) -> dict:
    model = build_tiny_model(vocab_size=VOCAB + 24, max_positions=512).train()
    scope = {"__name__": "__recipe__", "model": model, "tokenizer": tiny_tokenizer()}
    exec(compile(code, "docs/export.md (TRL recipe)", "exec"), scope)  # noqa: S102
    return scope


def test_the_recipe_trains_as_written(workdir):
    code = recipe()
    for setting in ("padding_free=True", "max_length=None", '"skip_prepare_dataset": True'):
        assert setting in code
    scope = run(code)
    trainer = scope["trainer"]
    assert trainer.state.global_step >= 1
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])


def test_the_recipes_check_stops_a_silent_configuration(workdir):
    code = recipe().replace("padding_free=True", "padding_free=False")
    with pytest.raises(TrainerCheckError, match="padding_free"):
        run(code)
    assert not (workdir / "out" / "trl-run" / "checkpoint-1").exists()
