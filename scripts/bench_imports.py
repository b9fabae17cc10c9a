"""Import-time benchmark: wall time of `packer --help`, `import packer.contract` and
`import packer.torch`, each a fresh process, and whether numba was loaded (a checkout without
`packer/contract/` imports `packer.own_outputs`, which held the output's names before it).

With `--baseline DIR` (another checkout of packer, e.g. a `git worktree` of an older commit) the
same commands run against both, alternating run by run so that a load change on a shared
machine hits both, and the table shows medians side by side with the ratio.

    python scripts/bench_imports.py --runs 9
    git worktree add /tmp/old <commit> && python scripts/bench_imports.py --baseline /tmp/old
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = "import sys; {stmt}; print('numba' in sys.modules)"
COMMANDS = {
    "packer --help": [
        "-c",
        PROBE.format(
            stmt="sys.argv = ['packer', '--help']\ntry:\n from packer.cli import run; run()\nexcept SystemExit: pass"
        ),
    ],
    # before packer.contract existed, packer.own_outputs held the output's names
    "import packer.contract": ["-c", PROBE.format(stmt="import packer.{contract}")],
    "import packer.torch": ["-c", PROBE.format(stmt="import packer.torch")],
    "import packer": ["-c", PROBE.format(stmt="import packer")],
}


def run_once(checkout: Path, args: list[str]) -> tuple[float, bool]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    contract = "contract" if (checkout / "packer" / "contract").is_dir() else "own_outputs"
    args = [a.replace("{contract}", contract) for a in args]
    t = time.perf_counter()
    res = subprocess.run(
        [sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - t
    if res.returncode != 0:
        return float("nan"), False
    return seconds, res.stdout.strip().splitlines()[-1] == "True"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--baseline", type=Path, help="another packer checkout to compare with")
    opts = ap.parse_args()
    checkouts = {"this": ROOT}
    if opts.baseline:
        checkouts["baseline"] = opts.baseline.resolve()
    times = {(c, n): [] for c in checkouts for n in COMMANDS}
    numba = {}
    for _ in range(opts.runs):
        for name, args in COMMANDS.items():
            for label, path in checkouts.items():
                seconds, loaded = run_once(path, args)
                times[label, name].append(seconds)
                numba[label, name] = loaded
    head = f"{'command':<24}" + "".join(f"{label + ' (s)':>16}{'numba':>7}" for label in checkouts)
    print(head + ("   this/baseline" if opts.baseline else ""))
    for name in COMMANDS:
        line = f"{name:<24}"
        medians = {}
        for label in checkouts:
            medians[label] = statistics.median(times[label, name])
            line += f"{medians[label]:>16.3f}{'yes' if numba[label, name] else 'no':>7}"
        if opts.baseline:
            line += f"{medians['this'] / medians['baseline']:>16.2f}"
        print(line)
    print(f"medians of {opts.runs} runs, each a fresh `{Path(sys.executable).name}` process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
