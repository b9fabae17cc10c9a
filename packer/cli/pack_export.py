"""`packer pack --export FORMAT`: the export target and the configuration checked before any
packing, then each packed output (the validation output's too) exported as `packer export`
would with its defaults."""

from __future__ import annotations

from pathlib import Path


def export_target(fmt: str | None, dest: Path | None, output: str, overwrite: bool):
    """Where `--export` writes, refused before any packing if it cannot be written."""
    from packer.errors import UsageError
    from packer.storage import is_url

    if fmt is None:
        if dest is not None:
            raise UsageError("--export-output needs --export FORMAT")
        return None
    from packer.export import FORMATS, check_destination, check_outside

    if fmt not in FORMATS:
        raise UsageError(f"--export must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if is_url(output):
        raise UsageError(
            "--export writes beside a local output; export a URL's output with "
            "packer export after packing",
            where=output,
        )
    output = Path(output)
    dest = dest if dest is not None else output.with_name(f"{output.name}-{fmt}")
    check_outside(dest, output, "--export-output")
    check_destination(dest, overwrite)
    return dest


def check_export_config(export_to: str | None, cfg, memory_budget) -> None:
    """Refuse, before packing, an --export that the packed output could not take."""
    if export_to is None:  # the exporters import numba: only when asked
        return
    from packer.errors import UsageError
    from packer.export.mds import DEFAULT_SIZE_LIMIT
    from packer.export.run import batch_tokens

    batch_tokens(cfg.max_len, export_to, memory_budget, DEFAULT_SIZE_LIMIT)
    if cfg.pairs:
        raise UsageError(
            "--export cannot be used with --pairs: the export formats have no pairs and "
            "would train each side as a separate sample"
        )
    if export_to == "megatron-bridge" and cfg.segment_multiple > 1:
        flag = "--cp-size" if cfg.cp_size > 1 else "--sequence-parallel"
        raise UsageError(
            f"--export megatron-bridge cannot be used with {flag}: Bridge's CP layout "
            "needs the EOS id; pack, then run packer export OUTPUT --to megatron-bridge "
            "--eos-id ID"
        )


def export_outputs(targets, fmt: str, overwrite: bool, memory_budget) -> dict:
    """`--export`: each (report key, packed output, destination) exported in turn, its
    warnings printed; the exports' reports by key."""
    from packer.cli.render import print_warnings
    from packer.export import export

    reports = {}
    for key, packed, dest in targets:
        exported = export(packed, fmt, dest, overwrite=overwrite, memory_budget=memory_budget)
        reports[key] = exported.to_dict()
        print_warnings(exported.warnings)
    return reports
