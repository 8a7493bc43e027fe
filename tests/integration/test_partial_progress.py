"""Partial progress: commits in batches, and a failed group fails alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from compactor import compaction
from compactor.bench.sample import events_batch
from compactor.commit.committer import commit_replace
from compactor.errors import CommitConflictError, DataFileError

from support.rows import assert_same_rows, scan_rows
from support.runs import run_compaction
from support.tables import (
    FIELD_IDS,
    IMPORTED,
    append_rows,
    events_table,
    list_files,
    live_data_files,
    local_path,
    unreferenced_files,
)

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")

TABLE = "db.events"


@pytest.fixture
def events(catalog: Catalog) -> Table:
    """12 partitions (3 days x 4 regions) of 5 small files each: 12 groups."""
    return events_table(catalog, TABLE, commits=5, rows_per_commit=480)


def _replace_chain(table: Table, count: int) -> list[int]:
    """Ids of the last ``count`` snapshots, asserting each is a replace on top of the previous."""
    chain = []
    snapshot = table.current_snapshot()
    for _ in range(count):
        assert snapshot.summary.operation == Operation.REPLACE
        chain.append(snapshot.snapshot_id)
        snapshot = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id)
    assert snapshot.summary.operation == Operation.APPEND
    return chain[::-1]


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize(
    ("commit_every", "max_commits", "commits", "file_kind"),
    [
        pytest.param(2, 10, 6, FIELD_IDS, id="2-10-6"),
        pytest.param(1, 3, 3, FIELD_IDS, id="1-3-3"),
        pytest.param(5, 10, 3, FIELD_IDS, id="5-10-3"),
        pytest.param(2, 10, 6, IMPORTED, id="2-10-6-imported"),
    ],
    indirect=["file_kind"],
)
def test_commits_in_batches(
    catalog: Catalog, events: Table, commit_every: int, max_commits: int, commits: int
) -> None:
    before = scan_rows(events)
    result, table = run_compaction(
        catalog, TABLE, commit_every=commit_every, max_commits=max_commits
    )
    assert len(result.plan.groups) == 12
    assert len(result.snapshot_ids) == commits
    assert _replace_chain(table, commits) == result.snapshot_ids
    assert result.to_dict()["committed_groups"] == 12
    assert_same_rows(before, scan_rows(table))
    assert unreferenced_files(table) == []


@pytest.mark.usefixtures("file_kind")
def test_failed_group_fails_alone(catalog: Catalog, events: Table, read_path: str) -> None:
    before = scan_rows(events)
    victim = sorted(p for p in live_data_files(events) if "region=eu" in p)[0]
    victim_partition = victim.rsplit("/", 1)[0]
    # A readable file that lost a row its manifest counts (an unreadable one fails no group).
    pq.write_table(pq.ParquetFile(local_path(victim)).read().slice(1), local_path(victim))
    result, table = run_compaction(catalog, TABLE, commit_every=1, parallelism=1)
    data = result.to_dict()
    assert [f["kind"] for f in data["failed_groups"]] == ["error"]
    reason = data["failed_groups"][0]["reason"]
    assert "(ts_day=2026-01-01/region=eu)" in reason
    assert (victim in reason) == (read_path == "iceberg")  # read alone, the file is named
    assert data["committed_groups"] == 11
    assert len(result.snapshot_ids) == 6  # batches of ceil(12 / 10) = 2 groups
    # The failed group's files are untouched and still live; every other partition compacted.
    live = live_data_files(table)
    assert victim in live
    assert len([p for p in live if p.startswith(victim_partition)]) == 5
    assert len(live) == 11 + 5
    assert unreferenced_files(table) == []
    # Rows outside the victim's region are exactly as before (the victim can't be read now).
    after = scan_rows(table, "region != 'eu'")
    assert_same_rows(before.filter(pc.field("region") != "eu"), after)


def test_failed_group_without_partial_progress_commits_nothing(
    catalog: Catalog, events: Table, warehouse: Path
) -> None:
    # A readable file that lost a row its manifest counts (an unreadable one fails no group).
    victim = local_path(sorted(live_data_files(events))[0])
    pq.write_table(pq.ParquetFile(victim).read().slice(1), victim)
    snapshots = [s.snapshot_id for s in events.metadata.snapshots]
    with pytest.raises(DataFileError, match="record"):
        run_compaction(catalog, TABLE, parallelism=1)
    table = catalog.load_table(TABLE)
    assert [s.snapshot_id for s in table.metadata.snapshots] == snapshots
    assert unreferenced_files(table) == []


def test_most_fragmented_partitions_are_committed_first(catalog: Catalog, events: Table) -> None:
    # Three more small files in one partition: 8 there, 5 in each of the others.
    for batch in range(100, 103):
        rows = events_batch(batch, 480, days=3)
        day = pc.day(rows["ts"])
        append_rows(events, rows.filter(pc.and_(pc.equal(rows["region"], "eu"), pc.equal(day, 2))))
    worst = {
        path
        for path, f in live_data_files(events).items()
        if f.partition[1] == "eu" and f.partition[0] == 20455
    }
    assert len(worst) == 8
    before = scan_rows(events)

    # One group at a time, so commits follow the plan's order (with more, groups start in it).
    result, table = run_compaction(catalog, TABLE, commit_every=1, max_commits=100, parallelism=1)

    assert [len(g.files) for g in result.plan.groups] == [8] + [5] * 11
    assert {f.path for f in result.plan.groups[0].files} == worst
    first = table.metadata.snapshot_by_id(result.snapshot_ids[0])
    assert first.summary.additional_properties["deleted-data-files"] == "8"
    assert_same_rows(before, scan_rows(table))


@pytest.mark.parametrize(("allowed", "stops"), [(2, True), (None, False)])
def test_max_failed_commits_stops_the_run_after_that_many_failed_commits(
    catalog: Catalog,
    events: Table,
    monkeypatch: pytest.MonkeyPatch,
    warehouse: Path,
    allowed: int | None,
    stops: bool,
) -> None:
    """Every input is overwritten before the first commit: each batch then commits nothing."""
    attempts: list[int] = []

    def after_a_concurrent_overwrite(table: Table, *args: Any, **kwargs: Any) -> Any:
        if not attempts:
            other = catalog.load_table(TABLE)
            other.overwrite(scan_rows(other))
        attempts.append(1)
        return commit_replace(table, *args, **kwargs)

    monkeypatch.setattr(compaction, "commit_replace", after_a_concurrent_overwrite)
    options = {"commit_every": 1, "parallelism": 1, "max_failed_commits": allowed}

    if stops:
        with pytest.raises(CommitConflictError, match=r"3 commits failed, more than max_failed"):
            run_compaction(catalog, TABLE, **options)
        assert len(attempts) == 3  # the third failure stops it: no fourth commit is tried
    else:
        result, _ = run_compaction(catalog, TABLE, **options)
        assert len(attempts) == 6  # batches of 2 groups (12 over max_commits 10), all failed
        assert len(result.to_dict()["failed_groups"]) == 12
    table = catalog.load_table(TABLE)
    assert Operation.REPLACE not in [s.summary.operation for s in table.metadata.snapshots]
    assert not [p for p in list_files(warehouse) if "/compactor-" in p]
