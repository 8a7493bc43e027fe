"""Merge-on-read deletes: position deletes are applied and retired, equality deletes respected."""

from __future__ import annotations

import pyarrow as pa
from helpers import (
    assert_same_rows,
    commit_delete_files,
    compact_and_verify,
    live_data_files,
    live_delete_files,
    live_entries,
    read_data_file,
    row_multiset,
    run_compaction,
    scan_rows,
    snapshot_entries,
    write_equality_delete_file,
    write_position_delete_file,
)
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFile, ManifestEntryStatus
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from compactor.bench.sample import create_events_table, events_batch


def _events(catalog: Catalog, commits: int = 4) -> Table:
    return create_events_table(
        catalog,
        "db.ev",
        commits=commits,
        rows_per_commit=400,
        days=1,
        properties={"format-version": "2"},
    )


def _region_files(table: Table, region: str) -> list[DataFile]:
    files = [f for f in live_data_files(table).values() if f.partition[1] == region]
    return sorted(files, key=lambda f: f.file_path)


def _event_ids_at(table: Table, data_file: DataFile, positions: list[int]) -> set[int]:
    ids = read_data_file(table, data_file).column("event_id").to_pylist()
    return {ids[p] for p in positions}


def test_position_delete_helper_hides_rows(catalog: Catalog) -> None:
    """The test helper writes real position deletes: pyiceberg's scan stops returning the rows."""
    table = _events(catalog, commits=2)
    before = scan_rows(table)
    target = _region_files(table, "eu")[0]
    gone = _event_ids_at(table, target, [0, 3])
    delete_file = write_position_delete_file(table, {target: [0, 3]})
    table = commit_delete_files(table, [delete_file])

    after = scan_rows(table)
    assert table.current_snapshot().summary.operation == Operation.DELETE
    assert after.num_rows == before.num_rows - 2
    assert not gone & set(after.column("event_id").to_pylist())
    assert gone <= set(before.column("event_id").to_pylist())
    assert set(live_delete_files(table)) == {delete_file.file_path}


def test_position_deletes_applied_and_retired(catalog: Catalog) -> None:
    table = _events(catalog)
    eu, us, ap = (_region_files(table, r) for r in ("eu", "us", "ap"))
    gone = (
        _event_ids_at(table, eu[0], [0, 5, 7])
        | _event_ids_at(table, eu[1], [1])
        | _event_ids_at(table, us[2], [3, 99])
        | _event_ids_at(table, ap[0], [2])
    )
    deletes = [
        # One file covering two data files (path bounds differ: matched by metrics).
        write_position_delete_file(table, {eu[0]: [0, 5, 7], eu[1]: [1]}),
        # One file for one data file (path bounds equal: matched by path).
        write_position_delete_file(table, {us[2]: [3, 99]}),
        # No path bounds: applies partition-wide.
        write_position_delete_file(table, {ap[0]: [2]}, path_bounds=False),
    ]
    table = commit_delete_files(table, deletes)
    pre = scan_rows(table)
    assert not gone & set(pre.column("event_id").to_pylist())
    data_before = live_data_files(table)

    result, after, before_rows = compact_and_verify(catalog, "db.ev")

    assert before_rows.num_rows == pre.num_rows == 4 * 400 - len(gone)
    summary = result.to_dict()
    assert summary["rewritten_delete_files"] == 3
    assert summary["deleted_rows_applied"] == len(gone)
    assert summary["records"] == before_rows.num_rows
    # The rewritten data files are no longer live, the deleted rows stay deleted.
    live = live_data_files(after)
    assert not set(data_before) & set(live)
    assert not gone & set(scan_rows(after).column("event_id").to_pylist())
    # The dangling delete files were removed by the same replace snapshot.
    assert live_delete_files(after) == {}
    snapshot = after.current_snapshot()
    removed = {
        e.data_file.file_path
        for e in snapshot_entries(after)
        if e.status == ManifestEntryStatus.DELETED and e.snapshot_id == snapshot.snapshot_id
    }
    assert {d.file_path for d in deletes} <= removed
    props = snapshot.summary.additional_properties
    assert props["removed-position-delete-files"] == "3"
    assert props["total-delete-files"] == "0"
    assert props["total-position-deletes"] == "0"


def test_position_deletes_outside_where_are_kept(catalog: Catalog) -> None:
    """A delete file whose data files are not rewritten stays, and its rows stay deleted."""
    table = _events(catalog)
    eu, us = _region_files(table, "eu"), _region_files(table, "us")
    eu_delete = write_position_delete_file(table, {eu[1]: [4]})
    us_delete = write_position_delete_file(table, {us[1]: [6, 8]})
    gone_us = _event_ids_at(table, us[1], [6, 8])
    table = commit_delete_files(table, [eu_delete, us_delete])

    result, after, _ = compact_and_verify(catalog, "db.ev", where="region = 'eu'")

    assert result.to_dict()["rewritten_delete_files"] == 1
    assert set(live_delete_files(after)) == {us_delete.file_path}
    assert us[1].file_path in live_data_files(after)
    assert not gone_us & set(scan_rows(after).column("event_id").to_pylist())


def test_equality_deletes_skip_files_they_apply_to(catalog: Catalog) -> None:
    """Files an equality delete applies to are not rewritten; newer files are."""
    table = _events(catalog)
    old_eu = _region_files(table, "eu")
    assert len(old_eu) == 4
    victims = sorted(read_data_file(table, old_eu[0]).column("event_id").to_pylist())[:3]
    eq_delete = write_equality_delete_file(
        table,
        ["event_id"],
        [(v,) for v in victims],
        spec_id=old_eu[0].spec_id,
        partition=old_eu[0].partition,
    )
    table = commit_delete_files(table, [eq_delete], operation=Operation.OVERWRITE)
    eq_sequence = table.current_snapshot().sequence_number
    # Two more commits: their eu files are newer than the equality delete.
    for commit in range(4, 6):
        table.append(events_batch(commit, 400, 1))
    table = catalog.load_table("db.ev")
    new_eu = [f for f in _region_files(table, "eu") if f not in old_eu]
    assert len(new_eu) == 2

    not_eu = "region != 'eu'"
    others_before = scan_rows(table, not_eu)
    eu_files_before = _region_files(table, "eu")
    eu_rows_before = pa.concat_tables(read_data_file(table, f) for f in eu_files_before)
    snapshots_before = len(table.metadata.snapshots)

    result, after = run_compaction(catalog, "db.ev")

    assert result.plan.skipped["files_with_equality_deletes"] == 4
    assert after.current_snapshot().summary.operation == Operation.REPLACE
    assert len(after.metadata.snapshots) == snapshots_before + 1
    # The files the delete applies to, and the delete itself, are untouched.
    live = live_data_files(after)
    assert {f.file_path for f in old_eu} <= set(live)
    assert set(live_delete_files(after)) == {eq_delete.file_path}
    # The newer eu files were compacted into one file whose sequence number is past the delete.
    eu_after = _region_files(after, "eu")
    assert len(eu_after) == 5
    for entry in live_entries(after):
        if entry.data_file.file_path in {f.file_path for f in old_eu}:
            assert entry.sequence_number < eq_sequence
        elif entry.data_file.file_path in {f.file_path for f in eu_after}:
            assert entry.sequence_number >= eq_sequence
    # Rows: identical outside eu (pyiceberg can scan around the equality delete), and the eu
    # files hold the same rows as before.
    assert row_multiset(scan_rows(after, not_eu)) == row_multiset(others_before)
    eu_rows_after = pa.concat_tables(read_data_file(after, f) for f in eu_after)
    assert row_multiset(eu_rows_after) == row_multiset(eu_rows_before)
    assert len(live) < len(live_data_files(table))


def test_delete_file_spanning_two_commits_is_retired_by_the_second(catalog: Catalog) -> None:
    """Partial progress: the data files of one delete file land in groups committed apart."""
    table = _events(catalog)
    # In commit order, as the planner packs them: the first and last land in different groups.
    sequence = {e.data_file.file_path: e.sequence_number for e in live_entries(table)}
    eu = sorted(_region_files(table, "eu"), key=lambda f: sequence[f.file_path])
    gone = _event_ids_at(table, eu[0], [1]) | _event_ids_at(table, eu[-1], [2])
    spanning = write_position_delete_file(table, {eu[0]: [1], eu[-1]: [2]})
    table = commit_delete_files(table, [spanning])
    # Groups of two files: every partition's four files make two groups, committed one by one.
    pair = max(f.file_size_in_bytes for f in live_data_files(table).values()) * 2 + 1
    before = scan_rows(table)

    result, after = run_compaction(
        catalog,
        "db.ev",
        target_file_size=str(pair),
        max_group_size=str(pair),
        commit_every=1,
        max_commits=100,
    )

    eu_groups = [
        {f.path for f in g.files}
        for g in result.plan.groups
        if {f.path for f in g.files} & {f.file_path for f in eu}
    ]
    assert len(eu_groups) == 2 and all(len(g) == 2 for g in eu_groups)
    assert not any({eu[0].file_path, eu[-1].file_path} <= g for g in eu_groups)
    assert len(result.snapshot_ids) == len(result.plan.groups)
    assert live_delete_files(after) == {}
    assert result.to_dict()["rewritten_delete_files"] == 1
    assert not gone & set(scan_rows(after).column("event_id").to_pylist())
    assert_same_rows(before, scan_rows(after))
