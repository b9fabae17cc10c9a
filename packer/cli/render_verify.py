"""Human rendering of a `VerifyResult` (rich, on stderr); `--json` prints `to_dict()` instead."""

from __future__ import annotations

from rich.table import Table

from packer.errors import count
from packer.verify.result import VerifyResult


def _kernel(kernel: dict | None) -> str:
    """What compiled FlexAttention did: its compiles and the bucket lengths it ran."""
    if not kernel or not kernel.get("compiled"):
        return ""
    lengths = ", ".join(f"{n:,}" for n in kernel.get("lengths", []))
    return f"; compiled: {_n(kernel, 'compiles', 'compile')} for lengths {lengths}"


def _n(d: dict, key: str, noun: str) -> str:
    """`1 row`, `2 rows`; `- rows` where the report lacks the count."""
    x = d.get(key)
    return count(x, noun) if isinstance(x, int) else f"{_fmt(x)} {noun}s"


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _summary(name: str, d: dict) -> str:
    if name == "structure":
        return (
            f"{_n(d, 'rows', 'row')}, {_n(d, 'samples', 'sample')}, "
            f"{_n(d, 'tokens', 'token')} in {_n(d, 'shards', 'shard')}"
        )
    if name == "manifest":
        return f"{_n(d, 'shards', 'shard')}: counts and hashes"
    if name == "input":
        return f"{_n(d, 'samples', 'source sample')}, tokens and labels"
    if name == "pairs":
        return (
            f"{_n(d, 'pairs', 'pair')} whole, adjacent, in one row, one prompt "
            f"({_n(d, 'segments', 'segment')})"
        )
    if name == "mixture":
        return (
            f"{_n(d, 'sources', 'source')}: {_n(d, 'tokens', 'token')} and "
            f"{_n(d, 'samples', 'sample')} counted per source against the manifest"
        )
    if name == "cp":
        return f"cp_size {_fmt(d.get('cp_size'))}: {d.get('splits', '-')}"
    if name == "cp_attention":
        controls = ", ".join(
            f"{k.replace('_', ' ')} {_fmt(c.get('min_diff'))}"
            + ("" if c.get("caught") else " NOT caught")
            for k, c in (d.get("controls") or {}).items()
        )
        return (
            f"{_fmt(d.get('cp_size'))} ranks simulated (zigzag, ring, fp32), "
            f"{_n(d, 'rows', 'row')} / {_n(d, 'samples', 'sample')}: vs alone max diff "
            f"{_fmt(d.get('max_diff'))} (tolerance {_fmt(d.get('tolerance'))}); controls "
            f"{controls} (must exceed {_fmt(d.get('threshold'))})"
        )
    if name == "attention":
        return (
            f"{d.get('backend')} ({d.get('device')}, {d.get('dtype')}), "
            f"{_n(d, 'rows', 'row')} / {_n(d, 'samples', 'sample')}: packed vs "
            f"alone max diff {_fmt(d.get('max_isolated_diff'))}, vs fp32 reference "
            f"{_fmt(d.get('max_reference_diff'))} (tolerance {_fmt(d.get('tolerance'))}); "
            f"{_fmt(d.get('seconds_per_million_tokens'))} s per million tokens"
            + _kernel(d.get("kernel"))
        )
    if name == "negative_control":
        synthetic = " (two joined samples)" if d.get("synthetic") else ""
        return (
            f"plain causal leaks {_fmt(d.get('min_leak'))}..{_fmt(d.get('max_leak'))} into "
            f"{_n(d, 'samples_measured', 'later sample')}{synthetic} (must exceed "
            f"{_fmt(d.get('threshold'))})"
        )
    if name == "model":
        return (
            f"{_n(d, 'samples', 'sample')}: loss diff {_fmt(d.get('max_loss_diff'))}, "
            f"logits diff {_fmt(d.get('max_logits_diff'))}; causal-mask control "
            f"{_fmt(d.get('control_min_logits_leak'))}"
        )
    if name == "user_model":
        head = f"{d.get('model')} ({d.get('weights')}; {d.get('attn_implementation')}, {d.get('dtype')})"
        if d.get("unsupported"):
            return f"{head}: not run, its layers cannot keep packed samples apart here"
        return (
            f"{head}, {_n(d, 'samples', 'sample')}: logits diff "
            f"{_fmt(d.get('max_logits_diff'))}, loss diff {_fmt(d.get('max_loss_diff'))} "
            f"(tolerance {_fmt(d.get('tolerance'))}); one-sequence control "
            f"{_fmt(d.get('control_min_logits_leak'))}"
        )
    return ""


def verify_table(result: VerifyResult) -> Table:
    verdict = "[bold green]passed[/]" if result.ok else "[bold red]FAILED[/]"
    attention = result.checks.get("attention")
    if attention is None or not attention.ran:
        verdict += " [yellow](attention not checked)[/]"
    table = Table(
        title=f"packer verify → {result.output}: {verdict}", title_justify="left", show_header=True
    )
    table.add_column("check", style="bold")
    table.add_column("result")
    table.add_column("details")
    for name, check in result.checks.items():
        if not check.ran:
            table.add_row(name, "[dim]skipped[/]", check.skipped_reason or "")
            continue
        status = "[green]ok[/]" if check.ok else f"[red]{check.failure_count} failed[/]"
        table.add_row(name, status, _summary(name, check.details))
    return table
