"""Peak anonymous memory of `packer pack`, in memory and out of core, at two input sizes.

Runs `packer pack` as a subprocess and samples /proc/PID/status RssAnon every ~20 ms
(memory-mapped file pages, such as the out-of-core token cache, are not anonymous memory).
The inputs are the first N rows of the lognormal benchmark dataset; the sizes are at least 4x
apart, and out of core the peak should not grow with the input.

    python scripts/bench_memory.py                        # 250k and 1M samples
    python scripts/bench_memory.py --sizes 50000 200000 --budget 512MiB
    python scripts/bench_memory.py --format jsonl --sizes 50000 200000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PACKER = str(Path(PY).parent / "packer")


def rss_anon(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run(cmd: list[str]) -> tuple[float, int, dict]:
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        value = rss_anon(proc.pid)
        if value:
            peak = max(peak, value)
        time.sleep(0.02)
    out, err = proc.communicate()
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err[-2000:]}")
    return elapsed, peak, json.loads(out)


def to_jsonl(parquet: Path, path: Path) -> Path:
    """The rows of a Parquet file as JSONL (written once, then reused)."""
    import json

    import pyarrow.parquet as pq

    if not path.exists():
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            for batch in pq.ParquetFile(parquet).iter_batches(batch_size=10_000):
                for row in batch.to_pylist():
                    fh.write(json.dumps(row, separators=(",", ":")) + "\n")
        tmp.rename(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=[250_000, 1_000_000])
    parser.add_argument("--budget", default="256MiB", help="--memory-budget out of core")
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--data-dir", default=str(ROOT / "bench-data"))
    parser.add_argument(
        "--format",
        choices=["parquet", "jsonl"],
        default="parquet",
        help="input format of the two sizes (JSONL: the same rows, one JSON object per line)",
    )
    args = parser.parse_args()

    import pyarrow.parquet as pq

    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    full = data_dir / "lognormal-1000000.parquet"
    if not full.exists():
        subprocess.run(
            [PY, str(ROOT / "scripts/make_lognormal.py"), str(full), "--samples", "1000000"],
            check=True,
        )
    inputs = []
    for n in args.sizes:
        path = data_dir / f"lognormal-head-{n}.parquet"
        if not path.exists():
            pf = pq.ParquetFile(full)
            table = pf.read().slice(0, n)
            pq.write_table(table, path, row_group_size=65536)
            del table
        if args.format == "jsonl":
            path = to_jsonl(path, data_dir / f"lognormal-head-{n}.jsonl")
        inputs.append((n, path))

    work = Path(tempfile.mkdtemp(prefix="packer-mem-", dir=data_dir))
    rows = []
    try:
        for n, path in inputs:
            for mode, budget in (("in memory", "64GiB"), ("out of core", args.budget)):
                best = None
                for _ in range(args.runs):
                    out = work / "out"
                    dt, peak, report = run(
                        [
                            PACKER,
                            "pack",
                            str(path),
                            "-o",
                            str(out),
                            "-L",
                            str(args.max_len),
                            "--overlength",
                            "split",
                            "--memory-budget",
                            budget,
                            "--json",
                        ]
                    )
                    shutil.rmtree(out, ignore_errors=True)
                    if best is None or peak < best[1]:
                        best = (dt, peak, report)
                dt, peak, report = best
                rows.append(
                    (
                        n,
                        report["tokens_in"],
                        path.stat().st_size,
                        mode,
                        budget,
                        bool(report["timings"].get("out_of_core")),
                        peak,
                        dt,
                    )
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        f"\npeak RssAnon of `packer pack -L {args.max_len} --overlength split` "
        f"(sampled every 20 ms)\n"
    )
    print(
        "| samples | tokens | input MB | mode | --memory-budget | streamed | peak RssAnon MiB "
        "| seconds |"
    )
    print("|---:|---:|---:|---|---|---|---:|---:|")
    for n, tokens, size, mode, budget, ooc, peak, dt in rows:
        print(
            f"| {n:,} | {tokens:,} | {size / 1e6:,.0f} | {mode} | {budget} | "
            f"{'yes' if ooc else 'no'} | {peak / 2**20:,.0f} | {dt:.2f} |"
        )


if __name__ == "__main__":
    main()
