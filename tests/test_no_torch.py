"""The core install without torch: pack, `verify --no-attention`, the one-line error without the
flag, the ImportError of `packer.torch`, and the CI recipe (scripts/ci_build.sh).

Each command runs in a subprocess whose `sitecustomize` (first on PYTHONPATH) makes importing
torch fail as it does where torch is not installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
BLOCKER = '''
import sys


class _NoTorch:
    """Importing torch fails, as on an install without it."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTorch())
'''
TORCH_LINE = (
    "error: the attention check needs torch (packer's 'verify' extra): pip install torch, or pass "
    "--no-attention for the structural checks alone"
)


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    blocker = tmp_path_factory.mktemp("no_torch")
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), str(ROOT)])
    return env


def run(env: dict, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def packed(env, tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("core")
    src = write_jsonl(
        root / "in.jsonl", make_samples(60, seed=8, median=30, max_len=128, vocab=400)
    )
    out = root / "out"
    res = run(env, "-m", "packer", "pack", str(src), "-o", str(out), "-L", "128", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["samples_packed"] == 60
    return out, src


def test_torch_is_blocked(env):
    res = run(env, "-c", "import torch")
    assert res.returncode == 1 and "No module named 'torch'" in res.stderr


def test_verify_no_attention_runs_the_structural_checks(env, packed):
    out, src = packed
    res = run(
        env, "-m", "packer", "verify", str(out), "--input", str(src), "--no-attention", "--json"
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    checks = report["checks"]
    assert report["ok"] is True
    for name in ("structure", "manifest", "input"):
        assert checks[name]["ran"] is True and checks[name]["ok"] is True
    assert checks["structure"]["samples"] == 60
    assert report["not_run"] == ["attention", "negative_control", "model", "user_model"]
    for name in report["not_run"]:
        assert checks[name] == {
            "ok": None,
            "ran": False,
            "failure_count": 0,
            "failures_omitted": 0,
            "failures": [],
            "skipped_reason": "--no-attention was given",
        }
    human = run(env, "-m", "packer", "verify", str(out), "--no-attention")
    # the line wraps where the output path is long (the terminal is 80 columns wide)
    assert human.returncode == 0 and "(attention not checked)" in " ".join(human.stderr.split())


def test_verify_no_attention_still_fails_a_planted_fault(env, packed, tmp_path):
    out = tmp_path / "bad"
    shutil.copytree(packed[0], out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["shards"][0]["rows"] += 1
    (out / "manifest.json").write_text(json.dumps(manifest))
    res = run(env, "-m", "packer", "verify", str(out), "--no-attention", "--json")
    assert res.returncode == 1
    [failure] = json.loads(res.stdout)["checks"]["manifest"]["failures"]
    assert "manifest says" in failure["message"] and "rows" in failure["message"]


def test_verify_without_the_flag_says_what_to_do(env, packed):
    res = run(env, "-m", "packer", "verify", str(packed[0]))
    assert res.returncode == 2
    assert res.stderr.strip() == TORCH_LINE  # one line, no traceback, no "internal error"
    assert res.stdout == ""


def test_import_packer_torch_names_the_extra(env):
    res = run(env, "-c", "import packer; import packer.torch")
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: packer.torch needs torch")
    assert "pip install torch" in last


def test_ci_build_script_on_the_bundled_sample(env, tmp_path):
    """The README's CI recipe, as it is, without torch: pack and verify the bundled sample."""
    cache = tmp_path / "numba-cache"
    script_env = dict(
        env, PYTHON=sys.executable, SKIP_INSTALL="1", NUMBA_CACHE_DIR=str(cache), MAX_LEN="2048"
    )
    out = tmp_path / "ci" / "out"
    res = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "ci_build.sh"),
            str(ROOT / "data" / "sample.jsonl.gz"),
            str(out),
        ],
        env=script_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    pack = json.loads((tmp_path / "ci" / "out.pack.json").read_text())
    verify = json.loads((tmp_path / "ci" / "out.verify.json").read_text())
    assert pack["samples_in"] == pack["samples_packed"] == 1500
    assert verify["ok"] is True and verify["checks"]["input"]["ran"] is True
    assert verify["checks"]["attention"]["ran"] is False
    # the kernels were compiled into the cache directory the recipe keeps between runs
    assert list(cache.rglob("*.nbi")) and list(cache.rglob("*.nbc"))
    # a failing step fails the script
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ci_build.sh"), str(tmp_path / "missing.jsonl"), str(out)],
        env=script_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode != 0 and "missing.jsonl" in res.stderr
