"""Write a large synthetic token dataset (Parquet) with lognormal sample lengths.

Used by the benchmarks and the row-count check in the README. Default: 1M samples, median
~300 tokens (about 450M tokens), with SFT-style labels. Deterministic for a seed.

    python scripts/make_lognormal.py bench-data/lognormal-1m.parquet
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def lognormal_lengths(n: int, median: float, sigma: float, seed: int, max_len: int | None = None):
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(median), sigma, n))).astype(np.int64)
    if max_len:
        lengths = np.minimum(lengths, max_len)
    return lengths


def make_table(lengths: np.ndarray, seed: int, vocab: int = 32000, labels: bool = True) -> pa.Table:
    rng = np.random.default_rng(seed + 1)
    offsets = np.zeros(lengths.size + 1, np.int32 if lengths.sum() < 2**31 else np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(0, vocab, size=int(offsets[-1]), dtype=np.int32)
    make = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    cols = {"input_ids": make.from_arrays(pa.array(offsets), pa.array(ids))}
    if labels:
        # mask a prompt prefix of each sample (first ~30% of its tokens) with -100
        lab = ids.copy()
        prompt = (lengths * 0.3).astype(np.int64)
        mask = np.zeros(ids.size + 1, np.int32)
        np.add.at(mask, offsets[:-1], 1)
        np.add.at(mask, offsets[:-1] + prompt, -1)
        lab[np.cumsum(mask[:-1]) > 0] = -100
        cols["labels"] = make.from_arrays(pa.array(offsets), pa.array(lab))
    return pa.table(cols)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--median", type=float, default=300)
    parser.add_argument("--sigma", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-labels", action="store_true")
    parser.add_argument("--row-group", type=int, default=65536)
    args = parser.parse_args()
    t = time.perf_counter()
    lengths = lognormal_lengths(args.samples, args.median, args.sigma, args.seed)
    table = make_table(lengths, args.seed, labels=not args.no_labels)
    pq.write_table(table, args.output, row_group_size=args.row_group)
    print(
        f"{args.output}: {args.samples:,} samples, {int(lengths.sum()):,} tokens, "
        f"median {int(np.median(lengths))}, max {int(lengths.max())} "
        f"({time.perf_counter() - t:.1f} s)"
    )


if __name__ == "__main__":
    main()
