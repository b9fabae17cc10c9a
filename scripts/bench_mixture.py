"""Planning cost of a mixture: `mix` and `split_validation` over many sources, lengths only.

The sources are SFT-like lognormal length mixes (medians from 60 to 2,000 tokens) of unequal
sizes, weighted by their tokens times a random factor in [0.7, 1.3]. Each case is timed
`--runs` times (the median is printed) and its peak memory is traced once with tracemalloc
(numpy's arrays included), not counting the inputs.

    python scripts/bench_mixture.py                        # 20 sources, 1M and 10M samples
    python scripts/bench_mixture.py --samples 1000000 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

from packer.planning.mixture import mix, split_validation


def sources(n_sources: int, samples: int, seed: int = 0) -> list[np.ndarray]:
    """`samples` lengths over `n_sources` sources of unequal sizes and length distributions."""
    rng = np.random.default_rng(seed)
    sizes = rng.dirichlet(np.full(n_sources, 2.0)) * samples
    sizes = np.maximum(1, sizes.astype(np.int64))
    medians = np.geomspace(60, 2000, n_sources)
    return [
        np.maximum(1, rng.lognormal(np.log(m), 0.9, int(n))).astype(np.int32)
        for m, n in zip(medians, sizes)
    ]


def cases(lengths: list[np.ndarray], weights: list[float]):
    """(name, function) per planned case: the default size, twice it (repeats), a split."""
    default = mix(lengths, weights).tokens
    return [
        ("mix, default size", lambda: mix(lengths, weights, seed=1)),
        ("mix, 2x tokens", lambda: mix(lengths, weights, tokens=2 * default, seed=1)),
        ("split_validation 1%", lambda: split_validation(lengths, 0.01, seed=1)),
    ]


def measure(fn, runs: int) -> tuple[float, float, int]:
    """Median wall and CPU seconds over `runs` (CPU time is what a busy machine's wall time
    hides), and the peak traced bytes of one more run."""
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(wall), statistics.median(cpu), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", type=int, default=20)
    parser.add_argument("--samples", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.sources} sources, median of {args.runs} runs, peak traced memory of one run\n")
    print("| samples in | case | samples out | tokens out | wall s | CPU s | peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for total in args.samples:
        lengths = sources(args.sources, total)
        noise = np.random.default_rng(1).uniform(0.7, 1.3, args.sources)
        weights = [float(x.sum()) * f for x, f in zip(lengths, noise)]
        for name, fn in cases(lengths, weights):
            wall, cpu, peak = measure(fn, args.runs)
            result = fn()
            if hasattr(result, "samples"):
                out, tokens = f"{result.samples:,}", f"{result.tokens:,}"
            else:
                out, tokens = f"{sum(v.size for v in result.validation):,} held out", "-"
            print(
                f"| {total:,} | {name} | {out} | {tokens} | {wall:.2f} | {cpu:.2f} | "
                f"{peak / 2**20:,.0f} |"
            )


if __name__ == "__main__":
    main()
