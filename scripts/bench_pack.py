"""End-to-end packing benchmark: packer against the copy limit and TRL, side by side.

Every contender runs in its own process (start-up and imports included), several times; the
table shows medians and ratios measured in the same run, since absolute times on shared
machines swing a lot.

- copy limit: pyarrow reads the Parquet and writes the same table as an Arrow IPC file;
- packer: `packer pack INPUT -o OUT -L 2048 --overlength truncate` (or `split`);
- TRL (if installed): `Dataset.from_parquet`, `pack_dataset(..., strategy="bfd")`,
  `save_to_disk`; TRL's "bfd" truncates over-length samples, like packer's `truncate`
  (`--trl-strategy bfd_split` compares with packer's `split` instead: no token lost);
- in memory, without I/O: packer's plan + gather of the loaded table vs TRL's `pack_dataset` call;
- JSONL parsing: packer's reader vs pyarrow's multithreaded JSON reader on the same file;
- with `--row-order`: packer with `--row-order plan` beside the default shuffled order, and
  the shuffle of the plan's rows alone (`packer.planning.row_order`).

    python scripts/bench_pack.py                 # 1M samples (~450M tokens), 3 runs each
    python scripts/bench_pack.py --samples 100000 --runs 2
    python scripts/bench_pack.py --samples 100000 --runs 5 --skip-trl --row-order   # + plan order
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
PY = sys.executable

COPY = """
import sys, pyarrow as pa, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
with pa.OSFile(sys.argv[2], "wb") as f, pa.ipc.new_file(f, t.schema) as w:
    w.write_table(t)
"""

TRL = """
import json, sys, time
t0 = time.perf_counter()
import datasets
from trl import pack_dataset
datasets.disable_progress_bars()
ds = datasets.Dataset.from_parquet(sys.argv[1], cache_dir=sys.argv[3])
t1 = time.perf_counter()
packed = pack_dataset(ds, seq_length=int(sys.argv[4]), strategy=sys.argv[5])
t2 = time.perf_counter()
packed.save_to_disk(sys.argv[2])
print(json.dumps({"pack_call": t2 - t1, "rows": packed.num_rows}))
"""

PACKER_IN_MEMORY = """
import json, sys, time
import packer
from packer.config import PackConfig
from packer.planning.overlength import resolve
from packer.planning.row_order import order_plan_rows
from packer.planning.strategies import plan
from packer.read.assemble import read_samples
from packer.write.shards import allocate, batch_bounds, gather_all, gather_batch
samples = read_samples([sys.argv[1]], chunked=True)
cfg = PackConfig(max_len=int(sys.argv[2]), overlength=sys.argv[3], row_order=sys.argv[4])
segs = resolve(
        samples.lengths, cfg.max_len, cfg.overlength, starts=samples.offsets[:-1], locate=samples.locate
    )  # warms the JIT cache load
t0 = time.perf_counter()
segs = resolve(
        samples.lengths, cfg.max_len, cfg.overlength, starts=samples.offsets[:-1], locate=samples.locate
    )
pl = plan(segs.length, cfg.max_len, cfg.strategy)
t_order = time.perf_counter()
pl = order_plan_rows(pl, cfg.row_order, cfg.seed)  # as `pack` writes them (shuffled)
t_order = time.perf_counter() - t_order
bounds = batch_bounds(pl, cfg)
buf = allocate(pl, segs, cfg, bounds)
for _, a, b in bounds:  # what `pack` does: every record batch into one reused set of buffers
    gather_batch(samples, segs, pl, cfg, a, b, buf)
t1 = time.perf_counter()
del buf
t2 = time.perf_counter()
every = gather_all(samples, segs, pl, cfg)  # every row at once, into fresh memory
t3 = time.perf_counter()
print(json.dumps({"seconds": t1 - t0, "all_rows": t3 - t2, "row_order": t_order,
                  "rows": pl.num_rows}))
"""

JSONL_PYARROW = """
import sys, time, pyarrow as pa, pyarrow.json as pj
t0 = time.perf_counter()
t = pj.read_json(sys.argv[1], read_options=pj.ReadOptions(use_threads=True, block_size=16 << 20))
print(t.num_rows, time.perf_counter() - t0)
"""

JSONL_PACKER = """
import sys, time
from packer.read.assemble import read_samples
t0 = time.perf_counter()
s = read_samples([sys.argv[1]])
print(s.num_samples, time.perf_counter() - t0, s.num_tokens)
"""


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} failed:\n{proc.stderr[-2000:]}")
    return elapsed, proc.stdout


def drop(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trl-runs", type=int, default=1)
    parser.add_argument("--data-dir", default=str(ROOT / "bench-data"))
    parser.add_argument("--jsonl-samples", type=int, default=200_000)
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument(
        "--trl-strategy",
        default="bfd",
        choices=["bfd", "bfd_split"],
        help="bfd (truncates; packer --overlength truncate) or bfd_split "
        "(packer --overlength split)",
    )
    parser.add_argument(
        "--row-order",
        action="store_true",
        help="also run packer with --row-order plan (the default shuffles the rows) and time "
        "the shuffle of the plan alone",
    )
    args = parser.parse_args()

    data_dir = Path(args.data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    data = data_dir / f"lognormal-{args.samples}.parquet"
    if not data.exists():
        subprocess.run(
            [
                PY,
                str(ROOT / "scripts/make_lognormal.py"),
                str(data),
                "--samples",
                str(args.samples),
            ],
            check=True,
        )
    import pyarrow.parquet as pq

    tokens = int(pq.read_metadata(data).num_rows)  # rows for now; tokens from packer's report
    work = Path(tempfile.mkdtemp(prefix="packer-bench-", dir=data_dir))
    results: dict[str, list[float]] = {}
    extra: dict[str, object] = {}
    L = str(args.max_len)
    policy = "truncate" if args.trl_strategy == "bfd" else "split"
    try:
        # warm the numba cache once so every timed packer run measures a cache load, like a user's
        timed(
            [
                str(Path(PY).parent / "packer"),
                "pack",
                str(data),
                "-o",
                str(work / "warm"),
                "-L",
                L,
                "--overlength",
                policy,
                "--json",
            ]
        )
        drop(work / "warm")
        for _ in range(args.runs):
            dt, _ = timed([PY, "-c", COPY, str(data), str(work / "copy.arrow")])
            results.setdefault("copy limit (read Parquet, write Arrow IPC)", []).append(dt)
            drop(work / "copy.arrow")
            dt, out = timed(
                [
                    str(Path(PY).parent / "packer"),
                    "pack",
                    str(data),
                    "-o",
                    str(work / "packed"),
                    "-L",
                    L,
                    "--overlength",
                    policy,
                    "--json",
                ]
            )
            results.setdefault("packer pack (end to end)", []).append(dt)
            report = json.loads(out)
            extra["packer"] = report
            drop(work / "packed")
            if args.row_order:
                dt, _ = timed(
                    [str(Path(PY).parent / "packer"), "pack", str(data), "-o", str(work / "plan")]
                    + ["-L", L, "--overlength", policy, "--row-order", "plan", "--json"]
                )
                results.setdefault("packer pack --row-order plan (end to end)", []).append(dt)
                drop(work / "plan")
            for order in ("shuffle", "plan") if args.row_order else ("shuffle",):
                dt, out = timed([PY, "-c", PACKER_IN_MEMORY, str(data), L, policy, order])
                info = json.loads(out)
                tag = " --row-order plan" if order == "plan" else ""
                results.setdefault(
                    f"packer plan + gather, in memory (batch buffers){tag}", []
                ).append(info["seconds"])
                if order == "shuffle":
                    results.setdefault("packer gather of every row into fresh memory", []).append(
                        info["all_rows"]
                    )
                if args.row_order and order == "shuffle":
                    results.setdefault("packer row shuffle of the plan alone", []).append(
                        info["row_order"]
                    )
        if not args.skip_trl:
            try:
                import trl  # noqa: F401
            except ImportError:
                print("TRL not installed: skipping (pip install trl, with torch==2.13.0 first)")
            else:
                for _ in range(args.trl_runs):
                    dt, out = timed(
                        [
                            PY,
                            "-c",
                            TRL,
                            str(data),
                            str(work / "trl"),
                            str(work / "hf-cache"),
                            L,
                            args.trl_strategy,
                        ]
                    )
                    info = json.loads(out.strip().splitlines()[-1])
                    results.setdefault("TRL from_parquet + pack_dataset + save_to_disk", []).append(
                        dt
                    )
                    results.setdefault("TRL pack_dataset call, in memory", []).append(
                        info["pack_call"]
                    )
                    extra["trl_rows"] = info["rows"]
                    drop(work / "trl")
                    drop(work / "hf-cache")
        # JSONL parsing
        jsonl = data_dir / f"lognormal-{args.jsonl_samples}.jsonl"
        if not jsonl.exists():
            import pyarrow as pa

            table = pq.read_table(data).slice(0, args.jsonl_samples)
            with open(jsonl, "w") as fh:
                for batch in table.to_batches(max_chunksize=10000):
                    for row in batch.to_pylist():
                        fh.write(json.dumps(row, separators=(",", ":")) + "\n")
            del table, pa
        for _ in range(args.runs):
            _, out = timed([PY, "-c", JSONL_PYARROW, str(jsonl)])
            results.setdefault("JSONL: pyarrow.json.read_json (threads)", []).append(
                float(out.split()[1])
            )
            _, out = timed([PY, "-c", JSONL_PACKER, str(jsonl)])
            results.setdefault("JSONL: packer reader (parse + validate)", []).append(
                float(out.split()[1])
            )
            extra["jsonl_tokens"] = int(out.split()[2])
    finally:
        shutil.rmtree(work, ignore_errors=True)

    report = extra.get("packer", {})
    tokens = report.get("tokens_in", tokens)
    med = {k: statistics.median(v) for k, v in results.items()}
    copy = med["copy limit (read Parquet, write Arrow IPC)"]
    print(
        f"\n{args.samples:,} samples, {tokens:,} tokens, L={args.max_len}, "
        f"{os.cpu_count()} cores; medians of {args.runs} runs (TRL: {args.trl_runs}); "
        f"packer --overlength {policy} vs TRL strategy={args.trl_strategy}\n"
    )
    print(f"| {'what':<52} | {'median s':>9} | {'runs':<30} | {'× copy':>7} |")
    print(f"|{'-' * 54}|{'-' * 11}|{'-' * 32}|{'-' * 9}|")
    for name, values in results.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        ratio = f"{med[name] / copy:.2f}" if not name.startswith("JSONL") else ""
        print(f"| {name:<52} | {med[name]:>9.2f} | {runs:<30} | {ratio:>7} |")
    print()
    if "TRL from_parquet + pack_dataset + save_to_disk" in med:
        e2e = (
            med["TRL from_parquet + pack_dataset + save_to_disk"] / med["packer pack (end to end)"]
        )
        mem = (
            med["TRL pack_dataset call, in memory"]
            / med["packer plan + gather, in memory (batch buffers)"]
        )
        print(f"packer vs TRL end to end: {e2e:.1f}x faster; in memory: {mem:.1f}x faster")
        print(
            f"rows: packer {report.get('rows'):,}, TRL {extra['trl_rows']:,}, lower bound "
            f"{report.get('lower_bound'):,}"
        )
    print(f"packer / copy limit: {med['packer pack (end to end)'] / copy:.2f}x")
    jp = med["JSONL: pyarrow.json.read_json (threads)"]
    jk = med["JSONL: packer reader (parse + validate)"]
    tok = extra["jsonl_tokens"]
    print(
        f"JSONL ({args.jsonl_samples:,} samples, {tok:,} tokens): packer reader {jk:.2f} s "
        f"({tok / jk / 1e6:.1f}M tokens/s) vs pyarrow {jp:.2f} s ({tok / jp / 1e6:.1f}M "
        f"tokens/s): {jp / jk:.2f}x"
    )


if __name__ == "__main__":
    main()
