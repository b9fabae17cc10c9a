"""What `--resume` saves: a 64-block run killed (SIGKILL) at about 80 %, resumed, against a full
rerun of the same killed run.

The data: lognormal samples (median 300 tokens, SFT labels) in 8 Parquet files of 8 row groups;
`--block-size` below a row group's size makes each row group one block (64 blocks). Each
repetition kills a run right after its 51st completion record (51 of 64 blocks, 80 %; the
`PACKER_FAULT_KILL_AT_RECORDS` test hook), then times `packer pack --resume` (runs the 13 blocks
left and the tail tasks), kills another run at the same point and times a plain rerun (cleans
up, runs everything). Every run is its own `packer pack --json` process, start-up included;
the table shows medians of wall and CPU seconds (user + system: steadier than wall time on a
machine shared with other work), and the resumed output is checked byte for byte against the
rerun's.

    python scripts/bench_resume.py                    # 3 runs, bench-data/resume-64k/
    python scripts/bench_resume.py --runs 5 --samples 128000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from bench_ray import ensure_data, same_bytes, split_files  # noqa: E402
from make_lognormal import lognormal_lengths  # noqa: E402

FILES, GROUPS = 8, 8  # 64 blocks: one per row group
CPU: list[float] = []  # CPU seconds of each `pack` process, in order


def pack(inputs: Path, out: Path, args: list[str], env: dict | None = None):
    """(wall seconds, the --json report or None, exit code) of one `packer pack` process; its
    CPU seconds (user + system) are appended to `CPU` (steadier than wall time on a machine
    shared with other work)."""
    cmd = [sys.executable, "-m", "packer", "pack", str(inputs), "-o", str(out), *args, "--json"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}
    )
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if r.returncode not in (0, -9):
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    report = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
    return wall, report, r.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64_000)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kill-at", type=int, default=51, help="completion records (of 64)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=ROOT / "bench-data")
    args = parser.parse_args()

    lengths = lognormal_lengths(args.samples, 300, 0.9, 0)
    per_group = -(-args.samples // (FILES * GROUPS))
    data = ensure_data(
        args.data / f"resume-{args.samples}",
        lambda d: split_files(lengths, d, FILES, per_group, 0),
    )
    flags = ["-L", str(args.max_len), "--overlength", "split", "--workers", str(args.workers)]
    flags += ["--block-size", "64KiB"]  # below every row group: one block per row group
    kill = {"PACKER_FAULT_KILL_AT_RECORDS": str(args.kill_at)}
    tmp = Path(tempfile.mkdtemp(prefix="bench-resume-", dir=args.data))
    walls: dict[str, list[float]] = {"uninterrupted": [], "resumed": [], "rerun": [], "kill": []}
    cpus: dict[str, list[float]] = {"uninterrupted": [], "resumed": [], "rerun": []}
    reports = {}
    try:
        for run in range(args.runs):
            shutil.rmtree(tmp / "full", ignore_errors=True)
            wall, reports["uninterrupted"], _ = pack(data, tmp / "full", flags)
            walls["uninterrupted"].append(wall)
            cpus["uninterrupted"].append(CPU[-1])
            for name, extra in (("resumed", ["--resume"]), ("rerun", [])):
                out = tmp / name
                shutil.rmtree(out, ignore_errors=True)
                wall, _, code = pack(data, out, flags, env=kill)
                assert code == -9 and not out.exists(), "the run was not killed"
                walls["kill"].append(wall)
                wall, reports[name], _ = pack(data, out, flags + extra)
                walls[name].append(wall)
                cpus[name].append(CPU[-1])
            print(
                f"run {run + 1}: uninterrupted {walls['uninterrupted'][-1]:.2f} s, resumed "
                f"{walls['resumed'][-1]:.2f} s, rerun {walls['rerun'][-1]:.2f} s",
                file=sys.stderr,
            )
        identical = same_bytes(tmp / "resumed", tmp / "rerun") and same_bytes(
            tmp / "resumed", tmp / "full"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rep = reports["resumed"]
    base = statistics.median(walls["rerun"])
    cpu_base = statistics.median(cpus["rerun"])
    print(
        f"\n{args.samples:,} lognormal samples (median 300, {rep['tokens']:,} tokens) in "
        f"{FILES} Parquet files, {rep['blocks']} blocks, L={args.max_len}, --overlength split, "
        f"--workers {args.workers}, local engine; killed after {args.kill_at} completion "
        f"records; medians of {args.runs}"
    )
    print(
        "\n| run | median s | runs | × full rerun | median CPU s | × rerun's CPU | tasks reused "
        "| tasks run |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name, label in (
        ("uninterrupted", "uninterrupted run"),
        ("rerun", "full rerun after the kill"),
        ("resumed", "--resume after the kill"),
    ):
        w = walls[name]
        r = reports[name]
        cpu = statistics.median(cpus[name])
        print(
            f"| {label} | {statistics.median(w):.2f} | {', '.join(f'{x:.2f}' for x in w)} | "
            f"{statistics.median(w) / base:.2f} | {cpu:.2f} | {cpu / cpu_base:.2f} | "
            f"{r['tasks_reused']} | {r['tasks_run']} |"
        )
    print(f"\nkilled runs took {statistics.median(walls['kill']):.2f} s (median) before the kill")
    print(f"resumed output identical to the rerun's and the uninterrupted run's: {identical}")
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
