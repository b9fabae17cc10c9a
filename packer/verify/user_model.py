"""`packer verify OUT --model DIR`: the user's own model, packed vs alone, on picked rows.

DIR is a local transformers checkpoint (weights are loaded) or a directory holding only a
`config.json` (the model is built from the config with random weights, seeded): nothing is ever
downloaded. An `"attn_implementation"` key in config.json picks the attention (default:
transformers' choice, sdpa where it can). Each picked row holding two or more samples goes through `check_isolation` as a
one-row flatten batch, in train mode, through the training loop's call (docs/training.md)
`model(**model_inputs(batch))`: the config's own attention implementation and `use_cache`
default are what is tested. A negative control runs the same row as one sequence (positions
0..T-1, no `cu_seq_lens`, no `seq_idx`, no mask): every attention implementation (sdpa, eager,
flash, flex) and every sliding window then reaches across the row's sample boundaries, so the
logits of the later samples must change by more than twice the tolerance, or the check could
not see a leak with this model. (An all-ones 2D `attention_mask` is no such control: the flash
paths turn it into None and keep the samples apart through `cu_seq_lens`.)

A hybrid model whose Mamba, Gated DeltaNet or short-convolution layers lack their kernels here
fails in one line naming them and what would isolate them (`packer.torch.hybrid`), with no
forward run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from packer.errors import UsageError, option
from packer.verify.picked_rows import RowInput, sample_failure, sample_label
from packer.verify.result import CheckResult, Failure

LEAK_FACTOR = 2.0  # the one-sequence control's leak must stand clear of the tolerance
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")


def has_weights(model_dir: Path) -> bool:
    return any(next(model_dir.glob(pattern), None) is not None for pattern in WEIGHT_FILES)


def load_model(model_dir: str | Path, seed: int, dtype: str | None):
    """(model, description) from a local directory; UsageError when it is not a model dir."""
    import torch

    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise UsageError(
            f"{option('model_dir', '--model')} needs transformers: pip install transformers"
        ) from None
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise UsageError(
            f"{option('model_dir', '--model')} needs a local directory with a config.json",
            where=str(path),
        )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one report, on stdout or stderr, and nothing else
    cuda = torch.cuda.is_available()
    torch_dtype = {
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp32": torch.float32,
        # bf16 only where the GPU has it natively (as verify's attention check decides)
        None: (
            torch.bfloat16
            if cuda and torch.cuda.is_bf16_supported(including_emulation=False)
            else torch.float16
            if cuda
            else torch.float32
        ),
    }[dtype]
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        if has_weights(path):
            # an "attn_implementation" key in config.json picks the attention, as from_config
            # reads it; from_pretrained needs it passed
            chosen = {"attn_implementation": config._attn_implementation}
            model = AutoModelForCausalLM.from_pretrained(
                str(path),
                local_files_only=True,
                dtype=torch_dtype,
                **(chosen if config._attn_implementation else {}),
            )
            how = "weights from the checkpoint"
        else:
            state = torch.random.get_rng_state()
            torch.manual_seed(seed)
            try:
                model = AutoModelForCausalLM.from_config(config).to(torch_dtype)
            finally:
                torch.random.set_rng_state(state)
            how = f"config only, random weights (seed {seed})"
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"cannot load a causal LM from it ({first})", where=str(path)) from None
    return model.to("cuda" if cuda else "cpu"), how


def run_user_model(
    rows: list[RowInput],
    model_dir: str | Path,
    seed: int,
    dtype: str | None,
    result: CheckResult,
    on_row: Callable[[int, int], None] | None = None,
) -> None:
    """The user's model over each picked row of two or more samples; on_row(done, total)."""
    import torch

    from packer.torch import check_isolation, collate_packed, model_inputs

    t0 = time.perf_counter()
    model, how = load_model(model_dir, seed, dtype)
    multi = [r for r in rows if len(r.data["sample_index"]) > 1]
    _check_vocabulary(multi, int(getattr(model.config, "vocab_size", 0) or 0), model_dir)
    model.train()  # the training call: train mode, the config's use_cache default
    samples = 0
    logits_max = loss_max = 0.0
    leaks: list[float] = []
    tol = unsupported = None
    if on_row:
        on_row(0, len(multi))
    for done, item in enumerate(multi, 1):
        batch = collate_packed([item.data], "flatten")
        report = check_isolation(model, batch, raise_on_failure=False, max_samples=None)
        if report.unsupported:  # layers that cannot keep packed samples apart: no forward ran
            unsupported = report.unsupported
            result.fail(Failure(unsupported))
            break
        tol = report.tolerance
        samples += report.samples
        logits_max = max(logits_max, report.max_logits_diff)
        loss_max = max(loss_max, report.max_loss_diff)
        for (_, j, a, b_last), message in zip(report.failed_at, report.failures):
            text = message.split(": ", 1)[1]
            label = sample_label(item.shard, item.row, item.data, a, b_last + 1, j)
            result.fail(sample_failure(item, label, text))
        leaks.append(_control_leak(model, batch, model_inputs, torch))
        if leaks[-1] <= LEAK_FACTOR * tol:
            result.fail(
                Failure(
                    f"{item.shard} row {item.row}: run as one sequence (positions 0..T-1, no "
                    f"sample boundaries) the model's logits change by only {leaks[-1]:.3g} "
                    f"(needs > {LEAK_FACTOR * tol:g}): the check could not see a leak here",
                    shard=item.shard,
                    row=item.row,
                )
            )
        if on_row:
            on_row(done, len(multi))
    if not multi:
        result.ran = False
        result.skipped_reason = "no picked row holds two samples"
    result.details.update(
        {
            "model_dir": str(model_dir),
            "model": type(model).__name__,
            "weights": how,
            "attn_implementation": getattr(model.config, "_attn_implementation", None),
            "use_cache_default": getattr(model.config, "use_cache", None),
            "call": "model.train(); model(**model_inputs(batch)) (flatten)",
            "control": "the row as one sequence: positions 0..T-1, no cu_seq_lens, seq_idx or mask",
            "device": str(next(model.parameters()).device),
            "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "rows": len(leaks),
            "samples": samples,
            "unsupported": unsupported,
            "max_logits_diff": logits_max,
            "max_loss_diff": loss_max,
            "tolerance": tol,
            "control_min_logits_leak": min(leaks) if leaks else None,
            "seconds": round(time.perf_counter() - t0, 3),
        }
    )


def _check_vocabulary(rows: list[RowInput], vocab: int, model_dir) -> None:
    """UsageError for a row holding a token id the model has no embedding for."""
    for item in rows:
        top = int(np.max(item.data["input_ids"]))
        if vocab and top >= vocab:
            raise UsageError(
                f"{item.shard} row {item.row} holds token id {top}, outside the model's "
                f"vocabulary ({vocab}): the data was not tokenized for this model",
                where=str(model_dir),
            )


def _control_leak(model, batch, model_inputs, torch) -> float:
    """How much the logits after the row's first sample move when the row is one sequence:
    positions 0..T-1 and none of the boundaries (cu_seq_lens, seq_idx, a mask), so no attention
    implementation, sliding window or recurrent layer can keep the samples apart."""
    from packer.torch.isolation import NoDropout

    first_end = int(batch["cu_seq_lens_q"][1])
    ids = batch["input_ids"].to(model.device)
    whole = {"input_ids": ids, "position_ids": torch.arange(ids.shape[1], device=ids.device)[None]}
    inputs = {k: v.to(model.device) if hasattr(v, "to") else v for k, v in batch.items()}
    with torch.no_grad(), NoDropout(model):
        isolated = model(**model_inputs(inputs)).logits[0, first_end:].float()
        merged = model(**model_inputs(whole)).logits[0, first_end:].float()
    scale = max(1.0, float(isolated.abs().max()))
    return float((merged - isolated).abs().max()) / scale
