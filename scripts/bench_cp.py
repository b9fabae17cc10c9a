"""What context-parallel padding costs: rows and efficiency at cp_size 1, 2, 4, 8.

`pack --cp-size N` pads every sample (every piece of a split one) at its end to a multiple of 2N
and plans the padded lengths. On the two mixes scripts/bench_balance.py generates (SFT chat
lengths: lognormal, median 300; long documents: half the tokens from documents of median 4,000,
some over 100k, split at L) this plans each case with packer's planner (the `bfd` default, as
`pack` calls it) and prints, per mix, L and cp_size:

- `pad %`: the CP padding's share of the padded tokens;
- `rows`, `LB padded` (`⌈padded tokens / L⌉`, the fewest rows any planner could use for the
  padded lengths) and `rows / LB padded` (the target: within 0.05% of it at cp_size 8);
- `LB real` (`⌈real tokens / L⌉`) and `rows / LB real`: what the padding and the planner cost
  together against the fewest rows without CP;
- `eff`: real tokens over rows x L; `eff padded`: padded tokens over rows x L (the planner's
  packing of what it was given); `CP cost`: the efficiency lost to the padding, in points
  against cp_size 1 on the same lengths;
- `plan s`: the planner's seconds, median of `--repeats` runs (JIT cache warm).

Then the worst `rows / LB padded` over `--seeds` draws of every mix, and an end-to-end check:
`--pack-rows` rows of each mix at the first L written as Parquet and packed by `packer.pack` at
every cp_size, the manifest's rows and efficiency against the planner's, with the packing
seconds (median of `--repeats`) against cp_size 1.

    python scripts/bench_cp.py                      # the tables in docs/context-parallel.md
    python scripts/bench_cp.py --rows 500 --contexts 32768 --cp-sizes 1 8 --pack-rows 0
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_balance import MIXES, mix_lengths  # noqa: E402
from make_lognormal import make_table  # noqa: E402

from packer import PackConfig, pack  # noqa: E402
from packer.planning.cp import padded_lengths  # noqa: E402
from packer.planning.strategies import lower_bound, plan  # noqa: E402

MIX_NAMES = {"lognormal": "SFT chat", "long-documents": "long documents"}
TARGET = 0.0005  # rows within 0.05% of the lower bound on the padded lengths


def bench_case(lengths: np.ndarray, max_len: int, cp_size: int, repeats: int) -> dict:
    padded = padded_lengths(lengths, cp_size)
    plan(padded[:64], max_len)  # load the JIT cache
    times, rows = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        rows = plan(padded, max_len).num_rows
        times.append(time.perf_counter() - t)
    real_tokens, padded_tokens = int(lengths.sum()), int(padded.sum())
    lb_real, lb_padded = lower_bound(real_tokens, max_len), lower_bound(padded_tokens, max_len)
    return {
        "cp_size": cp_size,
        "samples": int(lengths.size),
        "tokens": real_tokens,
        "pad_share": (padded_tokens - real_tokens) / padded_tokens,
        "rows": rows,
        "lb_padded": lb_padded,
        "over_lb_padded": rows / lb_padded - 1,
        "lb_real": lb_real,
        "over_lb_real": rows / lb_real - 1,
        "efficiency": real_tokens / (rows * max_len),
        "efficiency_padded": padded_tokens / (rows * max_len),
        "seconds": statistics.median(times),
    }


def pack_check(args, tmp: Path) -> None:
    """Pack `--pack-rows` rows of each mix at every cp_size; the manifest against the planner."""
    max_len = args.contexts[0]
    print(
        f"\n`packer.pack` on {args.pack_rows} rows of each mix at L = {max_len:,} "
        f"(median of {args.repeats} runs)\n"
    )
    print("| mix | cp | rows | planner rows | eff | cp_pad_tokens | pack s | vs cp 1 |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for mix in args.mixes:
        lengths = mix_lengths(mix, args.pack_rows, max_len, seed=args.seed)
        src = tmp / f"{mix}.parquet"
        pq.write_table(make_table(lengths, args.seed), src, row_group_size=65536)
        base = None
        for cp_size in args.cp_sizes:
            cfg = PackConfig(max_len=max_len, cp_size=cp_size)
            times = []
            for _ in range(args.repeats):
                out = tmp / f"{mix}-cp{cp_size}"
                t = time.perf_counter()
                pack([src], out, cfg, overwrite=True)
                times.append(time.perf_counter() - t)
            stats = json.loads((out / "manifest.json").read_text())["stats"]
            planned = plan(padded_lengths(lengths, cp_size), max_len).num_rows
            seconds = statistics.median(times)
            base = seconds if cp_size == 1 else base
            ratio = f"{seconds / base:.2f}x" if base else ""
            print(
                f"| {MIX_NAMES[mix]} | {cp_size} | {stats['rows']:,} | {planned:,} | "
                f"{100 * stats['efficiency']:.3f} % | {stats.get('cp_pad_tokens', 0):,} | "
                f"{seconds:.2f} | {ratio} |"
            )
            if stats["rows"] != planned:
                raise SystemExit(f"error: pack wrote {stats['rows']} rows, the plan {planned}")
            shutil.rmtree(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000, help="rows of L per mix (about)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072])
    parser.add_argument("--cp-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--mixes", nargs="+", default=list(MIXES), choices=MIXES)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=5, help="draws for the worst case")
    parser.add_argument("--pack-rows", type=int, default=1000, help="0: no end-to-end check")
    args = parser.parse_args()

    print(
        "| mix | L | cp | samples | pad % | rows | LB padded | rows / LB padded | LB real | "
        "rows / LB real | eff | eff padded | CP cost | plan s |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    misses = []
    for mix in args.mixes:
        for max_len in args.contexts:
            lengths = mix_lengths(mix, args.rows, max_len, seed=args.seed)
            base = None
            for cp_size in args.cp_sizes:
                if max_len % (2 * cp_size) and cp_size > 1:
                    raise SystemExit(f"error: L={max_len} is not a multiple of 2 x {cp_size}")
                r = bench_case(lengths, max_len, cp_size, args.repeats)
                base = r["efficiency"] if cp_size == 1 else base
                cost = "" if base is None else f"{100 * (base - r['efficiency']):.3f}"
                print(
                    f"| {MIX_NAMES[mix]} | {max_len:,} | {cp_size} | {r['samples']:,} | "
                    f"{100 * r['pad_share']:.3f} | {r['rows']:,} | {r['lb_padded']:,} | "
                    f"+{100 * r['over_lb_padded']:.3f} % | {r['lb_real']:,} | "
                    f"+{100 * r['over_lb_real']:.3f} % | {100 * r['efficiency']:.3f} % | "
                    f"{100 * r['efficiency_padded']:.3f} % | {cost} | {r['seconds']:.3f} |"
                )
    print(
        f"\nCP cost: efficiency points lost against cp_size 1 on the same lengths. "
        f"Target: rows within {100 * TARGET:.2f} % of LB padded."
    )
    worst = {}  # cp_size -> (rows / LB padded - 1, rows over, case) over every seed
    for seed in range(args.seeds):
        for mix in args.mixes:
            for max_len in args.contexts:
                lengths = mix_lengths(mix, args.rows, max_len, seed=seed)
                for cp_size in args.cp_sizes:
                    r = bench_case(lengths, max_len, cp_size, 1)
                    case = (r["over_lb_padded"], r["rows"] - r["lb_padded"], mix, max_len, seed)
                    worst[cp_size] = max(worst.get(cp_size, case), case)
                    if r["over_lb_padded"] > TARGET:
                        misses.append((mix, max_len, cp_size, seed, r))
    print(f"\nworst rows / LB padded over seeds 0-{args.seeds - 1}, both mixes, every L:")
    for cp_size, (over, extra, mix, max_len, seed) in sorted(worst.items()):
        if extra == 0:
            print(f"  cp {cp_size}: +0 % (the lower bound in every case)")
            continue
        print(
            f"  cp {cp_size}: +{100 * over:.4f} % ({extra} rows over; "
            f"{MIX_NAMES[mix]}, L={max_len:,}, seed {seed})"
        )
    for mix, max_len, cp_size, seed, r in misses:
        extra = r["rows"] - r["lb_padded"]
        print(
            f"missed: {MIX_NAMES[mix]} L={max_len:,} cp={cp_size} seed {seed}: {extra} rows "
            f"over {r['lb_padded']:,} (+{100 * r['over_lb_padded']:.3f} %)"
        )
    if args.pack_rows:
        tmp = Path(tempfile.mkdtemp(prefix="bench-cp-"))
        try:
            pack_check(args, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
