"""packer: offline sample packing for LLM training, with isolation you can verify.

The public names resolve on first use, so that `import packer.contract` or `import packer.torch`
(and `packer --help`) load neither numba nor the pipeline they do not need.
"""

from __future__ import annotations

from packer import starting as _starting

if _starting.is_command_line():  # first: a signal while the command imports ends it in one line
    _starting.exit_while_starting()

import importlib  # noqa: E402

from packer.version import __version__  # noqa: E402

# public name -> the module that defines it
_PUBLIC = {
    "PackConfig": "packer.config",
    "PackResult": "packer.pipelines.result",
    "PackedInputError": "packer.contract.outputs",
    "export": "packer.export.run",
    "Plan": "packer.planning.strategies",
    "lower_bound": "packer.planning.strategies",
    "pack": "packer.pipelines.pack",
    "pack_dataset": "packer.pipelines.dataset",
    "plan": "packer.planning.strategies",
    "read_manifest": "packer.contract.manifest",
    "read_samples": "packer.read.assemble",
}

__all__ = [
    "PackConfig",
    "PackResult",
    "PackedInputError",
    "Plan",
    "__version__",
    "export",
    "lower_bound",
    "pack",
    "pack_dataset",
    "plan",
    "read_manifest",
    "read_samples",
]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})
