"""An interrupt that packer handles ends the command with 130 (or 143), never by SIGINT.

CPython remembers a KeyboardInterrupt that left Python code run by C (`PyRun_String`: Cython
modules run it while they import, and pyarrow, numba and torch import lazily during a run) as
"unhandled", even when packer catches it a moment later and prints its one line; at exit the
interpreter then kills itself by SIGINT, and a scheduler sees -2 instead of 130 (about 1 run in
50 of `pack --repack` and `verify` stopped by one Ctrl-C). Here the interrupt lands in such an
evaluation on purpose, every time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals")

ROOT = Path(__file__).resolve().parents[1]

# a command whose run evaluates code through PyRun_String, where the signal lands
SCRIPT = """
import ctypes, os, signal, sys
from packer.cli import app, run
from packer.cli.app import user_errors
import packer.cli.render  # loaded in a real run already (its progress bars): imported later, in
import rich.markup  # the error line, they would start a new evaluation that clears the flag

@app.command("lands-in-c")
def lands_in_c(late: bool = False) -> None:
    with user_errors(False):
        if late:  # the output is in place: the signal is recorded, the run finishes
            from packer.interrupts import commit_point
            with commit_point("out"):
                pass
        run_string = ctypes.pythonapi.PyRun_String
        run_string.restype = ctypes.py_object
        run_string.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
        code = b"import os, signal\\nos.kill(os.getpid(), signal.SIG%s)\\nfor _ in range(10**6): pass\\n"
        namespace = {}
        run_string(code % os.environ["SIGNAME"].encode(), 257, namespace, namespace)

sys.argv = ["packer"] + sys.argv[1:]
run()
"""


@pytest.fixture
def lands_in_c(tmp_path):
    """Run the command as `python -m`, as `python -m packer` runs: the interpreter's check of
    the flag is on that path (a script's `sys.exit` leaves before it)."""
    (tmp_path / "lands_in_c.py").write_text(SCRIPT)
    path = os.pathsep.join((str(ROOT), str(tmp_path)))

    def run(signame: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "lands_in_c", "lands-in-c", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": path, "SIGNAME": signame},
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            timeout=60,
        )

    return run


@pytest.mark.parametrize(
    "signame, code, line",
    [
        ("INT", 130, "error: interrupted; no partial output was left\n"),
        ("TERM", 143, "error: terminated; no partial output was left\n"),
    ],
)
def test_an_interrupt_raised_in_c_evaluated_code_exits_with_its_code(
    lands_in_c, signame, code, line
):
    done = lands_in_c(signame)
    assert (done.returncode, done.stderr) == (code, line)


def test_a_signal_after_the_commit_point_in_c_evaluated_code_exits_0(lands_in_c):
    done = lands_in_c("INT", "--late")
    assert done.returncode == 0, done.stderr
    assert "after the output was in place" in done.stderr
