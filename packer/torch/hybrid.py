"""Which layers of a model keep packed samples apart only through kernels this install lacks.

Attention layers isolate packed samples from `cu_seq_lens` or restarting `position_ids`. The
token-mixing layers of hybrid models do not read either on their torch paths:

- Mamba2 mixers (Nemotron-H, Bamba, Falcon-H1, Zamba2, Granite-4 hybrid): the scan and its
  causal convolution keep samples apart only in mamba_ssm's and causal_conv1d's CUDA kernels,
  given `seq_idx`; Mamba (v1) mixers (Mamba, Falcon-Mamba, Jamba) are found the same way, and
  whether their call hands the kernels the boundaries only a run with the kernels shows;
- Gated DeltaNet and other delta-rule linear attention (Qwen3-Next, Qwen3.5, Kimi Linear): the
  recurrence needs flash-linear-attention's kernels with `cu_seqlens` (transformers passes them
  `cu_seq_lens_q`), and the convolution before it causal_conv1d with `seq_idx`;
- short convolutions (LFM2): causal_conv1d with `seq_idx`.

transformers runs the torch path when the package does not import; given `seq_idx` or
`cu_seqlens` there it raises "... can't keep packed sequences apart without ...", without them
the samples of a row silently see each other. `isolation_needs(model)` finds such layers by
their modules (a mixer owns an `A_log` parameter; a short convolution a depthwise `Conv1d`) and
says what is missing; `needs_line` puts it in one line.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass

import torch

# import name -> what `pip install` takes
DISTRIBUTIONS = {
    "mamba_ssm": "mamba-ssm",
    "causal_conv1d": "causal-conv1d",
    "fla": "flash-linear-attention",
}
KINDS = {
    "mamba": ("Mamba/SSM mixers", ("mamba_ssm", "causal_conv1d"), "seq_idx"),
    "delta": ("Gated DeltaNet mixers", ("fla", "causal_conv1d"), "cu_seq_lens_q"),
    "conv": ("short convolutions", ("causal_conv1d",), "seq_idx"),
}
# the model's own refusal (transformers' kernel fallback given seq_idx or cu_seqlens)
REFUSAL = re.compile(r"`(\w+)` can't keep packed sequences apart without `([\w.-]+)`")


@functools.cache
def kernel_available(package: str) -> bool:
    """Whether `package` imports, as transformers tries it before falling back to torch."""
    try:
        importlib.import_module(package)
    except Exception:  # ImportError, or a CUDA extension that fails to load
        return False
    return True


@dataclass
class Need:
    kind: str  # a key of KINDS
    layers: list[int]  # decoder layer numbers (or module names where there is none)
    missing: list[str]  # import names of the packages that do not import here

    @property
    def ok(self) -> bool:
        return not self.missing


def _kind(module: torch.nn.Module) -> str | None:
    name = type(module).__name__
    own = dict(module.named_parameters(recurse=False))
    if "A_log" in own:
        return "delta" if "Delta" in name or "LinearAttention" in name else "mamba"
    if "ShortConv" in name:
        return "conv"
    return None


def _layer(path: str) -> int | str:
    found = re.search(r"layers\.(\d+)\.", path + ".")
    return int(found.group(1)) if found else path


def isolation_needs(model: torch.nn.Module) -> list[Need]:
    """The model's token-mixing layers that are not attention, by kind, and the packages each
    kind would need that do not import here (empty `missing`: the kernels are installed)."""
    matched: list[str] = []
    layers: dict[str, list] = {}
    for path, module in model.named_modules():
        kind = _kind(module)
        if kind is None or any(path.startswith(p + ".") for p in matched):
            continue  # not a mixer, or inside one already counted
        matched.append(path)
        layers.setdefault(kind, []).append(_layer(path))
    return [
        Need(kind, where, [p for p in KINDS[kind][1] if not kernel_available(p)])
        for kind, where in layers.items()
    ]


def _pip(packages, sep: str = " ") -> str:
    return sep.join(DISTRIBUTIONS.get(p, p) for p in packages)


def needs_line(needs: list[Need]) -> str | None:
    """One line naming the layers that cannot keep packed samples apart on this install and
    what would; None when every such layer has its kernels."""
    missing = [n for n in needs if not n.ok]
    if not missing:
        return None
    parts = []
    for n in missing:
        label, packages, key = KINDS[n.kind]
        keys = "seq_idx" if key == "seq_idx" else f"{key} and seq_idx"
        where = ", ".join(str(x) for x in n.layers)
        parts.append(f"{label} in layers {where} (need {_pip(packages, ' and ')}, with {keys})")
    packages = sorted({p for n in missing for p in n.missing}, key=list(DISTRIBUTIONS).index)
    return (
        "layers that cannot keep packed samples apart on this install: "
        + "; ".join(parts)
        + f"; missing {', '.join(_pip([p]) for p in packages)}: pip install {_pip(packages)} "
        "on a CUDA GPU (collate_packed's batch carries seq_idx and cu_seq_lens_q)"
    )


def refusal_line(exc: BaseException, needs: list[Need]) -> str | None:
    """The one line for the model's own ValueError about packed sequences, or None when the
    error is another one."""
    text = str(exc)
    found = REFUSAL.search(text)
    if not found and "packed sequences" not in text:
        return None
    line = needs_line(needs)
    if line:
        return line
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return f"the model refuses packed samples on this install: {first}"
