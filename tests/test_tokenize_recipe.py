"""scripts/tokenize_chats.py and docs/tokenize.md: raw chats and texts become packer's input, with
labels -100 exactly outside the assistant's replies, and the page's commands run as written.

The tokenizers are byte-level BPEs trained here on a few strings (no hub), saved with the
page's ChatML template (which has {% generation %} markers), with the same template without
the markers, with a template that rewrites earlier replies, and with none. Byte-level decoding
is exact, so the labeled tokens are compared with the assistant texts character for character.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import read_shards

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "tokenize_chats.py"
DOC = ROOT / "docs" / "tokenize.md"
EOS = "<|im_end|>"


def doc_blocks(lang: str) -> list[str]:
    """The page's fenced blocks of one language, in order."""
    text = DOC.read_text(encoding="utf-8")
    return re.findall(rf"(?ms)^```{lang}\n(.*?)^```\s*$", text)


MARKED = doc_blocks("jinja")[0]  # the page's ChatML template
PLAIN = re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", MARKED)
REWRITING = PLAIN.replace(  # earlier replies are rendered shorter than the last one
    "{{ message['content'] + '<|im_end|>' }}",
    "{{ (message['content'] if loop.last else 'ok') + '<|im_end|>' }}",
)
assert REWRITING != PLAIN
CHATS = [
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "How are you?"},
        {"role": "assistant", "content": "Fine, thanks: café ☕"},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "It is four.\nCheck: 2 + 2 = 4"},
    ],
    [
        {"role": "user", "content": "Say hi"},
        {"role": "assistant", "content": "hi"},
    ],
]


def build_tokenizer(path: Path, template: str | None) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [m["content"] for chat in CHATS for m in chat] + doc_blocks("jsonl")
    tok.train_from_iterator(corpus, trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token="<|endoftext|>", chat_template=template
    ).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def toks(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    templates = {"marked": MARKED, "plain": PLAIN, "rewriting": REWRITING, "bare": None}
    return {name: build_tokenizer(root / name, t) for name, t in templates.items()}


@pytest.fixture(scope="module")
def script():
    """The script as a module, to call its main() in-process (a subprocess costs seconds)."""
    spec = importlib.util.spec_from_file_location("tokenize_chats", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tokenize(script, capsys, monkeypatch):
    """Run the script in-process; returns (exit code, stderr)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def run(*args) -> tuple[int, str]:
        capsys.readouterr()
        code = script.main([str(a) for a in args])
        return code, capsys.readouterr().err

    return run


def write_lines(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def label_runs(labels: list[int]) -> list[list[int]]:
    """Maximal runs of labels that are not -100."""
    runs, current = [], []
    for label in [*labels, -100]:
        if label != -100:
            current.append(label)
        elif current:
            runs.append(current)
            current = []
    return runs


def load(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


# --------------------------------------------------------------------------------------------
# Chats


def test_chats_label_exactly_the_replies_with_their_end_of_turn(toks, tokenize, cli, tmp_path):
    """Markers, the prefix fallback on the same template without markers, and the prefix method
    forced on the marked one all give the same samples: the template's tokens, labeled on
    exactly each reply and its <|im_end|>, not on ChatML's newline after it."""
    chats = write_lines(tmp_path / "chats.jsonl", [{"messages": c} for c in CHATS])
    runs = {
        "marked": [toks["marked"]],
        "plain": [toks["plain"]],
        "prefix": [toks["marked"], "--assistant-mask", "prefix"],
    }
    outputs = {}
    for name, args in runs.items():
        out = tmp_path / f"{name}.jsonl"
        code, err = tokenize(chats, "-o", out, "--tokenizer", *args)
        assert code == 0, err
        assert err.startswith(f"{out}: chats 2; ") and err.count("\n") == 1
        outputs[name] = read_jsonl(out)
    assert outputs["plain"] == outputs["marked"] == outputs["prefix"]

    tokenizer = load(toks["marked"])
    for chat, sample in zip(CHATS, outputs["marked"]):
        ids, labels = sample["input_ids"], sample["labels"]
        assert ids == list(
            tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
        )
        assert tokenizer.decode(ids) == tokenizer.apply_chat_template(chat, tokenize=False)
        assert all(label in (-100, i) for label, i in zip(labels, ids))
        replies = [m["content"] + EOS for m in chat if m["role"] == "assistant"]
        assert [tokenizer.decode(run) for run in label_runs(labels)] == replies
        assert all(run[-1] == tokenizer.eos_token_id for run in label_runs(labels))

    # packer packs it and verifies every sample's tokens and labels against the file
    packed = tmp_path / "packed"
    result = cli("pack", tmp_path / "marked.jsonl", "-o", packed, "-L", 512)
    assert result.exit_code == 0, result.output
    result = cli("verify", packed, "--input", tmp_path / "marked.jsonl", "--no-attention")
    assert result.exit_code == 0, result.output
    table = read_shards(packed).to_pylist()
    for row in table:
        bounds = row["cu_seqlens"]
        for k, index in enumerate(row["sample_index"]):
            labels = row["labels"][bounds[k] : bounds[k + 1]]
            assert labels == [-100, *outputs["marked"][index]["labels"][1:]]


def test_prefix_method_refuses_a_template_that_rewrites_earlier_replies(toks, tokenize, tmp_path):
    chats = write_lines(tmp_path / "chats.jsonl", [{"messages": CHATS[1]}, {"messages": CHATS[0]}])
    out = tmp_path / "out.jsonl"
    code, err = tokenize(chats, "--tokenizer", toks["rewriting"], "-o", out)
    assert code == 1
    assert err.startswith(f"error: {chats}:2: the chat template does not render the chat before ")
    assert "messages[2]" in err and "--chat-template" in err and err.count("\n") == 1
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["chats.jsonl"]
    # one reply, the last: the template renders it as the whole chat does, and it is accepted
    write_lines(chats, [{"messages": CHATS[1]}])
    assert tokenize(chats, "--tokenizer", toks["rewriting"], "-o", out)[0] == 0


def test_chat_template_file_replaces_the_tokenizers(toks, tokenize, tmp_path):
    chats = write_lines(tmp_path / "chats.jsonl", [{"messages": c} for c in CHATS])
    template = tmp_path / "chatml.jinja"
    template.write_text(MARKED)
    out, ref = tmp_path / "bare.jsonl", tmp_path / "marked.jsonl"
    assert (
        tokenize(chats, "--tokenizer", toks["bare"], "--chat-template", template, "-o", out)[0] == 0
    )
    assert tokenize(chats, "--tokenizer", toks["marked"], "-o", ref)[0] == 0
    assert out.read_bytes() == ref.read_bytes()
    # and a raise_exception in a template is one line naming the chat's line
    template.write_text("{{ raise_exception('roles must alternate') }}" + MARKED)
    code, err = tokenize(
        chats, "--tokenizer", toks["bare"], "--chat-template", template, "-o", out, "--overwrite"
    )
    assert (code, err) == (1, f"error: {chats}:1: TemplateError: roles must alternate\n")
    assert out.read_bytes() == ref.read_bytes()  # the old output stays
    # markers around nothing would train nothing: refused, not written as all -100
    template.write_text(
        MARKED.replace(
            "{{ message['content'] + '<|im_end|>' }}{% endgeneration", "{% endgeneration"
        )
    )
    code, err = tokenize(
        chats, "--tokenizer", toks["bare"], "--chat-template", template, "-o", tmp_path / "x.jsonl"
    )
    assert (code, err) == (
        1,
        f"error: {chats}:1: the chat template renders no assistant token: its {{% generation %}} blocks must hold each reply\n",
    )


# --------------------------------------------------------------------------------------------
# Texts, prompts and completions, output formats


def test_texts_and_completions_end_with_eos(toks, tokenize, tmp_path):
    records = [
        {"text": "Plain text, trained on whole."},
        {"text": f"Already ended.{EOS}"},
        {"prompt": "Translate: good morning\n", "completion": "bonjour"},
        {"messages": CHATS[1], "id": "ignored"},
    ]
    src = write_lines(tmp_path / "in.jsonl", records)
    code, err = tokenize(src, "--tokenizer", toks["marked"], "-o", tmp_path / "out.jsonl")
    assert code == 0, err
    assert "chats 1, texts 2, prompt/completion pairs 1;" in err
    text, ended, pair, _ = read_jsonl(tmp_path / "out.jsonl")
    tokenizer = load(toks["marked"])
    eos = tokenizer.eos_token_id
    assert text["labels"] == text["input_ids"] and text["input_ids"][-1] == eos
    assert tokenizer.decode(text["input_ids"]) == records[0]["text"] + EOS
    assert ended["input_ids"].count(eos) == 1 and ended["input_ids"][-1] == eos  # not twice
    prompt = tokenizer(records[2]["prompt"])["input_ids"]
    completion = tokenizer(records[2]["completion"], add_special_tokens=False)["input_ids"]
    assert pair["input_ids"] == prompt + completion + [eos]  # tokenized apart
    assert pair["labels"] == [-100] * len(prompt) + completion + [eos]

    # .parquet and .jsonl.gz hold the same samples; Parquet as list<int32>
    for name in ("out.parquet", "out.jsonl.gz"):
        assert tokenize(src, "--tokenizer", toks["marked"], "-o", tmp_path / name)[0] == 0
    table = pq.read_table(tmp_path / "out.parquet")
    assert str(table.schema.field("input_ids").type) == "list<element: int32>"
    assert table.to_pylist() == read_jsonl(tmp_path / "out.jsonl")
    import gzip

    assert (
        gzip.decompress((tmp_path / "out.jsonl.gz").read_bytes())
        == (tmp_path / "out.jsonl").read_bytes()
    )


# --------------------------------------------------------------------------------------------
# Errors


def test_a_line_that_is_not_json_is_one_error_line(toks, tmp_path):
    """As a subprocess, as the page quotes it: file and line, no traceback, nothing written."""
    lines = [json.dumps({"messages": CHATS[1]})] * 3 + [""] * 3 + ["oops"]
    (tmp_path / "chats.jsonl").write_text("\n".join(lines) + "\n")
    res = subprocess.run(
        [sys.executable, SCRIPT, "chats.jsonl", "--tokenizer", toks["marked"], "-o", "out.jsonl"],
        cwd=tmp_path,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    quoted = re.search(r"`(error: chats\.jsonl:7: not JSON [^`]*)`", DOC.read_text()).group(1)
    assert (res.returncode, res.stderr, res.stdout) == (1, quoted + "\n", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.jsonl"]


@pytest.mark.parametrize(
    "line, problem",
    [
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"input_ids": [1, 2]}', "no 'messages', 'text' or 'prompt'/'completion' field"),
        ('{"messages": "hi"}', "'messages' must be a non-empty list"),
        ('{"messages": [{"content": "hi"}]}', "messages[0] has no 'role' string"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "no message with role 'assistant'"),
        ('{"messages": [{"from": "gpt", "value": "hi"}]}', "messages[0] has no 'role' string"),
        ('{"text": ""}', "'text' must be a non-empty string"),
        ('{"prompt": "hi"}', "'prompt' and 'completion' must be strings"),
        (b'{"text": "\xff"}', "not JSON"),
    ],
)
def test_bad_lines_name_file_and_line(toks, tokenize, tmp_path, line, problem):
    good = json.dumps({"text": "fine"}).encode()
    src = tmp_path / "in.jsonl"
    src.write_bytes(good + b"\n" + (line if isinstance(line, bytes) else line.encode()) + b"\n")
    code, err = tokenize(src, "--tokenizer", toks["marked"], "-o", tmp_path / "out.jsonl")
    assert code == 1 and err.startswith(f"error: {src}:2: {problem}") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


@pytest.mark.parametrize(
    "tok, extra, output, flag",
    [
        ("plain", ["--assistant-mask", "generation"], "out.jsonl", "--assistant-mask generation"),
        ("marked", [], "out.txt", "--output"),
        ("marked", [], "exists.jsonl", "pass --overwrite"),
        (None, [], "out.jsonl", "--tokenizer ./missing: no such directory"),
        ("bare", [], "out.jsonl", "pass --chat-template FILE"),
        ("marked", ["--chat-template", "missing.jinja"], "out.jsonl", "--chat-template"),
        ("marked", ["--chat-template", "ignores.jinja"], "out.jsonl", "ignores add_generation"),
    ],
)
def test_bad_options_name_the_flag(toks, tokenize, tmp_path, monkeypatch, tok, extra, output, flag):
    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "in.jsonl", [{"messages": CHATS[1]}])
    (tmp_path / "exists.jsonl").write_text("keep\n")
    (tmp_path / "ignores.jinja").write_text(
        re.sub(r"(?s)\{%- if add_generation_prompt.*", "", PLAIN)
    )
    code, err = tokenize(
        "in.jsonl", "--tokenizer", toks[tok] if tok else "./missing", *extra, "-o", output
    )
    assert code == 2 and err.startswith("error: ") and flag in err and err.count("\n") == 1
    assert (tmp_path / "exists.jsonl").read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "exists.jsonl",
        "ignores.jinja",
        "in.jsonl",
    ]


# --------------------------------------------------------------------------------------------
# The page


def doc_commands() -> list[str]:
    return [
        line.strip()
        for block in doc_blocks("bash")
        for line in block.splitlines()
        if line.strip().startswith(("python ", "packer "))
    ]


def test_doc_commands_run_as_written(toks, cli, tmp_path):
    """The page's commands, in order, on its example input and the page's ChatML template, with
    ./tokenizer holding the template without markers (the prefix method): each exits 0, the
    marked template gives the same samples, and inspect shows the masks the page shows."""
    commands = doc_commands()
    assert len(commands) == 5 and commands[0].startswith("python scripts/tokenize_chats.py")
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    shutil.copytree(toks["plain"], tmp_path / "tokenizer")
    (tmp_path / "chats.jsonl").write_text(doc_blocks("jsonl")[0])
    (tmp_path / "chatml.jinja").write_text(MARKED)
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    )
    for command in commands:
        res = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, (
            f"docs/tokenize.md: `{command}` exited {res.returncode}: {res.stderr}"
        )
        if command.startswith("python"):
            example = next(b for b in doc_blocks("text") if b.startswith("out/train.jsonl:"))
            pattern = re.escape(example.strip()).replace("train\\.jsonl", r"train\.\w+")
            assert re.fullmatch(re.sub(r"\d+", r"\\d+", pattern), res.stderr.strip())

    out = tmp_path / "out"
    assert pq.read_table(out / "train.parquet").to_pylist() == read_jsonl(out / "train.jsonl")
    inspect = cli(
        "inspect", out / "chats", "--row", 0, "--tokenizer", tmp_path / "tokenizer", "--json"
    )
    chat = next(
        s
        for s in json.loads(inspect.stdout)["row_views"][0]["segments"]
        if s.get("sample_index") == 0
    )
    shown = "".join(f"«{r['text']}»" if r["masked"] else r["text"] for r in chat["text"])
    assert shown + "\n" == next(b for b in doc_blocks("text") if b.startswith("«"))


def test_usage_errors_and_missing_inputs_are_one_line(toks, tokenize, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        tokenize(tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl")
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err == "error: the following arguments are required: --tokenizer\n"
    code, err = tokenize(
        tmp_path / "in.jsonl", "--tokenizer", toks["marked"], "-o", tmp_path / "out.jsonl"
    )
    assert code == 1 and err.startswith(f"error: {tmp_path / 'in.jsonl'}: cannot read: ")
    assert err.count("\n") == 1 and not any(tmp_path.iterdir())
