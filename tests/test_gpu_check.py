"""scripts/gpu_check.py on a machine without a GPU: its first line says so, the checks that need
no GPU run and pass, every GPU check is reported as skipped with its reason, and the exit code
(3) is not a pass. Run with a small option set; its JSON report is read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
GPU_KERNELS = {
    f"{n} {d}"
    for n in ("flash-attn-3", "flash-attn", "torch-varlen", "flex")
    for d in ("bf16", "fp16")
}


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU, gpu_check.py is the GPU proof")
def test_gpu_check_on_a_cpu_machine(tmp_path):
    out = tmp_path / "report"
    cmd = [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--out", str(out)]
    cmd += ["--groups", "kernel", "planted", "--segments", "1", "5", "129"]
    cmd += ["--small-samples", "60"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 3, res.stdout[-2000:] + res.stderr[-2000:]
    first = res.stdout.splitlines()[0]
    assert first.startswith("gpu_check: no CUDA GPU (torch ") and "not a GPU proof" in first

    report = json.loads((out / "report.json").read_text())
    assert report["cuda"] is False and report["env"]["gpu"] is None
    assert set(report["env"]["probes"]) == {
        "flash-attn-3",
        "flash-attn",
        "torch-varlen",
        "flex",
        "cpu",
    }
    checks = report["checks"]
    by = {(c["group"], c["name"]): c for c in checks}
    assert all(c["status"] == "skipped" and c["reason"] for c in checks if c["gpu"])
    assert {n for g, n in by if g == "kernel" and by[g, n]["gpu"]} == GPU_KERNELS
    assert all(by["kernel", k]["reason"] == "no CUDA GPU" for k in GPU_KERNELS)
    assert {n for g, n in by if g == "planted" and by[g, n]["gpu"]} == {
        f"cu_seqlens shift, {k}" for k in GPU_KERNELS
    }
    for name in ("cpu fp32", "cpu fp16", "flex fp32"):  # what needs no GPU ran, and passed
        c = by["kernel", name]
        d = c["details"]
        assert c["status"] == "pass" and c["gpu"] is False and d["segments"] == [1, 5, 129]
        assert (
            d["max_packed_vs_alone"] <= d["tolerance"] and d["max_packed_vs_fp32"] <= d["tolerance"]
        )
        assert d["margin"] > 10 and d["non_causal_control_min"] > 10 * d["tolerance"]
    planted = by["planted", "cu_seqlens shift, cpu fp32"]
    assert planted["status"] == "pass" and planted["details"]["exit"] == 1
    assert planted["details"]["attention_failures"] >= 1
    assert (
        by["pack", "small: the bundled sample's first --small-samples samples, L 1024, split"][
            "status"
        ]
        == "pass"
    )
    for group in ("verify", "model", "long"):
        assert by[group, "all"]["status"] == "skipped"
        assert by[group, "all"]["reason"] == "left out (--groups)"
    assert by["suite", "CPU test suite, CUDA hidden"]["reason"] == (
        "on a CPU machine only with --with-suite"
    )
    assert report["counts"]["fail"] == 0
    table = (out / "report.md").read_text()
    assert "| kernel | flash-attn bf16 | skipped (no CUDA GPU) |" in table
    assert "| planted | cu_seqlens shift, cpu fp32 | pass |" in table
