"""Attention isolation: packed varlen attention over a row equals each sample run alone.

For each picked row, the chosen backend (`backends.py`) runs the row packed, each sample of it
alone, and the row as one plain causal sequence: packed must equal alone (and the fp32 SDPA
reference, the witness across implementations) within the tolerance the dtype and the rows'
longest segment allow (`tolerance.py`), and plain causal must differ, or the check
could not have seen a leak (the negative control). q, k and v are a seeded random vector per
token id, so a run is reproducible. Torch is imported only inside the functions here, so packing
and the structure checks never load it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from packer.verify.backends import Backend
from packer.verify.forwards import causal_sdpa
from packer.verify.memory import ATTENTION_HEADS, budget_bytes
from packer.verify.picked_rows import RowInput, alone_segments, sample_failure, sample_label
from packer.verify.result import CheckResult, Failure
from packer.verify.tolerance import RULE, UNIT_ROUNDOFF, tolerance

TOLERANCE = {"fp32": 1e-5}  # the CP simulation's (cp_attention: fp32, short chunks)
LEAK_FACTOR = 10.0  # the negative control must differ by at least this times the tolerance
HEADS, HEAD_DIM = ATTENTION_HEADS, 64
TABLE_ROWS = 4093  # q/k/v come from a seeded random table indexed by token id modulo this


@functools.lru_cache(maxsize=2)
def _qkv_table(seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randn(TABLE_ROWS, 3, HEADS, HEAD_DIM, generator=gen)


def qkv_from_tokens(ids: np.ndarray, seed: int, device: str, dtype):
    """Seeded random q, k, v of shape (T, HEADS, HEAD_DIM): a fixed random vector per token id."""
    import torch

    table = _qkv_table(seed)
    index = torch.from_numpy(np.asarray(ids, dtype=np.int64) % TABLE_ROWS)
    qkv = table[index].to(device=device, dtype=dtype)
    return qkv[:, 0].contiguous(), qkv[:, 1].contiguous(), qkv[:, 2].contiguous()


def value_bound(seed: int, dtype) -> float:
    """max |v| over the q/k/v table in `dtype`: every value row a check can see is in it."""
    return float(_qkv_table(seed)[:, 2].to(dtype).abs().max())


def longest_segment(rows: list[RowInput]) -> int:
    """The most keys one query of these rows attends to: the tolerance's reduction length."""
    lengths = [np.diff(np.asarray(r.data["cu_seqlens"], dtype=np.int64)) for r in rows]
    return max((int(x.max(initial=1)) for x in lengths), default=1)


def reference_attention(q, k, v, budget: int | None = None):
    """fp32 causal attention over one sample (SDPA), the cross-implementation witness; on the
    CPU in query blocks that fit `budget` (`forwards.causal_sdpa`)."""
    return causal_sdpa(q.float(), k.float(), v.float(), budget_bytes(budget))


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


@dataclass
class _Run:
    """One attention check under way: what it runs with, where it reports, what it measured."""

    backend: Backend
    torch_dtype: object
    seed: int
    tol: float
    threshold: float
    isolation: CheckResult
    control: CheckResult
    budget: int  # bytes the CPU reference's query blocks may hold (`memory.block_queries`)
    iso_max: float = 0.0
    ref_max: float = 0.0
    first_max: float = 0.0
    leaks: list[float] = field(default_factory=list)
    tokens: int = 0
    samples: int = 0
    packed_seconds: float = 0.0
    rule: dict = field(default_factory=dict)  # what the tolerance was derived from

    def row(self, item: RowInput) -> None:
        """The row packed, and as one plain causal sequence; then each of its samples alone."""
        import torch

        row = item.data
        dev = self.backend.device
        ids = np.asarray(row["input_ids"])
        n = len(ids)
        q, k, v = qkv_from_tokens(ids, self.seed, dev, self.torch_dtype)
        cu = torch.tensor(np.asarray(row["cu_seqlens"]), dtype=torch.int32, device=dev)
        max_seqlen = int(np.diff(np.asarray(row["cu_seqlens"])).max())
        _sync(dev)
        t0 = time.perf_counter()
        packed = self.backend.forward(q, k, v, cu, max_seqlen)
        _sync(dev)
        self.packed_seconds += time.perf_counter() - t0
        whole = torch.tensor([0, n], dtype=torch.int32, device=dev)
        causal = self.backend.forward(q, k, v, whole, n).float()
        packed = packed.float()
        self.tokens += n
        for j, (a, b) in enumerate(alone_segments(row["position_ids"])):
            self.sample(item, j, a, b, (q, k, v), packed, causal)

    def sample(self, item: RowInput, j: int, a: int, b: int, qkv, packed, causal) -> None:
        """Sample j of the row (tokens a..b-1) alone vs packed, vs the reference, and vs the
        row under plain causal attention (the control; not for the row's first sample)."""
        import torch

        q, k, v = qkv
        backend, tol, threshold = self.backend, self.tol, self.threshold
        self.samples += 1
        seg_cu = torch.tensor([0, b - a], dtype=torch.int32, device=backend.device)
        alone = backend.forward(q[a:b], k[a:b], v[a:b], seg_cu, b - a).float()
        iso = float((packed[a:b] - alone).abs().max())
        ref = float(
            (packed[a:b] - reference_attention(q[a:b], k[a:b], v[a:b], self.budget)).abs().max()
        )
        leak = float((causal[a:b] - alone).abs().max())
        self.iso_max, self.ref_max = max(self.iso_max, iso), max(self.ref_max, ref)
        label = sample_label(item.shard, item.row, item.data, a, b, j)
        if iso > tol:
            self.isolation.fail(
                sample_failure(
                    item,
                    label,
                    f"the packed {backend.name} forward differs from "
                    f"the sample run alone by {iso:.3g} (tolerance {tol:g}): attention "
                    "crosses a sample boundary",
                )
            )
        elif ref > tol:
            self.isolation.fail(
                sample_failure(
                    item,
                    label,
                    f"the packed {backend.name} forward differs from "
                    f"the fp32 reference by {ref:.3g} (tolerance {tol:g})",
                )
            )
        if j == 0:
            self.first_max = max(self.first_max, leak)
            return
        self.leaks.append(leak)
        if leak <= threshold:
            self.control.fail(
                sample_failure(
                    item,
                    label,
                    f"plain causal attention over the whole "
                    f"row changes this sample by only {leak:.3g} (needs > {threshold:g}): "
                    "the check could not see a leak here, so it proves nothing",
                )
            )


def run_attention(
    rows: list[RowInput],
    backend: Backend,
    dtype: str,
    seed: int,
    isolation: CheckResult,
    control: CheckResult,
    on_row: Callable[[int, int], None] | None = None,
    budget: int | None = None,
) -> None:
    """Packed forward vs each sample alone (isolation), and plain causal (negative control).

    on_row(done, total) after each row: on the CPU a row of 4k tokens takes seconds. `budget`:
    the bytes the fp32 reference's blocks may hold (default: `--memory-budget`'s default).
    """
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    bound, length = value_bound(seed, torch_dtype), longest_segment(rows)
    tol = tolerance(dtype, length, bound)
    threshold = LEAK_FACTOR * tol
    run = _Run(backend, torch_dtype, seed, tol, threshold, isolation, control, budget_bytes(budget))
    run.rule = {"unit_roundoff": UNIT_ROUNDOFF[dtype], "value_bound": bound, "length": length}
    t_start = time.perf_counter()
    if on_row:
        on_row(0, len(rows))
    with torch.inference_mode():
        for done, item in enumerate(rows, 1):
            run.row(item)
            if on_row:
                on_row(done, len(rows))
    synthetic = False
    if not run.leaks and rows:
        run.leaks.append(_synthetic_control(rows, backend, torch_dtype, seed))
        synthetic = True
        if run.leaks[0] <= threshold:
            control.fail(
                Failure(
                    f"plain causal attention over two joined "
                    f"samples changes the second by only {run.leaks[0]:.3g} (needs > "
                    f"{threshold:g}): the check could not see a leak",
                )
            )
    elapsed = time.perf_counter() - t_start
    isolation.details.update(_isolation_details(run, dtype, len(rows), elapsed))
    control.details.update(_control_details(run, dtype, synthetic))
    if not rows:
        isolation.ran = control.ran = False
        isolation.skipped_reason = control.skipped_reason = "no usable row to run"


def _isolation_details(run: _Run, dtype: str, rows: int, elapsed: float) -> dict:
    tokens = run.tokens
    return {
        "backend": run.backend.name,
        "device": run.backend.device,
        "dtype": dtype,
        "call": run.backend.call,
        "rows": rows,
        "samples": run.samples,
        "tokens": tokens,
        "max_isolated_diff": run.iso_max,
        "max_reference_diff": run.ref_max,
        "tolerance": run.tol,
        "tolerance_rule": RULE,
        "tolerance_from": run.rule,
        **({"kernel": dict(run.backend.report)} if run.backend.report else {}),
        "seconds": round(elapsed, 3),
        "packed_seconds_per_million_tokens": round(run.packed_seconds / tokens * 1e6, 4)
        if tokens
        else None,
        "seconds_per_million_tokens": round(elapsed / tokens * 1e6, 4) if tokens else None,
    }


def _control_details(run: _Run, dtype: str, synthetic: bool) -> dict:
    leaks = run.leaks
    return {
        "backend": run.backend.name,
        "dtype": dtype,
        "min_leak": min(leaks) if leaks else None,
        "max_leak": max(leaks) if leaks else None,
        "first_sample_diff": run.first_max,
        "threshold": run.threshold,
        "margin": round(min(leaks) / run.tol, 1) if leaks and run.tol else None,
        "samples_measured": len(leaks),
        "synthetic": synthetic,
    }


def _synthetic_control(rows: list[RowInput], backend: Backend, torch_dtype, seed: int) -> float:
    """When no picked row holds two samples: join two samples into one row, measure the leak."""
    import torch

    first = np.asarray(rows[0].data["input_ids"])
    second = np.asarray(rows[1].data["input_ids"]) if len(rows) > 1 else first[::-1].copy()
    ids = np.concatenate([first, second])
    dev = backend.device
    q, k, v = qkv_from_tokens(ids, seed, dev, torch_dtype)
    n, a = len(ids), len(first)
    with torch.inference_mode():
        causal = backend.forward(q, k, v, torch.tensor([0, n], dtype=torch.int32, device=dev), n)
        alone = backend.forward(
            q[a:], k[a:], v[a:], torch.tensor([0, n - a], dtype=torch.int32, device=dev), n - a
        )
    return float((causal[a:].float() - alone.float()).abs().max())
