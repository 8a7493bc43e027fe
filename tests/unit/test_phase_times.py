"""Phase times of a rewrite task: per thread, nested phases counted once, off by default."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from compactor.rewrite import phase_times
from compactor.rewrite.phase_times import PhaseTimes, carried, phase, recording, timed

SPIN_S = 0.002


def _busy() -> None:
    """Spend SPIN_S of this thread's CPU."""
    started = time.thread_time()
    while time.thread_time() - started < SPIN_S:
        sum(range(100))


def _footer(_: int) -> None:
    with phase("open_footer"):
        _busy()


def test_a_phase_inside_another_is_left_out_of_it_and_threads_record_into_the_task() -> None:
    times = PhaseTimes()
    started = time.thread_time()
    with recording(times), phase("write"):
        _busy()
        with phase("statistics"):
            _busy()
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(carried(_footer), range(2)))
        for _ in timed("decode", [1, 2]):
            _busy()  # between items: "write", not "decode"
    spent = time.thread_time() - started

    recorded = times.to_dict()
    assert set(recorded) == {"write", "statistics", "decode", "open_footer"}
    assert recorded["open_footer"] >= 2 * SPIN_S  # the pool's threads, into the task's times
    assert recorded["statistics"] >= SPIN_S
    # This thread's phases: "statistics" and "decode" are not counted again in "write".
    assert 3 * SPIN_S <= recorded["write"] + recorded["statistics"] + recorded["decode"] <= spent


def test_nothing_is_recorded_unless_enabled_and_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(phase_times, "_enabled", False)
    assert PhaseTimes.if_enabled() is None
    monkeypatch.setattr(phase_times, "_enabled", True)
    times = PhaseTimes.if_enabled()
    assert times is not None
    with recording(times):
        pass
    with phase("write"):  # the recording has ended: nothing to record into
        _busy()
    assert times.to_dict() == {}
