"""Warm wall time of whole packer commands on this checkout and another, side by side.

Each run is its own process (imports included); the two checkouts alternate run by run, so that
a load change on a shared machine hits both, and the first round only fills both JIT caches.
The other checkout is typically a `git worktree` of an older commit:

    git worktree add /tmp/old <commit>
    python scripts/bench_compare.py --baseline /tmp/old --runs 7
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "data" / "sample.jsonl.gz"
CONFIG = ROOT / "configs" / "ctx4k.yaml"
COMMANDS = {
    "pack ctx4k": ["pack", str(SAMPLE), "--config", str(CONFIG), "-o", "{out}/one"],
    "pack blocks": [
        *("pack", str(SAMPLE), "-L", "4096", "--overlength", "split"),
        *("--block-size", "1MiB", "-o", "{out}/blocks"),
    ],
    "verify --no-attention": ["verify", "{out}/one", "--no-attention"],
}


def run(checkout: Path, args: list[str], out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [a.replace("{out}", str(out)) for a in args]
    if argv[0] == "pack":
        argv += ["--overwrite"]
    t = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "packer", *argv, "--json"],
        cwd=checkout,
        env=env,
        capture_output=True,
    )
    seconds = time.perf_counter() - t
    if res.returncode != 0:
        sys.exit(f"error: {' '.join(argv)} failed in {checkout}: {res.stderr.decode()[-300:]}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another packer checkout")
    ap.add_argument("--runs", type=int, default=5, help="timed runs of each (after one warm-up)")
    opts = ap.parse_args()
    trees = {"this": ROOT, "baseline": opts.baseline.resolve()}
    work = Path(tempfile.mkdtemp(prefix="packer-bench-compare-"))
    times = {(t, c): [] for t in trees for c in COMMANDS}
    try:
        for i in range(opts.runs + 1):
            for name, args in COMMANDS.items():
                for label, tree in trees.items():
                    seconds = run(tree, args, work / label)
                    if i:
                        times[label, name].append(seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'command':<24}{'this s':>9}{'baseline s':>12}{'this/baseline':>15}")
    for name in COMMANDS:
        a = statistics.median(times["this", name])
        b = statistics.median(times["baseline", name])
        print(f"{name:<24}{a:>9.3f}{b:>12.3f}{a / b:>15.2f}")
    print(
        f"medians of {opts.runs} warm runs each, interleaved; load average {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
