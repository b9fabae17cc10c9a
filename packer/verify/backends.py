"""Choosing the attention backend: what can run here, what was asked for, and in which dtype.

The ladder (DESIGN.md): flash-attn 3's and flash-attn's `flash_attn_varlen_func` if they import,
torch's varlen flash attention on a CUDA GPU, FlexAttention with a document mask, and the CPU
reference (fp32 `scaled_dot_product_attention` with a block-diagonal causal mask). Each GPU
kernel runs only on the compute capabilities it was built for (`NEEDS`): on an older GPU `auto`
steps down the ladder, and a backend asked for by name is refused before any work, in one line,
instead of failing inside its first forward. Choosing (`select_backend`) is a plain function of
the probes, so it is tested on the CPU with probes of fake GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packer.errors import UsageError, option
from packer.verify.choices import BACKENDS, DTYPES
from packer.verify.forwards import (
    Forward,
    make_aten_flash_forward,
    make_cpu_forward,
    make_flash_attn3_forward,
    make_flash_attn_forward,
    make_flex_forward,
    make_varlen_forward,
)


@dataclass
class Backend:
    """A backend ready to run: where, its forward, the call the report shows, its dtypes, and
    what its kernel did (`report`, filled in as it runs: compiled FlexAttention's compiles)."""

    name: str
    device: str
    forward: Forward
    call: str  # the kernel call as the report shows it
    dtypes: tuple[str, ...]
    report: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Gpu:
    """The CUDA device the GPU backends would run on: its name, compute capability, native bf16."""

    name: str
    capability: tuple[int, int]
    bf16: bool

    @property
    def sm(self) -> str:
        return f"sm{self.capability[0]}{self.capability[1]}"


# the compute capability each GPU backend needs, from the kernels' own checks: flash-attn 2 and
# torch's varlen (flash) kernel Ampere (sm80) or newer, flash-attn 3 Hopper (sm90) only, and
# Triton (compiled FlexAttention) sm70 or newer
NEEDS = {
    "flash-attn-3": ((9, 0), (10, 0), "Hopper (sm90)"),
    "flash-attn": ((8, 0), None, "sm80 or newer (Ampere, Ada, Hopper)"),
    "torch-varlen": ((8, 0), None, "sm80 or newer (Ampere, Ada, Hopper)"),
    "flex": ((7, 0), None, "sm70 or newer (Triton)"),
}


def probe_gpu() -> Gpu | None:
    """The current CUDA device, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))
    return Gpu(torch.cuda.get_device_name(index), (int(major), int(minor)), bf16)


def _too_old(name: str, gpu: Gpu) -> str | None:
    low, high, what = NEEDS[name]
    if gpu.capability < low or (high is not None and gpu.capability >= high):
        return f"{name} needs {what}; this GPU, {gpu.name}, is {gpu.sm}"
    return None


def probe_backends() -> dict[str, str | None]:
    """For every backend: None when it can run here, else why not. `_cuda` says whether a GPU
    is there, `_gpu` holds its `Gpu` (not a reason: the facts the defaults are chosen from)."""
    import torch

    gpu = probe_gpu()
    found: dict = {}
    try:
        from flash_attn_interface import flash_attn_varlen_func  # noqa: F401

        found["flash-attn-3"] = "flash-attn 3 needs a CUDA GPU" if gpu is None else None
    except Exception:  # ImportError, or a broken build that fails while loading its library
        found["flash-attn-3"] = (
            "flash-attn 3 is not installed (flash_attn_interface, built from flash-attention's "
            "hopper/ directory)"
        )
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401, F811

        found["flash-attn"] = "flash-attn needs a CUDA GPU" if gpu is None else None
    except Exception:
        found["flash-attn"] = (
            "flash-attn is not installed "
            "(pip install flash-attn --no-build-isolation, with a CUDA toolkit)"
        )
    if gpu is None:  # not probed: importing torch's varlen module loads torch._dynamo (~3 s)
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
    if gpu is not None and found["flex"] is None and not _has_triton():
        found["flex"] = "compiled FlexAttention on a GPU needs Triton (pip install triton)"
    if gpu is not None:
        for name in NEEDS:
            if found[name] is None:
                found[name] = _too_old(name, gpu)
    found["cpu"] = None
    found["_cuda"] = None if gpu is not None else "no CUDA GPU"
    found["_gpu"] = gpu
    return found


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def select_backend(requested: str, probes: dict) -> str:
    """The backend to run. `auto` takes the first that can run of flash-attn-3, flash-attn,
    torch-varlen, flex (only on a GPU: on the CPU it runs unfused and the reference is the
    better witness) and cpu. A backend asked for by name that cannot run is a usage error."""
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


def default_dtype(backend: str, device: str, gpu: Gpu | None = None) -> str:
    """fp32 on the CPU; on a GPU bf16 where it has bf16 units (sm80+), else fp16."""
    if backend == "cpu" or device == "cpu":
        return "fp32"
    return "bf16" if gpu is None or gpu.bf16 else "fp16"


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
    if name == "flash-attn-3":
        from flash_attn_interface import flash_attn_varlen_func

        fwd, call = make_flash_attn3_forward(flash_attn_varlen_func)
        return Backend(name, "cuda", fwd, call, ("bf16", "fp16"))
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
        report: dict = {}
        fwd, call = make_flex_forward(device, compiled=device == "cuda", report=report)
        return Backend(name, device, fwd, call, DTYPES, report)
    fwd, call = make_cpu_forward(budget)
    return Backend("cpu", "cpu", fwd, call, DTYPES)


def resolve(requested: str, dtype: str | None, budget: int | None = None) -> tuple[Backend, str]:
    """The backend and dtype to run, or a UsageError saying why the request cannot run."""
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"unknown {option('dtype')} '{dtype}' (choose from {', '.join(DTYPES)})")
    probes = probe_backends()
    name = select_backend(requested, probes)
    gpu = probes.get("_gpu")
    backend = build_backend(name, gpu is not None, budget)
    dtype = dtype or default_dtype(name, backend.device, gpu)
    if dtype not in backend.dtypes:
        raise UsageError(
            f"{option('backend')} {name} supports {option('dtype')} "
            f"{'/'.join(backend.dtypes)}, not {dtype}"
        )
    if dtype == "bf16" and backend.device == "cuda" and gpu is not None and not gpu.bf16:
        raise UsageError(
            f"{option('dtype')} bf16: this GPU, {gpu.name} ({gpu.sm}), has no bf16 "
            f"(is_bf16_supported is False); pass {option('dtype')} fp16"
        )
    return backend, dtype
