"""`pack RAW --tokenizer`: the packing step's kernels load while the workers tokenize, in a
thread started only once the worker pool has forked and joined before the command goes on."""

from __future__ import annotations

import threading

import pytest

import packer.pipelines.warmup as warmup
from packer.cli.raw import warming_meanwhile
from packer.config import PackConfig

STRATEGY = PackConfig(max_len=8).strategy


@pytest.fixture
def started(monkeypatch) -> list:
    """The warm-ups started, each (strategy, its Warming)."""
    calls = []
    real = warmup.start_warming

    def start(strategy):
        calls.append((strategy, real(strategy)))
        return calls[-1][1]

    monkeypatch.setattr(warmup, "start_warming", start)
    return calls


def test_the_kernels_load_from_the_first_batch_done_and_the_thread_is_joined(started):
    seen = []
    before = threading.active_count()
    with warming_meanwhile(STRATEGY, lambda *a: seen.append(a)) as report:
        assert not started and threading.active_count() == before  # the pool may still fork
        report("tokenize", 1024, 0, "1,024 lines")
        report("tokenize", 2048, 0, "2,048 lines")
        assert [s for s, _ in started] == [STRATEGY]  # started once
    assert not started[0][1]._thread.is_alive()  # joined: a later pool may fork
    assert seen == [("tokenize", 1024, 0, "1,024 lines"), ("tokenize", 2048, 0, "2,048 lines")]


def test_without_a_progress_display_the_kernels_still_load(started):
    with warming_meanwhile(STRATEGY, None) as report:
        report("tokenize", 1, 0, "")
    assert len(started) == 1 and not started[0][1]._thread.is_alive()


def test_an_engine_run_is_left_alone(started):
    shown = object()
    with warming_meanwhile(None, shown) as report:
        assert report is shown
    assert not started
