"""Interrupt state belongs to one run: a run in a long-lived process (a notebook, a trainer,
typer's CliRunner) starts clean, however an earlier run in that process ended.

packer records what a signal did (an interrupt raised, one that came after the commit point,
the outputs put in place) for the command's error line. In-process, a run that a signal stopped
left it recorded: the next ordinary `packer pack` or `packer tokenize` of the process exited
130, "interrupted after <an earlier run's output> was complete and in place".

The signal is raised in the main thread at a named point of the commit (`interrupts._fault_pause`,
the hook of PACKER_FAULT_COMMIT_PAUSE), so it lands at the same bytecode every time.
"""

from __future__ import annotations

import json
import signal
import sys
from contextlib import suppress

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import read_shards
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import packer.interrupts as interrupts
from packer.cli import app

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals")

CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
WHAT = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(5)
    lengths = rng.integers(5, 60, 400)
    offsets = np.zeros(lengths.size + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(0, 1000, int(offsets[-1]), dtype=np.int32)
    path = tmp_path_factory.mktemp("interrupt_state") / "in.parquet"
    pq.write_table(pa.table({"input_ids": pa.ListArray.from_arrays(offsets, ids)}), path)
    return path


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """(a JSONL of texts, a local word-level tokenizer for it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = ["hello", "world", "what", "is", "the", "answer", "one", "two", "three"]
    special = ["<unk>", "<eos>"]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(special_tokens=special))
    root = tmp_path_factory.mktemp("interrupt_state_raw")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    fast.save_pretrained(root / "tok")
    rng = np.random.default_rng(6)
    lines = [" ".join(rng.choice(words, int(rng.integers(1, 20)))) for _ in range(200)]
    path = root / "texts.jsonl"
    path.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    return path, root / "tok"


def pack(data, out, *extra):
    return CliRunner().invoke(app, ["pack", str(data), "-o", str(out), "-L", "256", *extra])


def tokenize(raw, out):
    texts, tok = raw
    args = ["tokenize", str(texts), "--tokenizer", str(tok), "-o", str(out), "--workers", "1"]
    return CliRunner().invoke(app, args)


def ordinary_runs(data, raw, tmp_path) -> None:
    """A `packer tokenize`, then a `packer pack`: both complete. (tokenize first: it checks for
    an interrupt before its first `interrupt_once`, which would clear one.)"""
    tokenized = tokenize(raw, tmp_path / "tokenized")
    assert tokenized.exit_code == 0, tokenized.output
    table = pq.read_table(sorted((tmp_path / "tokenized").glob("part-*.parquet")))
    assert table.num_rows == 200
    packed = pack(data, tmp_path / "again")
    assert packed.exit_code == 0, packed.output
    assert read_shards(tmp_path / "again").num_rows > 0


def signal_at(monkeypatch, point: str, signum: int) -> list[str]:
    """Raise `signum` in this process when a run reaches `point` of its commit (once)."""
    real, fired = interrupts._fault_pause, []

    def pause(where, *args):
        real(where, *args)
        if where == f"commit {point}" and not fired:
            fired.append(where)
            handler = signal.getsignal(signum)
            assert callable(handler), f"{signum}: {handler}"  # SIG_DFL would end pytest
            signal.raise_signal(signum)

    monkeypatch.setattr(interrupts, "_fault_pause", pause)
    return fired


def clean() -> bool:
    """No run's interrupt state is left in the process."""
    return not (
        interrupts._interrupted.is_set()
        or interrupts._committed.is_set()
        or interrupts._late
        or interrupts._outputs
        or interrupts._sigterm_seen.is_set()
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("point", ["before", "held", "done"])
def test_a_run_after_an_interrupted_in_process_run_starts_clean(
    data, raw, tmp_path, monkeypatch, point, signum
):
    assert pack(data, tmp_path / "first").exit_code == 0  # an output put in place earlier
    fired = signal_at(monkeypatch, point, signum)
    stopped = pack(data, tmp_path / "stopped")
    assert fired, stopped.output
    assert stopped.exit_code == CODES[signum], stopped.output
    if point == "before":  # the previous run's output is not this one's
        assert stopped.output.endswith(f"error: {WHAT[signum]}; no partial output was left\n")
        assert not (tmp_path / "stopped").exists()
    else:  # in place: in a program, the caller's Ctrl-C (SIGTERM as one) comes after it
        line = f"error: {WHAT[signum]} after {tmp_path / 'stopped'} was complete and in place"
        assert stopped.output.startswith(line), stopped.output
    monkeypatch.undo()
    ordinary_runs(data, raw, tmp_path)
    assert read_shards(tmp_path / "again").equals(read_shards(tmp_path / "first"))
    assert clean()


@pytest.mark.parametrize("point", ["before", "done"])
def test_a_command_after_an_interrupted_library_pack_starts_clean(
    data, raw, tmp_path, monkeypatch, point
):
    """`packer.pack` in a program, stopped by Ctrl-C before its commit point or after it (the
    caller's Ctrl-C, once the output is in place), then commands in the same process."""
    import packer

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        fired = signal_at(monkeypatch, point, signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            packer.pack([data], tmp_path / "stopped", packer.PackConfig(max_len=256))
        assert fired
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (tmp_path / "stopped").exists() == (point == "done")
    monkeypatch.undo()
    ordinary_runs(data, raw, tmp_path)
    assert clean()


def test_a_run_after_a_build_that_was_interrupted_starts_clean(data, raw, tmp_path):
    """A build stopped by Ctrl-C (its `interrupt_once` scope, as a signal test runs it in
    the tests' process), then commands in the same process."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), interrupts.interrupt_once():
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    ordinary_runs(data, raw, tmp_path)
    assert clean()


def test_an_interrupt_swallowed_by_a_library_caller_is_not_the_next_runs(data, raw, tmp_path):
    """An interrupt that something inside a build swallowed (the build went on): the next
    run in the process does not raise it."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupts.interrupt_once(), suppress(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)
    ordinary_runs(data, raw, tmp_path)
    assert clean()


# a run's shape: scopes (a build's `interrupt_once`, a `commit_point`, a caller's `except` that
# swallows what its block raises) around signals and errors raised at their points
LEAVES = st.sampled_from(["SIGINT", "SIGTERM", "error"])
RUNS = st.recursive(
    LEAVES,
    lambda inner: st.tuples(st.sampled_from(["build", "commit", "swallow"]), st.lists(inner)),
    max_leaves=8,
)


def play(step) -> None:
    if isinstance(step, str):
        if step == "error":
            raise RuntimeError("a failure of the run")
        signum = getattr(signal, step)
        if callable(signal.getsignal(signum)):  # SIG_DFL (none here) would end pytest
            signal.raise_signal(signum)
        return
    kind, inner = step
    if kind == "swallow":
        for each in inner:
            with suppress(KeyboardInterrupt, RuntimeError):
                play(each)
        return
    with interrupts.interrupt_once() if kind == "build" else interrupts.commit_point("out"):
        for each in inner:
            play(each)


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(RUNS, min_size=1, max_size=3))
def test_each_run_of_a_program_starts_with_no_interrupt_of_an_earlier_one(runs):
    """However a run in a program ended (stopped by SIGINT or SIGTERM before or after its commit
    point, failed, its interrupt caught by the caller), the next one starts clean: its first
    check does not stop it, it has no late signal and has put nothing in place."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    term = signal.getsignal(signal.SIGTERM)
    try:
        for run in runs:
            # SIGTERM as Ctrl-C, as `packer pack` and `packer tokenize` take it
            with suppress(KeyboardInterrupt, RuntimeError), interrupts.sigterm_as_interrupt():
                play(run)
            try:
                interrupts.begin_output()  # as `tokenize` starts, before its build's scope
            except KeyboardInterrupt:  # not raised on: pytest would take it as its own Ctrl-C
                pytest.fail(f"an interrupt of {run} stopped the next run")
            assert interrupts.late_signal() is None
            assert interrupts.committed_outputs() == []
            assert clean()
            assert signal.getsignal(signal.SIGTERM) == term
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
