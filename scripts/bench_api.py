"""`packer.pack_dataset` against TRL's `pack_dataset` and fast-axolotl's `pack_sequences`.

Every contender runs in its own process, runs interleaved, and the table shows medians taken in
the same run (absolute times on a shared machine swing a lot). Each process times only the
packing call (its first call, so numba's compiled-kernel cache load is included, as a user pays
it) and samples its own RssAnon every 10 ms: "extra memory" is the peak during the call minus
the value just before it. Memory-mapped input pages are file-backed and do not count.

(a) The lognormal benchmark (scripts/make_lognormal.py) held as a memory-mapped
    `datasets.Dataset`: `pack_dataset(ds, L, overlength="truncate")` vs
    `trl.pack_dataset(ds, L, strategy="bfd")` (TRL's bfd truncates too): time, rows and the
    extra memory against the size of the packed output. Both write their result to a cache
    file beside the input and return it memory-mapped (packer's `cache-packer-*.arrow`, TRL's
    map `cache-*.arrow`); each run writes a fresh file, deleted after the run.
    The floor row writes as many bytes as packer's file, from one reused buffer, the way the
    cache file is written (`packer.write.direct.DirectFile`, then fsync): what the device alone
    costs.
(b) Python token lists (lognormal lengths capped at L - 2, since fast-axolotl appends an EOS
    and fails on a sample that fills a row): `pack_dataset(lists, L)` vs fast-axolotl's
    `pack_sequences(lists, L, pad_token_id=0, eos_token_id=2)` (`pip install fast-axolotl`,
    the `bench` extra), with each one's efficiency: input tokens / (rows x L).

    python scripts/bench_api.py                  # 1M samples and 100k lists, 3 runs each
    python scripts/bench_api.py --quick          # 100k samples and 20k lists, 1 run
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

PEAK = """
import threading, time

def rss_anon():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0

class Peak:
    '''Peak RssAnon above the value at start, sampled every 10 ms on a thread.'''
    def __init__(self):
        self.base = self.peak = rss_anon()
        self.running = True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
    def run(self):
        while self.running:
            self.peak = max(self.peak, rss_anon())
            time.sleep(0.01)
    def stop(self):
        self.running = False
        self.thread.join()
        return max(self.peak, rss_anon()) - self.base
"""

DATASET_PACKER = (
    PEAK
    + """
import json, os, sys, time
import datasets, packer
ds = datasets.Dataset.from_file(sys.argv[1])
peak = Peak()
t = time.perf_counter()
packed, stats = packer.pack_dataset(ds, int(sys.argv[2]), overlength="truncate", return_stats=True)
seconds = time.perf_counter() - t
extra = peak.stop()
(cache,) = packed.cache_files  # the file-backed path: a memory-mapped cache file
print(json.dumps({"seconds": seconds, "rows": packed.num_rows, "extra": extra,
                  "output": packed.data.table.nbytes, "lower_bound": stats["lower_bound"],
                  "tokens": stats["tokens_in"], "efficiency": stats["efficiency"],
                  "file": os.path.getsize(cache["filename"])}))
"""
)

DATASET_TRL = (
    PEAK
    + """
import json, sys, time
import datasets
from trl import pack_dataset
datasets.disable_progress_bars()
ds = datasets.Dataset.from_file(sys.argv[1])
peak = Peak()
t = time.perf_counter()
packed = pack_dataset(ds, int(sys.argv[2]), strategy="bfd",
                      map_kwargs={"load_from_cache_file": False})
seconds = time.perf_counter() - t
extra = peak.stop()
print(json.dumps({"seconds": seconds, "rows": packed.num_rows, "extra": extra,
                  "output": packed.data.table.nbytes}))
"""
)

FLOOR = """
import json, os, sys, time
from pathlib import Path
from packer.write.direct import DirectFile
path, size = Path(sys.argv[1]), int(sys.argv[2])
block = memoryview(bytearray(16 << 20))
t = time.perf_counter()
out = DirectFile(path)
left = size
while left:
    n = min(left, len(block))
    out.write(block[:n])
    left -= n
out.close()
fd = os.open(path, os.O_RDONLY)
os.fsync(fd)
os.close(fd)
seconds = time.perf_counter() - t
os.unlink(path)
print(json.dumps({"seconds": seconds, "direct": out.direct, "bytes": size}))
"""

LISTS = """
import numpy as np
def token_lists(n, max_len, seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(300), 0.9, n))).astype(np.int64)
    lengths = np.minimum(lengths, max_len - 2)
    ids = rng.integers(3, 32000, size=int(lengths.sum()))
    cuts = np.cumsum(lengths)[:-1]
    return [x.tolist() for x in np.split(ids, cuts)], int(lengths.sum())
"""

LISTS_PACKER = (
    PEAK
    + LISTS
    + """
import json, sys, time
import packer
L = int(sys.argv[2])
lists, tokens = token_lists(int(sys.argv[1]), L)
peak = Peak()
t = time.perf_counter()
table, stats = packer.pack_dataset(lists, L, return_stats=True)
seconds = time.perf_counter() - t
extra = peak.stop()
print(json.dumps({"seconds": seconds, "rows": table.num_rows, "extra": extra,
                  "efficiency": tokens / (table.num_rows * L), "tokens": tokens,
                  "boundaries": True}))
"""
)

LISTS_FAST_AXOLOTL = (
    PEAK
    + LISTS
    + """
import json, sys, time
from fast_axolotl import pack_sequences
L = int(sys.argv[2])
lists, tokens = token_lists(int(sys.argv[1]), L)
peak = Peak()
t = time.perf_counter()
out = pack_sequences(lists, L, 0, 2)
seconds = time.perf_counter() - t
extra = peak.stop()
rows = len(out["input_ids"])
print(json.dumps({"seconds": seconds, "rows": rows, "extra": extra,
                  "efficiency": tokens / (rows * L), "tokens": tokens,
                  "boundaries": "cu_seqlens" in out or "position_ids" in out}))
"""
)


def run(code: str, *args: str) -> dict:
    proc = subprocess.run([PY, "-c", code, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"a benchmark process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def have(module: str) -> bool:
    return subprocess.run([PY, "-c", f"import {module}"], capture_output=True).returncode == 0


def dataset_file(data_dir: Path, samples: int) -> Path:
    """The lognormal benchmark as one Arrow IPC stream file, memory-mapped by `from_file`."""
    parquet = data_dir / f"lognormal-{samples}.parquet"
    if not parquet.exists():
        subprocess.run(
            [PY, str(ROOT / "scripts/make_lognormal.py"), str(parquet), "--samples", str(samples)],
            check=True,
        )
    arrow = data_dir / f"lognormal-{samples}.arrow"
    if not arrow.exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(parquet)
        tmp = arrow.with_suffix(".tmp")
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, pf.schema_arrow) as w:
            for batch in pf.iter_batches(batch_size=65536):
                w.write_batch(batch)
        tmp.rename(arrow)
    return arrow


def drop_caches(directory: Path, pattern: str = "cache-*.arrow") -> None:
    """Both write their result as a cache file beside the input (TRL's map `cache-*.arrow`,
    packer's `cache-packer-*.arrow`): remove it after each run, so that every run writes anew."""
    for path in directory.glob(pattern):
        path.unlink()


def median(results: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in results)


def runs_text(results: list[dict]) -> str:
    return ", ".join(f"{r['seconds']:.2f}" for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000, help="(a) Dataset samples")
    parser.add_argument("--lists", type=int, default=100_000, help="(b) Python token lists")
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100k samples, 20k lists, 1 run")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--data-dir", default=str(ROOT / "bench-data"))
    args = parser.parse_args()
    if args.quick:
        args.samples, args.lists, args.runs = 100_000, 20_000, 1
    L = str(args.max_len)

    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    source = dataset_file(data_dir, args.samples)
    work = Path(tempfile.mkdtemp(prefix="packer-bench-api-", dir=data_dir))
    data = work / source.name
    os.link(source, data)  # TRL writes its cache files beside its input: keep them in `work`
    trl = not args.skip_trl and have("trl")
    fast_axolotl = have("fast_axolotl")
    res: dict[str, list[dict]] = {}
    try:
        run(DATASET_PACKER, str(data), L)  # fills numba's cache, as any earlier use would
        drop_caches(work, "cache-packer-*.arrow")
        for _ in range(args.runs):
            res.setdefault("packer", []).append(run(DATASET_PACKER, str(data), L))
            drop_caches(work, "cache-packer-*.arrow")
            size = str(res["packer"][-1]["file"])
            res.setdefault("floor", []).append(run(FLOOR, str(work / "floor.arrow"), size))
            if trl:
                res.setdefault("trl", []).append(run(DATASET_TRL, str(data), L))
                drop_caches(work)
            res.setdefault("lists_packer", []).append(run(LISTS_PACKER, str(args.lists), L))
            if fast_axolotl:
                res.setdefault("lists_fa", []).append(run(LISTS_FAST_AXOLOTL, str(args.lists), L))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mib = 1 << 20
    p = res["packer"]
    print(
        f"\n(a) {args.samples:,} samples ({p[0]['tokens']:,} tokens) as a memory-mapped "
        f"datasets.Dataset, L={args.max_len}, {os.cpu_count()} cores; medians of {args.runs} "
        "run(s), each in its own process\n"
    )
    print("| contender | median s | runs | rows | extra memory MiB | output MiB | extra / output |")
    print("|---|---:|---|---:|---:|---:|---:|")
    rows = [('packer.pack_dataset(ds, L, overlength="truncate")', p)]
    if trl:
        rows.append(('trl.pack_dataset(ds, L, strategy="bfd")', res["trl"]))
    for name, r in rows:
        print(
            f"| {name} | {median(r, 'seconds'):.2f} | "
            f"{runs_text(r)} | {r[0]['rows']:,} | "
            f"{median(r, 'extra') / mib:,.0f} | {r[0]['output'] / mib:,.0f} | "
            f"{median(r, 'extra') / r[0]['output']:.2f} |"
        )
    f = res["floor"]
    print(
        f"| floor: the same {f[0]['bytes'] / mib:,.0f} MiB written with nothing else "
        f"({'O_DIRECT' if f[0]['direct'] else 'page cache'}) | {median(f, 'seconds'):.2f} | "
        f"{runs_text(f)} | | | | |"
    )
    print(
        f"\npacker's result: a memory-mapped cache file beside the input "
        f"({p[0]['file'] / mib:,.0f} MiB on disk); output MiB is the result table's nbytes"
    )
    print(f"lower bound ⌈tokens / L⌉: {p[0]['lower_bound']:,} rows")
    if trl:
        t = res["trl"]
        print(
            f"pack_dataset vs TRL: {median(t, 'seconds') / median(p, 'seconds'):.1f}x faster; "
            f"rows {p[0]['rows']:,} vs {t[0]['rows']:,} "
            f"({100 * (p[0]['rows'] / p[0]['lower_bound'] - 1):+.3f} % vs "
            f"{100 * (t[0]['rows'] / p[0]['lower_bound'] - 1):+.3f} % over the bound)"
        )
    else:
        print("TRL not installed (or --skip-trl): no TRL column")
    print(
        f"pack_dataset extra memory / output size: "
        f"{median(p, 'extra') / p[0]['output']:.2f} (target <= 1.5)"
    )

    q = res["lists_packer"]
    print(
        f"\n(b) {args.lists:,} Python token lists ({q[0]['tokens']:,} tokens, lengths <= L-2), "
        f"L={args.max_len}\n"
    )
    print("| contender | median s | runs | rows | efficiency | sample boundaries |")
    print("|---|---:|---|---:|---:|---|")
    rows = [("packer.pack_dataset(lists, L)", q)]
    if fast_axolotl:
        rows.append(("fast_axolotl.pack_sequences(lists, L, 0, 2)", res["lists_fa"]))
    for name, r in rows:
        print(
            f"| {name} | {median(r, 'seconds'):.2f} | "
            f"{runs_text(r)} | {r[0]['rows']:,} | "
            f"{100 * r[0]['efficiency']:.3f} % | {'yes' if r[0]['boundaries'] else 'no'} |"
        )
    if fast_axolotl:
        f = res["lists_fa"]
        print(
            f"\npack_dataset vs fast-axolotl: "
            f"{median(f, 'seconds') / median(q, 'seconds'):.2f}x faster"
        )
    else:
        print("\nfast-axolotl not installed (pip install fast-axolotl): no fast-axolotl column")


if __name__ == "__main__":
    main()
