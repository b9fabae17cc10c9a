"""Make a preference-pair dataset (TRL's tokenized DPO form), reproducibly.

Each pair is a prompt with a chosen and a rejected completion, without the prompt:
`prompt_input_ids`, `chosen_input_ids`, `rejected_input_ids`, ids random in a 32k vocabulary.
The lengths are lognormal, a shape that chat preference sets share: by default prompts of
median 120 tokens (sigma 1.0, so a tail of long multi-turn prompts), chosen completions of
median 280 (sigma 0.7) and rejected ones of median 230 (sigma 0.8), each capped at 4,096. The
two completions of a pair are drawn independently, so their lengths differ as real ones do;
that difference is what a padded DPO batch pays for twice.

    python scripts/make_pairs.py /tmp/pairs.jsonl.gz --pairs 20000
"""

from __future__ import annotations

import argparse
import gzip
import json
import os

import numpy as np

COLUMNS = ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")
SHAPES = {"prompt": (120, 1.0), "chosen": (280, 0.7), "rejected": (230, 0.8)}


def pair_lengths(n: int, seed: int, cap: int = 4096) -> np.ndarray:
    """int64 [n, 3]: prompt, chosen and rejected lengths."""
    rng = np.random.default_rng(seed)
    cols = [rng.lognormal(np.log(median), sigma, n) for median, sigma in SHAPES.values()]
    return np.clip(np.round(np.stack(cols, 1)), 1, cap).astype(np.int64)


def make_pairs(n: int, seed: int, vocab: int = 32000):
    rng = np.random.default_rng(seed + 1)
    for lengths in pair_lengths(n, seed):
        yield {c: rng.integers(3, vocab, size=k).tolist() for c, k in zip(COLUMNS, lengths)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="path ending in .jsonl or .jsonl.gz")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lines = (json.dumps(p, separators=(",", ":")) + "\n" for p in make_pairs(args.pairs, args.seed))
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    if args.output.endswith(".gz"):
        with (
            open(args.output, "wb") as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as fh,
        ):
            for line in lines:
                fh.write(line.encode())
    else:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.writelines(lines)


if __name__ == "__main__":
    main()
