"""Raw chats to packed rows: `packer pack RAW --tokenizer` against the tokenizer alone.

Generates LINES raw records (chats with an optional system prompt and 1-4 turns, texts,
prompt/completion pairs), trains a small BPE tokenizer on them and gives it a ChatML template
without generation tags (nothing is downloaded), then times, on the same lines:

- baseline: one process that parses the lines, renders every chat with the template and
  batch-tokenizes all the rendered texts (`tokenizer(texts)`): the tokenizer's own cost;
- raw -> packed: `packer pack RAW --tokenizer DIR -L L1` with a cold cache (a subprocess,
  start-up included), and the issue's guard (<= 1.0x the baseline) and goal (0.6x on 2 cores);
- again at L2: the same raw data packed at another L, from the cache (goal <= 0.5x the first).

It also checks every chat's input_ids against the baseline's tokens of the same render (an
independent reference), and that `packer tokenize` + `packer pack` gives the same shard bytes.

    python scripts/bench_tokenize.py                # 20,000 lines, all cores
    python scripts/bench_tokenize.py --lines 4000 --workers 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
VOCAB = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "it",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "by",
    "this",
    "be",
    "are",
    "from",
    "or",
    "an",
    "at",
    "which",
    "model",
    "data",
    "token",
    "packer",
    "row",
    "sample",
    "train",
    "chat",
    "reply",
    "question",
    "answer",
    "how",
    "why",
    "what",
    "when",
    "please",
    "explain",
    "short",
    "long",
    "first",
    "next",
    "last",
    "time",
    "value",
    "list",
    "file",
    "line",
]


def make_records(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)

    def sentence(lo: int, hi: int) -> str:
        return " ".join(rng.choice(VOCAB, int(rng.integers(lo, hi)))).capitalize() + "."

    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.6:
            messages = []
            if rng.random() < 0.5:
                messages.append({"role": "system", "content": sentence(5, 20)})
            for _ in range(int(rng.integers(1, 5))):
                messages.append({"role": "user", "content": sentence(5, 40)})
                messages.append({"role": "assistant", "content": sentence(10, 120)})
            out.append({"messages": messages})
        elif kind < 0.8:
            out.append({"text": " ".join(sentence(5, 30) for _ in range(int(rng.integers(1, 8))))})
        else:
            out.append({"prompt": sentence(5, 40), "completion": " " + sentence(5, 80)})
    return out


def make_tokenizer(path: Path, records: list[dict]) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    texts = [json.dumps(r) for r in records[:2000]]
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=special[1:],
    )
    fast.chat_template = CHATML
    fast.save_pretrained(str(path))


def baseline(raw: Path, tokenizer: Path) -> tuple[tuple[float, float], dict[int, list[int]]]:
    """One process: parse, render every chat, batch-tokenize every text. (seconds, chat ids by
    line index)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    t0, c0 = time.perf_counter(), time.process_time()
    texts, chats = [], {}  # chats: line index -> position of its render in texts
    with open(raw, encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            row = json.loads(line)
            if "messages" in row:
                chats[i] = len(texts)
                texts.append(tok.apply_chat_template(row["messages"], tokenize=False))
            elif "text" in row:
                texts.append(row["text"])
            else:
                texts += [row["prompt"], row["completion"]]
    encoded = tok(texts, add_special_tokens=False)["input_ids"]
    seconds = (time.perf_counter() - t0, time.process_time() - c0)
    return seconds, {i: encoded[k] for i, k in chats.items()}


def packer(*args, env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its workers)."""
    t0, c0 = time.perf_counter(), _children_cpu()
    res = subprocess.run(
        [sys.executable, "-m", "packer", *map(str, args)], capture_output=True, text=True, env=env
    )
    seconds = (time.perf_counter() - t0, _children_cpu() - c0)
    if res.returncode != 0:
        sys.exit(f"packer {' '.join(map(str, args))} failed:\n{res.stderr}")
    return seconds


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def digests(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.glob("shard-*"))
    }


def check_reference(tokenized: Path, by_line: dict[int, list[int]]) -> tuple[int, int]:
    """(chats whose input_ids equal the baseline's tokens of their render, chats)."""
    import pyarrow.parquet as pq

    ids = pq.read_table(sorted(tokenized.glob("part-*.parquet"))).column("input_ids").to_pylist()
    same = sum(ids[i] == ref for i, ref in by_line.items())
    return same, len(by_line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=None, help="default: all available cores")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-L", type=int, nargs=2, default=(4096, 8192), metavar=("L1", "L2"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as tmp:
        tmp = Path(tmp)
        records = make_records(args.lines, args.seed)
        raw = tmp / "raw.jsonl"
        raw.write_text("".join(json.dumps(r) + "\n" for r in records))
        make_tokenizer(tmp / "tok", records)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_CACHE_DIR": str(tmp / "cache")}
        workers = ["--workers", args.workers] if args.workers else []
        base, by_line = baseline(raw, tmp / "tok")
        common = ("--tokenizer", tmp / "tok", "--overlength", "split", *workers)
        first = packer("pack", raw, "-o", tmp / "p1", "-L", args.L[0], *common, env=env)
        second = packer("pack", raw, "-o", tmp / "p2", "-L", args.L[1], *common, env=env)
        packer(
            "tokenize", raw, "--tokenizer", tmp / "tok", "-o", tmp / "tok-out", *workers, env=env
        )
        packer(
            "pack",
            tmp / "tok-out",
            "-o",
            tmp / "p3",
            "-L",
            args.L[0],
            "--overlength",
            "split",
            env=env,
        )
        same_bytes = digests(tmp / "p1") == digests(tmp / "p3")
        matched, chats = check_reference(tmp / "tok-out", by_line)
    cores = args.workers or len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    print(
        f"{args.lines:,} lines ({chats:,} chats), {cores} workers, ChatML without generation tags"
    )
    print(f"load average {load:.1f} on {os.cpu_count()} cores (CPU seconds are less noisy then)")
    print("| run | wall s | vs baseline | CPU s | vs baseline |")
    print("|---|---:|---:|---:|---:|")
    rows = [
        ("baseline: 1 process renders + batch-tokenizes (tokenizer loaded)", base),
        (f"packer pack RAW --tokenizer -L {args.L[0]} (cold cache, start-up included)", first),
        (f"packer pack RAW --tokenizer -L {args.L[1]} (from the cache)", second),
    ]
    for name, (wall, cpu) in rows:
        print(f"| {name} | {wall:.2f} | {wall / base[0]:.2f}x | {cpu:.2f} | {cpu / base[1]:.2f}x |")
    print(
        f"guard 1.0x: {'met' if first[0] <= base[0] else 'MISSED'}; goal 0.6x: "
        f"{'met' if first[0] <= 0.6 * base[0] else 'missed'}; cache goal 0.5x the first: "
        f"{'met' if second[0] <= 0.5 * first[0] else 'missed'} ({second[0] / first[0]:.2f}x)"
    )
    print(
        f"reference: {matched:,}/{chats:,} chats' input_ids equal the baseline's; "
        f"two-step shards {'byte-identical' if same_bytes else 'DIFFER'}"
    )


if __name__ == "__main__":
    main()
