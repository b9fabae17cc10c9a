"""Build `.venv-readers`: the trainers' own readers that prove `packer export`, kept apart.

megatron-core (Megatron-LM's IndexedDataset), megatron-bridge (its packed Parquet dataset and
collate_fn) and mosaicml-streaming (StreamingDataset, MDSWriter) are never dependencies of
packer: streaming pins an old huggingface_hub, transformers and torch that break datasets 5
beside it, and Bridge needs CUDA-only packages (transformer-engine, flashinfer, triton). They
go, without their dependencies, into a virtualenv of their own that sees the dev environment's
packages (torch, numpy, pyarrow, datasets) through a .pth file, with the few small modules
their imports need. megatron-core 0.18 and megatron-bridge 0.6 declare Python >= 3.12; the
modules the tests run import and run on 3.11, so they are installed with
`--ignore-requires-python`. Built once (a lock file keeps two test workers from building it
together), then reused; `make readers` runs this script.

Usage: python scripts/readers_venv.py [DIR]   (default: .venv-readers beside the repo's files)
"""

from __future__ import annotations

import fcntl
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = [
    # GPTDataset's inter-document masking is new in 0.19; Bridge 0.6.0's data path runs on it
    "megatron-core==0.19.2",
    "megatron-bridge==0.6.0",
    "mosaicml-streaming==0.13.0",
    # what streaming's modules import at load time (compression codecs, PIL for its image
    # encodings, catalogue for its registry); all small
    "brotli==1.2.1",
    "python-snappy==0.7.3",
    "cramjam==2.14.0",
    "zstd==1.5.7.2",
    "pillow==13.0.0",
    "catalogue==2.0.10",
]
STAMP = ".readers-installed"


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


def build(env: Path) -> Path:
    env.parent.mkdir(parents=True, exist_ok=True)
    with open(env.parent / f"{env.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = env / STAMP
        wanted = "\n".join(PACKAGES)
        if stamp.is_file() and stamp.read_text() == wanted:
            return python_of(env)
        venv.EnvBuilder(clear=True, with_pip=True).create(env)
        site = subprocess.run(
            [
                str(python_of(env)),
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        # the dev environment's torch and numpy, seen from the readers' env
        Path(site, "dev_site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run(
            [
                str(python_of(env)),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-compile",  # compiled on first import instead (make test keeps bytecode)
                "--ignore-requires-python",
                *PACKAGES,
            ],
            check=True,
        )
        stamp.write_text(wanted)
    return python_of(env)


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".venv-readers"
    print(build(target))
