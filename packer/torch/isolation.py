"""`check_isolation`: the user's own model gives each packed sample what it gives the sample alone.

`packer verify` proves the shards are right; this proves the training call is. A model config
can undo the isolation the shards carry (a cache switches off transformers' detection of packed
samples, eager attention reads a boolean mask as 1 / 0, a 2D `attention_mask` merges a row's
samples), and none of that shows in the loss curve. So, at the start of a run:

    check_isolation(model, next(iter(loader)))            # raises IsolationError on a leak

runs the model once on the collated batch, through the call the training loop makes
(`model(**model_inputs(batch))`, or the `forward` passed), and once per sample alone (the
sample collated by itself in the same layout, through the same call), and compares the logits
and the per-sample loss. The model keeps its mode (train or eval) and its gradient
checkpointing; only dropout is held at 0 for the check, since its random masks differ between
the packed and the alone runs. Runs under `torch.no_grad()`.

A hybrid model whose Mamba, Gated DeltaNet or short-convolution layers lack the kernels that
keep packed samples apart (`packer.torch.hybrid`) is refused before any forward, in one line
that names the layers and the packages that would; the model's own ValueError about packed
sequences becomes the same line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from packer.torch.collate import IGNORE_INDEX, collate_packed, model_inputs
from packer.torch.hybrid import isolation_needs, needs_line, refusal_line

# Largest allowed |packed - alone| of the logits, relative to max(1, largest |alone logit|), and
# of a sample's mean token loss (absolute), by the dtype the model computes in. Packed and
# alone runs differ only by the order of reductions: ~1e-6 in fp32, a few bf16 ulps otherwise.
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8, torch.float16: 1e-2, torch.bfloat16: 5e-2}
MAX_SAMPLES = 64

Forward = Callable[[torch.nn.Module, dict], object]


class IsolationError(RuntimeError):
    """A packed sample's logits or loss differ from the sample run alone: samples leak."""

    def __init__(self, report: IsolationReport):
        self.report = report
        first = report.failures[0]
        more = len(report.failures) - 1
        super().__init__(first + (f" (and {more} more sample(s))" if more > 0 else ""))


@dataclass
class IsolationReport:
    samples: int = 0
    samples_after_first: int = 0  # samples with another before them in their row: leaks show here
    max_logits_diff: float = 0.0  # relative to max(1, |alone logits|)
    max_loss_diff: float = 0.0
    tolerance: float = 0.0
    dtype: str = ""
    failures: list[str] = field(default_factory=list)  # one line per sample that differs
    # where each failure is: batch row, sample number in that row, first and last token
    failed_at: list[tuple[int, int, int, int]] = field(default_factory=list)
    # the one line for layers that cannot keep packed samples apart here (no forward was run)
    unsupported: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "samples": self.samples,
            "samples_after_first": self.samples_after_first,
            "max_logits_diff": self.max_logits_diff,
            "max_loss_diff": self.max_loss_diff,
            "tolerance": self.tolerance,
            "dtype": self.dtype,
            "failures": list(self.failures),
            "unsupported": self.unsupported,
        }


def default_forward(model: torch.nn.Module, batch: dict):
    """The training loop's call (docs/training.md): every model key of the batch, `use_cache=False`."""
    return model(**model_inputs(batch))


def _logits(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if logits is None and isinstance(out, (tuple, list)):
        logits = out[0]
    if not isinstance(logits, torch.Tensor):
        raise TypeError("forward must return the model output (with .logits) or a logits tensor")
    return logits


def _segments(batch: dict) -> list[tuple[int, int, int]]:
    """(batch row, start, end) of every sample: flatten from cu_seq_lens_q, pad from cu_seqlens
    (the final padding segment of each row, whose labels are all -100, left out)."""
    if "cu_seq_lens_q" in batch:
        cu = batch["cu_seq_lens_q"].tolist()
        return [(0, a, b) for a, b in zip(cu, cu[1:]) if b > a]
    if "cu_seqlens" not in batch:
        raise KeyError("the batch has neither cu_seq_lens_q nor cu_seqlens: use collate_packed")
    out = []
    labels = batch["labels"]
    for r, cu in enumerate(batch["cu_seqlens"].tolist()):
        spans = [(a, b) for a, b in zip(cu, cu[1:]) if b > a]
        while spans and bool((labels[r, spans[-1][0] : spans[-1][1]] == IGNORE_INDEX).all()):
            spans.pop()  # padding (or a sample with no target, which cannot show a loss)
        out += [(r, a, b) for a, b in spans]
    return out


def _alone_batch(batch: dict, r: int, a: int, b: int, mode: str, pad_id: int) -> dict:
    """The sample at batch[r, a:b] collated by itself, in the layout of the batch."""
    ids = batch["input_ids"][r, a:b].cpu().numpy()
    labels = batch["labels"][r, a:b].cpu().numpy()
    row = {
        "input_ids": ids,
        "labels": labels,
        "position_ids": np.arange(b - a),
        "cu_seqlens": np.array([0, b - a]),
        "sample_index": np.array([0]),
        "sample_offset": np.array([0]),
        "num_loss_tokens": int((labels != IGNORE_INDEX).sum()),
    }
    return collate_packed([row], mode, pad_id=pad_id)


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _token_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[float, int]:
    """(summed loss, targets) of labels[1:] predicted from logits[:-1], -100 ignored."""
    if labels.shape[0] < 2:
        return 0.0, 0
    ce = F.cross_entropy(
        logits[:-1].float(),
        labels[1:].to(logits.device),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return float(ce), int((labels[1:] != IGNORE_INDEX).sum())


class NoDropout:
    """Hold every dropout probability of the model at 0 (nn.Dropout modules and the float
    `attention_dropout` / `dropout` attributes attention layers read), restoring them after."""

    NAMES = ("attention_dropout", "dropout", "attn_dropout", "dropout_p")

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.saved: list[tuple[object, str, float]] = []

    def __enter__(self):
        for module in self.model.modules():
            if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p:
                self.saved.append((module, "p", module.p))
                module.p = 0.0
            for name in self.NAMES:
                value = module.__dict__.get(name)
                if isinstance(value, float) and value:
                    self.saved.append((module, name, value))
                    setattr(module, name, 0.0)
        return self

    def __exit__(self, *exc):
        for obj, name, value in reversed(self.saved):
            setattr(obj, name, value)
        return False


def _compute_dtype(model: torch.nn.Module, device: torch.device) -> torch.dtype:
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    param = next(model.parameters(), None)
    return param.dtype if param is not None else torch.float32


def check_isolation(
    model: torch.nn.Module,
    batch: dict,
    *,
    forward: Forward | None = None,
    tolerance: float | None = None,
    max_samples: int | None = MAX_SAMPLES,
    pad_id: int = 0,
    raise_on_failure: bool = True,
) -> IsolationReport:
    """Run `model` on a collated packed batch and on each of its samples alone; raise
    `IsolationError` (or, with `raise_on_failure=False`, return the report) when a sample's
    logits or mean token loss differ beyond a tolerance for the model's dtype.

    `batch` comes from `collate_packed` (flatten or pad) and must hold a row with two or more
    samples (else a leak could not show). `forward(model, batch)` is the training loop's call
    (default: `model(**model_inputs(batch))`); it gets the packed batch and each one-sample
    batch, moved to the model's device, and returns the output (`.logits`) or the logits.
    `max_samples` caps the alone runs (the first samples in batch order). A model with layers
    that cannot keep packed samples apart on this install fails with one line (`unsupported`)
    and no forward.
    """
    forward = forward or default_forward
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = _compute_dtype(model, device)
    tol = TOLERANCE.get(dtype, 1e-4) if tolerance is None else float(tolerance)
    mode = "flatten" if "cu_seq_lens_q" in batch else "pad"
    segments = _segments(batch)
    if max_samples is not None:
        segments = segments[:max_samples]
    report = IsolationReport(tolerance=tol, dtype=str(dtype).replace("torch.", ""))
    report.samples_after_first = sum(1 for _, a, _ in segments if a > 0)
    if not report.samples_after_first:
        raise ValueError(
            "check_isolation needs a batch with a row of two or more samples: a sample at the "
            "start of its row cannot show a leak"
        )
    needs = isolation_needs(model)
    report.unsupported = needs_line(needs)
    if report.unsupported is None:
        try:
            _compare(model, batch, forward, segments, mode, pad_id, device, report)
        except ValueError as exc:
            report.unsupported = refusal_line(exc, needs)
            if report.unsupported is None:
                raise
    if report.unsupported is not None:
        report.failures, report.failed_at = [report.unsupported], []
    if report.failures and raise_on_failure:
        raise IsolationError(report)
    return report


def _compare(model, batch, forward, segments, mode, pad_id, device, report) -> None:
    """The packed forward, then each sample alone: the report's measures and failures."""
    tol = report.tolerance
    labels = batch["labels"]
    with torch.no_grad(), NoDropout(model):
        packed = _logits(forward(model, _to(batch, device)))
        for i, (r, a, b) in enumerate(segments):
            j = i - next(k for k, seg in enumerate(segments) if seg[0] == r)  # within its row
            alone_batch = _alone_batch(batch, r, a, b, mode, pad_id)
            alone = _logits(forward(model, _to(alone_batch, device)))[0, : b - a].float()
            got = packed[r, a:b].float()
            scale = max(1.0, float(alone.abs().max()))
            d_logits = float((got - alone).abs().max()) / scale
            # the packed run also counts the target at the sample's first token (it must be
            # -100): predicted from the previous sample's last token, it would be a label leak
            lo = a - 1 if a > 0 else a
            s_packed, n_packed = _token_loss(packed[r, lo:b], labels[r, lo:b])
            s_alone, n_alone = _token_loss(alone, labels[r, a:b])
            d_loss = abs(s_packed / max(n_packed, 1) - s_alone / max(n_alone, 1))
            report.samples += 1
            report.max_logits_diff = max(report.max_logits_diff, d_logits)
            report.max_loss_diff = max(report.max_loss_diff, d_loss)
            place = f"batch row {r}, sample {j} (tokens {a}..{b - 1})"
            if n_packed != n_alone or d_logits > tol or d_loss > tol:
                report.failed_at.append((r, j, a, b - 1))
            if n_packed != n_alone:
                report.failures.append(
                    f"{place}: the packed batch trains {n_packed} targets of this sample, alone "
                    f"it has {n_alone}: its first token is the target of the previous sample"
                )
            elif d_logits > tol or d_loss > tol:
                report.failures.append(
                    f"{place}: packed vs alone, the logits differ by {d_logits:.3g} (relative) "
                    f"and the mean token loss by {d_loss:.3g}; tolerance {tol:g} for "
                    f"{report.dtype}: the samples of a row see each other in this forward call "
                    "(a cache, a 2D attention_mask, or a mask the attention reads wrong)"
                )
