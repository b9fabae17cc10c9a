"""What the line count costs `packer pack`'s reading of a tokenized JSONL file.

Arrow's JSON parser reads two objects on one line as two rows, so the in-memory and the
out-of-core readers compare the rows they got with the file's non-blank lines
(`packer.read.formats.count_lines`, a streamed pass over the bytes). This prints, for one
generated file, the medians of interleaved runs of: the parser alone (the baseline), the line
count alone, and the reader as `packer pack` calls it (parser and count).

    python scripts/bench_jsonl_lines.py              # 60,000 samples (about 130 MB), 5 runs
    python scripts/bench_jsonl_lines.py --samples 10000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.json as pa_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from packer.read import formats

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokens.jsonl"
        with path.open("w") as fh:
            for _ in range(args.samples):
                ids = rng.integers(0, 50_000, int(rng.integers(50, 600))).tolist()
                fh.write(json.dumps({"input_ids": ids}) + "\n")
        options = pa_json.ParseOptions(
            explicit_schema=formats._json_schema(["input_ids"]), unexpected_field_behavior="ignore"
        )
        runs = {
            "parser alone (baseline)": lambda: pa_json.read_json(path, parse_options=options),
            "line count alone": lambda: formats.count_lines(path, None),
            "reader (parser + count)": lambda: formats._read_jsonl(path, ["input_ids"]),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.runs):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        size = path.stat().st_size / 1e6
    base = statistics.median(times["parser alone (baseline)"])
    print(f"{args.samples:,} samples, {size:.0f} MB, median of {args.runs} runs")
    print(f"| {'run':<26} | {'seconds':>8} | {'vs baseline':>11} |")
    print(f"|{'-' * 28}|{'-' * 10}|{'-' * 13}|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name:<26} | {median:8.3f} | {median / base:10.2f}x |")


if __name__ == "__main__":
    main()
