"""Make the bundled sample dataset: tokenized chat-style SFT samples, reproducibly.

Lengths are lognormal (median ~200 tokens), ids are random in a 32k vocabulary, and each sample
has a prompt whose labels are -100 followed by a response whose labels equal its ids, which is
what an SFT data pipeline hands to a packer. A few samples are longer than 2048 tokens so the
over-length policies have something to do.

    python scripts/make_sample.py data/sample.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json

import numpy as np


def make_samples(n: int, seed: int, median: int = 200, sigma: float = 0.9, vocab: int = 32000):
    rng = np.random.default_rng(seed)
    lengths = np.maximum(2, np.round(rng.lognormal(np.log(median), sigma, n))).astype(int)
    for i, length in enumerate(lengths):
        ids = rng.integers(3, vocab, size=length)
        prompt = int(rng.integers(1, max(2, length // 2)))
        labels = np.concatenate([np.full(prompt, -100), ids[prompt:]])
        yield {"id": f"sample-{i:05d}", "input_ids": ids.tolist(), "labels": labels.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="path ending in .jsonl or .jsonl.gz")
    parser.add_argument("--samples", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.output.endswith(".gz"):
        # no name and mtime=0 in the gzip header: the file is byte-identical on every machine
        with (
            open(args.output, "wb") as raw,
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as fh,
        ):
            for sample in make_samples(args.samples, args.seed):
                fh.write((json.dumps(sample, separators=(",", ":")) + "\n").encode())
    else:
        with open(args.output, "w", encoding="utf-8") as fh:
            for sample in make_samples(args.samples, args.seed):
                fh.write(json.dumps(sample, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
