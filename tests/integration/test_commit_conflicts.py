"""Commits beside a concurrent writer: appends are retried and kept, conflicting groups refused.

The concurrent writer commits through its own table object after compactor has rewritten its
groups and before it commits, so compactor's first attempt meets a stale head, exactly as when
a streaming job commits during a run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from compactor import compaction
from compactor.bench.sample import create_events_table, events_batch
from compactor.errors import CommitConflictError
from compactor.options import resolve_options

from support.deletes import (
    commit_delete_files,
    write_equality_delete_file,
    write_position_delete_file,
)
from support.java_reader import assert_java_reads_same
from support.rows import assert_same_rows, scan_rows
from support.runs import DEFAULT_OPTIONS
from support.tables import (
    list_files,
    live_data_files,
    live_delete_files,
    live_entries,
    read_data_file,
)

TABLE = "db.events"


@pytest.fixture
def events(catalog: Catalog) -> Table:
    """12 partitions (3 days x 4 regions), 6 small files each."""
    return create_events_table(catalog, TABLE, commits=6, rows_per_commit=480)


def _compact_with_concurrent(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, concurrent: Callable[[Table], None]
) -> compaction.RunResult:
    """Run a compaction; ``concurrent`` commits through another table object just before the
    run's first catalog call, after the run last read the table (so the catalog must refuse
    the run's stale commit, and the run re-validate)."""
    calls = []
    commit_table = catalog.commit_table

    def concurrent_writer_first(table: Table, requirements: tuple, updates: tuple):
        if not calls and f"{'.'.join(table.name())}" == TABLE:
            calls.append(1)
            concurrent(catalog.load_table(TABLE))
        return commit_table(table, requirements, updates)

    monkeypatch.setattr(catalog, "commit_table", concurrent_writer_first)
    table = catalog.load_table(TABLE)
    options = resolve_options(TABLE, table.metadata.properties, **DEFAULT_OPTIONS)
    result = compaction.compact_table(table, options)
    assert calls == [1]
    return result


def _data_files_in(region: str, table: Table) -> list:
    return [f for f in live_data_files(table).values() if region in f.file_path]


def _output_paths(result: compaction.RunResult, warehouse: Path) -> set[str]:
    """Files under the warehouse written by this run (compactor's names carry the run id)."""
    return {p for p in list_files(warehouse) if f"compactor-{result.run_id}-" in p}


def test_concurrent_append_is_retried_and_kept(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = scan_rows(events)
    appended = events_batch(commit=100, rows=240, days=3)
    appended_ids: list[int] = []

    def append(other: Table) -> None:
        other.append(appended)
        appended_ids.append(other.current_snapshot().snapshot_id)

    result = _compact_with_concurrent(catalog, monkeypatch, append)
    data = result.to_dict()
    assert data["snapshot_id"] is not None and data["failed_groups"] == []
    assert [c.attempts for c in result.commits] == [
        2
    ]  # the first commit met the append and was retried
    table = catalog.load_table(TABLE)
    snapshot = table.current_snapshot()
    assert snapshot.snapshot_id == data["snapshot_id"]
    assert snapshot.summary.operation == Operation.REPLACE
    assert snapshot.parent_snapshot_id == appended_ids[0]
    assert_same_rows(pa.concat_tables([before, appended.cast(before.schema)]), scan_rows(table))


def test_concurrent_delete_of_an_input_refuses_that_group_only(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch, warehouse: Path
) -> None:
    victim = sorted(_data_files_in("region=eu", events), key=lambda f: f.file_path)[0]
    victim_partition = victim.file_path.rsplit("/", 1)[0]
    doomed = scan_rows(events, "region = 'eu'").column("event_id")[0].as_py()
    expected = scan_rows(events).filter(pa.compute.field("event_id") != doomed)

    def delete_row(other: Table) -> None:
        # A copy-on-write delete rewrites the file holding the row: an input is replaced.
        other.delete(f"event_id = {doomed}")

    result = _compact_with_concurrent(catalog, monkeypatch, delete_row)
    data = result.to_dict()
    assert len(data["failed_groups"]) == 1
    assert "removed by snapshot" in data["failed_groups"][0]["reason"]
    assert data["committed_groups"] == data["groups"] - 1
    table = catalog.load_table(TABLE)
    assert table.current_snapshot().summary.operation == Operation.REPLACE
    # The deleted row stays deleted; every other row is there exactly once.
    assert_same_rows(expected, scan_rows(table))
    # The refused group's partition still has its small files; no output of it is left on disk.
    assert len([p for p in live_data_files(table) if p.startswith(victim_partition)]) > 1
    live = {p.rsplit("/", 1)[-1] for p in live_data_files(table)}
    leftovers = {p for p in _output_paths(result, warehouse) if p.rsplit("/", 1)[-1] not in live}
    assert leftovers == set()


def test_concurrent_position_delete_on_an_input_refuses_its_group(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = sorted(_data_files_in("region=us", events), key=lambda f: f.file_path)[0]

    def add_position_delete(other: Table) -> None:
        commit_delete_files(other, [write_position_delete_file(other, {victim: [0, 1, 2]})])

    expected_rows: list[pa.Table] = []

    def add_and_remember(other: Table) -> None:
        add_position_delete(other)
        expected_rows.append(scan_rows(catalog.load_table(TABLE)))

    result = _compact_with_concurrent(catalog, monkeypatch, add_and_remember)
    data = result.to_dict()
    assert len(data["failed_groups"]) == 1
    assert "position delete" in data["failed_groups"][0]["reason"]
    table = catalog.load_table(TABLE)
    assert victim.file_path in live_data_files(table)
    assert_same_rows(expected_rows[0], scan_rows(table))


def test_concurrent_equality_delete_still_applies_to_the_rewritten_rows(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch, java_reader: object
) -> None:
    """No group is refused: the outputs keep the start's sequence number, below the delete's."""
    victim = sorted(_data_files_in("region=ap", events), key=lambda f: f.file_path)[0]
    doomed = read_data_file(events, victim).column("event_id")[0].as_py()
    before = scan_rows(events)
    added: list[str] = []

    def add_equality_delete(other: Table) -> None:
        delete_file = write_equality_delete_file(
            other, ["event_id"], [(doomed,)], spec_id=victim.spec_id, partition=victim.partition
        )
        commit_delete_files(other, [delete_file])
        added.append(delete_file.file_path)

    result = _compact_with_concurrent(catalog, monkeypatch, add_equality_delete)
    data = result.to_dict()
    assert data["failed_groups"] == []
    assert data["committed_groups"] == data["groups"] > 0
    table = catalog.load_table(TABLE)
    assert victim.file_path not in live_data_files(table)
    assert set(live_delete_files(table)) == set(added)
    delete_sequence = max(
        e.sequence_number for e in live_entries(table) if e.data_file.file_path in added
    )
    outputs = [
        e for e in live_entries(table) if f"compactor-{result.run_id}-" in e.data_file.file_path
    ]
    assert outputs and all(e.sequence_number < delete_sequence for e in outputs)
    expected = before.filter(pa.compute.field("event_id") != doomed)
    assert len(expected) == len(before) - 1
    current = table.current_snapshot().snapshot_id
    assert_java_reads_same(table, {None: expected, current: expected}, snapshot_ids=[current])


def test_every_group_refused_commits_nothing_and_leaves_no_file(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch, warehouse: Path
) -> None:
    def overwrite_everything(other: Table) -> None:
        other.overwrite(scan_rows(other))

    with pytest.raises(CommitConflictError, match="nothing committed"):
        _compact_with_concurrent(catalog, monkeypatch, overwrite_everything)
    table = catalog.load_table(TABLE)
    operations = [s.summary.operation for s in table.metadata.snapshots]
    assert Operation.REPLACE not in operations
    assert not [p for p in list_files(warehouse) if "/compactor-" in p]


def test_retries_exhausted_aborts_cleanly(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch, warehouse: Path
) -> None:
    with events.transaction() as tx:
        tx.set_properties({"commit.retry.num-retries": "0"})

    appended = events_batch(commit=200, rows=48, days=1)
    with pytest.raises(CommitConflictError, match="after 1 attempts"):
        _compact_with_concurrent(catalog, monkeypatch, lambda other: other.append(appended))
    table = catalog.load_table(TABLE)
    assert table.current_snapshot().summary.operation == Operation.APPEND
    assert not [p for p in list_files(warehouse) if "/compactor-" in p]
