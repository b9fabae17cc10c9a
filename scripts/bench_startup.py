"""Start-up benchmark: wall time of `packer pack`, `plan` and `verify` with an empty JIT cache
(cold: a fresh `NUMBA_CACHE_DIR` per run) and with a filled one (warm), side by side.

Each run is its own process, imports included. Cold and warm runs alternate, so that a load
change on a shared machine hits both; the table shows medians and the cold / warm ratio.
`NUMBA_CACHE_DIR` set means numba neither reads nor writes `packer/__pycache__`.

    python scripts/bench_startup.py                    # 5 runs of each, pack, plan and verify
    python scripts/bench_startup.py --runs 3 --commands pack
"""

from __future__ import annotations

import argparse
import json
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


PACKER = [sys.executable, "-m", "packer"]


def pack_argv(out: Path) -> list[str]:
    return PACKER + ["pack", str(SAMPLE), "--config", str(CONFIG), "-o", str(out), "--overwrite"]


def commands(work: Path) -> dict[str, list[str]]:
    return {
        "pack": pack_argv(work / "out-run"),
        "plan": PACKER + ["plan", str(SAMPLE), "--max-len", "4096"],
        "verify": PACKER + ["verify", str(work / "out"), "--rows", "1"],
    }


def run(argv: list[str], cache_dir: Path) -> float:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": "1"}
    t = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(argv[2:4])} failed ({done.returncode}):\n{done.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="cold and warm runs of each command")
    parser.add_argument(
        "--commands",
        nargs="+",
        default=["pack", "plan", "verify"],
        choices=["pack", "plan", "verify"],
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="packer-startup-") as tmp:
        work = Path(tmp)
        argv = commands(work)
        warm_cache = work / "cache-warm"
        run(pack_argv(work / "out"), warm_cache)  # the output that verify checks
        for name in args.commands:
            run(argv[name], warm_cache)  # fills the warm cache for this command
            cold, warm = [], []
            for i in range(args.runs):
                cache = work / f"cache-cold-{name}-{i}"
                cold.append(run(argv[name], cache))
                shutil.rmtree(cache, ignore_errors=True)
                warm.append(run(argv[name], warm_cache))
            c, w = statistics.median(cold), statistics.median(warm)
            results.append(
                {
                    "command": name,
                    "cold_s": c,
                    "warm_s": w,
                    "ratio": c / w,
                    "cold": cold,
                    "warm": warm,
                }
            )
    if args.json:
        print(json.dumps(results))
        return
    print(f"{'command':<10}{'cold s':>9}{'warm s':>9}{'cold/warm':>11}   (medians of {args.runs})")
    for r in results:
        print(f"{r['command']:<10}{r['cold_s']:>9.2f}{r['warm_s']:>9.2f}{r['ratio']:>10.2f}x")


if __name__ == "__main__":
    main()
