"""Resuming a block mixture whose validation output was committed before it was killed.

A split's two outputs are committed one after the other, the validation output first; a run
killed between the two leaves the validation output in place and the training output's
temporary directory behind. `--resume` then keeps the validation output when its manifest is
the one this run would write (the same packer, configuration, input files, sources, split and
seed, and `validation_of` this training output: the held-out samples depend on nothing else)
and packs the training output alone. Any other output in its place is refused in one line
naming what differs and how to start over.
"""

from __future__ import annotations

import json
from pathlib import Path

from packer.config import PackConfig
from packer.contract.names import MANIFEST
from packer.errors import UsageError, option
from packer.pipelines.mixture.select import MixSource
from packer.read.files import fingerprint
from packer.storage import display
from packer.version import __version__


def finished_validation(out: Path, validation_output, resume: bool, overwrite: bool):
    """The validation output a resumed run may keep: its path when `resume` (not
    `overwrite`) finds a committed output there, else None (the usual checks apply)."""
    if not resume or overwrite:
        return None
    dest = Path(validation_output) if validation_output is not None else None
    dest = dest if dest is not None else out.with_name(f"{out.name}-validation")
    return dest if (dest / MANIFEST).is_file() else None


def check_finished_validation(
    vout: Path,
    out: Path,
    cfg: PackConfig,
    sources: list[MixSource],
    files: list[list],
    split,
) -> dict:
    """The `mixture.validation` entry of the training manifest, once the committed validation
    output at `vout` is found to be this run's; else one `UsageError` naming what differs."""
    what = _differs(vout, out, cfg, sources, files, split)
    if what is not None:
        raise UsageError(
            f"cannot resume: {display(vout)} holds a validation output that this run would "
            f"not write ({what}); pass {option('overwrite=True', '--overwrite')} to pack both "
            "outputs from the start",
            where=display(out),
        )
    return {"output": display(vout), "split": split, "seed": cfg.seed}


def _differs(vout: Path, out: Path, cfg, sources, files, split) -> str | None:
    """What differs between the committed validation output and this run's, in words."""
    try:
        manifest = json.loads((vout / MANIFEST).read_text())
    except (OSError, ValueError):
        return "its manifest.json cannot be read"
    mixture = manifest.get("mixture") if isinstance(manifest, dict) else None
    if not isinstance(mixture, dict) or mixture.get("validation_of") is None:
        return "it is not a validation output"
    if manifest.get("packer_version") != __version__:
        return f"packer {manifest.get('packer_version')}, this is {__version__}"
    of = str(mixture["validation_of"])
    if of != display(out) and Path(of).resolve() != out.resolve():
        return f"it holds the samples held out of {of}"
    if mixture.get("validation_split") != split:
        return f"{option('validation_split')} {mixture.get('validation_split')}, not {split}"
    if manifest.get("config") != json.loads(json.dumps(cfg.to_dict())):
        return "another configuration"
    named = [
        (s.raw or (s.paths[0] if len(s.paths) == 1 else list(s.paths)), dict(s.columns))
        for s in sources
    ]
    recorded = [(s.get("path"), s.get("columns") or {}) for s in mixture.get("sources") or []]
    if named != recorded:
        return "other sources"
    return _inputs_differ(manifest.get("inputs") or [], [f for part in files for f in part])


def _inputs_differ(recorded: list, files: list) -> str | None:
    """The input files against the manifest's: the same, in order, with the same sizes and
    fingerprints."""
    if [str(Path(str(e.get("path")))) for e in recorded] != [str(Path(display(f))) for f in files]:
        return "other input files"
    for entry, f in zip(recorded, files):
        if entry.get("fingerprint") != fingerprint(f):
            return f"the input {display(f)} changed"
    return None
