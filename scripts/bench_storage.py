"""Object storage against local disk: the same pack from and to a local S3 server, side by side.

A local S3 server (moto's `ThreadedMotoServer`, in this process, every object in memory) serves
a lognormal benchmark (default 250k samples in 8 Parquet files). Every run is its own
`packer pack --json` process; the table gives medians of `--runs` runs:

- local disk → local disk (the baseline);
- s3 → local disk, local disk → s3, s3 → s3 (packer's staging and commit);
- a plain pyarrow copy through the same server of the same bytes (the inputs down, the shards
  up), which is what moving them costs on this server without packer;
- with `--block-size`, the block pipeline local disk → local disk and s3 → s3, where the tasks
  read their blocks from the server in place and upload their own shards (checked equal to
  the local block run's);

with the bytes moved and the requests the server answered (counted from its request log), so
the server's own cost can be told from packer's. The shards of every run are checked equal.

    python scripts/bench_storage.py                     # 3 runs each
    python scripts/bench_storage.py --runs 1 --samples 50000
    python scripts/bench_storage.py --block-size 16MiB   # and the block pipeline
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from make_lognormal import lognormal_lengths, make_table  # noqa: E402

BUCKET = "bench"


class Requests(logging.Handler):
    """Counts the server's requests by method, from werkzeug's access log."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()
        self.guard = threading.Lock()

    def emit(self, record):
        text = record.getMessage()
        for method in ("GET", "PUT", "POST", "HEAD", "DELETE"):
            if f'"{method} ' in text:
                with self.guard:
                    self.counts[method] += 1

    def take(self) -> Counter:
        with self.guard:
            counts, self.counts = self.counts, Counter()
        return counts


def make_data(directory: Path, samples: int, files: int, median: float, seed: int = 0) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    lengths = lognormal_lengths(samples, median, 0.8, seed)
    bounds = np.linspace(0, samples, files + 1).astype(int)
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        pq.write_table(make_table(lengths[a:b], seed + k), directory / f"part-{k:03d}.parquet")
    return int(lengths.sum())


def pack(inputs: str, out: str, args: list[str], env: dict) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "packer", "pack", inputs, "-o", out, "--overwrite", *args]
    t = time.perf_counter()
    r = subprocess.run(cmd + ["--json"], capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return wall, json.loads(r.stdout.strip().splitlines()[-1])


def shard_bytes(fs: pafs.FileSystem, base: str) -> list[bytes]:
    with fs.open_input_stream(f"{base}/manifest.json", compression=None) as fh:
        manifest = json.loads(fh.read())
    out = []
    for shard in manifest["shards"]:
        with fs.open_input_stream(f"{base}/{shard['file']}", compression=None) as fh:
            out.append(fh.read())
    return out


def plain_copy(s3fs, local: Path, data: Path, shards: Path, scratch: Path) -> float:
    """The inputs down and the shards up through the same server, with pyarrow alone."""
    t = time.perf_counter()
    down = scratch / "down"
    shutil.rmtree(down, ignore_errors=True)
    down.mkdir()
    pafs.copy_files(f"{BUCKET}/in", str(down), source_filesystem=s3fs, destination_filesystem=local)
    pafs.copy_files(
        str(shards), f"{BUCKET}/copy", source_filesystem=local, destination_filesystem=s3fs
    )
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=250_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--median", type=float, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("-L", "--max-len", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--block-size", default=None, help="also time block runs (e.g. 16MiB)")
    opts = parser.parse_args()

    from moto.server import ThreadedMotoServer

    counter = Requests()
    logging.getLogger("werkzeug").addHandler(counter)
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    logging.getLogger("werkzeug").propagate = False
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "OMP_NUM_THREADS": "1",
    }
    s3fs = pafs.S3FileSystem(
        endpoint_override=f"{host}:{port}",
        scheme="http",
        access_key="bench",
        secret_key="bench",
        region="us-east-1",
    )
    local = pafs.LocalFileSystem()
    scratch = Path(tempfile.mkdtemp(prefix="packer-bench-storage-"))
    try:
        data = scratch / "data"
        tokens = make_data(data, opts.samples, opts.files, opts.median)
        import boto3

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        pafs.copy_files(
            str(data), f"{BUCKET}/in", source_filesystem=local, destination_filesystem=s3fs
        )
        in_bytes = sum(p.stat().st_size for p in data.iterdir())
        args = ["-L", str(opts.max_len), "--overlength", "split", "--workers", str(opts.workers)]
        runs = {
            "local disk → local disk": (str(data), str(scratch / "out")),
            "s3 → local disk": (f"s3://{BUCKET}/in/", str(scratch / "out-from-s3")),
            "local disk → s3": (str(data), f"s3://{BUCKET}/out-to-s3"),
            "s3 → s3": (f"s3://{BUCKET}/in/", f"s3://{BUCKET}/out"),
        }
        blocks = {}
        if opts.block_size:
            blocks = {
                "blocks: local disk → local disk": (str(data), str(scratch / "out-blocks")),
                "blocks: s3 → s3 (read in place)": (f"s3://{BUCKET}/in/", f"s3://{BUCKET}/b"),
            }
        rows, reports = [], {}
        counter.take()
        for name, (src, dst) in {**runs, **blocks}.items():
            walls, requests = [], Counter()
            extra = ["--block-size", opts.block_size] if name in blocks else []
            for _ in range(opts.runs):
                wall, report = pack(src, dst, args + extra, env)
                walls.append(wall)
                requests = counter.take()
            reports[name] = report
            rows.append((name, walls, report, requests))
        base = Path(runs["local disk → local disk"][1])
        expected = shard_bytes(local, str(base))
        for name, (_, dst) in runs.items():
            got = (
                shard_bytes(s3fs, dst.removeprefix("s3://"))
                if dst.startswith("s3://")
                else shard_bytes(local, dst)
            )
            assert got == expected, f"{name}: shards differ from the local run"
        if blocks:
            local_blocks = shard_bytes(local, blocks["blocks: local disk → local disk"][1])
            remote = blocks["blocks: s3 → s3 (read in place)"][1].removeprefix("s3://")
            assert shard_bytes(s3fs, remote) == local_blocks, "block shards differ"
        out_bytes = sum(len(b) for b in expected)
        shards_only = scratch / "shards"
        shards_only.mkdir()
        for p in base.glob("shard-*.arrow"):
            shutil.copy(p, shards_only / p.name)
        copies = [plain_copy(s3fs, local, data, shards_only, scratch) for _ in range(opts.runs)]
        copy_requests = counter.take()
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    baseline = statistics.median(rows[0][1])
    print(
        f"{opts.samples:,} samples, {tokens:,} tokens, {opts.files} Parquet files "
        f"({in_bytes / 1e6:.1f} MB in), {len(expected)} shards ({out_bytes / 1e6:.1f} MB out), "
        f"L = {opts.max_len}, --workers {opts.workers}; medians of {opts.runs}; shards of "
        "every run byte-identical\n"
    )
    print(
        "| run | median s | runs | × local | MB down | MB up | requests (last run) | "
        "packer's read s | packer's write s |"
    )
    print("|---|---:|---|---:|---:|---:|---|---:|---:|")
    for name, walls, report, requests in rows:
        down = in_bytes / 1e6 if name.startswith("s3") or "s3 →" in name else 0.0
        up = out_bytes / 1e6 if "→ s3" in name else 0.0
        timings = report.get("timings", {})
        req = ", ".join(f"{m} {n}" for m, n in sorted(requests.items())) or "–"
        print(
            f"| {name} | {statistics.median(walls):.2f} | "
            f"{', '.join(f'{w:.2f}' for w in walls)} | {statistics.median(walls) / baseline:.2f} | "
            f"{down:.1f} | {up:.1f} | {req} | {_seconds(timings, 'read')} | "
            f"{_seconds(timings, 'write')} |"
        )
    req = ", ".join(f"{m} {n}" for m, n in sorted(copy_requests.items()))
    print(
        f"| plain pyarrow copy: inputs down + shards up | {statistics.median(copies):.2f} | "
        f"{', '.join(f'{w:.2f}' for w in copies)} | – | {in_bytes / 1e6:.1f} | "
        f"{out_bytes / 1e6:.1f} | {req} (all runs) | – | – |"
    )


def _seconds(timings: dict, key: str) -> str:
    """A one-plan run's read or write time; block runs time their stages instead."""
    return f"{timings[key]:.2f}" if key in timings else "–"


if __name__ == "__main__":
    main()
