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
from conftest import foreground, python_script

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


CONSOLE_SCRIPT = Path(sys.executable).with_name("packer")  # the installed `packer` command
LINES = {
    signal.SIGINT: (130, "error: interrupted; no partial output was left\n"),
    signal.SIGTERM: (143, "error: terminated; no partial output was left\n"),
}


@pytest.fixture
def small_input(tmp_path) -> Path:
    data = tmp_path / "in.jsonl"
    data.write_text("".join('{"input_ids": [1, 2, 3]}\n' for _ in range(8)))
    return data


@pytest.mark.parametrize(
    "entry, signum, json_out",
    [
        (["-m", "packer"], signal.SIGINT, False),
        (["-m", "packer.cli"], signal.SIGINT, True),
        ([str(CONSOLE_SCRIPT)], signal.SIGTERM, True),
    ],
    ids=["python-m-packer", "python-m-packer.cli", "console-script"],
)
def test_a_signal_while_the_command_imports_its_modules_ends_it_in_one_line(
    small_input, tmp_path, entry, signum, json_out
):
    """From the first line of `packer/__init__.py` on (before the CLI's modules import), a signal
    ends the command with its line and status, not a traceback of the import it landed in
    (Ctrl-C) or a silent death (SIGTERM); --json's object too. Here it lands at that first line."""
    if entry[0] != "-m" and not CONSOLE_SCRIPT.exists():
        pytest.skip("no console script beside this interpreter")
    command = [*entry, "pack", str(small_input), "-o", str(tmp_path / "out"), "-L", "8"]
    proc = subprocess.Popen(
        ([sys.executable] if entry[0] == "-m" else []) + command + (["--json"] if json_out else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PACKER_FAULT_START_PAUSE": "60"},
        preexec_fn=foreground,
    )
    first = proc.stderr.readline()
    assert first == "packer-fault: starting\n", first + proc.stderr.read()
    assert "numpy" not in Path(f"/proc/{proc.pid}/maps").read_text()  # before the CLI's imports
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    code, line = LINES[signum]
    assert (proc.returncode, stderr) == (code, line)
    expected = f'{{"error": "{line[len("error: ") : -1]}", "exit_code": {code}}}\n'
    assert stdout == (expected if json_out else "")
    assert not (tmp_path / "out").exists()


def test_a_ctrl_c_python_swallowed_before_the_command_started_still_stops_it(small_input, tmp_path):
    """A Ctrl-C before packer's first line, inside importlib's lock code, is printed and dropped
    by Python ("Exception ignored in ... _get_module_lock") with the import lock left held: the
    run went on as if no signal came, then hung at another thread's import. The command sees the
    held lock as it starts and stops there. Here the lock is left held on purpose."""
    script = (
        "import _imp, sys\n"
        f"sys.argv = ['packer', 'pack', {str(small_input)!r}, '-o', {str(tmp_path / 'out')!r}]\n"
        "_imp.acquire_lock()\n"
        "from packer.cli import run\n"
        "run()\n"
    )
    done = python_script(script, timeout=60)
    assert (done.returncode, done.stderr) == LINES[signal.SIGINT]
    assert not (tmp_path / "out").exists()


def test_a_program_that_imports_packer_keeps_its_own_signal_handlers():
    """Only the command installs the start-up handler: a program's Ctrl-C stays Python's."""
    script = (
        "import signal, sys\n"
        "sys.argv = ['-m', 'x']\n"  # as runpy sets it while `python -m x` imports x's package
        "import packer, packer.cli\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler,"
        " signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)\n"
    )
    done = python_script(script)
    assert (done.returncode, done.stdout) == (0, "True True\n"), done.stderr


def test_a_finished_command_ignores_signals_while_the_interpreter_exits(small_input, tmp_path):
    """Once the command is done (here a `verify` whose report is printed), a signal cannot turn
    its exit status into a death by signal: the interpreter's exit restores the default actions
    of the signals Python handles, and a Ctrl-C there ended a passed `verify` with -2."""
    script = (
        "import atexit, signal, sys\n"
        "from packer import PackConfig, pack\n"
        f"pack([{str(small_input)!r}], {str(tmp_path / 'out')!r}, PackConfig(max_len=8))\n"
        "atexit.register(lambda: print(*(signal.getsignal(s) == signal.SIG_IGN"
        " for s in (signal.SIGINT, signal.SIGTERM))))\n"
        f"sys.argv = ['packer', 'verify', {str(tmp_path / 'out')!r}, '--no-attention']\n"
        "from packer.cli import run\n"
        "run()\n"
    )
    done = python_script(script, preexec_fn=foreground, timeout=120)
    assert (done.returncode, done.stdout) == (0, "True True\n"), done.stderr
