"""packer: offline sample packing for LLM training, with isolation you can verify."""

__version__ = "0.1.0"

from packer.config import PackConfig  # noqa: E402
from packer.in_memory import pack_dataset  # noqa: E402
from packer.own_outputs import PackedInputError  # noqa: E402
from packer.pipeline import PackResult, pack, read_manifest  # noqa: E402
from packer.planning.strategies import Plan, lower_bound, plan  # noqa: E402
from packer.read.assemble import read_samples  # noqa: E402

__all__ = [
    "PackConfig",
    "PackResult",
    "PackedInputError",
    "Plan",
    "__version__",
    "lower_bound",
    "pack",
    "pack_dataset",
    "plan",
    "read_manifest",
    "read_samples",
]
