"""The daemon's decisions: which run starts next, when a table rests, and when a table is due.

:class:`~compactor.daemon.scheduling.RunPolicy` runs on a fake clock that only moves when a test moves
it, so cool-downs and back-offs are checked to the second without waiting. Fragmentation is
scored on real tables of a SQLite catalog, and what the scanner reads is counted independently
of the scanner's own bookkeeping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from helpers import (
    commit_delete_files,
    live_data_files,
    live_delete_files,
    write_position_delete_file,
)
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import PyArrowFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from compactor.daemon.fragmentation import MANIFESTS, SUMMARY, Fragmentation, FragmentationScanner
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
from compactor.options import MIN_FILE_SIZE_RATIO, resolve_options
from compactor.planning.health import table_health

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


# --- scanning real tables --------------------------------------------------------------------

TABLE = "db.frag"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
)
BY_REGION = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region")
)


@pytest.fixture
def manifest_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths of the manifests opened for reading from storage, in order, however they are reached."""
    reads: list[str] = []
    original = PyArrowFile.open

    def counting(self: PyArrowFile, *args: Any, **kwargs: Any) -> Any:
        name = self.location.rsplit("/", 1)[-1]
        if name.endswith(".avro") and not name.startswith("snap-"):
            reads.append(self.location)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PyArrowFile, "open", counting)
    return reads


def region_table(catalog: Catalog, appends: dict[str, int]) -> Table:
    """``TABLE`` (v2) partitioned by region; each append writes one file into one region."""
    table = catalog.create_table(
        TABLE, SCHEMA, partition_spec=BY_REGION, properties={"format-version": "2"}
    )
    next_id, rows = 0, 20
    for region, count in appends.items():
        for _ in range(count):
            rows += 15  # every file a different size
            table.append(
                pa.table(
                    {
                        "id": pa.array(range(next_id, next_id + rows), pa.int64()),
                        "region": pa.array([region] * rows),
                    },
                    schema=SCHEMA.as_arrow(),
                )
            )
            next_id += rows
    return catalog.load_table(TABLE)


def manifest_paths(table: Table) -> set[str]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {m.manifest_path for m in snapshot.manifests(table.io)}


def append_region(table: Table, region: str, first_id: int) -> None:
    table.append(
        pa.table(
            {"id": pa.array(range(first_id, first_id + 10), pa.int64()), "region": [region] * 10},
            schema=SCHEMA.as_arrow(),
        )
    )


def test_scanner_counts_agree_with_table_health_and_the_manifests(catalog: Catalog) -> None:
    table = region_table(catalog, {"eu": 4, "us": 3, "ap": 1})
    eu_file = next(f for f in live_data_files(table).values() if f.partition[0] == "eu")
    table = commit_delete_files(
        table,
        [
            write_position_delete_file(table, {eu_file: [0]}),
            write_position_delete_file(table, {eu_file: [1]}),
        ],
    )
    data = live_data_files(table)
    sizes = sorted(f.file_size_in_bytes for f in data.values())
    # A target whose small-file threshold falls inside the range of file sizes.
    target = int(sizes[len(sizes) // 2] / MIN_FILE_SIZE_RATIO) + 1
    small = int(target * MIN_FILE_SIZE_RATIO)
    expected_small = [f for f in data.values() if f.file_size_in_bytes < small]
    assert 0 < len(expected_small) < len(data)

    section = CompactAction(every="1m", min_small_files=1)
    found = FragmentationScanner().scan(table, TABLE, target, section)
    health = table_health(table, TABLE, target, section.min_input_files)

    assert found.source == MANIFESTS
    assert found.snapshot_id == table.current_snapshot().snapshot_id
    assert (found.data_files, found.small_files, found.files_under_target) == (
        health.data_files,
        health.small_files,
        health.files_under_target,
    )
    assert (found.data_bytes, found.small_bytes, found.bytes_under_target) == (
        health.data_bytes,
        health.small_bytes,
        health.bytes_under_target,
    )
    assert (found.delete_files, found.partitions) == (health.delete_files, len(health.partitions))
    assert found.data_files == len(data) == 8
    assert found.files_under_target == len(expected_small)
    assert found.bytes_under_target == sum(f.file_size_in_bytes for f in expected_small)
    assert found.delete_files == len(live_delete_files(table)) == 2
    assert found.partitions == 3
    assert found.score == (found.small_files or 0) + 2


def test_rescanning_an_unchanged_snapshot_reads_no_manifest(
    catalog: Catalog, manifest_reads: list[str]
) -> None:
    region_table(catalog, {"eu": 3, "us": 2})
    scanner = FragmentationScanner()
    section = CompactAction(every="1m", min_small_files=1, min_input_files=2)
    table = catalog.load_table(TABLE)
    manifest_reads.clear()
    first = scanner.scan(table, TABLE, MiB, section)
    assert first.manifests_read == len(manifest_reads) == len(manifest_paths(table)) == 5
    manifest_reads.clear()

    again = scanner.scan(catalog.load_table(TABLE), TABLE, MiB, section)

    assert manifest_reads == []
    assert again.snapshot_id == first.snapshot_id
    assert again.data_files == first.data_files
    assert again.small_files == first.small_files == 5
    assert again.manifests_read == 0


def test_after_an_append_the_scanner_reads_only_the_new_manifests(
    catalog: Catalog, manifest_reads: list[str]
) -> None:
    table = region_table(catalog, {"eu": 3, "us": 2})
    scanner = FragmentationScanner()
    section = CompactAction(every="1m", min_small_files=1, min_input_files=2)
    first = scanner.scan(table, TABLE, MiB, section)
    before = manifest_paths(table)

    for round_number in range(3):
        append_region(table, "ap", 10_000 + 10 * round_number)
        table = catalog.load_table(TABLE)
        new = manifest_paths(table) - before
        assert len(new) == 1  # a fast append writes one manifest
        manifest_reads.clear()

        found = scanner.scan(table, TABLE, MiB, section)

        assert sorted(manifest_reads) == sorted(new)
        assert found.manifests_read == len(new)
        assert found.data_files == first.data_files + round_number + 1
        before = manifest_paths(table)

    # The three appended ap files are now worth merging too.
    assert found.small_files == 5 + 3


def test_a_delete_commit_is_read_as_its_one_new_manifest(
    catalog: Catalog, manifest_reads: list[str]
) -> None:
    table = region_table(catalog, {"eu": 3})
    scanner = FragmentationScanner()
    section = CompactAction(every="1m", min_small_files=1)
    scanner.scan(table, TABLE, MiB, section)
    before = manifest_paths(table)
    eu_file = next(iter(live_data_files(table).values()))
    table = commit_delete_files(table, [write_position_delete_file(table, {eu_file: [0]})])
    manifest_reads.clear()

    found = scanner.scan(catalog.load_table(TABLE), TABLE, MiB, section)

    new = manifest_paths(table) - before
    assert sorted(manifest_reads) == sorted(new) and len(new) == 1
    assert found.manifests_read == 1
    assert found.delete_files == 1


def test_a_table_below_every_threshold_is_scored_from_its_summary(
    catalog: Catalog, manifest_reads: list[str]
) -> None:
    table = region_table(catalog, {"eu": 3, "us": 2})  # 5 data files, no delete files
    summary = table.current_snapshot().summary.additional_properties
    manifest_reads.clear()

    found = FragmentationScanner().scan(
        table, TABLE, MiB, CompactAction(every="1m", min_small_files=6, min_input_files=2)
    )

    assert manifest_reads == []
    assert found.source == SUMMARY
    assert found.manifests_read == 0
    assert found.data_files == 5
    assert found.data_bytes == int(summary["total-files-size"])
    assert found.delete_files == 0
    assert found.small_files is None and found.files_under_target is None
    assert due_reasons(found, min_small_files=6) == []


@pytest.mark.parametrize(
    "section",
    [
        {"min_small_files": 5},  # every data file might be a mergeable small file
        {"min_small_files": 100, "min_small_bytes": "1GB"},  # bytes are only in the manifests
    ],
    ids=["small files at the threshold", "byte threshold"],
)
def test_a_table_that_might_cross_a_threshold_is_scored_from_its_manifests(
    catalog: Catalog, manifest_reads: list[str], section: dict[str, Any]
) -> None:
    table = region_table(catalog, {"eu": 3, "us": 2})
    manifest_reads.clear()

    found = FragmentationScanner().scan(
        table, TABLE, MiB, CompactAction(every="1m", min_input_files=2, **section)
    )

    assert found.source == MANIFESTS
    assert found.manifests_read == len(manifest_reads) == 5
    assert found.small_files == 5


# min_input_files -> regions whose small files a rewrite would merge
MERGEABLE_REGIONS = {1: {"eu", "sa"}, 2: {"eu", "sa"}, 3: {"eu"}, 6: {"eu"}, 7: set()}


def test_small_files_count_only_partitions_with_min_input_files(
    catalog: Catalog,
) -> None:
    # eu: 6 small files; sa: 2; us and ap: 1 each (nothing to merge a lone file with).
    table = region_table(catalog, {"eu": 6, "sa": 2, "us": 1, "ap": 1})
    files = list(live_data_files(table).values())

    for min_input_files, regions in MERGEABLE_REGIONS.items():
        expected = [f for f in files if f.partition[0] in regions]
        section = CompactAction(every="1m", min_small_files=1, min_input_files=min_input_files)

        found = FragmentationScanner().scan(table, TABLE, MiB, section)

        assert found.files_under_target == len(files) == 10
        assert found.small_files == len(expected), min_input_files
        assert found.small_bytes == sum(f.file_size_in_bytes for f in expected)
        assert found.worst_partition == "region=eu"
        assert found.worst_partition_files_under_target == 6
        assert found.score == len(expected)
        assert bool(due_reasons(found, min_small_files=1)) == bool(expected)


def test_rescanning_the_same_snapshot_under_another_section_uses_that_section(
    catalog: Catalog,
) -> None:
    """One daemon, two job files whose [compact] sections both cover a table."""
    region_table(catalog, {"eu": 6, "us": 1})
    scanner = FragmentationScanner()
    strict = CompactAction(every="1m", min_small_files=100, min_input_files=2)
    eager = CompactAction(every="1m", min_small_files=1, min_input_files=2)

    assert scanner.scan(catalog.load_table(TABLE), TABLE, MiB, strict).source == SUMMARY
    found = scanner.scan(catalog.load_table(TABLE), TABLE, MiB, eager)

    assert found.small_files == 6
    assert due_reasons(found, min_small_files=1) != []


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
