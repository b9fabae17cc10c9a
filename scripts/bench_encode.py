"""Tokens per second of `packer.tokenize.Encoder.encode_batch` in one process, against the
plain baseline on the same chats: render every chat with the template, then batch-tokenize the
renders, with no masks and no checks.

    PYTHONPATH=. python scripts/bench_encode.py --chats 2000 --template plain [--tokenizer-engine hf]

The tokenizer is a byte-level BPE trained on the spot (tests/tokenizers_util.py, no hub), with
ChatML with generation tags (`tagged`) or without (`plain`: masks by prefix rendering). Each
side runs `--repeat` times, the two interleaved; the best CPU time of each (this process's, all
its threads) is reported, since wall times here swing with the load. Set RAYON_NUM_THREADS=1 for
the tokenizer's one-core figure.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tokenizers_util import TEMPLATES, build_tokenizer, generated_chat  # noqa: E402

from packer.tokenize import Encoder, to_record  # noqa: E402


def timed(fn) -> tuple[float, object]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=2000)
    parser.add_argument("--template", choices=["tagged", "plain"], default="plain")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokenizer-engine", choices=["hf", "fastokens", "auto"], default="hf")
    args = parser.parse_args()
    rng = random.Random(0)
    chats = [generated_chat(rng) for _ in range(args.chats)]
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tokenizer(Path(tmp) / "tok", TEMPLATES[args.template])
        encoder = Encoder(path, tokenizer_engine=args.tokenizer_engine)
        encoder.resolve_engine()  # the engine's build and proof are per run, not per batch
    records = [to_record({"messages": c}) for c in chats]
    tok = encoder.tokenizer
    batches = [range(i, min(i + args.batch, len(chats))) for i in range(0, len(chats), args.batch)]

    def baseline():
        n = 0
        for b in batches:
            texts = tok.apply_chat_template([chats[i] for i in b], tokenize=False)
            n += sum(
                len(e.ids)
                for e in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
            )
        return n

    def encode():
        return sum(
            len(ids) for b in batches for ids, _ in encoder.encode_batch([records[i] for i in b])
        )

    runs = [(timed(baseline), timed(encode)) for _ in range(args.repeat)]  # interleaved
    base_s, tokens = min(b for b, _ in runs)
    enc_s, encoded = min(e for _, e in runs)
    assert encoded == tokens, (encoded, tokens)
    print(
        f"{args.chats} chats, {tokens:,} tokens, template {args.template} "
        f"({encoder.template.method}), engine {encoder.engine_name}"
    )
    print(
        f"baseline (render + batch tokenize, no masks): {base_s:.3f} s, {tokens / base_s:,.0f} tokens/s"
    )
    print(
        f"Encoder.encode_batch (masks + checks):        {enc_s:.3f} s, {tokens / enc_s:,.0f} tokens/s"
    )
    print(f"ratio: {enc_s / base_s:.2f}x the baseline's time")


if __name__ == "__main__":
    main()
