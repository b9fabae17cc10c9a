"""Local against Ray: the 1M-sample lognormal benchmark split into 16 Parquet files.

Every run is its own `packer pack --json` process (start-up, and Ray's start and shutdown,
included); the table shows medians. Runs:

- local, one global plan (today's default);
- local, `--block-size` (the block pipeline in one process);
- ray, a local instance with `--workers` CPUs, the same `--block-size` (same bytes as the above,
  checked).

It reports Ray's overhead as a ratio, the time per block task, the tokens moved, and the rows
against one global plan and the lower bounds. A second, quality-only part packs a multi-file
mix of chat, code and long-document lengths (`--overlength split`) with blocks and globally.

    python scripts/bench_ray.py                       # 3 runs each, bench-data/ray-16/
    python scripts/bench_ray.py --runs 1 --samples 200000
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from make_lognormal import lognormal_lengths, make_table  # noqa: E402


def split_files(lengths: np.ndarray, directory: Path, files: int, row_group: int, seed: int):
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, lengths.size, files + 1).astype(int)
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        table = make_table(lengths[a:b], seed + k)
        pq.write_table(table, directory / f"part-{k:03d}.parquet", row_group_size=row_group)


def ensure_data(directory: Path, make) -> Path:
    done = directory / ".complete"
    if not done.exists():
        shutil.rmtree(directory, ignore_errors=True)
        t = time.perf_counter()
        make(directory)
        done.write_text("")
        print(f"wrote {directory} ({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    return directory


def pack(inputs: Path, out: Path, args: list[str]) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "packer", "pack", str(inputs), "-o", str(out), "--overwrite"]
    t = time.perf_counter()
    r = subprocess.run(cmd + args + ["--json"], capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd + args)}\n{r.stderr}")
    return wall, json.loads(r.stdout.strip().splitlines()[-1])


def same_bytes(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--row-group", type=int, default=8192)
    parser.add_argument("--block-size", default="16MiB")
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=ROOT / "bench-data")
    parser.add_argument("--skip-mix", action="store_true")
    args = parser.parse_args()

    lengths = lognormal_lengths(args.samples, 300, 0.9, 0)
    data = ensure_data(
        args.data / f"ray-{args.files}-{args.samples}",
        lambda d: split_files(lengths, d, args.files, args.row_group, 0),
    )
    common = ["-L", str(args.max_len), "--overlength", "split", "--workers", str(args.workers)]
    blocks = ["--block-size", args.block_size]
    variants = [
        ("local, one global plan", common),
        (f"local, --block-size {args.block_size}", common + blocks),
        (
            f"ray (local instance, {args.workers} CPUs), --block-size {args.block_size}",
            common + blocks + ["--engine", "ray"],
        ),  # fmt: skip
    ]
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-", dir=args.data))
    results = {}
    try:
        for run in range(args.runs):
            for k, (name, flags) in enumerate(variants):
                wall, report = pack(data, tmp / f"out{k}", flags)
                results.setdefault(name, []).append((wall, report))
                print(f"run {run + 1} {name}: {wall:.2f} s", file=sys.stderr)
        identical = same_bytes(tmp / "out1", tmp / "out2")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    base = statistics.median(w for w, _ in results[variants[0][0]])
    rows_global = results[variants[0][0]][0][1]["rows"]
    print(
        f"\n{args.samples:,} lognormal samples (median 300) in {args.files} Parquet files, "
        f"L={args.max_len}, --overlength split, --workers {args.workers}; medians of {args.runs}"
    )
    print("\n| run | median s | runs | × local global | blocks | block task median s | "
          "tokens moved | rows | rows vs global plan | rows / lower bound |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, _ in variants:
        walls = [w for w, _ in results[name]]
        rep = results[name][0][1]
        med = statistics.median(walls)
        task = statistics.median(r["timings"].get("block_task_median", 0) for _, r in results[name])
        print(
            f"| {name} | {med:.2f} | {', '.join(f'{w:.2f}' for w in walls)} | {med / base:.2f} | "
            f"{rep.get('blocks', 1)} | {task:.3f} | {rep.get('tokens_moved', 0):,} "
            f"({100 * rep.get('tokens_moved', 0) / rep['tokens']:.2f} %) | {rep['rows']:,} | "
            f"{100 * (rep['rows'] / rows_global - 1):+.4f} % | {rep['rows_over_lower_bound']:.6f} |"
        )
    ray_name, blocks_name = variants[2][0], variants[1][0]
    ray_med = statistics.median(w for w, _ in results[ray_name])
    blk_med = statistics.median(w for w, _ in results[blocks_name])
    timing = results[ray_name][0][1]["timings"]
    print(
        f"\nray / local blocks: {ray_med / blk_med:.2f}x; ray / local global: {ray_med / base:.2f}x;"
        f" ray and local block outputs byte-identical: {identical}"
    )
    print(f"ray timings of the first run: {json.dumps(timing)}")

    if not args.skip_mix:
        mix_quality(args)


def mix_lengths() -> np.ndarray:
    """Chat turns, code files and long documents, shuffled together (seeded)."""
    rng = np.random.default_rng(5)
    parts = [
        lognormal_lengths(240_000, 180, 0.8, 1),  # chat
        lognormal_lengths(50_000, 900, 1.0, 2),  # code
        lognormal_lengths(10_000, 3000, 1.1, 3),  # long documents (split at L)
    ]
    lengths = np.concatenate(parts)
    return lengths[rng.permutation(lengths.size)]


def mix_quality(args) -> None:
    lengths = mix_lengths()
    data = ensure_data(
        args.data / "ray-mix-16",
        lambda d: split_files(lengths, d, args.files, 2048, 11),
    )
    common = ["-L", str(args.max_len), "--overlength", "split", "--workers", str(args.workers)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-", dir=args.data))
    try:
        _, one = pack(data, tmp / "a", common)
        print(
            f"\nmix: {lengths.size:,} samples (chat, code, documents), {one['tokens']:,} tokens in "
            f"{args.files} Parquet files (row groups of 2048)"
        )
        print("\n| block size | blocks | tokens moved | rows | rows vs global plan | "
              "rows / lower bound |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|")
        print(f"| none (global plan) | 1 | 0 | {one['rows']:,} | +0.0000 % | "
              f"{one['rows_over_lower_bound']:.6f} |")  # fmt: skip
        for size in ("8MiB", "4MiB"):
            _, rep = pack(data, tmp / "b", common + ["--block-size", size])
            print(
                f"| {size} | {rep['blocks']} | {rep['tokens_moved']:,} "
                f"({100 * rep['tokens_moved'] / rep['tokens']:.2f} %) | {rep['rows']:,} | "
                f"{100 * (rep['rows'] / one['rows'] - 1):+.4f} % | "
                f"{rep['rows_over_lower_bound']:.6f} |"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
