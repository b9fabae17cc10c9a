"""Attention isolation: packed varlen attention over a row equals each sample run alone.

The backend ladder (DESIGN.md): flash-attn's `flash_attn_varlen_func` if it imports, torch's
varlen flash attention on a CUDA GPU, FlexAttention with a document mask, and the CPU reference
(fp32 `scaled_dot_product_attention` with a block-diagonal causal mask). Torch is imported only
inside the functions here, so packing and the structure checks never load it.

Every backend is reduced to one `forward(q, k, v, cu_seqlens, max_seqlen)` over `(T, H, D)`
tensors that is causal within the segments of `cu_seqlens`. Choosing a backend
(`select_backend`) and adapting a kernel's signature (`varlen_call_form`, `make_*_forward`) are
plain functions, tested on the CPU with fake kernels.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from packer.errors import UsageError, option
from packer.verify.result import CheckResult, Failure

BACKENDS = ("flash-attn", "torch-varlen", "flex", "cpu")
DTYPES = ("bf16", "fp16", "fp32")
# packed vs alone and vs the fp32 reference (DESIGN.md: across implementations)
TOLERANCE = {"bf16": 2e-2, "fp16": 2e-3, "fp32": 1e-5}
LEAK_FACTOR = 10.0  # the negative control must differ by at least this times the tolerance
HEADS, HEAD_DIM = 4, 64
TABLE_ROWS = 4093  # q/k/v come from a seeded random table indexed by token id modulo this

Forward = Callable  # (q, k, v, cu_seqlens int32, max_seqlen int) -> (T, H, D)


@dataclass
class Backend:
    name: str
    device: str
    forward: Forward
    call: str  # the kernel call as the report shows it
    dtypes: tuple[str, ...]


# --------------------------------------------------------------------------------------------
# Signature adapters (pure; tested with fake kernels)


def varlen_call_form(fn: Callable) -> str:
    """How torch's `varlen_attn` asks for causal masking: 'window_size' (2.11+) or 'is_causal'
    (2.10), read from its signature."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise UsageError("cannot read the signature of torch's varlen_attn") from None
    if "window_size" in params:
        return "window_size"
    if "is_causal" in params:
        return "is_causal"
    raise UsageError(
        "torch's varlen_attn takes neither window_size= nor is_causal=; this torch "
        "version is not supported by --backend torch-varlen"
    )


def varlen_causal_kwargs(form: str) -> dict:
    """Keyword arguments that make `varlen_attn` causal in the given call form."""
    if form == "window_size":
        return {"window_size": (-1, 0)}  # no limit to the left, nothing to the right
    if form == "is_causal":
        return {"is_causal": True}
    raise ValueError(f"unknown varlen call form {form!r}")


def make_varlen_forward(fn: Callable) -> tuple[Forward, str]:
    form = varlen_call_form(fn)
    kwargs = varlen_causal_kwargs(form)

    def forward(q, k, v, cu, max_seqlen):
        return fn(q, k, v, cu, cu, int(max_seqlen), int(max_seqlen), **kwargs)

    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return forward, f"torch.nn.attention.varlen.varlen_attn(q, k, v, cu, cu, max, max, {shown})"


def make_aten_flash_forward(op: Callable) -> tuple[Forward, str]:
    """Torch before 2.10: the private `aten._flash_attention_forward` (output is item 0)."""

    def forward(q, k, v, cu, max_seqlen):
        return op(q, k, v, cu, cu, int(max_seqlen), int(max_seqlen), 0.0, True, False)[0]

    return forward, "torch.ops.aten._flash_attention_forward(..., dropout_p=0.0, is_causal=True)"


def make_flash_attn_forward(fn: Callable) -> tuple[Forward, str]:
    def forward(q, k, v, cu, max_seqlen):
        return fn(
            q,
            k,
            v,
            cu,
            cu,
            int(max_seqlen),
            int(max_seqlen),
            dropout_p=0.0,
            softmax_scale=None,
            causal=True,
        )

    return forward, "flash_attn.flash_attn_varlen_func(..., dropout_p=0.0, causal=True)"


def segment_ids(cu, length: int):
    """Document id of every token position, from cu_seqlens (a torch tensor)."""
    import torch

    positions = torch.arange(length, device=cu.device, dtype=cu.dtype)
    return torch.searchsorted(cu[1:].contiguous(), positions, right=True)


def block_causal_mask(cu, length: int):
    """Boolean (T, T) mask: True where query i may attend key j (same segment, j <= i)."""
    import torch

    doc = segment_ids(cu, length)
    causal = torch.ones(length, length, dtype=torch.bool, device=cu.device).tril()
    return (doc[:, None] == doc[None, :]) & causal


def check_varlen_call(q, cu, max_seqlen) -> None:
    """The varlen kernels' contract, enforced by the masked references that stand in for them
    on a CPU: int32 `cu_seqlens` from 0 to the token count, and `max_seqlen` the longest
    segment. flash-attn refuses int64 offsets and reads past a segment longer than
    `max_seqlen` silently, so a caller that gets these wrong must fail here, not on a GPU."""
    import torch

    n = q.shape[0]
    if cu.dtype != torch.int32 or cu.dim() != 1 or cu.device != q.device:
        raise ValueError(f"cu_seqlens must be 1-D int32 on {q.device}, got {cu.dtype} {cu.device}")
    if cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != n or bool((cu[1:] < cu[:-1]).any()):
        raise ValueError(f"cu_seqlens must rise from 0 to {n}, got {cu.tolist()}")
    longest = int((cu[1:] - cu[:-1]).max())
    if max_seqlen != longest:
        raise ValueError(f"max_seqlen is {max_seqlen} but the longest segment has {longest} tokens")


def make_cpu_forward() -> tuple[Forward, str]:
    import torch.nn.functional as F

    def forward(q, k, v, cu, max_seqlen):
        check_varlen_call(q, cu, max_seqlen)
        mask = block_causal_mask(cu, q.shape[0])
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
        )
        return out.transpose(0, 1)

    return forward, "scaled_dot_product_attention(attn_mask=block-diagonal causal)"


def make_flex_forward(device: str, compiled: bool) -> tuple[Forward, str]:
    import warnings

    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    kernel = torch.compile(flex_attention, dynamic=True) if compiled else flex_attention

    def forward(q, k, v, cu, max_seqlen):
        check_varlen_call(q, cu, max_seqlen)
        length = q.shape[0]
        doc = segment_ids(cu, length)

        def document_causal(b, h, qi, ki):
            return (doc[qi] == doc[ki]) & (qi >= ki)

        mask = create_block_mask(document_causal, None, None, length, length, device=device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager flex on CPU warns that it is unfused
            out = kernel(
                q.transpose(0, 1)[None],
                k.transpose(0, 1)[None],
                v.transpose(0, 1)[None],
                block_mask=mask,
            )
        return out[0].transpose(0, 1)

    how = "compiled" if compiled else "eager"
    return forward, f"flex_attention(block_mask=create_block_mask(document causal), {how})"


# --------------------------------------------------------------------------------------------
# Choosing a backend


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
    has_varlen = _torch_varlen() is not None
    if not cuda:
        found["torch-varlen"] = "torch's varlen flash attention needs a CUDA GPU"
    elif not has_varlen:
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


def build_backend(name: str, cuda: bool) -> Backend:
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
    fwd, call = make_cpu_forward()
    return Backend("cpu", "cpu", fwd, call, DTYPES)


def resolve(requested: str, dtype: str | None) -> tuple[Backend, str]:
    """The backend and dtype to run, or a UsageError saying why the request cannot run."""
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"unknown {option('dtype')} '{dtype}' (choose from {', '.join(DTYPES)})")
    probes = probe_backends()
    name = select_backend(requested, probes)
    backend = build_backend(name, probes["_cuda"] is None)
    dtype = dtype or default_dtype(name, backend.device)
    if dtype not in backend.dtypes:
        raise UsageError(
            f"{option('backend')} {name} supports {option('dtype')} "
            f"{'/'.join(backend.dtypes)}, not {dtype}"
        )
    return backend, dtype


# --------------------------------------------------------------------------------------------
# The check


@dataclass
class RowInput:
    """A row picked for the attention and model checks."""

    shard: str
    row: int
    data: dict  # ShardArrays.row(): numpy views of the row's columns


def alone_segments(position_ids: np.ndarray) -> list[tuple[int, int]]:
    """Samples as the position ids delimit them (independent of cu_seqlens): [start, end)."""
    n = len(position_ids)
    starts = np.flatnonzero(np.asarray(position_ids) == 0).tolist()
    if not starts or starts[0] != 0:
        starts = [0] + starts
    return list(zip(starts, starts[1:] + [n]))


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


def _reference(q, k, v):
    """fp32 causal attention over one sample (SDPA), the cross-implementation witness."""
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1),
        k.float().transpose(0, 1),
        v.float().transpose(0, 1),
        is_causal=True,
    )
    return out.transpose(0, 1)


def _segment_of(cu: np.ndarray, token: int) -> int:
    return int(np.searchsorted(cu, token, side="right")) - 1


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _label(
    shard: str, r: int, row: dict, a: int, b: int, j: int | None = None
) -> tuple[str, int, int | None]:
    """Name the j-th sample as the position ids delimit it (tokens a..b-1): sample_index[j]
    when the row lists that many, else by the cu_seqlens segment holding token a."""
    cu = np.asarray(row["cu_seqlens"])
    idx = row["sample_index"]
    k = j if j is not None and j < len(idx) else _segment_of(cu, a)
    if 0 <= k < len(idx):
        off = int(row["sample_offset"][k])
        name = f"sample {int(idx[k])}" + (f" (piece at token {off})" if off else "")
        return f"{shard} row {r}, {name} (tokens {a}..{b - 1})", k, int(idx[k])
    return f"{shard} row {r}, padding (tokens {a}..{b - 1})", k, None


def _failure(item: RowInput, label: tuple, text: str) -> Failure:
    """A failure about one sample of a checked row, placed as `_label` names it."""
    place, seg, idx = label
    return Failure(f"{place}: {text}", shard=item.shard, row=item.row, sample=idx, segment=seg)


def run_attention(
    rows: list[RowInput],
    backend: Backend,
    dtype: str,
    seed: int,
    isolation: CheckResult,
    control: CheckResult,
    on_row: Callable[[int, int], None] | None = None,
) -> None:
    """Packed forward vs each sample alone (isolation), and plain causal (negative control).

    on_row(done, total) after each row: on the CPU a row of 4k tokens takes seconds.
    """
    import torch

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    tol = TOLERANCE[dtype]
    threshold = LEAK_FACTOR * tol
    dev = backend.device
    iso_max = ref_max = first_max = 0.0
    leaks: list[float] = []
    tokens = samples = 0
    packed_seconds = 0.0
    t_start = time.perf_counter()
    if on_row:
        on_row(0, len(rows))
    with torch.inference_mode():
        for done, item in enumerate(rows, 1):
            row = item.data
            ids = np.asarray(row["input_ids"])
            n = len(ids)
            q, k, v = qkv_from_tokens(ids, seed, dev, torch_dtype)
            cu = torch.tensor(np.asarray(row["cu_seqlens"]), dtype=torch.int32, device=dev)
            max_seqlen = int(np.diff(np.asarray(row["cu_seqlens"])).max())
            _sync(dev)
            t0 = time.perf_counter()
            packed = backend.forward(q, k, v, cu, max_seqlen)
            _sync(dev)
            packed_seconds += time.perf_counter() - t0
            whole = torch.tensor([0, n], dtype=torch.int32, device=dev)
            causal = backend.forward(q, k, v, whole, n).float()
            packed = packed.float()
            tokens += n
            for j, (a, b) in enumerate(alone_segments(row["position_ids"])):
                samples += 1
                seg_cu = torch.tensor([0, b - a], dtype=torch.int32, device=dev)
                alone = backend.forward(q[a:b], k[a:b], v[a:b], seg_cu, b - a).float()
                iso = float((packed[a:b] - alone).abs().max())
                ref = float((packed[a:b] - _reference(q[a:b], k[a:b], v[a:b])).abs().max())
                leak = float((causal[a:b] - alone).abs().max())
                iso_max, ref_max = max(iso_max, iso), max(ref_max, ref)
                label = _label(item.shard, item.row, row, a, b, j)
                if iso > tol:
                    isolation.fail(
                        _failure(
                            item,
                            label,
                            f"the packed {backend.name} forward differs from "
                            f"the sample run alone by {iso:.3g} (tolerance {tol:g}): attention "
                            "crosses a sample boundary",
                        )
                    )
                elif ref > tol:
                    isolation.fail(
                        _failure(
                            item,
                            label,
                            f"the packed {backend.name} forward differs from "
                            f"the fp32 reference by {ref:.3g} (tolerance {tol:g})",
                        )
                    )
                if j == 0:
                    first_max = max(first_max, leak)
                    continue
                leaks.append(leak)
                if leak <= threshold:
                    control.fail(
                        _failure(
                            item,
                            label,
                            f"plain causal attention over the whole "
                            f"row changes this sample by only {leak:.3g} (needs > {threshold:g}): "
                            "the check could not see a leak here, so it proves nothing",
                        )
                    )
            if on_row:
                on_row(done, len(rows))
    synthetic = False
    if not leaks and rows:
        leaks.append(_synthetic_control(rows, backend, torch_dtype, seed))
        synthetic = True
        if leaks[0] <= threshold:
            control.fail(
                Failure(
                    f"plain causal attention over two joined "
                    f"samples changes the second by only {leaks[0]:.3g} (needs > "
                    f"{threshold:g}): the check could not see a leak",
                )
            )
    elapsed = time.perf_counter() - t_start
    isolation.details.update(
        {
            "backend": backend.name,
            "device": dev,
            "dtype": dtype,
            "call": backend.call,
            "rows": len(rows),
            "samples": samples,
            "tokens": tokens,
            "max_isolated_diff": iso_max,
            "max_reference_diff": ref_max,
            "tolerance": tol,
            "seconds": round(elapsed, 3),
            "packed_seconds_per_million_tokens": round(packed_seconds / tokens * 1e6, 4)
            if tokens
            else None,
            "seconds_per_million_tokens": round(elapsed / tokens * 1e6, 4) if tokens else None,
        }
    )
    control.details.update(
        {
            "backend": backend.name,
            "dtype": dtype,
            "min_leak": min(leaks) if leaks else None,
            "max_leak": max(leaks) if leaks else None,
            "first_sample_diff": first_max,
            "threshold": threshold,
            "samples_measured": len(leaks),
            "synthetic": synthetic,
        }
    )
    if not rows:
        isolation.ran = control.ran = False
        isolation.skipped_reason = control.skipped_reason = "no usable row to run"


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


def pick_rows(
    candidates: list[tuple[int, int, int]], count: int | None, seed: int
) -> list[tuple[int, int]]:
    """Rows to run, from (shard number, row, segments) of usable rows: all when count is None,
    else `count` picked with the seed, rows holding two or more samples first."""
    if count is None:
        return [(s, r) for s, r, _ in candidates]
    rng = np.random.default_rng(seed)
    multi = [c for c in candidates if c[2] > 1]
    single = [c for c in candidates if c[2] <= 1]
    chosen = [multi[i] for i in rng.permutation(len(multi))[:count]]
    if len(chosen) < count:
        chosen += [single[i] for i in rng.permutation(len(single))[: count - len(chosen)]]
    return sorted((s, r) for s, r, _ in chosen)
