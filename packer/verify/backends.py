"""Choosing the attention backend: what can run here, what was asked for, and in which dtype.

The ladder (DESIGN.md): flash-attn's `flash_attn_varlen_func` if it imports, torch's varlen
flash attention on a CUDA GPU, FlexAttention with a document mask, and the CPU reference (fp32
`scaled_dot_product_attention` with a block-diagonal causal mask). Choosing (`select_backend`)
is a plain function of the probes, so it is tested on the CPU; a request that cannot run is a
usage error before any work.
"""

from __future__ import annotations

from dataclasses import dataclass

from packer.errors import UsageError, option
from packer.verify.choices import BACKENDS, DTYPES
from packer.verify.forwards import (
    Forward,
    make_aten_flash_forward,
    make_cpu_forward,
    make_flash_attn_forward,
    make_flex_forward,
    make_varlen_forward,
)


@dataclass
class Backend:
    """A backend ready to run: where, its forward, the call the report shows, its dtypes."""

    name: str
    device: str
    forward: Forward
    call: str  # the kernel call as the report shows it
    dtypes: tuple[str, ...]


def probe_backends() -> dict[str, str | None]:
    """For every backend: None when it can run here, else why not."""
    import torch

    cuda = torch.cuda.is_available()
    found: dict[str, str | None] = {}
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401

        found["flash-attn"] = None if cuda else "flash-attn needs a CUDA GPU"
    except Exception:  # ImportError, or a broken build that fails while loading its library
        found["flash-attn"] = (
            "flash-attn is not installed "
            "(pip install flash-attn --no-build-isolation, with a CUDA toolkit)"
        )
    if not cuda:  # not probed: importing torch's varlen module loads torch._dynamo (~3 s)
        found["torch-varlen"] = "torch's varlen flash attention needs a CUDA GPU"
    elif _torch_varlen() is None:
        found["torch-varlen"] = f"torch {torch.__version__} has no varlen attention"
    else:
        found["torch-varlen"] = None
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401

        found["flex"] = None
    except ImportError:
        found["flex"] = f"torch {torch.__version__} has no FlexAttention"
    found["cpu"] = None
    found["_cuda"] = None if cuda else "no CUDA GPU"
    return found


def select_backend(requested: str, probes: dict[str, str | None]) -> str:
    """The backend to run. `auto` takes the first that can run of flash-attn, torch-varlen,
    flex (only on a GPU: on the CPU it runs unfused and the reference is the better witness)
    and cpu. A backend asked for by name that cannot run is a usage error."""
    if requested == "auto":
        for name in BACKENDS:
            if probes.get(name) is None and (name != "flex" or probes.get("_cuda") is None):
                return name
        return "cpu"
    if requested not in BACKENDS:
        raise UsageError(
            f"unknown {option('backend')} '{requested}' (choose from auto, {', '.join(BACKENDS)})"
        )
    reason = probes.get(requested)
    if reason is not None:
        raise UsageError(f"{option('backend')} {requested} cannot run here: {reason}")
    return requested


def default_dtype(backend: str, device: str) -> str:
    return "fp32" if backend == "cpu" or device == "cpu" else "bf16"


def _torch_varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn

        return varlen_attn
    except ImportError:
        import torch

        return getattr(torch.ops.aten, "_flash_attention_forward", None)


def build_backend(name: str, cuda: bool, budget: int | None = None) -> Backend:
    """The backend `name`; the CPU reference runs in query blocks that fit `budget`."""
    device = "cuda" if cuda and name != "cpu" else "cpu"
    if name == "flash-attn":
        from flash_attn import flash_attn_varlen_func

        fwd, call = make_flash_attn_forward(flash_attn_varlen_func)
        return Backend(name, "cuda", fwd, call, ("bf16", "fp16"))
    if name == "torch-varlen":
        fn = _torch_varlen()
        if getattr(fn, "__name__", "") == "varlen_attn":
            fwd, call = make_varlen_forward(fn)
        else:
            fwd, call = make_aten_flash_forward(fn)
        return Backend(name, "cuda", fwd, call, ("bf16", "fp16"))
    if name == "flex":
        fwd, call = make_flex_forward(device, compiled=device == "cuda")
        return Backend(name, device, fwd, call, DTYPES)
    fwd, call = make_cpu_forward(budget)
    return Backend("cpu", "cpu", fwd, call, DTYPES)


def resolve(requested: str, dtype: str | None, budget: int | None = None) -> tuple[Backend, str]:
    """The backend and dtype to run, or a UsageError saying why the request cannot run."""
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"unknown {option('dtype')} '{dtype}' (choose from {', '.join(DTYPES)})")
    probes = probe_backends()
    name = select_backend(requested, probes)
    backend = build_backend(name, probes["_cuda"] is None, budget)
    dtype = dtype or default_dtype(name, backend.device)
    if dtype not in backend.dtypes:
        raise UsageError(
            f"{option('backend')} {name} supports {option('dtype')} "
            f"{'/'.join(backend.dtypes)}, not {dtype}"
        )
    return backend, dtype
