"""Issue 35's bar, end to end: raw lines -> packed rows that match an independent reference.

Generates LINES raw records (OpenAI chats with an optional system prompt and 1-4 turns, texts,
prompt/completion pairs, some ShareGPT and Alpaca records), trains a small byte-level BPE with
`tokenizers` and saves it with a ChatML template WITHOUT generation tags (masks then come from
prefix rendering; nothing is downloaded), and runs, as a user would, in subprocesses:

1. `packer pack RAW --tokenizer DIR -o ONE` (a cold cache);
2. reads every packed sample back with pyarrow and compares its ids AND labels with a plain
   Python ChatML reference for its raw line (found through `sample_index`); the reference
   builds each chat turn by turn from tokenized pieces, with no template and no packer code;
3. `packer tokenize RAW` then `packer pack` of the tokenized shards: the same shard bytes;
4. `packer verify ONE --input RAW --tokenizer DIR --rows all`.

It prints a table (counts, tokens, mismatches, each step's time) and exits 1 on any mismatch
or failed step.

    python scripts/check_raw_bar.py                 # 20,000 lines
    python scripts/check_raw_bar.py --lines 300     # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from tokenizers_util import PLAIN, WORDS, build_tokenizer, generated_chat, sentence  # noqa: E402

IGNORE = -100
L = 4096  # longer than any generated sample: every sample is packed whole
SHAREGPT = {"system": "system", "user": "human", "assistant": "gpt"}


def generate(lines: int, seed: int) -> list[dict]:
    """Raw records of every kind the issue names, in a seeded mix."""
    rng = random.Random(seed)
    rows = []
    for _ in range(lines):
        pick = rng.random()
        if pick < 0.45:
            rows.append({"messages": generated_chat(rng)})
        elif pick < 0.55:
            chat = [
                {"from": SHAREGPT[m["role"]], "value": m["content"]} for m in generated_chat(rng)
            ]
            rows.append({"conversations": chat})
        elif pick < 0.62:
            extra = sentence(rng) if rng.random() < 0.5 else ""
            rows.append({"instruction": sentence(rng), "input": extra, "output": sentence(rng)})
        elif pick < 0.82:
            rows.append({"text": sentence(rng, 1, 40)})
        else:
            completion = " " + rng.choice(WORDS) + " " + sentence(rng)
            rows.append({"prompt": sentence(rng), "completion": completion})
    return rows


class Reference:
    """ChatML ids and labels built piece by piece: no template, no rendering, no packer."""

    def __init__(self, tokenizer_dir: Path):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        self.start = self.tok.token_to_id("<|im_start|>")
        self.end = self.tok.token_to_id("<|im_end|>")
        self.eos = self.tok.token_to_id("<|endoftext|>")

    def enc(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def chat(self, chat: list[dict]) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        labels: list[int] = []
        for message in chat:
            head = [self.start, *self.enc(message["role"] + "\n")]
            body = [*self.enc(message["content"]), self.end]
            tail = self.enc("\n")
            trained = message["role"] == "assistant"
            ids += head + body + tail
            labels += [IGNORE] * len(head) + (body if trained else [IGNORE] * len(body))
            labels += [IGNORE] * len(tail)
        return ids, labels

    def __call__(self, row: dict) -> tuple[list[int], list[int]]:
        if "messages" in row:
            return self.chat(row["messages"])
        if "conversations" in row:
            roles = {v: k for k, v in SHAREGPT.items()}
            return self.chat(
                [{"role": roles[t["from"]], "content": t["value"]} for t in row["conversations"]]
            )
        if "instruction" in row:
            user = row["instruction"] + (f"\n\n{row['input']}" if row["input"] else "")
            return self.chat(
                [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]
            )
        if "text" in row:
            ids = [*self.enc(row["text"]), self.eos]
            return ids, list(ids)
        prompt = self.enc(row["prompt"])
        completion = [*self.enc(row["completion"]), self.eos]
        return prompt + completion, [IGNORE] * len(prompt) + completion


def packed_samples(out: Path):
    """(sample_index, input_ids, labels) of every sample in every shard of `out`."""
    import pyarrow as pa

    for shard in sorted(out.glob("shard-*.arrow")):
        table = pa.ipc.open_stream(pa.memory_map(str(shard))).read_all()
        cols = table.select(["input_ids", "labels", "cu_seqlens", "sample_index"]).to_pydict()
        for ids, labels, cu, index in zip(
            cols["input_ids"], cols["labels"], cols["cu_seqlens"], cols["sample_index"]
        ):
            for k, s in enumerate(index):
                yield s, ids[cu[k] : cu[k + 1]], labels[cu[k] : cu[k + 1]]


def compare(out: Path, rows: list[dict], ref: Reference) -> dict:
    """Every packed sample against the reference of its raw line; every line packed once."""
    counts = {"samples": 0, "tokens": 0, "loss_tokens": 0, "mismatches": 0, "first": None}
    seen = [0] * len(rows)
    for s, ids, labels in packed_samples(out):
        counts["samples"] += 1
        counts["tokens"] += len(ids)
        counts["loss_tokens"] += sum(x != IGNORE for x in labels)
        ok = 0 <= s < len(rows)
        if ok:
            seen[s] += 1
            want_ids, want_labels = ref(rows[s])
            want_labels = [IGNORE, *want_labels[1:]]  # packing masks each sample's first label
            ok = ids == want_ids and labels == want_labels
        if not ok:
            counts["mismatches"] += 1
            counts["first"] = counts["first"] or f"sample_index {s}"
    unpacked = sum(n != 1 for n in seen)
    if unpacked:
        counts["mismatches"] += unpacked
        first = next(i for i, n in enumerate(seen) if n != 1)
        counts["first"] = counts["first"] or f"line {first + 1} packed {seen[first]} times"
    return counts


def run(args: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, done


def same_shards(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("shard-*"))
    return names == sorted(p.name for p in b.glob("shard-*")) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=20_000, help="raw lines (default 20,000)")
    parser.add_argument("--workers", type=int, default=None, help="packer's --workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: temp)")
    opts = parser.parse_args()
    if opts.lines < 1:
        parser.error("--lines must be at least 1")
    work = Path(opts.dir or tempfile.mkdtemp(prefix="raw-bar-"))
    work.mkdir(parents=True, exist_ok=True)
    packer = [sys.executable, "-m", "packer"]
    env = {**os.environ, "PACKER_CACHE_DIR": str(work / "cache"), "PYTHONPATH": str(ROOT)}
    workers = ["--workers", str(opts.workers)] if opts.workers else []
    times: dict[str, float] = {}
    failures: list[str] = []

    start = time.perf_counter()
    rows = generate(opts.lines, opts.seed)
    raw = work / "raw.jsonl"
    raw.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    tok = build_tokenizer(work / "tokenizer", PLAIN)
    ref = Reference(tok)
    times["generate + train tokenizer"] = time.perf_counter() - start

    one, tokenized, two = work / "one", work / "tokenized", work / "two"
    steps = [
        ("pack RAW --tokenizer", [*packer, "pack", str(raw), "--tokenizer", str(tok)]
         + ["-o", str(one), "-L", str(L), *workers]),
        ("tokenize RAW", [*packer, "tokenize", str(raw), "--tokenizer", str(tok)]
         + ["-o", str(tokenized), *workers]),
        ("pack TOKENIZED", [*packer, "pack", str(tokenized), "-o", str(two), "-L", str(L)]),
        ("verify --input RAW --rows all", [*packer, "verify", str(one), "--input", str(raw)]
         + ["--tokenizer", str(tok), "--rows", "all"]),
    ]  # fmt: skip
    counts = None
    for name, args in steps:
        times[name], done = run(args, env)
        if done.returncode != 0:
            tail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:]
            failures.append(f"{name}: exit {done.returncode}: {' '.join(tail)}")
            if name == "pack RAW --tokenizer":
                break
        if name == "pack RAW --tokenizer":
            start = time.perf_counter()
            counts = compare(one, rows, ref)
            times["compare with the reference"] = time.perf_counter() - start
    identical = two.is_dir() and one.is_dir() and same_shards(one, two)
    if not identical:
        failures.append("tokenize + pack: shards differ from pack --tokenizer")
    if counts and counts["mismatches"]:
        failures.append(f"{counts['mismatches']} mismatches (first: {counts['first']})")

    kinds = {
        k: sum(k in r for r in rows)
        for k in ("messages", "conversations", "instruction", "text", "prompt")
    }
    print(f"{'lines':<34}{opts.lines:>12,}")
    for kind, n in kinds.items():
        print(f"{'  ' + kind:<34}{n:>12,}")
    for key in ("samples", "tokens", "loss_tokens", "mismatches"):
        value = counts[key] if counts else "-"
        print(f"{key.replace('_', ' '):<34}{value:>12,}" if counts else f"{key:<34}{value:>12}")
    print(f"{'two-step shards identical':<34}{'yes' if identical else 'NO':>12}")
    for name, seconds in times.items():
        print(f"{name + ' (s)':<34}{seconds:>12.2f}")
    print(f"{'load average (1 min)':<34}{os.getloadavg()[0]:>12.2f}")
    print(f"work directory: {work}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
