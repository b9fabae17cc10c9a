"""Model check: a tiny random transformers causal LM gives each sample the same loss packed as alone.

What is compared, exactly: for every picked row, the model runs once over the whole row with the
row's `position_ids` and an explicit 4-D boolean block-diagonal causal mask built from the row's
`cu_seqlens` (sdpa attention, fp32, no cache); and once per sample alone, with positions
0..n-1 and no mask. Samples are delimited by the position restarts, independently of
cu_seqlens. For each sample the mean next-token loss over the row's labels (the packed run
counts the target at the sample's first token too, which must be -100) and the number of
targets must match the alone run, and so must the logits. A negative control runs the same row
under a plain causal mask: the logits of every later sample must then change.

transformers 5 also isolates packed samples on sdpa from `position_ids` alone when no mask is
given; that is its own detection, so the check passes the mask explicitly and depends on
nothing but the row's columns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from packer.verify.memory import (
    ATTENTION_HEADS,
    budget_bytes,
    logit_block,
    refuse,
    verify_needs,
)
from packer.verify.picked_rows import RowInput, alone_segments, sample_failure, sample_label
from packer.verify.result import CheckResult

LOSS_TOLERANCE = 1e-4  # per-sample mean loss, fp32
LOGITS_TOLERANCE = 1e-4
LEAK_FACTOR = 10.0


def _loss(logits, targets) -> float:
    """Summed next-token loss of `targets` given `logits` (one row each), -100 ignored."""
    import torch.nn.functional as F

    if not targets.numel():
        return 0.0
    ce = F.cross_entropy(logits.float(), targets.long(), ignore_index=-100, reduction="none")
    return float(ce.double().sum())


def _as_long(values):
    import torch

    return torch.from_numpy(np.asarray(values, dtype=np.int64))


@dataclass
class _ModelRun:
    """The tiny model over the picked rows: where it reports, and what it measured so far."""

    model: object
    result: CheckResult
    block: int = 1 << 30  # tokens whose logits are held at once (`memory.logit_block`)
    loss_max: float = 0.0
    logits_max: float = 0.0
    leaks: list[float] = field(default_factory=list)
    samples: int = 0

    def hidden(self, ids, positions, mask=None):
        """One forward as a training step makes it (no cache, so nothing carries over), up to
        the last hidden states: the logits are taken a block of tokens at a time."""
        out = self.model.model(ids, position_ids=positions, attention_mask=mask, use_cache=False)
        return out.last_hidden_state[0]

    def row(self, item: RowInput) -> None:
        """The row under its block-diagonal causal mask and under a plain causal one (the
        control; one T x T mask held at a time), then each of its samples alone."""
        import torch

        row = item.data
        ids, labels = _as_long(row["input_ids"])[None], _as_long(row["labels"])
        pos, cu = _as_long(row["position_ids"])[None], _as_long(row["cu_seqlens"])
        n = ids.shape[1]
        doc = torch.searchsorted(cu[1:].contiguous(), torch.arange(n), right=True)
        packed = self.hidden(ids, pos, (doc[:, None] == doc[None, :]).tril_()[None, None])
        leaky = self.hidden(ids, pos, torch.ones(n, n, dtype=torch.bool).tril_()[None, None])
        for j, (a, b) in enumerate(alone_segments(row["position_ids"])):
            self.sample(item, j, (a, b), ids, labels, (packed, leaky))

    def sample(self, item: RowInput, j: int, span: tuple[int, int], ids, labels, runs) -> None:
        """Sample j of the row (tokens a..b-1) alone vs packed: its targets, mean loss and
        logits; and, after the row's first sample, that the plain causal run differs."""
        import torch

        (a, b), (packed, leaky) = span, runs
        result = self.result
        self.samples += 1
        alone = self.hidden(ids[:, a:b], torch.arange(b - a)[None])
        n_packed = int((labels[a:b] != -100).sum())
        n_alone = int((labels[a + 1 : b] != -100).sum())
        # the packed row also trains the target at the sample's first token (from the token
        # before it), which must be -100; alone it has no such target
        loss_packed = _loss(self.model.lm_head(packed[a - 1 : a]), labels[a : a + 1]) if a else 0.0
        loss_alone, d_logits, leak = 0.0, 0.0, 0.0
        for t in range(a, b, self.block):
            e = min(b, t + self.block)
            lp, la = self.model.lm_head(packed[t:e]), self.model.lm_head(alone[t - a : e - a])
            d_logits = max(d_logits, float((lp - la).abs().max()))
            if j > 0:
                leak = max(leak, float((self.model.lm_head(leaky[t:e]) - la).abs().max()))
            last = min(e, b - 1)  # tokens t..last-1 predict labels t+1..last
            loss_packed += _loss(lp[: last - t], labels[t + 1 : last + 1])
            loss_alone += _loss(la[: last - t], labels[t + 1 : last + 1])
        # the mean over the sample's targets, as a trainer normalizes it
        mean_packed = loss_packed / max(n_packed, 1)
        mean_alone = loss_alone / max(n_alone, 1)
        d_loss = abs(mean_packed - mean_alone)
        self.loss_max, self.logits_max = max(self.loss_max, d_loss), max(self.logits_max, d_logits)
        label = sample_label(item.shard, item.row, item.data, a, b, j)
        if n_packed != n_alone:
            result.fail(
                sample_failure(
                    item,
                    label,
                    f"the packed row trains {n_packed} targets of this "
                    f"sample, alone it has {n_alone}: its first token is the target of the "
                    "previous sample's last token",
                )
            )
        elif d_loss > LOSS_TOLERANCE or d_logits > LOGITS_TOLERANCE:
            result.fail(
                sample_failure(
                    item,
                    label,
                    f"the tiny model's loss differs by {d_loss:.3g} and its "
                    f"logits by {d_logits:.3g} between the packed row and the sample alone "
                    f"(tolerance {LOSS_TOLERANCE:g})",
                )
            )
        if j > 0:
            self.leaks.append(leak)
            if leak <= LEAK_FACTOR * LOGITS_TOLERANCE:
                result.fail(
                    sample_failure(
                        item,
                        label,
                        f"under a plain causal mask the logits change by "
                        f"only {leak:.3g}: the model check could not see a leak here",
                    )
                )


def run_model_check(
    rows: list[RowInput],
    seed: int,
    result: CheckResult,
    on_row: Callable[[int, int], None] | None = None,
    budget: int | None = None,
) -> None:
    """The tiny model over each picked row, packed vs each sample alone; on_row(done, total).
    Its forward is dense: rows that need more than `budget` are refused (`memory.refuse`)."""
    import torch

    from packer.torch.tiny_model import build_tiny_model

    t0 = time.perf_counter()
    if not rows:
        result.ran = False
        result.skipped_reason = "no usable row to run"
        return
    vocab = 2 + max(
        max(int(np.max(r.data["input_ids"])), int(np.max(r.data["labels"]))) for r in rows
    )
    longest = max(len(r.data["input_ids"]) for r in rows)
    budget = budget_bytes(budget)
    need = verify_needs(longest, ATTENTION_HEADS, model_check=True)
    if need.bytes > budget:
        refuse(need, longest, budget)
    model = build_tiny_model(seed, vocab_size=vocab, max_positions=max(longest, 16))
    run = _ModelRun(model, result, logit_block(vocab, budget))
    if on_row:
        on_row(0, len(rows))
    with torch.inference_mode():
        for done, item in enumerate(rows, 1):
            run.row(item)
            if on_row:
                on_row(done, len(rows))
    leaks = run.leaks
    result.details.update(
        {
            "model": f"LlamaForCausalLM, 2 layers, hidden 64, vocab {vocab}, random (seed {seed})",
            "attention": "sdpa, explicit 4-D block-diagonal causal mask from cu_seqlens, fp32",
            "rows": len(rows),
            "samples": run.samples,
            "max_loss_diff": run.loss_max,
            "max_logits_diff": run.logits_max,
            "tolerance": LOSS_TOLERANCE,
            "control_min_logits_leak": min(leaks) if leaks else None,
            "control_max_logits_leak": max(leaks) if leaks else None,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )
