"""`pack RAW --tokenizer`: the packing step's kernels load while the workers tokenize, in a
thread started only once the worker pool has forked and joined before the command goes on."""

from __future__ import annotations

import threading

from packer.cli.raw import warming_meanwhile
from packer.config import PackConfig


def _warmup_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "packer-jit-warmup"]


def test_the_kernels_load_from_the_first_batch_done_and_the_thread_is_joined():
    seen = []
    with warming_meanwhile(PackConfig(max_len=8).strategy, lambda *a: seen.append(a)) as report:
        assert not _warmup_threads()  # nothing before the pool has forked and reported
        report("tokenize", 1024, 0, "1,024 lines")
        started = _warmup_threads()
        assert len(started) == 1
        report("tokenize", 2048, 0, "2,048 lines")
        assert _warmup_threads() == started  # started once
    assert not any(t.is_alive() for t in started)  # joined: a later pool may fork
    assert seen == [("tokenize", 1024, 0, "1,024 lines"), ("tokenize", 2048, 0, "2,048 lines")]


def test_without_a_progress_display_the_kernels_still_load():
    with warming_meanwhile(PackConfig(max_len=8).strategy, None) as report:
        report("tokenize", 1, 0, "")
        assert len(_warmup_threads()) == 1
    assert not _warmup_threads() or not _warmup_threads()[0].is_alive()


def test_an_engine_run_is_left_alone():
    shown = object()
    with warming_meanwhile(None, shown) as report:
        assert report is shown
    assert not _warmup_threads()
