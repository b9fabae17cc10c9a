"""`packer tokenize` and `packer pack RAW --tokenizer`: raw records to tokenized shards, in worker
processes, through a cache, with the same bytes whichever way and however many workers.

The tokenizer is made here (a word-level vocabulary trained with `tokenizers`, a ChatML
template without generation tags), never fetched from the hub.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
WORDS = [
    "hello",
    "world",
    "you",
    "are",
    "a",
    "helpful",
    "bot",
    "what",
    "is",
    "the",
    "answer",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "please",
    "tell",
    "me",
    "more",
    "about",
    "this",
    "and",
    "that",
]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    """A local tokenizer directory (save_pretrained layout) with a ChatML template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<pad>", "<eos>", "<|im_start|>", "<|im_end|>"]
    words = WORDS + ["user", "assistant", "system"]
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(special_tokens=special))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        eos_token="<eos>",
        additional_special_tokens=special[3:],
    )
    fast.chat_template = CHATML
    path = tmp_path_factory.mktemp("tokenizer") / "tok"
    fast.save_pretrained(str(path))
    return path


def records(n: int, seed: int = 0) -> list[dict]:
    """Chats (with or without a system prompt, 1-3 turns), texts and prompt/completion pairs."""
    rng = np.random.default_rng(seed)

    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS, int(rng.integers(1, k))))

    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            messages = [{"role": "system", "content": words(6)}] if rng.random() < 0.5 else []
            for _ in range(int(rng.integers(1, 4))):
                messages += [
                    {"role": "user", "content": words(8)},
                    {"role": "assistant", "content": words(12)},
                ]
            out.append({"messages": messages})
        elif kind == 1:
            out.append({"text": words(30)})
        else:
            out.append({"prompt": words(8), "completion": " " + words(8)})
    return out


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def packer(*args, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    cmd = [sys.executable, "-m", "packer", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, **kwargs)


def digests(directory: Path, pattern: str) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.glob(pattern))
    }


def read_samples(directory: Path) -> tuple[list, list]:
    table = pq.read_table(sorted(directory.glob("part-*.parquet")))
    return table.column("input_ids").to_pylist(), table.column("labels").to_pylist()


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".packer-" in p.name)


def test_every_format_gives_the_same_samples(tokenizer, tmp_path):
    from packer.tokenize.encode import Encoder
    from packer.tokenize.run import tokenize

    rows = records(40)
    encoder = Encoder(str(tokenizer))
    text = "".join(json.dumps(r) + "\n" for r in rows).encode()
    (tmp_path / "a.jsonl").write_bytes(text)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(text, mtime=0))
    with pa.output_stream(str(tmp_path / "a.jsonl.zst"), compression="zstd") as out:
        out.write(text)
    (tmp_path / "a.json").write_text(json.dumps(rows, indent=1))
    keys = sorted({k for r in rows for k in r})  # a null where a row lacks the column
    pq.write_table(pa.table({k: [r.get(k) for r in rows] for k in keys}), tmp_path / "a.parquet")
    got = {}
    for name in ("a.jsonl", "a.jsonl.gz", "a.jsonl.zst", "a.json", "a.parquet"):
        result = tokenize([tmp_path / name], tmp_path / f"out-{name}", encoder, workers=1)
        assert (result.lines, result.samples, result.rejected) == (40, 40, 0)
        got[name] = read_samples(tmp_path / f"out-{name}")
    first = got["a.jsonl"]
    assert all(ids for ids in first[0]) and len(first[0]) == 40
    for name, samples in got.items():
        assert samples == first, name
    # a text sample is its tokens plus EOS, every one trained
    ids, labels = first[0][1], first[1][1]
    assert ids == labels and ids[-1] == encoder_eos(tokenizer)


def encoder_eos(tokenizer: Path) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer)).eos_token_id


def test_workers_1_and_2_write_the_same_bytes(tokenizer, tmp_path):
    write_jsonl(tmp_path / "a.jsonl", records(300, seed=1))
    write_jsonl(tmp_path / "b.jsonl", records(200, seed=2))
    outs = []
    for n in (1, 2):
        out = tmp_path / f"w{n}"
        res = packer(
            "tokenize", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "--tokenizer", tokenizer,
            "-o", out, "--workers", n, "--json",
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        report = json.loads(res.stdout)
        assert (report["lines"], report["samples"], report["workers"]) == (500, 500, n)
        outs.append(digests(out, "part-*.parquet"))
    assert outs[0] == outs[1] and len(outs[0]) == 2  # one shard per input file's batch


def test_one_step_and_two_step_packs_are_byte_identical(cli, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    raw = write_jsonl(tmp_path / "raw.jsonl", records(120, seed=3))
    res = cli("tokenize", raw, "--tokenizer", tokenizer, "-o", tmp_path / "tok")
    assert res.exit_code == 0, res.stderr
    res = cli("pack", tmp_path / "tok", "-o", tmp_path / "two", "-L", "256")
    assert res.exit_code == 0, res.stderr
    res = cli("pack", raw, "--tokenizer", tokenizer, "-o", tmp_path / "one", "-L", "256")
    assert res.exit_code == 0, res.stderr
    two, one = digests(tmp_path / "two", "shard-*"), digests(tmp_path / "one", "shard-*")
    assert one == two and one
    manifest = json.loads((tmp_path / "one" / "manifest.json").read_text())
    source = manifest["tokenized_from"]
    tokenized = json.loads((tmp_path / "tok" / "tokenized.json").read_text())
    assert source["encoder"] == tokenized["encoder"]
    assert source["encoder"]["mask_method"] == "full-render"
    assert source["inputs"] == [{"format": "jsonl", "path": str(raw)}]
    res = cli("verify", tmp_path / "one", "--no-attention")
    assert res.exit_code == 0, res.stderr


def test_cache_is_reused_at_another_L_and_missed_when_the_template_changes(
    cli, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    raw = write_jsonl(tmp_path / "raw.jsonl", records(60, seed=4))
    base = ("pack", raw, "--tokenizer", tokenizer)
    first = cli(*base, "-o", tmp_path / "p1", "-L", "256")
    assert first.exit_code == 0, first.stderr
    assert "tokenized 60 lines" in first.stderr
    entries = sorted((tmp_path / "cache" / "tokenized").iterdir())
    assert len(entries) == 1
    again = cli(*base, "-o", tmp_path / "p2", "-L", "512")
    assert again.exit_code == 0, again.stderr
    assert f"tokenized output reused from the cache: {entries[0]}" in again.stderr
    template = tmp_path / "other.jinja"
    template.write_text(CHATML.replace("<|im_end|>\\n", "<|im_end|>"))
    third = cli(*base, "-o", tmp_path / "p3", "-L", "256", "--chat-template", template)
    assert third.exit_code == 0, third.stderr
    assert "tokenized 60 lines" in third.stderr
    assert len(list((tmp_path / "cache" / "tokenized").iterdir())) == 2
    # the same bytes under another name hit; an edited file misses
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_bytes(raw.read_bytes())
    fourth = cli("pack", renamed, "--tokenizer", tokenizer, "-o", tmp_path / "p4", "-L", "256")
    assert "reused from the cache" in fourth.stderr, fourth.stderr
    renamed.write_bytes(raw.read_bytes() + raw.read_bytes().split(b"\n")[0] + b"\n")
    fifth = cli("pack", renamed, "--tokenizer", tokenizer, "-o", tmp_path / "p5", "-L", "256")
    assert "tokenized 61 lines" in fifth.stderr, fifth.stderr


def test_a_bad_line_is_named_by_file_and_line(cli, tokenizer, tmp_path):
    rows = records(6)
    lines = [json.dumps(r) for r in rows]
    lines[3] = '{"messages": [{"role": "user", "content": "hello"}'  # cut short
    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join(lines) + "\n")
    # hf: this word-level vocabulary is one fastokens cannot load (auto would say so first)
    hf = ("--tokenizer-engine", "hf")
    res = cli("tokenize", raw, "--tokenizer", tokenizer, "-o", tmp_path / "out", *hf)
    assert res.exit_code == 1
    assert res.stderr.startswith(f"error: {raw}:4: malformed JSON")
    assert len(res.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    res = cli(
        "tokenize", raw, "--tokenizer", tokenizer, "-o", tmp_path / "out", "--on-error", "skip"
    )
    assert res.exit_code == 0, res.stderr
    assert "5 samples" in res.stderr and "1 rejected" in res.stderr
    rejects = (tmp_path / "out" / "rejects.txt").read_text().splitlines()
    assert len(rejects) == 1 and rejects[0].startswith(f"{raw}:4: malformed JSON")
    assert len(read_samples(tmp_path / "out")[0]) == 5


def test_a_chat_without_an_assistant_turn_is_named(tokenizer, tmp_path):
    rows = records(4)
    rows[2] = {"messages": [{"role": "user", "content": "hello"}]}
    raw = write_jsonl(tmp_path / "raw.jsonl", rows)
    args = ("--workers", 2, "--tokenizer-engine", "hf")  # hf: no line saying auto's choice
    res = packer("tokenize", raw, "--tokenizer", tokenizer, "-o", tmp_path / "out", *args)
    assert res.returncode == 1
    assert res.stderr.startswith(f"error: {raw}:3: ") and len(res.stderr.splitlines()) == 1
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_bad_options_exit_2_in_one_line(cli, tokenizer, tmp_path):
    raw = write_jsonl(tmp_path / "raw.jsonl", records(3))
    cases = [
        (("tokenize", raw, "--tokenizer", tokenizer, "-o", tmp_path / "o", "--train-on", "x"), "--train-on"),
        (("tokenize", raw, "--tokenizer", tokenizer, "-o", tmp_path / "o", "--column", "a=b"), "--column"),
        (("pack", raw, "-o", tmp_path / "p", "-L", "64", "--train-on", "all"), "--train-on needs --tokenizer"),
        (("tokenize", raw, "--tokenizer", tmp_path / "missing", "-o", tmp_path / "o"), "--tokenizer"),
    ]  # fmt: skip
    for args, needle in cases:
        res = cli(*args)
        assert res.exit_code == 2, (args, res.stderr)
        assert len(res.stderr.splitlines()) == 1 and needle in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals")
def test_sigterm_while_tokenizing_leaves_nothing(tokenizer, tmp_path):
    raw = write_jsonl(tmp_path / "raw.jsonl", records(12000, seed=5))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_PROGRESS_INTERVAL": "0"}
    cmd = [sys.executable, "-m", "packer", "tokenize", str(raw), "--tokenizer", str(tokenizer)]
    cmd += ["-o", str(tmp_path / "out"), "--workers", "2"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        if line.startswith("progress: tokenizing"):
            proc.send_signal(signal.SIGTERM)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 143, rest
    assert rest.splitlines()[-1] == "error: terminated; no partial output was left"
    assert not (tmp_path / "out").exists()
    time.sleep(0.5)
    assert leftovers(tmp_path) == []


def test_memory_budget_caps_the_workers_and_leaves_the_bytes(tokenizer, tmp_path):
    from packer.errors import UsageError
    from packer.tokenize.encode import Encoder
    from packer.tokenize.run import tokenize

    raw = write_jsonl(tmp_path / "raw.jsonl", records(50, seed=6))
    encoder = Encoder(str(tokenizer))
    two = {"workers": 2, "batch_rows": 25}  # two batches: room for two workers
    small = tokenize(raw, tmp_path / "small", encoder, memory_budget="600MiB", **two)
    large = tokenize(raw, tmp_path / "large", encoder, memory_budget="2GiB", **two)
    assert (small.workers, large.workers) == (1, 2)
    assert digests(tmp_path / "small", "part-*") == digests(tmp_path / "large", "part-*")
    with pytest.raises(UsageError, match="memory_budget"):
        tokenize(raw, tmp_path / "bad", encoder, memory_budget="lots")
    with pytest.raises(UsageError, match="output directory exists"):
        tokenize(raw, tmp_path / "small", encoder)


def test_verify_rerenders_the_raw_input(cli, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    raw = write_jsonl(tmp_path / "raw.jsonl", records(90, seed=7))
    res = cli("pack", raw, "--tokenizer", tokenizer, "-o", tmp_path / "p", "-L", "256")
    assert res.exit_code == 0, res.stderr
    check = ("verify", tmp_path / "p", "--input", raw, "--tokenizer", tokenizer, "--no-attention")
    res = cli(*check, "--json")
    assert res.exit_code == 0, res.stderr
    checked = json.loads(res.stdout)["checks"]["input"]
    assert checked["ok"] and checked["ran"] and checked["samples"] == 90, checked
    # another template: refused in one line, before any check
    template = tmp_path / "other.jinja"
    template.write_text(CHATML.replace("<|im_end|>\\n", "<|im_end|>"))
    res = cli(*check, "--chat-template", template)
    assert res.exit_code == 1
    assert "was packed with another tokenizer, template or --train-on" in res.stderr
    # a raw record changed after packing: the fresh render no longer matches
    rows = records(90, seed=7)
    rows[10] = records(3, seed=99)[1]
    write_jsonl(raw, rows)
    res = cli(*check)
    assert res.exit_code == 1, res.stderr
    assert not list(tmp_path.glob("packer-verify-raw-*"))


def test_pack_on_error_skip_leaves_bad_raw_records_out_and_says_where(
    cli, tokenizer, tmp_path, monkeypatch
):
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    lines = [json.dumps(r) for r in records(12, seed=8)]
    lines[4] = '{"messages": [{"role": "robot", "content": "hello"}]}'
    raw = tmp_path / "raw.jsonl"
    raw.write_text("\n".join(lines) + "\n")
    args = ("pack", raw, "--tokenizer", tokenizer, "-o", tmp_path / "p", "-L", "256")
    args += ("--tokenizer-engine", "hf")  # no line saying auto's choice before the error
    res = cli(*args)
    assert res.exit_code == 1 and res.stderr.startswith(f"error: {raw}:5: ")
    assert not (tmp_path / "p").exists()
    res = cli(*args, "--on-error", "skip")
    assert res.exit_code == 0, res.stderr
    assert "note: 1 raw record left out, listed in " in res.stderr
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["stats"]["samples_packed"] == 11
    assert manifest["tokenized_from"]["stats"]["rejected"] == 1
    rejects = Path(manifest["tokenized_from"]["cache"]) / "rejects.txt"
    assert rejects.read_text().startswith(f"{raw}:5: ")


def test_no_more_workers_than_batches(tokenizer, tmp_path, monkeypatch):
    """An input of one batch is tokenized in the driver: no worker process is started (the
    second or so a start costs is most of a small run); two batches get two workers."""
    from packer.tokenize import run
    from packer.tokenize.encode import Encoder

    started = []
    real = run.WorkerPool

    def counting(context, n, *args):
        started.append(n)
        return real(context, n, *args)

    monkeypatch.setattr(run, "WorkerPool", counting)
    raw = write_jsonl(tmp_path / "raw.jsonl", records(40, seed=7))
    encoder = Encoder(str(tokenizer))
    one = run.tokenize(raw, tmp_path / "one", encoder, workers=2)
    assert (one.workers, started) == (1, [])
    many = run.tokenize(raw, tmp_path / "many", encoder, workers=4, batch_rows=20)
    assert (many.workers, started) == (2, [2])
    assert digests(tmp_path / "one", "part-*") != {}
    assert (one.lines, one.samples) == (many.lines, many.samples) == (40, 40)
