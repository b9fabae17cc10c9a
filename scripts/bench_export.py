"""`packer export` to each format against the copy limit of the same bytes, and its peak memory.

Packs the first N samples of the lognormal benchmark dataset (scripts/make_lognormal.py; 1M
samples, about 450M tokens, by default) once, then for each format runs `packer export` as a
subprocess (RssAnon sampled every ~20 ms, as bench_memory.py does) and, beside it, the copy
limit: reading every shard file of the output once and writing the same number of bytes the
export wrote, with plain buffered file I/O and an fsync at the end (the export's commit syncs
its files too). The ratio export / copy says what the format's own work costs.

    python scripts/bench_export.py                       # 1M samples, 3 runs, median
    python scripts/bench_export.py --samples 200000 --runs 5
    python scripts/bench_export.py --memory-budget 256MiB   # peak memory under a budget
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_memory import PACKER, PY, ROOT, run  # noqa: E402

FORMATS = ("megatron-bridge", "megatron", "mds", "trl")
CHUNK = 1 << 24


def copy_limit(shards: list[Path], dest: Path, nbytes: int) -> float:
    """Read every shard once and write `nbytes` of what was read (cycling over it if the export
    is larger than the shards), then fsync, as the export's commit does: the I/O that no
    exporter can avoid."""
    import os

    t = time.perf_counter()
    written, kept = 0, []
    with open(dest, "wb") as out:
        for shard in shards:
            with open(shard, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    if written < nbytes:
                        part = chunk[: nbytes - written]
                        out.write(part)
                        written += len(part)
                        if len(kept) < 4:
                            kept.append(part)
        while written < nbytes and kept:  # an export larger than its source
            for part in kept:
                part = part[: nbytes - written]
                out.write(part)
                written += len(part)
        out.flush()
        os.fsync(out.fileno())
    return time.perf_counter() - t


def drop_cache(paths: list[Path]) -> None:
    """Evict the files from the page cache where the OS allows, so every run reads alike."""
    import os

    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        except (OSError, AttributeError):
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data-dir", default=str(ROOT / "bench-data"))
    parser.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    parser.add_argument(
        "--memory-budget", default=None, help="passed to packer export (default: its own)"
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
    source = full
    if args.samples != 1_000_000:
        source = data_dir / f"lognormal-head-{args.samples}.parquet"
        if not source.exists():
            pq.write_table(pq.read_table(full).slice(0, args.samples), source, row_group_size=65536)
    work = Path(tempfile.mkdtemp(prefix="packer-export-", dir=data_dir))
    try:
        packed = work / "packed"
        subprocess.run(
            [
                PACKER,
                "pack",
                str(source),
                "-o",
                str(packed),
                "-L",
                str(args.max_len),
                "--overlength",
                "split",
                "--json",
            ],
            check=True,
            capture_output=True,
        )
        manifest = json.loads((packed / "manifest.json").read_text())
        shards = [packed / s["file"] for s in manifest["shards"]]
        in_bytes = sum(p.stat().st_size for p in shards)
        lines = []
        for fmt in args.formats:
            times, copies, peaks, out_bytes = [], [], [], 0
            for _ in range(args.runs):
                dest = work / fmt
                drop_cache(shards)
                budget = ["--memory-budget", args.memory_budget] if args.memory_budget else []
                dt, peak, report = run(
                    [PACKER, "export", str(packed), "--to", fmt, "-o", str(dest), "--json", *budget]
                )
                out_bytes = sum(f["bytes"] for f in report["files"])
                shutil.rmtree(dest)
                drop_cache(shards)
                copies.append(copy_limit(shards, work / "copy.bin", out_bytes))
                (work / "copy.bin").unlink()
                times.append(dt)
                peaks.append(peak)
            t, c = statistics.median(times), statistics.median(copies)
            lines.append((fmt, out_bytes, t, c, t / c, max(peaks)))
        print(
            f"packer export: {manifest['stats']['samples_in']:,} samples, "
            f"{manifest['stats']['rows']:,} rows of L={args.max_len}, shards {in_bytes / 2**30:.2f} GiB; "
            f"--memory-budget {args.memory_budget or 'default'}; median of {args.runs} runs\n"
        )
        print("| format | written | export s | copy limit s | ratio | peak RssAnon |")
        print("|---|---|---|---|---|---|")
        for fmt, nbytes, t, c, ratio, peak in lines:
            print(
                f"| {fmt} | {nbytes / 2**30:.2f} GiB | {t:.2f} | {c:.2f} | {ratio:.2f}x | "
                f"{peak / 2**20:.0f} MiB |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
