"""The daemon's decisions: which run starts next, when a table rests, and when a table is due.

:class:`~compactor.daemon.scheduling.RunPolicy` runs on a fake clock that only moves when a test moves
it, so cool-downs and back-offs are checked to the second without waiting. Thresholds are judged
on fragmentation scores made up here; the scores of real tables are checked in
tests/integration/test_fragmentation_scans.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from compactor.daemon.fragmentation import MANIFESTS, SUMMARY, Fragmentation
from compactor.daemon.fragmentation import due_reasons as fragmentation_due_reasons
from compactor.daemon.history import History
from compactor.daemon.jobfiles import CompactAction
from compactor.daemon.scheduling import (
    CANCELLED,
    CONFLICT,
    FAILED,
    INTERRUPTED,
    NOOP,
    PARTIAL,
    SKIPPED,
    SUCCEEDED,
    Request,
    RunPolicy,
)
from compactor.daemon.service import _growth_settings
from compactor.options import resolve_options

MiB = 1 << 20
INITIAL, MAXIMUM = 60.0, 600.0  # back-off bounds of every policy below, in seconds


class FakeClock:
    """A clock that stands still until a test advances it."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def make_policy(
    clock: FakeClock, *, max_concurrent: int = 10, conflicts_before_backoff: int = 2
) -> RunPolicy:
    return RunPolicy(max_concurrent, INITIAL, MAXIMUM, conflicts_before_backoff, clock)


def compact(table: str, priority: float = 0.0, cooldown_s: float = 0.0) -> Request:
    return Request(table, "compact", "job", priority=priority, cooldown_s=cooldown_s)


def keys(requests: list[Request]) -> list[tuple[str, str]]:
    return [r.key for r in requests]


def run_once(
    policy: RunPolicy, request: Request, outcome: str, conflicts: int = 0
) -> tuple[str, str]:
    """Offer ``request``, start it (it must start now) and finish it with ``outcome``."""
    assert policy.offer(request) is None
    assert keys(policy.take()) == [request.key]
    policy.finish(request, outcome, conflicts)
    return request.key


def rest(policy: RunPolicy, clock: FakeClock, request: Request) -> float:
    """Seconds from now until ``request`` may start again."""
    return policy.not_before(request) - clock.now


# --- order -----------------------------------------------------------------------------------


def test_highest_priority_starts_first_and_ties_go_in_offer_order(clock: FakeClock) -> None:
    policy = make_policy(clock)
    for name, priority in [("a", 1), ("b", 5), ("c", 1), ("d", 5), ("e", 3)]:
        assert policy.offer(compact(f"db.{name}", priority)) is None

    started = policy.take()

    assert [r.table for r in started] == ["db.b", "db.d", "db.e", "db.a", "db.c"]


def test_one_slot_serves_the_queue_in_priority_order(clock: FakeClock) -> None:
    policy = make_policy(clock, max_concurrent=1)
    for name, priority in [("a", 1), ("b", 5), ("c", 1), ("d", 5)]:
        policy.offer(compact(f"db.{name}", priority))

    order = []
    while started := policy.take():
        assert len(started) == 1
        order.append(started[0].table)
        policy.finish(started[0], SUCCEEDED)

    assert order == ["db.b", "db.d", "db.a", "db.c"]


def test_reoffering_a_queued_key_updates_its_priority_and_keeps_its_place(
    clock: FakeClock,
) -> None:
    policy = make_policy(clock)
    policy.offer(compact("db.a", 1))
    policy.offer(compact("db.b", 3))
    policy.offer(compact("db.c", 3))

    assert policy.offer(compact("db.a", 3)) is None

    queued = policy.queued
    assert [r.table for r in queued] == ["db.a", "db.b", "db.c"]
    assert queued[0].priority == 3
    # Tied with b and c, a goes first: it was offered first. Moved to the back of the line, or
    # still at priority 1, it would go last.
    assert [r.table for r in policy.take()] == ["db.a", "db.b", "db.c"]


def test_reoffering_with_a_lower_priority_lowers_it(clock: FakeClock) -> None:
    policy = make_policy(clock)
    policy.offer(compact("db.a", 9))
    policy.offer(compact("db.b", 5))
    policy.offer(compact("db.a", 1))

    assert [r.table for r in policy.take()] == ["db.b", "db.a"]


# --- concurrency -----------------------------------------------------------------------------


def test_never_more_than_max_concurrent_runs_and_finishing_one_frees_a_slot(
    clock: FakeClock,
) -> None:
    policy = make_policy(clock, max_concurrent=2)
    for name, priority in [("a", 4), ("b", 3), ("c", 2), ("d", 1)]:
        policy.offer(compact(f"db.{name}", priority))

    first = policy.take()
    assert [r.table for r in first] == ["db.a", "db.b"]
    assert policy.take() == []
    assert len(policy.running) == 2
    assert [r.table for r in policy.queued] == ["db.c", "db.d"]

    policy.finish(first[1], SUCCEEDED)
    second = policy.take()
    assert [r.table for r in second] == ["db.c"]
    assert len(policy.running) == 2
    assert policy.take() == []

    policy.finish(first[0], FAILED)
    policy.finish(second[0], NOOP)
    assert [r.table for r in policy.take()] == ["db.d"]
    assert len(policy.running) == 1
    assert policy.queued == []


def test_one_run_per_table_across_actions_while_another_table_may_start(
    clock: FakeClock,
) -> None:
    policy = make_policy(clock, max_concurrent=3)
    compact_t1 = compact("db.t1", 9)
    expire_t1 = Request("db.t1", "expire", "job", priority=8)
    compact_t2 = compact("db.t2", 1)
    for request in (compact_t1, expire_t1, compact_t2):
        assert policy.offer(request) is None

    assert keys(policy.take()) == [compact_t1.key, compact_t2.key]
    # A free slot, but db.t1 is busy: its expiry waits for the compaction.
    assert policy.take() == []
    assert keys(policy.queued) == [expire_t1.key]
    # The running key itself is not queued twice.
    assert policy.offer(compact_t1) == "running"

    policy.finish(compact_t1, SUCCEEDED)
    assert keys(policy.take()) == [expire_t1.key]

    # The compaction may be queued again, but not started while the expiry runs.
    assert policy.offer(compact_t1) is None
    assert policy.take() == []
    policy.finish(expire_t1, SUCCEEDED)
    assert keys(policy.take()) == [compact_t1.key]
    assert {r.table for r in policy.running} == {"db.t1", "db.t2"}


# --- cool-down -------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", [SUCCEEDED, NOOP, PARTIAL])
def test_a_finished_run_rests_its_table_for_the_cooldown(clock: FakeClock, outcome: str) -> None:
    policy = make_policy(clock)
    request = compact("db.a", cooldown_s=300)
    run_once(policy, request, outcome)

    assert policy.not_before(request) == clock.now + 300
    clock.advance(299)
    refused = policy.offer(request)
    assert refused is not None and refused.startswith("cooling down"), refused
    assert policy.queued == []

    clock.advance(1)
    assert policy.offer(request) is None
    assert keys(policy.take()) == [request.key]


def test_the_cooldown_is_per_action(clock: FakeClock) -> None:
    policy = make_policy(clock)
    run_once(policy, compact("db.a", cooldown_s=300), SUCCEEDED)

    assert policy.offer(Request("db.a", "expire", "job", cooldown_s=300)) is None
    assert policy.offer(compact("db.b", cooldown_s=300)) is None


@pytest.mark.parametrize("outcome", [CANCELLED, SKIPPED])
def test_cancelled_and_skipped_runs_start_no_cooldown(clock: FakeClock, outcome: str) -> None:
    policy = make_policy(clock)
    request = compact("db.a", cooldown_s=300)
    run_once(policy, request, outcome)

    assert policy.not_before(request) == 0.0
    assert policy.offer(request) is None
    assert keys(policy.take()) == [request.key]


@pytest.mark.parametrize("outcome", [CANCELLED, SKIPPED])
def test_cancelled_and_skipped_runs_neither_extend_nor_reset_a_streak(
    clock: FakeClock, outcome: str
) -> None:
    policy = make_policy(clock)
    request = compact("db.a", cooldown_s=10)
    run_once(policy, request, FAILED)
    clock.advance(INITIAL)
    failed_at = clock.now - INITIAL

    run_once(policy, request, outcome)
    # The rest still counts from the failure, not from the run that did not happen.
    assert policy.not_before(request) == failed_at + INITIAL
    run_once(policy, request, FAILED)
    assert rest(policy, clock, request) == 2 * INITIAL


# --- back-off --------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", [FAILED, INTERRUPTED])
def test_consecutive_failures_back_off_exponentially_up_to_the_maximum(
    clock: FakeClock, outcome: str
) -> None:
    policy = make_policy(clock)
    request = compact("db.a", cooldown_s=10)

    rests = []
    for _ in range(7):
        run_once(policy, request, outcome)
        rests.append(rest(policy, clock, request))
        clock.advance(rests[-1] - 1)
        refused = policy.offer(request)
        assert refused is not None and refused.startswith("backing off"), refused
        clock.advance(1)

    assert rests == [INITIAL, 2 * INITIAL, 4 * INITIAL, 8 * INITIAL, MAXIMUM, MAXIMUM, MAXIMUM]


def test_the_longer_of_cooldown_and_backoff_applies(clock: FakeClock) -> None:
    policy = make_policy(clock)
    request = compact("db.a", cooldown_s=100)

    run_once(policy, request, FAILED)
    assert rest(policy, clock, request) == 100
    refused = policy.offer(request)
    assert refused is not None and refused.startswith("cooling down"), refused

    clock.advance(100)
    run_once(policy, request, FAILED)
    assert rest(policy, clock, request) == 2 * INITIAL
    refused = policy.offer(request)
    assert refused is not None and refused.startswith("backing off"), refused


@pytest.mark.parametrize("outcome", [SUCCEEDED, NOOP])
def test_a_clean_run_resets_the_failure_streak(clock: FakeClock, outcome: str) -> None:
    policy = make_policy(clock)
    request = compact("db.a")
    for _ in range(3):
        run_once(policy, request, FAILED)
        clock.advance(rest(policy, clock, request))
    assert policy.backoff_s(policy.state("db.a", "compact")) == 4 * INITIAL

    run_once(policy, request, outcome)
    assert rest(policy, clock, request) == 0
    run_once(policy, request, FAILED)
    assert rest(policy, clock, request) == INITIAL


def test_conflicts_back_off_only_from_the_configured_streak(clock: FakeClock) -> None:
    policy = make_policy(clock, conflicts_before_backoff=3)
    request = compact("db.a")

    rests = []
    for _ in range(6):
        run_once(policy, request, CONFLICT, conflicts=2)
        rests.append(rest(policy, clock, request))
        clock.advance(rests[-1])

    assert rests == [0, 0, INITIAL, 2 * INITIAL, 4 * INITIAL, 8 * INITIAL]

    run_once(policy, request, SUCCEEDED)
    run_once(policy, request, CONFLICT, conflicts=1)
    run_once(policy, request, CONFLICT, conflicts=1)
    assert rest(policy, clock, request) == 0


def test_a_partial_run_with_conflicts_counts_as_a_conflict(clock: FakeClock) -> None:
    policy = make_policy(clock, conflicts_before_backoff=3)
    request = compact("db.a")
    run_once(policy, request, CONFLICT, conflicts=1)
    run_once(policy, request, CONFLICT, conflicts=1)

    run_once(policy, request, PARTIAL, conflicts=2)

    assert rest(policy, clock, request) == INITIAL


def test_a_partial_run_without_conflicts_resets_the_conflict_streak(clock: FakeClock) -> None:
    policy = make_policy(clock, conflicts_before_backoff=3)
    request = compact("db.a")
    run_once(policy, request, CONFLICT, conflicts=1)
    run_once(policy, request, CONFLICT, conflicts=1)

    run_once(policy, request, PARTIAL, conflicts=0)
    run_once(policy, request, CONFLICT, conflicts=1)
    run_once(policy, request, CONFLICT, conflicts=1)

    assert rest(policy, clock, request) == 0
    run_once(policy, request, CONFLICT, conflicts=1)
    assert rest(policy, clock, request) == INITIAL


# --- restore ---------------------------------------------------------------------------------

# Per (table, action): runs as (outcome, conflicts, seconds the run took).
RUN_HISTORIES: dict[tuple[str, str], list[tuple[str, int, float]]] = {
    ("db.failing", "compact"): [(FAILED, 0, 5), (INTERRUPTED, 0, 70), (FAILED, 0, 130)],
    ("db.recovered", "compact"): [(FAILED, 0, 5), (FAILED, 0, 70), (SUCCEEDED, 0, 130)],
    ("db.conflicted", "compact"): [
        (CONFLICT, 1, 5),
        (PARTIAL, 2, 5),
        (CONFLICT, 3, 60),
        (CONFLICT, 1, 120),
    ],
    ("db.partial", "compact"): [(CONFLICT, 1, 5), (CONFLICT, 1, 5), (PARTIAL, 0, 5)],
    ("db.cancelled", "compact"): [(SUCCEEDED, 0, 5), (CANCELLED, 0, 5), (SKIPPED, 0, 5)],
    ("db.failing", "expire"): [(NOOP, 0, 5), (FAILED, 0, 5)],
}


def test_restoring_from_history_rebuilds_the_state_live_runs_left(
    clock: FakeClock, tmp_path: Path
) -> None:
    live = make_policy(clock, conflicts_before_backoff=2)
    history = History(tmp_path / "state.db")
    # Interleave the keys' runs, as a daemon would, writing each to the state file.
    longest = max(len(runs) for runs in RUN_HISTORIES.values())
    for index in range(longest):
        for (table, action), runs in RUN_HISTORIES.items():
            if index >= len(runs):
                continue
            outcome, conflicts, duration = runs[index]
            request = Request(table, action, "job")
            row = history.start_run(table, action, "job", clock.now)
            clock.advance(duration)
            live.finish(request, outcome, conflicts)
            row.ended_at, row.outcome, row.conflicts = clock.now, outcome, conflicts
            history.finish_run(row)
        clock.advance(1)
    assert live.running == []
    recent = history.recent_runs(32)
    history.close()

    restarted = make_policy(clock, conflicts_before_backoff=2)
    restarted.restore(
        {
            key: [(r.outcome or FAILED, r.ended_at or clock.now, r.conflicts) for r in runs]
            for key, runs in recent.items()
        }
    )

    assert set(recent) == set(RUN_HISTORIES)
    for table, action in RUN_HISTORIES:
        for cooldown_s in (0, 30, 1000):
            request = Request(table, action, "job", cooldown_s=cooldown_s)
            assert restarted.not_before(request) == live.not_before(request), (table, action)
            assert restarted.not_before(request) > 0
        assert restarted.state(table, action) == live.state(table, action)
    # The histories above exercise every streak rule.
    states = {key: live.state(*key) for key in RUN_HISTORIES}
    assert states["db.failing", "compact"].failures == 3
    assert states["db.recovered", "compact"].failures == 0
    assert states["db.conflicted", "compact"].conflicts == 4
    assert states["db.partial", "compact"].conflicts == 0


# --- drain -----------------------------------------------------------------------------------


def test_close_drains_nothing_starts_and_offers_are_refused(clock: FakeClock) -> None:
    policy = make_policy(clock, max_concurrent=1)
    running = compact("db.a", 5)
    assert policy.offer(running) is None
    assert policy.take() == [running]
    assert policy.offer(compact("db.b", 1)) is None

    policy.close()

    assert policy.take() == []
    assert policy.queued == []
    assert policy.offer(compact("db.c", 9)) == "draining"
    # The run under way still reports back, and its slot frees nothing to start.
    policy.finish(running, SUCCEEDED)
    assert policy.running == []
    assert policy.take() == []
    assert policy.offer(compact("db.b", 1)) == "draining"


# --- thresholds ------------------------------------------------------------------------------


def fragmentation(
    mergeable: int | None = 0, mergeable_bytes: int | None = 0, delete_files: int = 0
) -> Fragmentation:
    return Fragmentation(
        table="db.t",
        snapshot_id=1,
        data_files=100,
        data_bytes=100 * MiB,
        delete_files=delete_files,
        small_files=mergeable,
        small_bytes=mergeable_bytes,
        files_under_target=mergeable,
        bytes_under_target=mergeable_bytes,
        partitions=4,
        worst_partition=None,
        worst_partition_files_under_target=None,
        source=MANIFESTS if mergeable is not None else SUMMARY,
        manifests_read=0,
    )


def due_reasons(found: Fragmentation, **section: Any) -> list[str]:
    return fragmentation_due_reasons(found, CompactAction(every="1m", **section))


def test_min_small_files_is_crossed_at_the_threshold() -> None:
    high = {"min_delete_files": 1000}
    assert due_reasons(fragmentation(mergeable=11), min_small_files=12, **high) == []
    reasons = due_reasons(fragmentation(mergeable=12), min_small_files=12, **high)
    assert len(reasons) == 1 and "min_small_files 12" in reasons[0], reasons


def test_min_small_bytes_is_crossed_at_the_threshold_and_off_by_default() -> None:
    high = {"min_small_files": 1000, "min_delete_files": 1000}
    below, at = fragmentation(3, MiB - 1), fragmentation(3, MiB)
    assert due_reasons(below, min_small_bytes="1MiB", **high) == []
    reasons = due_reasons(at, min_small_bytes="1MiB", **high)
    assert len(reasons) == 1 and "min_small_bytes" in reasons[0], reasons
    assert due_reasons(fragmentation(3, 1000 * MiB), **high) == []


def test_min_delete_files_is_crossed_at_the_threshold() -> None:
    high = {"min_small_files": 1000}
    assert due_reasons(fragmentation(delete_files=7), min_delete_files=8, **high) == []
    reasons = due_reasons(fragmentation(delete_files=8), min_delete_files=8, **high)
    assert len(reasons) == 1 and "min_delete_files 8" in reasons[0], reasons


def test_every_threshold_crossed_is_a_reason() -> None:
    found = fragmentation(mergeable=20, mergeable_bytes=2 * MiB, delete_files=9)
    reasons = due_reasons(found, min_small_files=20, min_small_bytes="2MiB", min_delete_files=9)
    assert len(reasons) == 3, reasons


def test_a_summary_score_crosses_only_the_delete_threshold() -> None:
    found = fragmentation(mergeable=None, mergeable_bytes=None, delete_files=8)
    assert due_reasons(found, min_small_files=1, min_small_bytes="1", min_delete_files=9) == []
    reasons = due_reasons(found, min_small_files=1, min_delete_files=8)
    assert len(reasons) == 1 and "min_delete_files" in reasons[0], reasons


def test_grown_groups_are_remembered_per_job_table_and_settings(tmp_path: Path) -> None:
    """The state file keeps the inputs of groups that grew, for the same settings only."""
    history = History(tmp_path / "state.db")
    grown = frozenset({frozenset({"s3://b/t/data/a.parquet", "s3://b/t/data/b.parquet"})})
    history.record_grown_groups("job", "db.t", "settings-1", grown)

    reopened = History(tmp_path / "state.db")
    assert reopened.grown_groups("job", "db.t", "settings-1") == grown
    assert reopened.grown_groups("job", "db.t", "settings-2") == frozenset()  # a codec changed
    assert reopened.grown_groups("other", "db.t", "settings-1") == frozenset()
    reopened.forget_grown_groups({"other"})  # "job" is no longer configured
    assert reopened.grown_groups("job", "db.t", "settings-1") == frozenset()

    history.record_grown_groups("job", "db.t", "settings-1", grown)
    history.record_grown_groups("job", "db.t", "settings-1", frozenset())  # none grew this time
    assert history.grown_groups("job", "db.t", "settings-1") == frozenset()


def test_the_settings_groups_grew_under_change_with_the_options_and_the_table_properties() -> None:
    """A codec set on the table, or another target, makes grown groups candidates again."""
    codec = "write.parquet.compression-codec"
    options = resolve_options("db.t", {})
    zstd = _growth_settings(options, {codec: "zstd", "owner": "etl"})
    assert _growth_settings(options, {"owner": "etl", codec: "zstd"}) == zstd
    assert _growth_settings(options, {codec: "uncompressed", "owner": "etl"}) != zstd
    other_target = resolve_options("db.t", {}, target_file_size="256MiB")
    assert _growth_settings(other_target, {codec: "zstd", "owner": "etl"}) != zstd
