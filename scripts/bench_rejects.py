"""Seconds of `packer tokenize --on-error skip` on chats of which some are rejected, beside the
same run on the good chats alone: a rejected chat must cost its own encoding, not another pass
over its batch.

    python scripts/bench_rejects.py --lines 600 --rejects 54 --repeat 3
    python scripts/bench_rejects.py --baseline /path/to/an/older/checkout   # adds its rows

Rejects are chats whose reply holds a special token's text (refused while encoding). One
worker, a tiny ChatML tokenizer built here (tests/tokenizers_util.py); medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rows(lines: int, rejects: int, seed: int) -> tuple[list[dict], list[dict]]:
    sys.path.insert(0, str(ROOT / "tests"))
    from tokenizers_util import generated_chat

    rng = random.Random(seed)
    bad = set(rng.sample(range(lines), rejects))
    every, good = [], []
    for i in range(lines):
        chat = generated_chat(rng)
        if i in bad:
            chat[-1] = dict(chat[-1], content=chat[-1]["content"] + " <|im_end|>")
        every.append({"messages": chat})
        if i not in bad:
            good.append({"messages": chat})
    return every, good


def run(checkout: Path, raw: Path, tokenizer: Path, out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout), "PACKER_CACHE_DIR": str(out) + ".cache"}
    args = [sys.executable, "-m", "packer", "tokenize", str(raw), "-o", str(out)]
    args += ["--tokenizer", str(tokenizer), "--on-error", "skip", "--workers", "1", "--overwrite"]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=checkout)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: packer tokenize failed: {done.stderr.strip()}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=600)
    parser.add_argument("--rejects", type=int, default=54)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", type=Path, help="another checkout of packer, run the same")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from tokenizers_util import TEMPLATES, build_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer = build_tokenizer(tmp / "tok", TEMPLATES["plain"])
        every, good = rows(args.lines, args.rejects, args.seed)
        files = {}
        for name, data in (("with rejects", every), ("good lines only", good)):
            files[name] = tmp / f"{name.replace(' ', '-')}.jsonl"
            files[name].write_text("".join(json.dumps(r) + "\n" for r in data))
        checkouts = {"this checkout": ROOT}
        if args.baseline is not None:
            checkouts["baseline"] = args.baseline.resolve()
        print(f"{args.lines} lines, {args.rejects} rejected, 1 worker; medians of {args.repeat}")
        print("| checkout | input | wall s |")
        print("|---|---|---:|")
        for label, checkout in checkouts.items():
            for name, raw in files.items():
                times = [
                    run(checkout, raw, tokenizer, tmp / f"out-{n}") for n in range(args.repeat)
                ]
                print(f"| {label} | {name} | {statistics.median(times):.2f} |")


if __name__ == "__main__":
    main()
