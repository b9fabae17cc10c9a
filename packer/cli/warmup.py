"""`packer warmup`: registered on the main typer app (imported by packer/cli/__init__.py)."""

from __future__ import annotations

import json
import os
import sys
import time

from packer.cli.app import DEBUG, JSON, app, user_errors


@app.command("warmup")
def warmup_command(json_out: bool = JSON, debug: bool = DEBUG) -> None:
    """Compile every numba kernel into the JIT cache, so that no later pack, plan or verify
    compiles: for a Docker image build or a CI cache. Prints what it compiled and the seconds.

    The cache is NUMBA_CACHE_DIR when set, else __pycache__ next to packer's modules."""
    from packer.cli.render import stderr
    from packer.export import export
    from packer.pipelines.pack import pack
    from packer.pipelines.warmup import compiled_during, warm_steps
    from packer.verify import verify

    with user_errors(debug):
        t0 = time.perf_counter()
        steps = []
        for name, step in warm_steps(pack, verify, export):
            t = time.perf_counter()
            kernels = compiled_during(step)
            steps.append({"step": name, "seconds": time.perf_counter() - t, "compiled": kernels})
        total = time.perf_counter() - t0
        cache = os.environ.get("NUMBA_CACHE_DIR") or "__pycache__ next to packer's modules"
        if json_out:
            report = {
                "seconds": round(total, 3),
                "cache": cache,
                "compiled": [
                    {"kernel": k, "seconds": round(sec, 3), "step": s["step"]}
                    for s in steps
                    for k, sec in s["compiled"]
                ],
            }
            sys.stdout.write(json.dumps(report) + "\n")
            return
        n = 0
        for s in steps:
            for kernel, seconds in s["compiled"]:
                n += 1
                stderr.print(
                    f"compiled {kernel:<40} {seconds:6.2f} s  ({s['step']})", highlight=False
                )
        what = f"{n} kernel compilations" if n else "nothing to compile: the JIT cache was warm"
        stderr.print(
            f"warmup: {what}, {total:.2f} s (cache: {cache})", highlight=False, soft_wrap=True
        )
