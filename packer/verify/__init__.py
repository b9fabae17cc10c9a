"""`verify`: prove that no packed sample can see or predict another.

Checks, in order: the structure of every row and the manifest (CPU, numba, no torch), the
samples against the source (`inputs`), attention isolation on picked rows with a negative
control, and optionally a tiny transformers model (`model_check`) and the user's own model
(`model_dir`). Torch is imported only when the attention or model checks run; with
`attention=False` they are reported as not run (`ran: false` and the reason).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from packer import arguments as A
from packer.contract.remote import local_copy
from packer.errors import UsageError, option
from packer.storage import display, is_url
from packer.verify.memory import budget_bytes, check_budget, return_freed_blocks
from packer.verify.output_version import OutputVersion
from packer.verify.result import CheckResult, Failure, VerificationFailed, VerifyResult

__all__ = ["CheckResult", "Failure", "VerificationFailed", "VerifyResult", "verify"]

DEFAULT_ROWS = 16


def parse_rows(value: str | int | None) -> int | None:
    """--rows: a positive count, or 'all' (None)."""
    if value is None:
        return DEFAULT_ROWS
    if isinstance(value, int):
        count = value
    elif str(value).strip().lower() == "all":
        return None
    else:
        try:
            count = int(str(value))
        except ValueError:
            raise UsageError(
                f"{option('rows')} must be a positive integer or 'all', got {value!r}"
            ) from None
    if count < 1:
        raise UsageError(f"{option('rows')} must be a positive integer or 'all', got {value!r}")
    return count


def torch_missing() -> str:
    return (
        "the attention check needs torch (packer's 'verify' extra): pip install torch, or pass "
        f"{option('attention=False', '--no-attention')} for the structural checks alone"
    )


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError(torch_missing()) from None


def _not_run(name: str, reason: str) -> CheckResult:
    return CheckResult(name, ran=False, skipped_reason=reason)


Progress = Callable[[str, int, int], None]
OnRow = Callable[[int, int], None]  # (rows done, rows in all), as a check goes

# The stages `verify` reports to its `progress` callback: (stage, done, total).
STAGE_INPUT = "reading the --input files"  # done counts files; the total is not known ahead
STAGE_STRUCTURE = "checking every row"
STAGE_ATTENTION = "attention rows"
STAGE_CP_ATTENTION = "CP ring attention rows"
STAGE_MODEL = "model rows"
STAGE_USER_MODEL = "your model's rows"


def verify(
    output_dir: str | Path,
    inputs: Iterable[str | Path] | None = None,
    *,
    backend: str = "auto",
    rows: str | int | None = DEFAULT_ROWS,
    dtype: str | None = None,
    seed: int = 0,
    model_check: bool = False,
    attention: bool = True,
    model_dir: str | Path | None = None,
    progress: Progress | None = None,
    cp_size: int | None = None,
    memory_budget: int | str | None = None,
) -> VerifyResult:
    """Verify a packer output; the result says which checks passed and what differs where.

    `rows` is how many rows the attention (and model) checks run: an int, or 'all'. `dtype`
    defaults to bf16 on a GPU backend and fp32 on the CPU. `attention=False` runs the CPU
    structure, manifest and input checks alone (no torch); the others are reported as not run.
    `model_dir`: a local transformers checkpoint or config directory whose model must give each
    sample the same logits packed as alone (`packer.torch.check_isolation`).
    `progress(stage, done, total)` is called as each check goes (the CLI draws it; the library
    prints nothing).
    `cp_size`: on an output packed without `--cp-size`, whether every row can be split for
    that CP size (the `cp` check); a CP output is checked for its own CP size regardless.
    `memory_budget` (bytes or a size such as "4GiB"; default min(8 GiB, half of available
    memory), as for `pack`): the CPU attention runs in blocks that fit it; a budget below what
    the output's rows need at least is a `UsageError` before any check runs.

    Every file is read from one version of the output: if it is replaced while it is checked
    (`pack --overwrite`), the checks run again on the new one; replaced again, a `UsageError`.
    """
    from packer.verify.kernels import load  # here: `import packer.verify` stays light

    t0 = time.perf_counter()
    load()  # before any check: a signal cannot land inside numba's loading
    # a remote output: what the store holds now is checked, not an earlier copy of it
    out = local_copy(output_dir, check_store=True) if is_url(output_dir) else Path(output_dir)
    version = OutputVersion(out)
    try:
        count = parse_rows(rows)
        seed = A.integer(seed, "seed", minimum=0)
        cp_size = A.integer(cp_size, "cp_size", minimum=1, none=True)
        budget = budget_bytes(memory_budget)
        chosen = _backend(attention, backend, dtype, model_check, model_dir, budget)

        def run(path: Path, manifest: dict, source) -> dict:
            if chosen is not None:  # before any work: refuse a budget the rows cannot run in
                check_budget(int(manifest["config"]["max_len"]), chosen[0], model_check, budget)
                return_freed_blocks()
            return _run_checks(
                path,
                manifest,
                source,
                chosen,
                count,
                seed,
                model_check,
                model_dir,
                dtype,
                progress,
                cp_size,
                budget,
            )

        inputs = list(inputs or [])
        source, columns = None, None
        for attempt in range(2):
            manifest = version.manifest
            if inputs and columns != _columns(manifest):
                columns = _columns(manifest)
                source = _read_source(inputs, manifest, progress)
            checks = _checks_of_version(version, source, run)
            if checks is not None:
                return VerifyResult(display(out), checks, seconds=time.perf_counter() - t0)
            version.close()
            if attempt == 0:
                version = OutputVersion(out)
    finally:
        version.close()
    raise UsageError(
        "the output changed while it was being verified, twice (a pack --overwrite of it?); "
        "verify it once nothing writes it",
        where=display(out),
    )


def _backend(attention: bool, backend: str, dtype, model_check: bool, model_dir, budget: int):
    """The attention backend and dtype to use (None without attention): usage errors come
    before any work."""
    if attention:
        _require_torch()
        from packer.verify.backends import resolve

        return resolve(backend, dtype, budget)
    if model_check or model_dir is not None:
        asked = (
            option("model_check", "--model-check")
            if model_check
            else option("model_dir", "--model")
        )
        raise UsageError(
            f"{option('attention=False', '--no-attention')} runs the structural checks "
            f"alone; drop it to use {asked}"
        )
    return None


def _checks_of_version(version: OutputVersion, source, run) -> dict | None:
    """The checks of this version of the output, paths shown as the user gave them; None when
    the output was replaced while they ran (a file gone mid-read, or a new manifest)."""
    try:
        checks = run(version.path, version.manifest, source)
    except Exception as exc:
        if not version.changed():
            if isinstance(exc, OSError) and isinstance(exc.filename, str):
                exc.filename = version.shown_path(exc.filename)
            raise
        return None
    for check in checks.values():
        for failure in check.failures:
            failure.message = version.shown_path(failure.message)
    return None if version.changed() else checks


def _columns(manifest: dict) -> tuple:
    """The source columns the output was packed from (how `--input` is read)."""
    cfg = manifest["config"]
    if cfg.get("pairs"):
        return "pairs", cfg["prompt_column"], cfg["chosen_column"], cfg["rejected_column"]
    if _by_source(manifest):
        from packer.verify.mixture_input import source_columns

        return "mixture", source_columns(manifest)
    labels = cfg["labels_column"]  # read where the inputs have it, as pack read it
    return cfg["input_column"], A.ColumnName(labels) if labels else None


def _by_source(manifest: dict) -> bool:
    """Whether `--input` is read source by source: a mixture of several sources, or of one
    with columns of its own."""
    mixture = manifest.get("mixture")
    if not mixture:
        return False
    sources = mixture["sources"]
    return len(sources) > 1 or any(s.get("columns") for s in sources)


def _read_source(inputs: list, manifest: dict, progress: Progress | None = None):
    """The `--input` samples (or pairs, for a pairs output), bad ones counted, not raised."""
    columns = _columns(manifest)
    on_file = None
    if progress is not None:  # a stage of its own: reading a large input takes a while
        files = [0]
        progress(STAGE_INPUT, 0, 0)

        def on_file(path) -> None:
            files[0] += 1
            progress(STAGE_INPUT, files[0], 0)

    if columns[0] == "pairs":
        from packer.read.pairs import read_pairs

        return read_pairs(inputs, columns[1:], on_error="skip", progress=on_file)
    if columns[0] == "mixture":
        from packer.verify.mixture_input import read_mixture_input

        return read_mixture_input(inputs, manifest, on_file)
    from packer.read.assemble import read_samples

    # verify counts rejects
    return read_samples(inputs, *columns, on_error="skip", progress=on_file)


def _check_mixture(out: Path, manifest: dict, result: CheckResult) -> None:
    from packer.verify.mixture import check_mixture  # here: numpy and pyarrow, only for it

    check_mixture(out, manifest, result)


def _run_checks(
    out: Path,
    manifest: dict,
    source,
    chosen,
    count: int | None,
    seed: int,
    model_check: bool,
    model_dir: str | Path | None,
    dtype: str | None,
    progress: Progress | None,
    cp_size: int | None = None,
    budget: int | None = None,
) -> dict[str, CheckResult]:
    """Every check on the output read through `out` (one version of it)."""
    from packer.verify.structure import check_structure

    checks: dict[str, CheckResult] = {}

    def add(check: CheckResult) -> CheckResult:
        """Reports are keyed by the check's own name, so the two cannot disagree."""
        checks[check.name] = check
        return check

    structure, manifest_check = add(CheckResult("structure")), add(CheckResult("manifest"))
    input_check = add(
        CheckResult("input") if source is not None else _not_run("input", "no --input given")
    )
    on_shard = _stage(progress, STAGE_STRUCTURE)
    pairs = bool(manifest["config"].get("pairs"))
    statuses = check_structure(
        out, manifest, None if pairs else source, structure, manifest_check, input_check, on_shard
    )
    if manifest.get("mixture") is not None:  # each source's tokens, from sample_source
        _check_mixture(out, manifest, add(CheckResult("mixture")))
    if pairs:
        from packer.verify.pairs import check_pairs

        pairs_check = add(CheckResult("pairs"))
        check_pairs(out, statuses, pairs_check, manifest, source, input_check)
    packed_cp = int(manifest["config"].get("cp_size", 1))
    cp_check = None
    if packed_cp > 1 or (cp_size or 1) > 1:
        from packer.verify.cp_check import check_cp_split

        cp_check = add(CheckResult("cp"))
        check_cp_split(statuses, packed_cp, cp_size, cp_check)

    if chosen is None:
        cp_names = ("cp_attention",) if cp_check is not None else ()
        for name in ("attention", "negative_control", *cp_names, "model", "user_model"):
            add(_not_run(name, "--no-attention was given"))
        return checks
    import numpy as np  # here: `import packer.verify` (the CLI's help) stays light

    from packer.verify.attention import run_attention
    from packer.verify.picked_rows import RowInput, pick_rows

    candidates = []
    for s, st in enumerate(statuses):
        usable = st.cu_usable
        n_seg = np.diff(st.shard.cu_off) - 1  # cu_seqlens has one entry more than segments
        candidates += [(s, int(r), int(n_seg[r])) for r in range(st.shard.rows) if usable[r]]
    picked = [
        RowInput(statuses[s].shard.name, statuses[s].shard.shard_row(r), statuses[s].shard.row(r))
        for s, r in pick_rows(candidates, count, seed)
    ]
    attention_check = add(CheckResult("attention"))
    control = add(CheckResult("negative_control"))
    backend_obj, dtype_name = chosen
    on_row = _stage(progress, STAGE_ATTENTION)
    run_attention(picked, backend_obj, dtype_name, seed, attention_check, control, on_row, budget)
    if cp_check is not None:
        from packer.verify.cp_attention import run_cp_attention

        size = cp_size if cp_size and cp_size > 1 else packed_cp
        on_row = _stage(progress, STAGE_CP_ATTENTION)
        cp_result = add(CheckResult("cp_attention"))
        run_cp_attention(statuses, size, count, seed, cp_result, on_row, budget)
    if model_check:
        from packer.verify.model_check import run_model_check

        model_result = add(CheckResult("model"))
        run_model_check(picked, seed, model_result, _stage(progress, STAGE_MODEL), budget)
    else:
        add(_not_run("model", "not asked (--model-check)"))
    if model_dir is not None:
        from packer.verify.user_model import run_user_model

        on_row = _stage(progress, STAGE_USER_MODEL)
        run_user_model(picked, model_dir, seed, dtype, add(CheckResult("user_model")), on_row)
    else:
        add(_not_run("user_model", "not asked (--model DIR)"))
    return checks


def _stage(progress: Progress | None, stage: str) -> OnRow | None:
    """The `on_row(done, total)` of one check: `progress(stage, done, total)`."""
    if progress is None:
        return None
    return lambda done, total: progress(stage, done, total)
