"""Modeled data-parallel efficiency of batches balanced by tokens vs by attention.

Two synthetic length mixes, planned into rows of L tokens with packer's planner (`bfd`, samples
longer than L split as `--overlength split` does), then one epoch per seed planned by
`plan_batches` for W ranks x b rows. The cost model is `tokens + Σ l² / (12 · hidden_size)`.

    python scripts/bench_balance.py            # the table in docs/balance.md
    python scripts/bench_balance.py --rows 4000 --world-sizes 8 64 256 --hidden-size 8192
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from packer.planning.balance import compare_balance
from packer.planning.strategies import plan

MIXES = ("lognormal", "long-documents")


def split_lengths(lengths: np.ndarray, max_len: int) -> np.ndarray:
    """Each length cut into pieces of `max_len` and a shorter last piece, in order."""
    lengths = np.asarray(lengths, np.int64)
    counts = -(-lengths // max_len)
    out = np.full(int(counts.sum()), max_len, np.int64)
    out[np.cumsum(counts) - 1] = lengths - (counts - 1) * max_len
    return out


def _draw(rng, median: float, sigma: float, tokens: int) -> np.ndarray:
    """Lognormal lengths (at least 1) until they hold `tokens` tokens."""
    mean = median * np.exp(sigma**2 / 2)
    n = int(tokens / mean * 1.2) + 16
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(median), sigma, n))).astype(np.int64)
    return lengths[: int(np.searchsorted(np.cumsum(lengths), tokens)) + 1]


def mix_lengths(mix: str, rows: int, max_len: int, seed: int = 0) -> np.ndarray:
    """Sample lengths of a mix holding about `rows` rows of `max_len` tokens, split at `max_len`.

    `lognormal`: SFT-like samples, median 300 tokens, sigma 0.9 (as scripts/make_lognormal.py).
    `long-documents`: half the tokens from such samples, half from documents of median 4,000
    tokens and sigma 1.2 (a few are over 100k), shuffled together.
    """
    rng = np.random.default_rng([seed, MIXES.index(mix)])
    tokens = rows * max_len
    if mix == "lognormal":
        lengths = _draw(rng, 300, 0.9, tokens)
    elif mix == "long-documents":
        both = [_draw(rng, 300, 0.9, tokens // 2), _draw(rng, 4000, 1.2, tokens // 2)]
        lengths = rng.permutation(np.concatenate(both))
    else:
        raise ValueError(f"unknown mix {mix!r} (choose from {', '.join(MIXES)})")
    return split_lengths(lengths, max_len)


def packed_rows(lengths: np.ndarray, max_len: int, strategy: str = "bfd"):
    """Rows planned by packer as CSR: (offsets, segment lengths)."""
    p = plan(lengths, max_len, strategy)
    return p.row_starts, lengths[p.order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="rows per epoch (about)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--batch-size", type=int, default=1, help="rows per rank per step")
    parser.add_argument("--hidden-size", type=int, default=4096)
    parser.add_argument("--seeds", type=int, default=3, help="epochs averaged (seeds 0..n-1)")
    args = parser.parse_args()
    print(
        f"modeled data-parallel efficiency, d = {args.hidden_size}, {args.batch_size} row(s) "
        f"per rank, mean (min) over {args.seeds} seeds\n"
    )
    print("| mix | L | rows | ranks | tokens | attention | seconds per epoch (both plans) |")
    print("|---|---|---|---|---|---|---|")
    for mix in MIXES:
        for max_len in args.contexts:
            lengths = mix_lengths(mix, args.rows, max_len)
            offsets, seg = packed_rows(lengths, max_len)
            for world in args.world_sizes:
                effs = {"tokens": [], "attention": []}
                t = time.perf_counter()
                for seed in range(args.seeds):
                    r = compare_balance(
                        offsets, seg, world, args.batch_size, args.hidden_size, seed
                    )
                    for k in effs:
                        effs[k].append(r[k])
                secs = (time.perf_counter() - t) / args.seeds
                cells = [f"{100 * np.mean(v):.1f}% ({100 * min(v):.1f}%)" for v in effs.values()]
                print(
                    f"| {mix} | {max_len // 1024}k | {len(offsets) - 1:,} | {world} | "
                    f"{cells[0]} | {cells[1]} | {secs:.3f} |"
                )


if __name__ == "__main__":
    main()
