"""Start-up: `packer warmup` fills the JIT cache so that `pack` compiles nothing, a run on an
empty cache still fails cleanly, and the numpy id checks that replaced a kernel on the read
path agree with their plain-Python reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import make_samples, python_script, write_jsonl, write_parquet
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.contract.names import IGNORE_INDEX
from packer.read.flatten import ids_valid
from packer.read.reasons import INT32_MAX
from packer.read.samples import as_chunks

# Runs several CLI commands in one interpreter (a JSON list of argument lists) and prints, last,
# a JSON list of the kernels numba compiled during each (not cache loads). One process for them
# all sees every compilation a process per command would: a kernel missing from the cache
# compiles in the first command that calls it.
COMPILES = """
import json
import sys
from numba.core import event

compiled = []


class Listener(event.Listener):
    def on_start(self, ev):
        compiled.append(ev.data["dispatcher"].py_func.__qualname__)

    def on_end(self, ev):
        pass


event.register("numba:compile", Listener())
from packer.cli.app import app

report = []
for args in json.loads(sys.argv[1]):
    del compiled[:]
    code = app(args=args, standalone_mode=False)
    report.append({"args": args, "code": code or 0, "compiled": list(compiled)})
print(json.dumps(report))
"""


def packer(args: list, cache: Path, script: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    head = ["-c", script] if script else ["-m", "packer"]
    return subprocess.run(
        [sys.executable, *head, *[str(a) for a in args]],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def compiles(commands: list[list], cache: Path) -> list[dict]:
    """Each command's exit code and the kernels it compiled, all run in one fresh process."""
    run = packer([json.dumps([[str(a) for a in c] for c in commands])], cache, COMPILES)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_after_warmup_pack_and_export_compile_nothing(tmp_path):
    cache = tmp_path / "jit"
    data = write_jsonl(tmp_path / "d.jsonl.gz", make_samples(300), compress="gzip")
    warm = packer(["warmup"], cache)
    assert warm.returncode == 0, warm.stderr
    assert "packer.planning.kernels._best_fit" in warm.stderr
    assert "packer.write.gather.gather_rows" in warm.stderr
    assert any(cache.rglob("*.nbc"))
    # made apart, in a process whose compilations are not checked: the padded output and not
    unpadded = tmp_path / "unpadded"
    made = packer(["pack", data, "-o", unpadded, "-L", 512, "--overlength", "split"], cache)
    assert made.returncode == 0, made.stderr

    out = tmp_path / "out"
    commands = [
        ["pack", data, "-o", out, "--overwrite", "-L", 512, "--overlength", "truncate"],
        ["pack", data, "-o", out, "--overwrite", "-L", 64, "--strategy", "histogram", "--pad"]
        + ["--overlength", "split"],
    ]
    for fmt in ("mds", "trl", "megatron", "megatron-bridge"):
        for src in (out, unpadded):
            commands.append(["export", src, "--to", fmt, "-o", tmp_path / f"{src.name}-{fmt}"])
    report = compiles(commands, cache)
    assert len(report) == len(commands)
    for each in report:
        assert each["code"] == 0 and each["compiled"] == [], each

    again = packer(["warmup", "--json"], cache)
    assert again.returncode == 0, again.stderr
    assert '"compiled": []' in again.stdout


def test_reading_parquet_leaves_pyarrow_dataset_unloaded(tmp_path):
    """pq.read_table imports pyarrow.dataset (about 0.5 s of a run's start-up); a Parquet
    input is read through ParquetFile, whole or a row group at a time, without it."""
    samples = make_samples(40, seed=3)
    src = write_parquet(tmp_path / "d.parquet", samples)
    code = (
        "import sys; from pathlib import Path; from packer.read.assemble import read_file; "
        f"source, tokens, lengths, labels, kept = read_file(Path({str(src)!r})); "
        "print(len(lengths), int(lengths.sum()), 'pyarrow.dataset' in sys.modules)"
    )
    run = python_script(code, timeout=300)
    assert run.returncode == 0, run.stderr
    total = sum(len(s["input_ids"]) for s in samples)
    assert run.stdout.split() == [str(len(samples)), str(total), "False"]


def test_a_run_on_an_empty_cache_fails_with_one_error_line(tmp_path):
    """The kernels compile in a background thread while the input is read; a bad input stops
    the run with its usual message, and the thread does not outlive it."""
    data = tmp_path / "bad.jsonl"
    data.write_text('{"input_ids": [1, 2]}\n{"input_ids": [3, \n')
    run = packer(["pack", data, "-L", 64, "-o", tmp_path / "out"], tmp_path / "jit")
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()


def ids_valid_reference(values: list[int], allow_ignore: bool) -> bool:
    return all(0 <= v <= INT32_MAX or (allow_ignore and v == IGNORE_INDEX) for v in values)


ids = st.one_of(
    st.integers(0, 50),
    st.sampled_from([IGNORE_INDEX, -1, -101, INT32_MAX, INT32_MAX + 1, -(2**40)]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(ids, max_size=12), st.booleans())
def test_ids_valid_matches_reference(values, allow_ignore):
    want = ids_valid_reference(values, allow_ignore)
    assert ids_valid(np.array(values, np.int64), allow_ignore) == want
    for dtype in (np.int32, np.int16, np.uint32, np.uint64):  # each that holds the values
        info = np.iinfo(dtype)
        if all(info.min <= v <= info.max for v in values):
            assert ids_valid(np.array(values, dtype), allow_ignore) == want, dtype


def test_gather_chunks_are_int32_arrays_with_their_addresses():
    a = np.arange(5, dtype=np.int32)
    b = np.arange(3, dtype=np.int32)
    chunks = as_chunks([a, b])
    assert list(chunks.addresses) == [a.ctypes.data, b.ctypes.data]
    assert chunks[0] is a and chunks[1] is b  # the arrays live as long as their addresses
    for wrong in (np.arange(5, dtype=np.int64), np.arange(10, dtype=np.int32)[::2]):
        try:
            as_chunks([wrong])
        except TypeError:
            continue
        raise AssertionError("a chunk the kernel cannot read was accepted")
