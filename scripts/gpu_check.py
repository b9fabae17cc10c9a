"""The GPU proof of `packer verify`: one command, on the machine a GPU is lent to.

    python scripts/gpu_check.py                 # or: make gpu-check
    python scripts/gpu_check.py --out out/gpu-check --no-suite

It writes `OUT/report.json` and `OUT/report.md` (the same table it prints), with:

- env: torch, its CUDA build, the GPU (name, compute capability, native bf16), every backend's
  probe (why it cannot run here, or that it can), flash-attn / flash-attn 3 / Triton versions;
- kernel: every GPU kernel (flash-attn 3, flash-attn 2, torch varlen, compiled flex) in bf16 and
  fp16 on one row of segments of 1, 5, 127, 128, 129 and 4,096 tokens: packed against each
  segment alone (about 0), against the fp32 reference (within the derived tolerance), plain
  causal over the row (the negative control) and non-causal attention of each segment, both of
  which must differ by more than 10x the tolerance;
- verify: `pack` of the bundled sample (data/sample.jsonl.gz, L = 4096), then `packer verify
  --rows all --json` under every backend and dtype;
- planted: a `cu_seqlens` entry shifted by one in a small packed output, which verify must fail
  under every backend (the attention check naming the row);
- model: `verify --model` with a tiny random Llama (config only) under sdpa and
  flash_attention_2: its control must leak and its check pass;
- long: one row of L = 32,768 tokens per GPU backend (bf16): seconds and peak GPU memory;
- suite: the CPU test suite with CUDA hidden (`CUDA_VISIBLE_DEVICES=`), on by default where a
  GPU is present (`--no-suite` leaves it out); on a CPU machine only with `--with-suite`.

Nothing is fetched: everything runs from the checkout and the installed packages. Where torch
has no CUDA, the first line says so, the checks that need no GPU run (the CPU reference and
eager FlexAttention on the same segments, pack, verify, the planted shift and the sdpa model on
the CPU), every GPU check is reported as skipped, and the exit code is 3, so a skipped proof
never reads as a pass. Exit codes: 0 every check ran and passed; 1 a check failed; 3 none
failed but some were skipped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "data" / "sample.jsonl.gz"
SEGMENTS = (1, 5, 127, 128, 129, 4096)
GPU_BACKENDS = ("flash-attn-3", "flash-attn", "torch-varlen", "flex")
GPU_DTYPES = ("bf16", "fp16")
LONG_ROW = (20_000, 8_192, 4_576)  # one row of 32,768 tokens
EXIT_FAILED, EXIT_SKIPPED = 1, 3


class Report:
    """The checks as they run: each with its group, whether it needs a GPU, status, numbers."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.env: dict = {}
        self.checks: list[dict] = []

    def add(self, group, name, gpu, status, details=None, reason=None, seconds=None) -> None:
        entry = {"group": group, "name": name, "gpu": gpu, "status": status}
        entry.update(details=details or {}, reason=reason, seconds=seconds)
        self.checks.append(entry)
        line = f"{status:7s} {group:7s} {name}"
        print(line + (f": {reason}" if reason else ""), flush=True)

    def skip(self, group, name, reason) -> None:
        self.add(group, name, True, "skipped", reason=reason)

    def counts(self) -> dict:
        return {s: sum(c["status"] == s for c in self.checks) for s in ("pass", "fail", "skipped")}

    def to_dict(self) -> dict:
        return {"cuda": self.cuda, "env": self.env, "counts": self.counts(), "checks": self.checks}


# --------------------------------------------------------------------------------------------
# env


def environment() -> dict:
    import torch

    from packer.verify.backends import probe_backends

    found = probe_backends()
    gpu = found.pop("_gpu")
    found.pop("_cuda")
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": gpu is not None,
        "gpu": None
        if gpu is None
        else {"name": gpu.name, "capability": list(gpu.capability), "bf16": gpu.bf16},
        "probes": {name: reason or "runs here" for name, reason in found.items()},
    }
    for module in ("flash_attn", "flash_attn_interface", "triton", "transformers"):
        env[module] = _version(module)
    return env


def _version(module: str) -> str | None:
    import importlib

    try:
        return str(getattr(importlib.import_module(module), "__version__", "installed"))
    except Exception:  # absent, or a build that cannot load
        return None


# --------------------------------------------------------------------------------------------
# kernels


def segment_row(lengths, seed: int = 0):
    import numpy as np

    from packer.verify.picked_rows import RowInput

    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    data = {
        "input_ids": np.random.default_rng(seed).integers(0, 32_000, cu[-1]).astype(np.int32),
        "position_ids": np.concatenate([np.arange(n) for n in lengths]).astype(np.int32),
        "cu_seqlens": cu,
        "sample_index": np.arange(len(lengths)),
        "sample_offset": np.zeros(len(lengths), np.int32),
    }
    return RowInput("gpu-check", 0, data)


def non_causal_gap(row, backend, dtype: str, seed: int) -> float:
    """The smallest, over segments of 2+ tokens, of the largest difference between the packed
    output and non-causal attention over the segment: a kernel that lost its causal mask would
    show this, so it must stand far above the tolerance."""
    import torch
    import torch.nn.functional as F

    from packer.verify.attention import qkv_from_tokens

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    ids, cu = row.data["input_ids"], [int(x) for x in row.data["cu_seqlens"]]
    q, k, v = qkv_from_tokens(ids, seed, backend.device, torch_dtype)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=backend.device)
    with torch.inference_mode():
        packed = backend.forward(q, k, v, cu_t, max(b - a for a, b in zip(cu, cu[1:]))).float()
        gaps = []
        for a, b in zip(cu, cu[1:]):
            if b - a < 2:
                continue
            qt, kt, vt = (x[a:b].float().transpose(0, 1)[None] for x in (q, k, v))
            full = F.scaled_dot_product_attention(qt, kt, vt)[0].transpose(0, 1)
            gaps.append(float((packed[a:b] - full).abs().max()))
    return min(gaps)


def kernel_check(report: Report, name: str, dtype: str, lengths, cuda: bool, gpu: bool) -> None:
    from packer.verify import attention as A
    from packer.verify.backends import build_backend
    from packer.verify.result import CheckResult

    t0 = time.perf_counter()
    try:
        backend = build_backend(name, cuda)
        row = segment_row(lengths)
        iso, ctl = CheckResult("attention"), CheckResult("negative_control")
        A.run_attention([row], backend, dtype, 0, iso, ctl)
        gap = non_causal_gap(row, backend, dtype, 0)
    except Exception as exc:  # a kernel that cannot run here is this check's failure
        report.add("kernel", f"{name} {dtype}", gpu, "fail", reason=_first_line(exc))
        return
    tol = iso.details["tolerance"]
    details = {
        "device": backend.device,
        "segments": list(lengths),
        "max_packed_vs_alone": iso.details["max_isolated_diff"],
        "max_packed_vs_fp32": iso.details["max_reference_diff"],
        "tolerance": tol,
        "causal_control_min": ctl.details["min_leak"],
        "non_causal_control_min": gap,
        "margin": ctl.details["margin"],
        **({"kernel": iso.details["kernel"]} if "kernel" in iso.details else {}),
    }
    ok = iso.ok and ctl.ok and gap > A.LEAK_FACTOR * tol
    failures = [f.message for f in iso.failures + ctl.failures][:3]
    if gap <= A.LEAK_FACTOR * tol:
        failures.append(f"non-causal attention differs by only {gap:.3g}")
    report.add(
        "kernel",
        f"{name} {dtype}",
        gpu,
        "pass" if ok else "fail",
        details,
        reason=None if ok else "; ".join(failures),
        seconds=round(time.perf_counter() - t0, 2),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


# --------------------------------------------------------------------------------------------
# pack, verify, the planted shift, the model


def packer_cli(args, timeout: int, hide_cuda: bool = False) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4"),
    }
    if hide_cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run(
        [sys.executable, "-m", "packer", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
    )


def verify_json(args, timeout: int, hide_cuda: bool = False) -> tuple[int, dict, str]:
    res = packer_cli(["verify", *args, "--json"], timeout, hide_cuda)
    try:
        report = json.loads(res.stdout) if res.stdout.strip() else {}
    except json.JSONDecodeError:
        report = {}
    return res.returncode, report, res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ""


PACKS = {
    "full": "the bundled sample, configs/ctx4k.yaml (L 4096)",
    "small": "the bundled sample's first --small-samples samples, L 1024, split",
}


def pack_output(which: str, work: Path, small_samples: int, timeout: int) -> Path:
    out = work / which
    if which == "full":
        args = [SAMPLE, "--config", ROOT / "configs" / "ctx4k.yaml"]
    else:
        src = work / "small.jsonl"
        with gzip.open(SAMPLE, "rt") as fh, src.open("w") as dest:
            for i, line in enumerate(fh):
                if i >= small_samples:
                    break
                dest.write(line)
        args = [src, "--max-len", "1024", "--overlength", "split"]
    res = packer_cli(["pack", *args, "-o", out, "--overwrite"], timeout)
    if res.returncode:
        raise RuntimeError(f"pack failed: {res.stderr.strip()[-300:]}")
    return out


def attention_numbers(report: dict) -> dict:
    att = report.get("checks", {}).get("attention", {})
    ctl = report.get("checks", {}).get("negative_control", {})
    keys = ("backend", "device", "dtype", "rows", "tokens", "max_isolated_diff")
    keys += ("max_reference_diff", "tolerance", "seconds", "kernel")
    out = {k: att[k] for k in keys if k in att}
    out.update(min_leak=ctl.get("min_leak"), margin=ctl.get("margin"))
    return out


def verify_check(report, output: Path, backend: str, dtype: str, rows: str, gpu, timeout) -> None:
    t0 = time.perf_counter()
    code, got, last = verify_json(
        [output, "--backend", backend, "--dtype", dtype, "--rows", rows], timeout, not gpu
    )
    ok = code == 0 and got.get("ok") is True
    report.add(
        "verify",
        f"{backend} {dtype} --rows {rows}",
        gpu,
        "pass" if ok else "fail",
        attention_numbers(got),
        reason=None if ok else f"exit {code}: {last}",
        seconds=round(time.perf_counter() - t0, 2),
    )


def plant_shift(source: Path, dest: Path) -> tuple[str, int]:
    """A copy of `source` with cu_seqlens[2] of its first row of 3+ samples moved one token
    later (the manifest's hash updated, so the attention check is reached)."""
    import shutil

    import pyarrow as pa

    from packer.contract.schema import SCHEMA
    from packer.hashing import file_digest

    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    for entry in manifest["shards"]:
        path = dest / entry["file"]
        with pa.memory_map(str(path)) as src:
            rows = pa.ipc.open_stream(src).read_all().to_pylist()
        for r, row in enumerate(rows):
            if len(row["sample_index"]) >= 3:
                row["cu_seqlens"][2] += 1
                table = pa.Table.from_pylist(rows, schema=SCHEMA)
                with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as w:
                    w.write_table(table)
                entry["xxh3_128"], entry["bytes"] = file_digest(path), path.stat().st_size
                (dest / "manifest.json").write_text(json.dumps(manifest))
                return entry["file"], r
    raise RuntimeError("no row of three samples to plant a shift in")


def planted_check(report, planted: Path, where, backend, dtype, gpu, timeout) -> None:
    t0 = time.perf_counter()
    code, got, last = verify_json(
        [planted, "--backend", backend, "--dtype", dtype, "--rows", "all"], timeout, not gpu
    )
    att = got.get("checks", {}).get("attention", {})
    named = [f for f in att.get("failures", []) if f"{where[0]} row {where[1]}," in f["message"]]
    ok = code == 1 and bool(named)
    report.add(
        "planted",
        f"cu_seqlens shift, {backend} {dtype}",
        gpu,
        "pass" if ok else "fail",
        {"exit": code, "attention_failures": len(att.get("failures", [])), "row": list(where)},
        reason=None if ok else f"exit {code}, attention did not name the row: {last}",
        seconds=round(time.perf_counter() - t0, 2),
    )


def model_dir(work: Path, attn: str) -> Path:
    path = work / f"llama-{attn}"
    path.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 32_000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
        "attn_implementation": attn,
    }
    (path / "config.json").write_text(json.dumps(config))
    return path


def model_check(report, output: Path, work: Path, attn: str, rows: str, gpu, timeout) -> None:
    t0 = time.perf_counter()
    code, got, last = verify_json(
        [output, "--model", model_dir(work, attn), "--rows", rows], timeout, not gpu
    )
    user = got.get("checks", {}).get("user_model", {})
    keys = ("attn_implementation", "device", "dtype", "rows", "samples", "max_logits_diff")
    keys += ("tolerance", "control_min_logits_leak")
    details = {k: user[k] for k in keys if k in user}
    leak = user.get("control_min_logits_leak")
    ok = code == 0 and user.get("ok") is True and leak is not None and leak > user["tolerance"]
    report.add(
        "model",
        f"tiny Llama, {attn}",
        gpu,
        "pass" if ok else "fail",
        details,
        reason=None if ok else f"exit {code}: {last}",
        seconds=round(time.perf_counter() - t0, 2),
    )


# --------------------------------------------------------------------------------------------
# the long row, the suite


def long_check(report: Report, name: str) -> None:
    import torch

    from packer.verify import attention as A
    from packer.verify.backends import build_backend
    from packer.verify.result import CheckResult

    t0 = time.perf_counter()
    try:
        backend = build_backend(name, True)
        torch.cuda.reset_peak_memory_stats()
        iso, ctl = CheckResult("attention"), CheckResult("negative_control")
        A.run_attention([segment_row(LONG_ROW, seed=1)], backend, "bf16", 0, iso, ctl)
        peak = torch.cuda.max_memory_allocated() / 2**30
    except Exception as exc:
        report.add("long", f"{name} bf16, L = 32,768", True, "fail", reason=_first_line(exc))
        return
    details = {
        "tokens": iso.details["tokens"],
        "seconds": iso.details["seconds"],
        "packed_seconds_per_million_tokens": iso.details["packed_seconds_per_million_tokens"],
        "peak_gpu_memory_gib": round(peak, 3),
        "max_packed_vs_alone": iso.details["max_isolated_diff"],
        "tolerance": iso.details["tolerance"],
    }
    ok = iso.ok and ctl.ok
    report.add(
        "long",
        f"{name} bf16, L = 32,768",
        True,
        "pass" if ok else "fail",
        details,
        reason=None if ok else "; ".join(f.message for f in iso.failures + ctl.failures)[:300],
        seconds=round(time.perf_counter() - t0, 2),
    )


def suite_check(report: Report, workers: int, timeout: int) -> None:
    t0 = time.perf_counter()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["-n", str(workers), "--dist", "loadgroup"] if workers > 1 else ["-n", "0"]
    try:
        res = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout
        )
        summary = (res.stdout.strip().splitlines() or [""])[-1]
        ok = res.returncode == 0
    except subprocess.TimeoutExpired:
        ok, summary = False, f"over {timeout} s"
    report.add(
        "suite",
        "CPU test suite, CUDA hidden",
        False,
        "pass" if ok else "fail",
        {"summary": summary, "workers": workers},
        reason=None if ok else summary,
        seconds=round(time.perf_counter() - t0, 2),
    )


# --------------------------------------------------------------------------------------------


def table(report: Report) -> str:
    lines = ["| group | check | status | numbers | s |", "|---|---|---|---|---|"]
    for c in report.checks:
        d = c["details"]
        picks = (
            "max_packed_vs_alone",
            "max_packed_vs_fp32",
            "max_isolated_diff",
            "max_reference_diff",
            "tolerance",
            "margin",
            "non_causal_control_min",
            "peak_gpu_memory_gib",
            "max_logits_diff",
            "control_min_logits_leak",
            "exit",
            "attention_failures",
            "summary",
        )
        shown = ", ".join(f"{k} {_fmt(d[k])}" for k in picks if d.get(k) is not None)
        status = c["status"] + (f" ({c['reason']})" if c["reason"] else "")
        lines.append(f"| {c['group']} | {c['name']} | {status} | {shown} | {c['seconds'] or ''} |")
    return "\n".join(lines)


def _fmt(x) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


GROUPS = ("kernel", "verify", "planted", "model", "long", "suite")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "gpu-check", help="report dir")
    suite = ap.add_mutually_exclusive_group()
    suite.add_argument("--with-suite", action="store_true", help="run the CPU suite here too")
    suite.add_argument("--no-suite", action="store_true", help="leave the CPU suite out")
    ap.add_argument("--groups", nargs="+", choices=GROUPS, default=list(GROUPS))
    ap.add_argument("--segments", type=int, nargs="+", default=list(SEGMENTS))
    ap.add_argument("--cpu-rows", default="2", help="--rows of the CPU-run verify checks")
    ap.add_argument("--small-samples", type=int, default=200, help="samples of the small output")
    ap.add_argument("--workers", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    ap.add_argument("--timeout", type=int, default=600, help="seconds for one verify or pack")
    ap.add_argument("--suite-timeout", type=int, default=900, help="seconds for the suite")
    args = ap.parse_args(argv)

    try:
        import torch
    except ImportError:
        print("gpu_check: torch is not installed (pip install torch): nothing can run")
        return 2
    cuda = torch.cuda.is_available()
    if cuda:
        major, minor = torch.cuda.get_device_capability()
        print(
            f"gpu_check: {torch.cuda.get_device_name()} (sm{major}{minor}), torch "
            f"{torch.__version__}, CUDA {torch.version.cuda}",
            flush=True,
        )
    else:
        print(
            f"gpu_check: no CUDA GPU (torch {torch.__version__}, CUDA build "
            f"{torch.version.cuda}): only the checks that need no GPU run, every GPU check is "
            f"reported as skipped, and the exit code is {EXIT_SKIPPED}: this is not a GPU proof",
            flush=True,
        )
    report = Report(cuda)
    report.env = environment()
    report.add("env", "torch, GPU, probes", False, "pass", report.env["probes"])
    checks = Checks(report, args, cuda)
    for group in GROUPS:
        if group == "suite":
            wanted = group in args.groups and (args.with_suite or (cuda and not args.no_suite))
            if wanted:
                suite_check(report, args.workers, args.suite_timeout)
            else:
                why = "--no-suite" if args.no_suite else "on a CPU machine only with --with-suite"
                report.add("suite", "CPU test suite, CUDA hidden", False, "skipped", reason=why)
        elif group in args.groups:
            getattr(checks, group)()
        else:
            report.add(group, "all", True, "skipped", reason="left out (--groups)")
    checks.close()

    args.out.mkdir(parents=True, exist_ok=True)
    text = table(report)
    (args.out / "report.json").write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    (args.out / "report.md").write_text(text + "\n")
    counts = report.counts()
    print(text)
    print(
        f"gpu_check: {counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} "
        f"skipped; report in {args.out / 'report.json'}"
    )
    if counts["fail"]:
        return EXIT_FAILED
    return EXIT_SKIPPED if any(c["gpu"] and c["status"] == "skipped" for c in report.checks) else 0


class Checks:
    """Each group of checks, with what they share: the probes, the packed outputs (made once,
    when a group first needs them, in a temporary directory)."""

    def __init__(self, report: Report, args, cuda: bool) -> None:
        self.report, self.args, self.cuda = report, args, cuda
        self.probes = report.env["probes"]
        self.bf16 = bool(report.env["gpu"] and report.env["gpu"]["bf16"])
        self.tmp = tempfile.TemporaryDirectory(prefix="gpu-check-")
        self.work = Path(self.tmp.name)
        self.outputs: dict[str, Path | None] = {}

    def close(self) -> None:
        self.tmp.cleanup()

    def why_not(self, name: str, dtype: str) -> str | None:
        """None when kernel `name` runs here in `dtype`, else why not."""
        if not self.cuda:
            return "no CUDA GPU"
        if self.probes[name] != "runs here":
            return self.probes[name]
        if dtype == "bf16" and not self.bf16:
            return "this GPU has no bf16"
        return None

    def each_gpu_kernel(self, group: str, label: str, run) -> None:
        for name in GPU_BACKENDS:
            for dtype in GPU_DTYPES:
                reason = self.why_not(name, dtype)
                if reason is None:
                    run(name, dtype)
                else:
                    self.report.skip(group, label.format(name=name, dtype=dtype), reason)

    def output(self, which: str) -> Path | None:
        """The packed bundled sample ('full', L 4096) or its first samples ('small', L 1024)."""
        if which not in self.outputs:
            t0 = time.perf_counter()
            try:
                self.outputs[which] = pack_output(
                    which, self.work, self.args.small_samples, self.args.timeout
                )
                self.report.add(
                    "pack",
                    f"{which}: {PACKS[which]}",
                    False,
                    "pass",
                    seconds=round(time.perf_counter() - t0, 2),
                )
            except Exception as exc:
                self.report.add("pack", which, False, "fail", reason=_first_line(exc))
                self.outputs[which] = None
        return self.outputs[which]

    def kernel(self) -> None:
        segs = self.args.segments
        self.each_gpu_kernel(
            "kernel",
            "{name} {dtype}",
            lambda n, d: kernel_check(self.report, n, d, segs, True, True),
        )
        if not self.cuda:  # what needs no GPU: the reference and eager FlexAttention
            for name, dtype in (("cpu", "fp32"), ("cpu", "fp16"), ("flex", "fp32")):
                kernel_check(self.report, name, dtype, segs, False, False)

    def verify(self) -> None:
        full, timeout = self.output("full"), self.args.timeout
        if full is None:
            return
        self.each_gpu_kernel(
            "verify",
            "{name} {dtype} --rows all",
            lambda n, d: verify_check(self.report, full, n, d, "all", True, timeout),
        )
        verify_check(self.report, full, "cpu", "fp32", self.args.cpu_rows, False, timeout)

    def planted(self) -> None:
        small, timeout = self.output("small"), self.args.timeout
        if small is None:
            return
        planted = self.work / "planted"
        where = plant_shift(small, planted)
        self.each_gpu_kernel(
            "planted",
            "cu_seqlens shift, {name} {dtype}",
            lambda n, d: planted_check(self.report, planted, where, n, d, True, timeout),
        )
        planted_check(self.report, planted, where, "cpu", "fp32", False, timeout)

    def model(self) -> None:
        small, timeout = self.output("small"), self.args.timeout
        if small is None:
            return
        rows = "all" if self.cuda else self.args.cpu_rows
        model_check(self.report, small, self.work, "sdpa", rows, self.cuda, timeout)
        flash = "tiny Llama, flash_attention_2"
        if not self.cuda:
            self.report.skip("model", flash, "no CUDA GPU")
        elif self.report.env["flash_attn"] is None:
            self.report.skip("model", flash, "flash-attn is not installed")
        else:
            model_check(self.report, small, self.work, "flash_attention_2", "all", True, timeout)

    def long(self) -> None:
        for name in GPU_BACKENDS:
            reason = self.why_not(name, "bf16")
            if reason is None:
                long_check(self.report, name)
            else:
                self.report.skip("long", f"{name} bf16, L = 32,768", reason)


if __name__ == "__main__":
    sys.exit(main())
