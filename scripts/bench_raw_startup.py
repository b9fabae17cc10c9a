"""The fixed part of `packer pack RAW --tokenizer`: what a run costs before and after its lines.

On the bench's chats and tokenizer (scripts/bench_tokenize.py: a ChatML template, a trained
BPE), with a cold cache each run (a fresh `PACKER_CACHE_DIR`), times in turn:

- `python -c pass`: the interpreter alone;
- `python -m packer --version`: the interpreter and packer's CLI;
- `packer pack RAW --tokenizer DIR -L 4096` on LINES lines (default 200: one batch, so the
  run is almost all fixed part), whole;
- the same with `-X importtime`, once, to say which imports the run pays for (cumulative
  seconds of the top-level packages, under the tracer's own overhead).

Medians of `--runs`; every run is its own process.

    python scripts/bench_raw_startup.py                 # 200 lines, 5 runs
    python scripts/bench_raw_startup.py --lines 20000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_tokenize import make_records, make_tokenizer  # noqa: E402

PACKAGES = ("packer", "transformers", "tokenizers", "fastokens", "numba", "pyarrow", "numpy")
IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    return seconds


def import_seconds(stderr: str) -> dict[str, float]:
    """Cumulative import seconds of each top-level package, from `-X importtime`'s lines."""
    found: dict[str, float] = {}
    for line in stderr.splitlines():
        match = IMPORT_LINE.match(line)
        if match and len(match.group(3)) == 1:  # a module imported at the top level
            name = match.group(4).split(".")[0]
            found[name] = found.get(name, 0.0) + int(match.group(2)) / 1e6
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokenizer-engine", default="auto", choices=["auto", "hf", "fastokens"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="packer-raw-startup-") as tmp:
        work = Path(tmp)
        records = make_records(args.lines, seed=0)
        raw = work / "raw.jsonl"
        raw.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        tok = work / "tok"
        make_tokenizer(tok, make_records(2000, seed=1))
        base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        base["PYTHONPATH"] = str(ROOT)
        py = [sys.executable]
        pack = py + ["-m", "packer", "pack", str(raw), "--tokenizer", str(tok), "-L", "4096"]
        pack += ["--tokenizer-engine", args.tokenizer_engine, "--overwrite"]

        def pack_env(i) -> dict:
            return {**base, "PACKER_CACHE_DIR": str(work / f"cache-{i}")}

        timed(pack + ["-o", str(work / "warm")], pack_env("warm"))  # bytecode, JIT cache
        rows: dict[str, list[float]] = {"interpreter": [], "packer --version": [], "pack": []}
        for i in range(args.runs):
            rows["interpreter"].append(timed(py + ["-c", "pass"], base))
            rows["packer --version"].append(timed(py + ["-m", "packer", "--version"], base))
            rows["pack"].append(timed(pack + ["-o", str(work / f"out-{i}")], pack_env(i)))
        traced = subprocess.run(
            py + ["-X", "importtime"] + pack[1:] + ["-o", str(work / "traced")],
            capture_output=True,
            text=True,
            env=pack_env("traced"),
        )
        imports = import_seconds(traced.stderr)
    print(
        f"packer pack RAW --tokenizer on {args.lines:,} lines, cold cache, medians of {args.runs}"
    )
    print(f"{'run':<22}{'wall s':>8}   all runs")
    for name, values in rows.items():
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:<22}{statistics.median(values):>8.2f}   {shown}")
    print("\nimports of the traced pack run (cumulative s, -X importtime):")
    for name in PACKAGES:
        if name in imports:
            print(f"  {name:<14}{imports[name]:6.2f}")
    print(f"  {'all':<14}{sum(imports.values()):6.2f}")


if __name__ == "__main__":
    main()
