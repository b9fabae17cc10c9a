"""Raw chats -> packed rows with a real tokenizer: the 65,000-token byte-level BPE (NFKC
normalizer) that the `anthropic` 0.38.0 wheel on PyPI ships as `anthropic/tokenizer.json`.
`make setup` downloads the wheel (no install: `pip download --no-deps` into .whl/); the test reads
the file out of it. Nothing comes from a model hub.

The tokenizer has no chat template: it gets a ChatML-shaped one over its own special tokens
(`<META_START>` opens a turn, `<EOT>` ends it and is EOS), without generation tags, so masks come
from prefix rendering. Every packed sample's ids and labels are compared with a reference built
from tokenized pieces (no template, no packer code), on text that NFKC rewrites (ligatures,
full-width and circled characters, combining accents) as well as plain words."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
WHEEL = ROOT / ".whl" / "anthropic-0.38.0-py3-none-any.whl"
START, END = "<META_START>", "<EOT>"
TEMPLATE = (
    "{%- for m in messages %}{{- '<META_START>' + m['role'] + '\\n' + m['content'] + '<EOT>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<META_START>assistant\\n' }}{%- endif %}"
)
WORDS = (  # noqa: SIM905 (a word list reads better as one string)
    "hello world the of and finance ﬁnance ＡＢＣ café cafe\u0301 naïve ① x² Ⅻ ｶﾀｶﾅ µ Å 日本語 "
    "🙂 well, yes: (maybe) 42 3.14 don't it's"
).split()
IGNORE = -100


def sentence(rng: random.Random, low: int = 1, high: int = 10) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(low, high)))


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    if not WHEEL.is_file():
        pytest.skip(f"{WHEEL.name} not downloaded (make setup downloads it)")
    d = tmp_path_factory.mktemp("real") / "tokenizer"
    d.mkdir()
    with zipfile.ZipFile(WHEEL) as wheel:
        (d / "tokenizer.json").write_bytes(wheel.read("anthropic/tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": END, "pad_token": END}
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return d


def generate(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        pick = rng.random()
        if pick < 0.6:
            chat = [{"role": "system", "content": sentence(rng)}] if rng.random() < 0.3 else []
            for _ in range(rng.randint(1, 3)):
                chat += [{"role": "user", "content": sentence(rng)}]
                chat += [{"role": "assistant", "content": sentence(rng)}]
            rows.append({"messages": chat})
        elif pick < 0.8:
            rows.append({"text": sentence(rng, 3, 30)})
        else:
            rows.append({"prompt": sentence(rng), "completion": " " + sentence(rng)})
    return rows


def reference(tokenizer_json: Path):
    """(ids, labels) of a raw row, from tokenized pieces."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    start, end = tok.token_to_id(START), tok.token_to_id(END)

    def enc(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    def build(row: dict) -> tuple[list[int], list[int]]:
        if "text" in row:
            ids = [*enc(row["text"]), end]
            return ids, ids
        if "prompt" in row:
            prompt, completion = enc(row["prompt"]), [*enc(row["completion"]), end]
            return prompt + completion, [IGNORE] * len(prompt) + completion
        ids, labels = [], []
        for m in row["messages"]:
            head, body, tail = [start, *enc(m["role"] + "\n")], [*enc(m["content"]), end], enc("\n")
            ids += head + body + tail
            trained = body if m["role"] == "assistant" else [IGNORE] * len(body)
            labels += [IGNORE] * len(head) + trained + [IGNORE] * len(tail)
        return ids, labels

    return build


def packer(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "packer", *args], env=env, capture_output=True, text=True
    )


def test_every_packed_sample_matches_the_reference_and_verify_passes(real: Path, tmp_path: Path):
    import pyarrow as pa

    rows = generate(300, seed=5)
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    env = {**os.environ, "PACKER_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "out"
    done = packer("pack", str(raw), "--tokenizer", str(real), "-o", str(out), "-L", "2048", env=env)
    assert done.returncode == 0, done.stderr
    build, seen = reference(real / "tokenizer.json"), 0
    for shard in sorted(out.glob("shard-*.arrow")):
        table = pa.ipc.open_stream(pa.memory_map(str(shard))).read_all().to_pydict()
        for ids, labels, cu, index in zip(
            table["input_ids"], table["labels"], table["cu_seqlens"], table["sample_index"]
        ):
            for k, s in enumerate(index):
                want_ids, want_labels = build(rows[s])
                assert ids[cu[k] : cu[k + 1]] == want_ids, f"line {s + 1}: ids"
                # packed labels mask each sample's first position (it has no previous token)
                assert labels[cu[k] : cu[k + 1]] == [IGNORE, *want_labels[1:]], f"line {s + 1}"
                seen += 1
    assert seen == len(rows)
    nfkc = sum("ﬁ" in json.dumps(r, ensure_ascii=False) for r in rows)
    assert nfkc > 20  # the normalizer rewrote text in many samples
    done = packer(
        "verify", str(out), "--input", str(raw), "--tokenizer", str(real), "--rows", "all", env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_reply_that_starts_with_a_space_is_refused_naming_its_line(real: Path, tmp_path: Path):
    """`assistant\\n` + ` yes`: this vocabulary merges the newline and the space into one token,
    half template and half reply; at inference the model sees the prompt's own newline token.
    packer stops at the first such chat; --on-error skip lists them."""
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": c}]}
            for c in ("hello", "  spaced reply", "fine")]  # fmt: skip
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "PACKER_CACHE_DIR": str(tmp_path / "cache")}
    args = ["pack", str(raw), "--tokenizer", str(real), "-L", "256"]
    done = packer(*args, "-o", str(tmp_path / "a"), env=env)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "raw.jsonl:2" in line and "a token crosses the start of assistant turn 1" in line
    assert line.endswith("strip the spaces or newlines at the reply's start)")
    assert not (tmp_path / "a").exists()
    done = packer(*args, "-o", str(tmp_path / "b"), "--on-error", "skip", env=env)
    assert done.returncode == 0, done.stderr
    listed = next(line for line in done.stderr.splitlines() if "left out" in line)
    rejects = Path(listed.rsplit(" ", 1)[1]).read_text().splitlines()
    assert len(rejects) == 1 and rejects[0].startswith(f"{raw}:2: a token crosses the start")
