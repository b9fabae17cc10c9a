"""Planning benchmark: seconds and rows / best bound of packer's strategies, side by side with
lightbinpack's C++ `obfd` when it is installed (`pip install -e .[bench]`).

Prints a table (medians of several runs, JIT cache warm); it is not a timed test. Times on a
shared machine swing, so compare ratios within one run. Usage:

    python scripts/bench_plan.py            # 1M at L=2048 and 8192, 16M at L=512
    python scripts/bench_plan.py --quick    # 1M cases only
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from packer.planning.choices import STRATEGIES
from packer.planning.strategies import best_bound, plan

try:
    from lightbinpack import obfd
except ImportError:  # optional bench extra
    obfd = None


def lognormal_lengths(
    n: int, max_len: int, median: float = 300, sigma: float = 1.0, seed: int = 0
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    lengths = np.round(rng.lognormal(np.log(median), sigma, n)).astype(np.int64)
    return np.clip(lengths, 1, max_len)


def median_seconds(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def bench_case(n: int, max_len: int, strategies, repeats: int, with_obfd: bool) -> list[dict]:
    lengths = lognormal_lengths(n, max_len)
    bound = best_bound(lengths, max_len)
    rows = []
    for name in strategies:
        plan(lengths[:100], max_len, name)  # load the JIT cache
        seconds, p = median_seconds(lambda name=name: plan(lengths, max_len, name), repeats)
        rows.append(
            {
                "case": f"{n / 1e6:g}M, L={max_len}",
                "method": f"packer {name}",
                "seconds": seconds,
                "rows": p.num_rows,
                "bound": bound,
            }
        )
    if with_obfd and obfd is not None:
        as_list = lengths.tolist()  # its input type; conversion not timed
        seconds, bins = median_seconds(lambda: obfd(as_list, max_len), repeats)
        rows.append(
            {
                "case": f"{n / 1e6:g}M, L={max_len}",
                "method": "lightbinpack obfd",
                "seconds": seconds,
                "rows": len(bins),
                "bound": bound,
            }
        )
        del bins
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 1M-sample cases")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    results = []
    results += bench_case(1_000_000, 2048, STRATEGIES, args.repeats, with_obfd=True)
    results += bench_case(
        1_000_000, 8192, ("bfd", "ffd", "histogram"), args.repeats, with_obfd=True
    )
    if not args.quick:
        results += bench_case(
            16_000_000,
            512,
            ("bfd", "ffd", "histogram", "nf"),
            max(3, args.repeats // 2),
            with_obfd=True,
        )
    if obfd is None:
        print("lightbinpack is not installed: no obfd baseline (pip install lightbinpack)")

    obfd_time = {r["case"]: r["seconds"] for r in results if r["method"] == "lightbinpack obfd"}
    head = (
        f"{'case':<14} {'method':<20} {'median s':>9} {'vs obfd':>8} {'rows':>11} "
        f"{'best bound':>11} {'rows/bound':>10}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        base = obfd_time.get(r["case"])
        speed = f"{base / r['seconds']:.1f}x" if base and r["method"] != "lightbinpack obfd" else ""
        print(
            f"{r['case']:<14} {r['method']:<20} {r['seconds']:>9.4f} {speed:>8} "
            f"{r['rows']:>11,} {r['bound']:>11,} {r['rows'] / r['bound']:>10.5f}"
        )


if __name__ == "__main__":
    main()
