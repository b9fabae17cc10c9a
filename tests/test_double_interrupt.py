"""Two Ctrl-C's in quick succession while `packer pack --overwrite` writes its shards.

The second SIGINT used to land inside the clean-up the first one started (a thread pool's join,
the removal of the temporary directory, the error line, the interpreter's exit): writer threads
were left running while the interpreter finalized (`Fatal Python error: PyGILState_Release`,
exit 134), or a traceback was printed. Whatever the delay between the two, the run must exit
130 with the one error line, leave no temporary directory and the previous output untouched.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import foreground, python_script

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals"),
    pytest.mark.xdist_group("double_interrupt"),  # one worker: the runs share one input
]

ERROR_LINE = "error: interrupted; no partial output was left"
# ms between the two SIGINTs: within the first one's clean-up, up to the interpreter's exit
DELAYS_MS = [0, 2, 5, 8, 12, 20, 30, 2, 5, 8]


def _default_sigint() -> None:
    # a shell starts background jobs with SIGINT ignored, and Python keeps it ignored
    foreground()


def pack(inputs: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "packer", "pack", str(inputs), "-o", str(out), "--overwrite"]
        + ["--max-len", "4096", "--shard-rows", "25", "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )


def snapshot(path: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def temp_dirs(parent: Path) -> list[Path]:
    return sorted(p for p in parent.iterdir() if ".packer-tmp-" in p.name)


@pytest.fixture(scope="module")
def previous(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """(input, output of a complete earlier run, its files' digests). ~25M tokens: shard
    writing lasts a second or more, long after the first shard file appears."""
    root = tmp_path_factory.mktemp("double_interrupt")
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 600, 80_000)
    offsets = np.zeros(lengths.size + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    inputs = root / "in.parquet"
    pq.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, ids)}), inputs)
    out = root / "out"
    proc = pack(inputs, out)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    return inputs, out, snapshot(out)


@pytest.mark.parametrize("delay_ms", DELAYS_MS)
def test_two_sigints_exit_130_cleanly(previous, delay_ms):
    inputs, out, digests = previous
    with pack(inputs, out) as proc:
        try:
            deadline = time.monotonic() + 60
            while not any(any(t.glob("shard-*.arrow")) for t in temp_dirs(out.parent)):
                assert proc.poll() is None, f"ended before writing shards: {proc.stderr.read()}"
                assert time.monotonic() < deadline, "no shard written within 60 s"
                time.sleep(0.002)
            proc.send_signal(signal.SIGINT)
            time.sleep(delay_ms / 1000)
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=60)
        finally:  # a run left hanging would hold its temporary output into the next test
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
                for temp in temp_dirs(out.parent):
                    shutil.rmtree(temp)

    assert "Fatal Python error" not in stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert proc.returncode == 130, stderr
    assert stderr.rstrip("\n").splitlines()[-1:] == [ERROR_LINE], stderr
    assert temp_dirs(out.parent) == []
    assert snapshot(out) == digests


NESTED_SIGNAL = """
import signal, sys
from packer import interrupts

HANDLERS = {interrupts._interrupt_once.__code__, interrupts._raise_terminated.__code__}

def second_signal_at(k, signum):
    seen, fired = [0], [False]

    def tracer(frame, event, arg):
        f = frame
        while f is not None and f.f_code not in HANDLERS:
            f = f.f_back
        if f is not None and event == "line" and not fired[0]:
            seen[0] += 1
            if seen[0] == k:
                fired[0] = True
                signal.raise_signal(signum)
        return tracer

    interrupts.interrupt_once_until_exit()
    try:
        try:
            sys.settrace(tracer)
            signal.raise_signal(signum)
            for _ in range(100):  # the handler runs here
                pass
        finally:
            sys.settrace(None)
    except KeyboardInterrupt:
        pass
    return fired[0]

for signum in (signal.SIGINT, signal.SIGTERM):
    k = 1
    while second_signal_at(k, signum):
        k += 1
    print(int(signum), k - 1)
"""


def test_a_second_signal_anywhere_inside_the_first_ones_handler_cannot_hang_it():
    """The second SIGINT (SIGTERM) runs its handler in the middle of the first one's, at each of
    the lines the first one runs in turn. With `threading.Event` as the handlers' state, the
    second one waited for the lock the first one held in `Event.set`: a `pack` hung for good
    after two Ctrl-C's 2 ms apart, and took SIGTERM the same way."""
    try:
        done = python_script(NESTED_SIGNAL, timeout=60, preexec_fn=foreground)
    except subprocess.TimeoutExpired:
        pytest.fail("a signal inside the first one's handler hung the process")
    assert done.returncode == 0, done.stderr
    lines = dict(map(int, line.split()) for line in done.stdout.split("\n") if line)
    assert set(lines) == {signal.SIGINT, signal.SIGTERM}
    assert min(lines.values()) >= 5, lines  # it did land inside: the handlers run 5+ lines


def test_only_the_first_interrupt_raises_and_ctrl_c_works_again_after():
    """Signals inside the clean-up of an interrupt are ignored; an interrupt that something
    swallowed (the run goes on) does not make the run unstoppable: the next one raises; a
    library caller (a notebook) gets its Ctrl-C back once the interrupted build is over."""
    from packer.interrupts import interrupt_once

    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # as a terminal's
    raised = 0
    with interrupt_once():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            raised += 1
            for _ in range(2):  # inside the clean-up the first one started
                signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):  # swallowed above: the next one stops the run
            signal.raise_signal(signal.SIGINT)
    assert raised == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt), interrupt_once():  # a new build: its first Ctrl-C
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def test_a_command_run_in_process_leaves_ctrl_c_working():
    """The CLI's error path after an interrupt ignores later signals for the rest of a command
    line's life; run in-process (typer's CliRunner, a program) it left the caller's process with
    SIGINT and SIGTERM ignored."""
    import typer

    import packer.interrupts as interrupts
    from packer.cli.app import user_errors

    with pytest.raises(typer.Exit), user_errors(False):
        raise KeyboardInterrupt
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not interrupts._exiting.is_set()
