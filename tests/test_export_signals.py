"""Ctrl-C and SIGTERM stop every command, on the first press, with 130/143 and one line.

`packer export --to mds|megatron` and `pack --repack` used to swallow the first Ctrl-C (it
landed in a lazy `import pandas` that Arrow runs on the main thread and clears the error of),
then ignore every later one, and commit their output with exit 0. SIGTERM killed an export
with no message and left its temporary directory. Each run here gets one signal at one of five
points between the command's start-up and its commit point (measured on an uninterrupted run:
PACKER_FAULT_COMMIT_PAUSE=0 marks the commit point on stderr) and must leave no output and no
temporary directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import python_script

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals"),
    pytest.mark.xdist_group("export_signals"),
]

ROOT = Path(__file__).resolve().parents[1]
FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)  # of the time from start-up to the commit point
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
LINES = {
    signal.SIGINT: "error: interrupted; no partial output was left\n",
    signal.SIGTERM: "error: terminated; no partial output was left\n",
}
MARK = "packer-fault: commit before\n"
DONE = {"export": "packer_export.json", "pack": "manifest.json"}  # written last, at the commit


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a shell starts background jobs without it


def start(*args) -> tuple[subprocess.Popen, list, float]:
    """The command, a list its stderr lines go to (with the time each came), its start time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_FAULT_COMMIT_PAUSE": "0"}
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "packer", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_default_sigint,
    )
    lines: list[tuple[float, str]] = []

    def read():
        for line in proc.stderr:
            lines.append((time.monotonic() - t0, line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc.reader = reader
    return proc, lines, t0


def finish(proc: subprocess.Popen, lines: list) -> tuple[int, str]:
    proc.wait(timeout=120)
    proc.reader.join(timeout=30)
    return proc.returncode, "".join(x for _, x in lines if not x.startswith("packer-fault:"))


def startup() -> float:
    """Seconds until a command has started (the interpreter, packer's CLI, its handlers)."""
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "packer", "--version"],
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
    )
    return time.monotonic() - t0


def commit_time(args, dest: Path) -> float:
    """Seconds from start to the commit point of an uninterrupted run (whose output is removed)."""
    proc, lines, _ = start(*args)
    code, stderr = finish(proc, lines)
    assert code == 0, stderr
    [t] = [t for t, x in lines if x == MARK]
    remove(dest)
    return t


def remove(path: Path) -> None:
    import shutil

    if path.exists():
        shutil.rmtree(path)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".packer-" in p.name)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    """A packed output of ~6M tokens: an export of it lasts a few seconds."""
    root = tmp_path_factory.mktemp("export_signals")
    rng = np.random.default_rng(7)
    lengths = rng.integers(20, 600, 20_000)
    offsets = np.zeros(lengths.size + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    data = root / "in.parquet"
    pq.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, ids)}), data)
    out = root / "packed"
    proc, lines, _ = start("pack", data, "-o", out, "-L", "4096", "--shard-rows", "200")
    code, stderr = finish(proc, lines)
    assert code == 0, stderr
    return out


def walk(args, dest: Path, signum: int) -> None:
    """One signal at each of five points of the run. Whatever the point, the run either stops
    with the signal's exit code and line, leaving neither `dest` nor a temporary directory, or
    (a point that fell after the commit point on this shared, busy machine) finishes with exit
    0 and a complete output. At least one point stops the run."""
    t_up = startup()
    t_commit = commit_time(args, dest)
    stopped = 0
    for fraction in FRACTIONS:
        at = t_up + fraction * max(t_commit - t_up, 0.1)
        proc, lines, t0 = start(*args)
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        proc.send_signal(signum)
        code, stderr = finish(proc, lines)
        if code == 0:
            # the signal came after the commit point (its note is missing when it lands while
            # the command exits after its report); a busy machine's timing cannot tell this
            # from a signal lost before the commit, so only the output's completeness is checked
            assert any(x == MARK for _, x in lines), (fraction, stderr)
            assert (dest / DONE[args[0]]).is_file(), (fraction, stderr)
            remove(dest)
        else:
            assert (code, stderr) == (CODES[signum], LINES[signum]), (fraction, stderr)
            assert not dest.exists()
            stopped += 1
        assert leftovers(dest.parent) == []
    assert stopped >= 1, "every point fell after the commit point"


@pytest.mark.parametrize("to", ["mds", "megatron"])
def test_ctrl_c_stops_an_export_at_five_points(packed, tmp_path, to):
    dest = tmp_path / "x"
    walk(("export", packed, "--to", to, "-o", dest), dest, signal.SIGINT)


def test_ctrl_c_stops_a_repack_at_five_points(packed, tmp_path):
    dest = tmp_path / "r"
    walk(("pack", packed, "--repack", "-L", "8192", "-o", dest), dest, signal.SIGINT)


def test_sigterm_stops_an_export_with_one_line(packed, tmp_path):
    dest = tmp_path / "x"
    walk(("export", packed, "--to", "mds", "-o", dest), dest, signal.SIGTERM)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_verify_with_one_line(packed, signum):
    """verify (its CPU attention over every row lasts long) stops on the first signal too."""
    proc, lines, _ = start("verify", packed, "--rows", "all")
    deadline = time.monotonic() + 60
    time.sleep(startup() + 0.5)
    assert proc.poll() is None and time.monotonic() < deadline
    proc.send_signal(signum)
    code, stderr = finish(proc, lines)
    assert (code, stderr.splitlines()[-1] + "\n") == (CODES[signum], LINES[signum]), stderr


def test_the_export_and_repack_paths_import_no_pandas(packed, tmp_path):
    """Arrow's `to_numpy` and `pa.array` import pandas the first time: on the main thread, in
    the middle of a run, where a Ctrl-C that lands in the import is lost."""
    script = (
        "import sys\n"
        "from packer import pack, PackConfig\n"
        "from packer.export import export\n"
        f"export({str(packed)!r}, 'mds', {str(tmp_path / 'm')!r})\n"
        f"export({str(packed)!r}, 'megatron', {str(tmp_path / 'g')!r})\n"
        f"pack([{str(packed)!r}], {str(tmp_path / 'r')!r}, PackConfig(max_len=8192), repack=True)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas')[:1])\n"
    )
    done = python_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_export_loads_its_code_ends_it_at_once(packed, tmp_path, signum):
    """The export's imports and its kernels' first load (numba's cache, llvmlite) come before
    it makes anything: a signal there ends it at once with its line (and --json's object),
    where an interrupt raised inside them left them half made (exit -11, a double free)."""
    dest = tmp_path / "x"
    _signalled_while_preparing(["export", packed, "--to", "mds", "-o", dest, "--json"], signum)
    assert not dest.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_verify_loads_its_code_ends_it_at_once(packed, signum):
    """verify's imports and its kernels' load (numba, llvmlite) come before its checks: a signal
    there ends it at once with its line and --json's object."""
    _signalled_while_preparing(["verify", packed, "--no-attention", "--json"], signum)


def _signalled_while_preparing(args: list, signum: int) -> None:
    """Run `packer ARGS` (with --json) paused in its `preparing` block, before its imports (numba's
    llvmlite is not loaded yet), send `signum` there: it ends at once with its one line, its
    status and --json's object."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKER_FAULT_PREPARE_PAUSE": "60"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "packer", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_default_sigint,
    )
    first = proc.stderr.readline()
    assert first == "packer-fault: preparing\n", first + proc.stderr.read()
    assert "llvmlite" not in Path(f"/proc/{proc.pid}/maps").read_text()
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    code, message = CODES[signum], LINES[signum][len("error: ") : -1]
    assert (proc.returncode, stderr) == (code, LINES[signum])
    assert json.loads(stdout) == {"error": message, "exit_code": code}


def test_an_export_runs_only_the_kernel_code_it_loaded_first(tmp_path):
    """`kernels.load` covers every argument type an export passes its kernels (padded rows or
    not, each format): none is loaded later, in the middle of the run, where signals raise."""
    script = f"""
import json, pathlib
from packer import PackConfig, pack
from packer.export import export, kernels
root = pathlib.Path({str(tmp_path)!r})
data = root / "in.jsonl"
rows = [{{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}}, {{"input_ids": [8], "labels": [8]}}]
data.write_text("".join(json.dumps(r) + "\\n" for r in rows))
every = (kernels.first_bad_position_row, kernels.put_bytes, kernels.put_shapes)
kernels.load()
loaded = [list(k.signatures) for k in every]
for pad in (False, True):
    pack([data], root / f"p{{pad}}", PackConfig(max_len=8, pad=pad))
    for to in ("mds", "megatron", "trl", "megatron-bridge"):
        export(root / f"p{{pad}}", to, root / f"{{to}}-{{pad}}")
print([[s for s in k.signatures if s not in seen] for k, seen in zip(every, loaded)])
"""
    done = python_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[[], [], []]\n"


def _ctrl_c_held_inside_preparing() -> None:
    """A Ctrl-C raised inside `preparing` in a program: held until the block ends, then raised."""
    from packer.interrupts import preparing

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    done = []
    try:
        with pytest.raises(KeyboardInterrupt), preparing():
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.01)  # Python's handlers run between bytecodes: here, had it raised
            done.append(True)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done == [True]


def test_a_library_callers_ctrl_c_comes_after_the_load():
    """In a program (not the command line) a Ctrl-C inside `preparing` is held, then raised."""
    _ctrl_c_held_inside_preparing()


@pytest.mark.parametrize(
    "where",
    ["<frozen importlib._bootstrap>", os.path.join("site", "llvmlite", "binding", "ffi.py")],
    ids=["importlib", "llvmlite"],
)
def test_an_interrupt_waits_for_the_end_of_code_it_would_break(where):
    """A signal that comes while the main thread runs importlib's lock code or llvmlite's
    wrappers (here: code named as theirs) is raised at the first line after it, not inside it,
    where it would leave the import lock held or a native object half made."""
    from packer.interrupts import interrupt_once

    source = (
        "def section(log, signal):\n"
        "    signal.raise_signal(signal.SIGINT)\n"
        "    for _ in range(1000):\n"
        "        log.append(1)\n"
    )
    scope: dict = {}
    exec(compile(source, where, "exec"), scope)
    log: list = []
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), interrupt_once():
            scope["section"](log, signal)
            log.append("after")  # the interrupt lands before this
    finally:
        signal.signal(signal.SIGINT, previous)
    assert log == [1] * 1000


def test_after_a_library_pack_a_ctrl_c_is_still_held_while_loading(tmp_path):
    """A program that packed once (its output committed) still gets `preparing`'s protection:
    the commit belonged to that call, not to the process."""
    import json

    from packer import pack
    from packer.config import PackConfig

    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [1, 2, 3]}) + "\n" for _ in range(4)))
    pack([data], tmp_path / "out", PackConfig(max_len=8), workers=1)
    _ctrl_c_held_inside_preparing()


VERIFY_KERNELS = "(K.check_rows, K.check_coverage, K.compare_source)"


def _packed_variants(root: Path) -> str:
    """Script lines that pack the outputs verify meets (rejected samples, padding, CP, an
    int64 Parquet input without labels) into `root`: [(output, [input])] as `outputs`."""
    return f"""
import json, pathlib
import pyarrow as pa, pyarrow.parquet as pq
from packer import PackConfig, pack
root = pathlib.Path({str(root)!r})
data = root / "in.jsonl"
rows = [{{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}}, {{"input_ids": [8], "labels": [8]}}]
data.write_text("".join(json.dumps(r) + "\\n" for r in rows) + '{{"input_ids": "x"}}\\n')
wide = root / "in.parquet"
pq.write_table(pa.table({{"input_ids": pa.array([[1, 2], [3]], pa.list_(pa.int64()))}}), wide)
outputs = []
for name, source, cfg in [
    ("p", data, PackConfig(max_len=8, on_error="skip")),
    ("pad", data, PackConfig(max_len=8, pad=True, on_error="skip")),
    ("cp", data, PackConfig(max_len=8, cp_size=2, on_error="skip")),
    ("wide", wide, PackConfig(max_len=4, pad=True)),
]:
    pack([source], root / name, cfg, workers=1)
    outputs.append((root / name, [source]))
"""


def test_verify_runs_only_the_kernel_code_it_loaded_first(tmp_path):
    """`verify`'s `kernels.load` covers every argument type its checks pass the kernels
    (rejects, padding, CP, each kind of input): none is loaded later, in the middle of the run,
    where a signal raises inside numba's loading."""
    script = (
        "from packer.verify import kernels as K, verify\n"
        f"every = {VERIFY_KERNELS}\n"
        "K.load()\n"
        "loaded = [list(k.signatures) for k in every]\n"
        + _packed_variants(tmp_path)
        + "for out, inputs in outputs:\n"
        "    assert verify(out, inputs, attention=False).ok, out\n"
        "    assert verify(out, attention=False).ok, out\n"
        "print([[s for s in k.signatures if s not in seen] for k, seen in zip(every, loaded)])\n"
    )
    done = python_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[[], [], []]\n"


def test_the_verify_command_loads_its_kernels_before_its_checks(tmp_path):
    """The command's own `preparing` block (where a signal exits at once, with --json's object)
    ends with every kernel the run calls loaded already."""
    script = (
        "import contextlib, sys\n"
        "import packer.interrupts as I\n"
        "from packer.verify import kernels as K\n"
        + _packed_variants(tmp_path)
        + f"every = {VERIFY_KERNELS}\n"
        "real, depth, at_end = I.preparing, [], []\n"
        "@contextlib.contextmanager\n"
        "def preparing(json_out=False):\n"
        "    depth.append(1)\n"
        "    with real(json_out):\n"
        "        yield\n"
        "    depth.pop()\n"
        "    if not depth and not at_end:  # the command's first block, as it ends\n"
        "        at_end.append([list(k.signatures) for k in every])\n"
        "I.preparing = preparing\n"
        "out, inputs = outputs[0]\n"
        "sys.argv = ['packer', 'verify', str(out), '--input', str(inputs[0]), '--no-attention']\n"
        "from packer.cli import run\n"
        "try:\n"
        "    run()\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print([[s for s in k.signatures if s not in seen] for k, seen in zip(every, at_end[0])])\n"
        "print([len(s) for s in at_end[0]])\n"
    )
    done = python_script(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[[], [], []]\n[1, 1, 1]\n", done.stderr


@pytest.mark.parametrize("module", ["packer.export.kernels", "packer.verify.kernels"])
def test_kernels_load_once_per_process(module, monkeypatch):
    """The library's export/verify load the kernels again after the command's own preparing
    block; that second call must not open a preparing block of its own, where a signal would
    end the command without --json's object."""
    import importlib

    kernels = importlib.import_module(module)
    kernels.load()

    def refused():
        raise AssertionError("a second load() entered preparing()")

    monkeypatch.setattr(kernels, "preparing", refused)
    kernels.load()
