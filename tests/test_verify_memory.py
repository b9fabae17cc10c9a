"""verify under `--memory-budget`: the CPU attention runs in query blocks whose scores fit the
budget and give the dense results, the estimate of what cannot be cut is a pure function of
sizes, and a budget below it is refused in one line before any check runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import make_samples, write_jsonl

import packer
from packer.errors import UsageError
from packer.verify import memory as M

torch = pytest.importorskip("torch")

MiB, GiB = 1 << 20, 1 << 30


@pytest.mark.parametrize("budget", [MiB, 64 * MiB, 8 * GiB, 64 * GiB])
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("keys_before", [0, 1, 1000, 30000])
def test_a_block_is_the_most_queries_that_fit_the_share(budget, heads, keys_before):
    room = min(budget // M.BLOCK_SHARE, M.MAX_BLOCK_BYTES)

    def held(block):
        return heads * block * (keys_before + block) * M.SCORE_BYTES

    for queries in (1, 10, 5000, 200_000):
        block = M.block_queries(queries, keys_before, heads, budget)
        assert 1 <= block <= queries
        if block == queries or block == M.MIN_QUERIES:
            continue
        assert held(block) <= room < held(block + 1)


def test_what_verify_needs_grows_with_the_row_and_names_its_cause():
    small, large = (M.verify_needs(n, 4) for n in (4096, 32768))
    assert small.what == large.what == "the attention check"
    assert large.bytes > small.bytes
    # blocks keep the attention check linear in the row; dense scores and the model are not
    assert large.bytes < 8 * small.bytes + 1
    assert M.verify_needs(32768, 4, dense=True).bytes > 60 * large.bytes
    model = M.verify_needs(32768, 4, model_check=True)
    assert model.what == "--model-check" and model.bytes >= M.model_check_bytes(32768)
    assert M.verify_needs(4096, 4, model_check=True).bytes < model.bytes / 40  # T x T mask
    # the model's logits: a block of tokens at a time, within the share
    for vocab in (50, 32000, 256_000):
        block = M.logit_block(vocab, 8 * GiB)
        assert block == M.MIN_QUERIES or block * vocab * M.LOGIT_BYTES <= M.MAX_BLOCK_BYTES
    assert M.gib(512 * MiB) == "512 MiB" and M.gib(3 * GiB // 2) == "1.5 GiB"


def test_the_cp_ring_blocks_follow_the_budget():
    from packer.verify import cp_attention as C

    assert M.block_scores(4, 8 * GiB) > C.QUERY_BLOCK_SCORES  # the default budget: as before
    small = M.block_scores(4, 64 * MiB)
    assert small * 4 * M.SCORE_BYTES <= 16 * MiB < (small + 1) * 4 * M.SCORE_BYTES
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(96, 2, 8, generator=gen) for _ in range(3))
    cu = [0, 32, 96]
    whole = C.ring_attention(q, k, v, cu, 2)
    assert float((C.ring_attention(q, k, v, cu, 2, scores=40) - whole).abs().max()) < 1e-6


def test_blocked_attention_equals_one_call_and_holds_its_share(monkeypatch):
    from packer.verify import forwards

    gen = torch.Generator().manual_seed(0)
    n = 700
    q, k, v = (torch.randn(n, 4, 64, generator=gen) for _ in range(3))
    cu = torch.tensor([0, 90, 91, 400, n], dtype=torch.int32)
    whole = forwards.causal_sdpa(q, k, v, 64 * GiB, cu)
    alone = forwards.causal_sdpa(q, k, v, 64 * GiB)
    budget = 4 * MiB  # a 1 MiB share: blocks of about 70 queries
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(qb, kb, vb, **kw):
        calls.append(qb.shape[1] * qb.shape[2] * kb.shape[2] * M.SCORE_BYTES)
        return sdpa(qb, kb, vb, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    blocked = forwards.causal_sdpa(q, k, v, budget, cu)
    assert len(calls) > 5 and max(calls) <= budget // M.BLOCK_SHARE
    assert float((blocked - whole).abs().max()) < 1e-6
    calls.clear()
    assert float((forwards.causal_sdpa(q, k, v, budget) - alone).abs().max()) < 1e-6
    assert len(calls) > 5 and max(calls) <= budget // M.BLOCK_SHARE
    # the segments stay apart in blocks: token 91's segment starts at 91
    single = forwards.causal_sdpa(q[91:400], k[91:400], v[91:400], 64 * GiB)
    assert float((blocked[91:400] - single).abs().max()) < 1e-6


@pytest.fixture(scope="module")
def long_rows(tmp_path_factory):
    """A CP output (cp_size 2) of rows of 8,192 tokens: dense fp32 attention over one row
    holds 4 x 8k x 8k scores (1 GiB), several copies of them in the unblocked SDPA."""
    root = tmp_path_factory.mktemp("verify-memory")
    src = write_jsonl(root / "in.jsonl", make_samples(40, seed=3, median=400))
    out = root / "out"
    config = packer.PackConfig(max_len=8192, pad=True, cp_size=2)
    packer.pack([src], out, config)
    return out


def _peak_rss(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    """Run `packer ARGS` in a child and return it with its peak RSS in bytes (ru_maxrss of
    the children of a wrapper that runs only it)."""
    wrapper = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
        "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr); "
        "sys.exit(r.returncode)"
    )
    cmd = [sys.executable, "-c", wrapper, sys.executable, "-m", "packer", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    *lines, peak = res.stderr.strip().splitlines()
    res.stderr = "\n".join(lines)
    return res, int(peak)


def _env():
    import os

    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _imports_rss() -> int:
    """Peak RSS of a process that only imports what verify's checks run on."""
    code = (
        "import resource, torch, numba, pyarrow, packer.cli.app, packer.verify.attention, "
        "packer.verify.cp_attention; torch.randn(8); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    return int(res.stdout.strip())


def test_verify_under_a_small_budget_passes_within_it(long_rows):
    """The row `--rows 1` picks holds 3 long samples: their blocks of scores come in many sizes,
    which glibc's malloc kept (0.96-1.12 GB peak) until verify had it return freed blocks."""
    budget = 256 * MiB
    res, peak = _peak_rss(
        "verify", str(long_rows), "--rows", "1", "--memory-budget", "256MiB", "--json"
    )
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["checks"]["attention"]["tokens"] == 8192
    assert report["checks"]["attention"]["samples"] == 3
    assert report["checks"]["cp_attention"]["ok"] is True
    # imports (torch, numba, pyarrow: about 0.3 GiB), then the blocks' budget and the row's
    # own tensors that blocks cannot cut; the unblocked SDPA of one such row alone took 2.8 GiB
    bound = _imports_rss() + budget + M.verify_needs(8192, 4).bytes
    assert peak < bound, f"peak RSS {peak / MiB:.0f} MiB, bound {bound / MiB:.0f} MiB"


def test_a_budget_below_the_rows_is_refused_in_one_line(cli, long_rows):
    res = cli("verify", long_rows, "--memory-budget", "16MiB")  # in this process
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        f"error: the attention check needs about {M.gib(M.verify_needs(8192, 4).bytes)} for "
        "rows of 8,192 tokens, more than "
        "--memory-budget 16 MiB: raise --memory-budget, or pass --no-attention"
    )
    res = cli("verify", long_rows, "--model-check", "--memory-budget", "512MiB")
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "--model-check needs about" in res.stderr and "leave out --model-check" in res.stderr


def test_the_library_names_the_parameter(long_rows):
    with pytest.raises(UsageError, match=r"more than memory_budget 16 MiB: raise memory_budget"):
        packer.verify.verify(long_rows, memory_budget="16MiB")
    with pytest.raises(UsageError, match="memory_budget must be a size"):
        packer.verify.verify(long_rows, memory_budget="lots")


def test_a_missing_output_is_no_such_directory(cli, tmp_path):
    res = cli("verify", tmp_path / "dem0")
    assert res.exit_code == 2
    assert res.stderr.strip() == f"error: {tmp_path / 'dem0'}: no such directory"


def test_the_model_check_in_logit_blocks_measures_what_one_block_does():
    """Rows of 20-31 tokens with ids near 5000: under a 1 MiB budget the logits go 16 tokens at
    a time, across the sample boundaries and the one-token shift of the loss."""
    from test_verify_model import _row

    from packer.verify.model_check import run_model_check
    from packer.verify.picked_rows import RowInput
    from packer.verify.result import CheckResult

    assert M.logit_block(5100, MiB) == M.MIN_QUERIES
    rows = [
        RowInput("s.arrow", i, r)
        for i, r in enumerate([_row([20, 31], 5000), _row([9, 25, 17], 5040)])
    ]
    whole, blocked = CheckResult("model"), CheckResult("model")
    run_model_check(rows, 0, whole)
    run_model_check(rows, 0, blocked, budget=MiB)
    assert whole.ok and blocked.ok
    for key in ("max_loss_diff", "max_logits_diff", "control_min_logits_leak"):
        assert blocked.details[key] == pytest.approx(whole.details[key], abs=1e-6), key
    assert blocked.details["samples"] == whole.details["samples"] == 5
